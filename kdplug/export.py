"""Export a trained student: its Hugging Face package or ONNX, optionally int8 and with a vocabulary
trimmed to the task; each checked against the fp32 student before it is kept, and timed. Either
can then be pushed to a Hugging Face hub repository.

ONNX goes through ``torch.onnx.export`` with the TorchScript exporter: the newer
``torch.export``-based one cannot trace the BiLSTM's packed sequences, which the TorchScript
exporter turns into ONNX's own ``LSTM`` with sequence lengths. Batch and sequence axes are
dynamic. The fp32 export is checked with ONNX Runtime against PyTorch on a sample of the run's dev
set; above ``tolerance`` (largest absolute difference of the logits) nothing is written.

What changes the model is checked on the whole dev split against the fp32 student: an int8 or
trimmed student may lose at most ``max_drop`` points of the task's main metric (agreement with the
fp32 student is printed beside it; without gold labels, ``--sample``, the share of changed
predictions counts instead). A trimmed vocabulary is built from the training split, the transfer set
and a corpus the user names, never from the dev texts: on those, the share of tokens it reads as
unknown is measured, and a high one is warned about (kdplug/vocab.py). An int8 ONNX file is then
measured itself against the PyTorch student on the sample the fp32 file was checked on, and that
figure is the one recorded.
"""

from __future__ import annotations

import copy
import inspect
import json
import shutil
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from .engine.package import drop_foreign_code, redact_loading_paths
from .engine.speed import SINGLE_EXAMPLES
from .errors import KdplugError, UsageError
from .inference import LoadedStudent, Text, load_student, student_directory
from .integrity import refuse_outside_links, refuse_package_code, tokenizer_record, verify_package
from .layout import INFO_FILE, ONNX_FILE
from .native_output import PACKED_SEQUENCE_SHAPE_WARNINGS, without_native_lines
from .quantize import INT8, TORCH_RECIPE, quantize_onnx
from .storage import atomic_directory
from .threads import other_load
from .timing import RETIME, megabytes, plus_minus, time_call, unreliable

OPSET = 17
TOLERANCE = 1e-4
SAMPLE_SIZE = 64
MAX_DROP = 1.0  # points of the main metric an int8 student may lose
FORMATS = ("hf", "onnx")


class ExportMismatchError(KdplugError):
    """The exported model does not compute what the student computes."""


@dataclass
class DevSet:
    """What an export is checked on: texts, their gold labels (None: unknown) and the task's metric."""

    texts: list[Text]
    labels: Optional[list] = None
    metrics: Optional[Callable[[list, list], dict[str, float]]] = None
    main_metric: Optional[str] = None
    is_regression: bool = False
    name: str = "dev texts"  # what they are, in words


@dataclass
class ExportReport:
    directory: Path
    max_abs_diff: Optional[float] = None
    sample_size: int = 0
    inputs: tuple[str, ...] = ()
    sample_texts: list = field(default_factory=list)
    #: the int8 file shipped against the fp32 PyTorch student on the same sample (None: not int8 ONNX)
    int8_max_abs_diff: Optional[float] = None
    int8_same_class: Optional[int] = None
    #: fp32 student and export on the dev texts: main metric (or None), agreement
    reference_metric: Optional[float] = None
    export_metric: Optional[float] = None
    agreement: Optional[float] = None
    vocabulary: Optional[str] = None  # what trimming did, in words
    coverage: Any = None  # kdplug.vocab.Coverage: how the trimmed vocabulary reads the dev texts

    def warnings(self) -> list[str]:
        """What ``kdplug export`` tells on stderr: a trimmed vocabulary that leaves much of the dev texts unread."""
        fix = "Name a corpus of the texts the student will serve (--vocab-corpus FILE), or export without --trim-vocab"
        warning = self.coverage.warning(fix) if self.coverage is not None else None
        return [warning] if warning else []

    size_mb: dict[str, float] = field(default_factory=dict)  # "fp32", "export"
    speed: dict[str, dict[str, float]] = field(default_factory=dict)  # "fp32", "export" -> ms_b1, per_s_b32

    def lines(self) -> list[str]:
        """What ``kdplug export`` prints."""
        out = []
        if self.max_abs_diff is not None:
            out.append(
                f"ONNX Runtime vs PyTorch on {self.sample_size} examples: largest absolute difference of the "
                f"logits {self.max_abs_diff:.2e} (tolerance {TOLERANCE:g})"
                + (" for the fp32 export, before quantization" if self.int8_max_abs_diff is not None else "")
            )
        if self.int8_max_abs_diff is not None:
            same = ""
            if self.int8_same_class is not None:
                same = f", the same predicted class for {self.int8_same_class} of {self.sample_size}"
            out.append(
                f"the int8 file shipped (ONNX Runtime) vs the fp32 PyTorch student on the same {self.sample_size} "
                f"examples: largest absolute difference of the logits {self.int8_max_abs_diff:.2e}{same}"
            )
        if self.vocabulary:
            out.append(f"trimmed: {self.vocabulary}; {self.coverage.describe()}")
        if self.agreement is not None:
            scores = ""
            if self.export_metric is not None:
                scores = f"{self.reference_metric * 100:.2f} fp32 -> {self.export_metric * 100:.2f} exported; "
            out.append(f"on the dev texts: {scores}agreement with the fp32 student {self.agreement * 100:.2f}%")
        if self.size_mb:
            out.append(f"size {self.size_mb['fp32']:.1f} MB fp32 -> {self.size_mb['export']:.1f} MB exported")
        if self.speed:
            fp32, new = self.speed["fp32"], self.speed["export"]
            out.append(
                f"speed (this machine, now): {fp32['ms_b1']:.2f} {plus_minus(fp32['spread_b1'])} -> "
                f"{new['ms_b1']:.2f} {plus_minus(new['spread_b1'])} ms/example at batch 1, {fp32['per_s_b32']:.0f} "
                f"{plus_minus(fp32['spread_b32'])} -> {new['per_s_b32']:.0f} {plus_minus(new['spread_b32'])} "
                f"examples/s at batch 32 ({new['per_s_b32'] / fp32['per_s_b32']:.2f}x)"
            )
            doubt = fp32["unreliable"] or new["unreliable"]
            if doubt:
                out.append(f"the speed figures are not reliable: {doubt}. Time them again {RETIME}")
        return out


class _LogitsOnly(nn.Module):
    """The student as ONNX sees it: token ids in, logits out."""

    def __init__(self, model: nn.Module, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.input_names = model, tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.input_names, inputs))).logits


def check_output(output: Union[str, Path], overwrite: bool) -> Path:
    """An export goes to a new or empty directory, or with ``overwrite`` replaces an earlier export."""
    output = Path(output).expanduser()
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory; choose another")
    if output.is_dir() and any(output.iterdir()):
        earlier = (output / INFO_FILE).is_file()
        if not (overwrite and earlier):
            hint = "pass --overwrite to replace it" if earlier else "it was not written by kdplug, choose another"
            raise UsageError(f"--output {output} is not empty; {hint}")
    return output


def _encode(student: LoadedStudent, texts: Sequence[Text]) -> dict[str, torch.Tensor]:
    first = [t[0] if isinstance(t, tuple) else t for t in texts]
    second = [t[1] for t in texts] if student.is_pair else None
    encoded = student.tokenizer(
        first, second, truncation=True, max_length=student.max_length, padding=True, return_tensors="pt"
    )
    return {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def _input_names(model: nn.Module, encoded: dict) -> list[str]:
    accepted = inspect.signature(model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in encoded and "token_type_ids" in accepted:
        names.append("token_type_ids")
    return names


def _require_onnx() -> Any:
    try:
        import onnx  # noqa: F401  (the exporter writes through it)
        import onnxruntime
    except ImportError:
        raise UsageError(
            "ONNX export needs the onnx and onnxruntime packages: pip install onnx onnxruntime (kdplug's deploy extra)"
        ) from None
    return onnxruntime


def export_student(
    path: Union[str, Path],
    output: Union[str, Path],
    *,
    fmt: str,
    dev: DevSet,
    quantize: Optional[str] = None,
    trim_texts: Optional[Sequence[Text]] = None,
    vocab_corpus: Sequence[Text] = (),
    vocab_min_count: int = 1,
    tolerance: float = TOLERANCE,
    max_drop: float = MAX_DROP,
    allow_drop: bool = False,
    measure: bool = True,
    overwrite: bool = False,
    verify: bool = True,
) -> ExportReport:
    """Export the student in ``path`` to ``output`` as ``fmt`` (``hf``: its package; ``onnx``), int8
    with ``quantize="int8"``, its vocabulary trimmed to ``trim_texts`` (the training split and the
    transfer set) and the tokens of ``vocab_corpus`` seen ``vocab_min_count`` times when given;
    checked on ``dev`` (see the module docstring), timed when ``measure``. ``verify``: check
    the source package against its checksums first (see :mod:`kdplug.integrity`)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if quantize not in (None, INT8):
        raise UsageError(f"--quantize takes {INT8}, got {quantize!r}")
    if fmt == "onnx":
        onnxruntime = _require_onnx()
    if not dev.texts:
        raise UsageError("the export needs texts to check the student on; none were given")
    output = check_output(output, overwrite)
    refuse_outside_links(student_directory(path))
    reference = load_student(path, device="cpu", runtime="torch", verify=verify)
    report = ExportReport(output)
    with atomic_directory(output, f"the export {output}") as staging:
        _copy_package(reference.directory, staging)
        if trim_texts is not None:
            report.vocabulary, report.coverage = _trim(
                reference, staging, trim_texts, vocab_corpus, vocab_min_count, dev
            )
        if fmt == "onnx":
            base = load_student(staging, device="cpu", runtime="torch", verify=False)
            report.sample_texts = list(dev.texts[:SAMPLE_SIZE])
            report.inputs, report.max_abs_diff, report.sample_size = _write_onnx(
                base, staging, report.sample_texts, tolerance, onnxruntime
            )
            for weights in staging.glob("*.safetensors"):
                weights.unlink()  # the ONNX export is its own weights
            if quantize == INT8:
                quantize_onnx(staging / ONNX_FILE, staging / f"int8-{ONNX_FILE}")
                (staging / f"int8-{ONNX_FILE}").replace(staging / ONNX_FILE)
                _check_int8_file(report, base, staging, onnxruntime)
        if quantize == INT8:
            _record(
                staging,
                quantization=TORCH_RECIPE if fmt == "hf" else {"method": "onnxruntime-dynamic", "weights": "int8"},
            )
        if quantize == INT8 or trim_texts is not None:
            what = " and ".join(filter(None, [quantize, "trimmed" if trim_texts is not None else None]))
            exported = load_student(staging, device="cpu", runtime="onnx" if fmt == "onnx" else "torch", verify=False)
            _check_drop(report, reference, exported, dev, max_drop, allow_drop, what=what)
            _record(
                staging,
                check={
                    "metric": dev.main_metric,
                    "fp32": report.reference_metric,
                    quantize or "trimmed": report.export_metric,
                    "agreement": report.agreement,
                },
            )
        report.size_mb = {"fp32": _size_mb(reference.directory), "export": _size_mb(staging)}
        if measure:
            exported = load_student(staging, device="cpu", runtime="onnx" if fmt == "onnx" else "torch", verify=False)
            load = other_load()  # before: while the models run, this process is one of the busy ones
            report.speed = {"fp32": speed(reference, dev.texts, load), "export": speed(exported, dev.texts, load)}
    return report


def _record(directory: Path, **facts: Any) -> None:
    info = json.loads((directory / INFO_FILE).read_text())
    info.update(facts)
    (directory / INFO_FILE).write_text(json.dumps(info, indent=2))


def _trim(
    reference: LoadedStudent,
    staging: Path,
    texts: Sequence[Text],
    corpus: Sequence[Text],
    min_count: int,
    dev: DevSet,
) -> tuple[str, Any]:
    """Rewrite the package in ``staging`` with the vocabulary :func:`kdplug.vocab.kept_token_ids`
    keeps; what it did, in words, and how it reads the ``dev`` texts (which it was not built from)."""
    from .vocab import measure_coverage, trim

    model = copy.deepcopy(reference.model)
    tokenizer, trimmed = trim(model, reference.tokenizer, list(texts), corpus, min_count)
    for old in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model"):
        (staging / old).unlink(missing_ok=True)
    if hasattr(model, "tokenizer"):  # not through capabilities(): one that carries it, even None
        model.tokenizer = tokenizer  # a pooled student saves the tokenizer it carries
    tokenizer.model_max_length = reference.max_length  # truncation=True cuts where training cut
    model.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    redact_loading_paths(staging)
    drop_foreign_code(staging)
    coverage = measure_coverage(reference.tokenizer, tokenizer, list(dev.texts), dev.name)
    sources = "training split, transfer set" + (f", corpus (tokens seen {min_count}+ times)" if corpus else "")
    _record(
        staging,
        vocabulary={
            "before": trimmed.vocab_before,
            "after": trimmed.vocab_after,
            "built_from": sources,
            **coverage.record(),
        },
        tokenizer=tokenizer_record(tokenizer),
    )
    return trimmed.describe(), coverage


def _write_onnx(
    student: LoadedStudent, staging: Path, sample: Sequence[Text], tolerance: float, onnxruntime: Any
) -> tuple[tuple[str, ...], float, int]:
    """``staging/model.onnx`` from ``student``, checked with ONNX Runtime against PyTorch on ``sample``."""
    encoded = _encode(student, list(sample[:8]))
    names = _input_names(student.model, encoded)
    wrapper = _LogitsOnly(student.model, names).eval()
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["logits"] = {0: "batch"}
    # the exporter's advice about LSTMs, Python's and C++'s: the check below is the proof
    with torch.inference_mode(), warnings.catch_warnings(), without_native_lines(*PACKED_SEQUENCE_SHAPE_WARNINGS):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            tuple(encoded[name] for name in names),
            str(staging / ONNX_FILE),
            input_names=names,
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    worst, _ = onnx_parity(student, names, staging / ONNX_FILE, sample, onnxruntime)
    if worst > tolerance:
        raise ExportMismatchError(
            f"the ONNX model differs from the student by up to {worst:.2e} in its logits "
            f"on {len(sample)} examples (tolerance {tolerance:g}); nothing was written"
        )
    _record(
        staging,
        onnx={
            "file": ONNX_FILE,
            "opset": OPSET,
            "inputs": names,
            "outputs": ["logits"],
            "checked_on": len(sample),
            "max_abs_diff": worst,
        },
    )
    return tuple(names), worst, len(sample)


def onnx_parity(
    student: LoadedStudent, names: Sequence[str], onnx_file: Path, sample: Sequence[Text], onnxruntime: Any
) -> tuple[float, Optional[int]]:
    """``onnx_file`` in ONNX Runtime against ``student`` in PyTorch on ``sample``, in batches of 16 and
    its first 4 texts one by one (other batch sizes and lengths than the traced ones; an int8 file
    quantizes its activations per batch, so the batches are part of the figure): the largest absolute
    difference of the logits and, for a classifier, how many of the batched texts get the same class."""
    wrapper = _LogitsOnly(student.model, names).eval()
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    worst, same = 0.0, 0
    chunks = [list(sample[start : start + 16]) for start in range(0, len(sample), 16)]
    singles = [[text] for text in sample[:4]]
    for index, chunk in enumerate(chunks + singles):
        batch = _encode(student, chunk)
        with torch.inference_mode():
            expected = wrapper(*(batch[name] for name in names)).numpy()
        got = session.run(["logits"], {name: batch[name].numpy() for name in names})[0]
        worst = max(worst, float(abs(got - expected).max()))
        if index < len(chunks):
            same += int((got.argmax(-1) == expected.argmax(-1)).sum())
    return worst, (same if expected.shape[-1] > 1 else None)


def _check_int8_file(report: ExportReport, student: LoadedStudent, staging: Path, onnxruntime: Any) -> None:
    """The figure of the file shipped: the int8 ``model.onnx`` against the fp32 PyTorch student on the
    sample the fp32 export was checked on; recorded in place of the fp32 file's (kept beside it)."""
    info = json.loads((staging / INFO_FILE).read_text())["onnx"]
    sample = report.sample_texts
    worst, same = onnx_parity(student, info["inputs"], staging / ONNX_FILE, sample, onnxruntime)
    report.int8_max_abs_diff, report.int8_same_class = worst, same
    info.update(
        weights=INT8,
        compared_with="the fp32 PyTorch student",
        max_abs_diff=worst,
        same_class=same,
        fp32_max_abs_diff=report.max_abs_diff,
    )
    _record(staging, onnx=info)


def _predicted(student: LoadedStudent, texts: Sequence[Text], regression: bool) -> list:
    return [p.score if regression else student.labels.index(p.label) for p in student.predict(list(texts))]


def _check_drop(
    report: ExportReport,
    reference: LoadedStudent,
    exported: LoadedStudent,
    dev: DevSet,
    max_drop: float,
    allow_drop: bool,
    what: str = INT8,
) -> None:
    """The ``what`` (int8, trimmed) student against the fp32 one on the dev texts: the main metric of
    both and their agreement; a loss of more than ``max_drop`` points stops the export unless ``allow_drop``."""
    before = _predicted(reference, dev.texts, dev.is_regression)
    after = _predicted(exported, dev.texts, dev.is_regression)
    if dev.is_regression:
        report.agreement = None
    else:
        report.agreement = sum(a == b for a, b in zip(before, after)) / len(before)
    if dev.labels is not None and dev.metrics is not None:
        report.reference_metric = dev.metrics(before, dev.labels)[dev.main_metric]
        report.export_metric = dev.metrics(after, dev.labels)[dev.main_metric]
        lost, measure = (report.reference_metric - report.export_metric) * 100, f"dev {dev.main_metric}"
    else:
        lost, measure = (1.0 - (report.agreement or 0.0)) * 100, "agreement with the fp32 student (no gold labels)"
    fix = " or ".join(option for option, name in (("--quantize", INT8), ("--trim-vocab", "trimmed")) if name in what)
    if lost > max_drop and not allow_drop:
        why = f" With the trimmed vocabulary, {report.coverage.describe()}." if report.coverage is not None else ""
        raise ExportMismatchError(
            f"the {what} student loses {lost:.2f} points of {measure} (--max-drop {max_drop:g}); nothing was written."
            f"{why} Keep it anyway with --allow-drop, or export without {fix}"
            + (", or name a corpus of the texts it will serve with --vocab-corpus FILE" if why else "")
        )


def speed(student: LoadedStudent, texts: Sequence[Text], load: Optional[float] = None) -> dict[str, Any]:
    """Milliseconds per example at batch 1 and examples per second at batch 32, on ``texts``
    tokenised once (the model's time alone), with :mod:`kdplug.timing`'s routine: the run's table
    uses the same. ``load``: other processes' load while it was measured, which may flag it."""
    single = [_encode(student, [text]) for text in list(texts)[:SINGLE_EXAMPLES]]
    batch = _encode(student, (list(texts) * 32)[:32])
    with torch.inference_mode():
        per_example = [time_call(lambda s=s: student.logits(s), repeats=3) for s in single]
        batched = time_call(lambda: student.logits(batch))
    return {
        "ms_b1": statistics.median(timing.median for timing in per_example) * 1000,
        "per_s_b32": 32 / batched.median,
        "spread_b1": statistics.median(timing.spread for timing in per_example),
        "spread_b32": batched.spread,
        "unreliable": unreliable([batched], load),
    }


def _size_mb(directory: Path) -> float:
    weights = [p for p in directory.iterdir() if p.suffix in (".safetensors", ".onnx")]
    return megabytes(sum(p.stat().st_size for p in weights))


def export_hf(
    path: Union[str, Path], output: Union[str, Path], *, overwrite: bool = False, verify: bool = True
) -> ExportReport:
    """A copy of the standalone student package (the Hugging Face format)."""
    source = student_directory(path)
    refuse_package_code(source)
    refuse_outside_links(source)
    if verify:
        verify_package(source)
    output = check_output(output, overwrite)
    with atomic_directory(output, f"the export {output}") as staging:
        _copy_package(source, staging)
    return ExportReport(output)


def _copy_package(source: Path, target: Path, skip: Sequence[str] = ()) -> None:
    """The package's files, without what would load code it does not carry (a package written before
    kdplug left its teacher's ``auto_map`` out)."""
    for item in source.iterdir():
        if item.name in skip or item.name.startswith("kdplug_checksums"):
            continue
        if item.is_dir():
            shutil.copytree(item, target / item.name)
        else:
            shutil.copy2(item, target / item.name)
    drop_foreign_code(target)


# -- the hub ---------------------------------------------------------------------------------------


def check_push(repo_id: str) -> None:
    """Everything a push needs, checked before any export work: a valid repository id, a hub that
    can be reached and a token."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from . import hub

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UsageError(
            f"--push-to-hub {repo_id!r} is not a repository id ({exc}); use owner/name, e.g. my-org/sst2-bilstm"
        ) from None
    hub.require(
        f"push to {repo_id}",
        "export with --output DIR now and push the directory from a machine with "
        "network ('hf upload REPO DIR', or kdplug export again with --push-to-hub)",
    )
    if get_token() is None:
        raise UsageError(
            f"pushing to {repo_id} needs a Hugging Face token with write access: run 'hf auth login', or set HF_TOKEN"
        )


def push_to_hub(
    folder: Union[str, Path],
    repo_id: str,
    *,
    private: bool = False,
    revision: Optional[str] = None,
    commit_message: str = "Upload a student distilled with kdplug",
) -> str:
    """Upload an export (or a student package) to ``repo_id``, creating it if needed; the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            revision=revision,
            commit_message=commit_message,
        )
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        hint = " (does the token have write access to it?)" if status in (401, 403) else ""
        raise KdplugError(
            f"the hub refused the push to {repo_id}{hint}: {str(exc).splitlines()[0]}; "
            f"{folder} is complete: push it again with 'hf upload {repo_id} {folder}'"
        ) from None
    return commit.commit_url

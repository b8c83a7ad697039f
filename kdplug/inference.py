"""Use a trained student: load it, and predict on new text (the public ``kdplug.load_student`` /
``kdplug.predict``; ``kdplug predict`` and ``kdplug export`` are built on these).

They read only the student package a run writes (``<run>/student``, see
:mod:`kdplug.engine.package`), or an ONNX export of it (``kdplug export --format onnx``): weights
and config through transformers' Auto classes, or ``model.onnx`` through ONNX Runtime, the
tokenizer it was trained with, its label names and maximum length. Both runtimes give the same
:class:`Prediction` objects and check their input the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch

from .errors import ArgumentError, UsageError

INFO_FILE = "kdplug_student.json"
STUDENT_DIR = "student"
ONNX_FILE = "model.onnx"
RUNTIMES = ("auto", "torch", "onnx")
#: what a student directory must hold, and what each file is
REQUIRED = {
    "config.json": "the model's config",
    "tokenizer_config.json": "the tokenizer",
    INFO_FILE: "kdplug's record of labels, input columns and maximum length",
}

Text = Union[str, tuple[str, str]]


@dataclass
class Prediction:
    """One input's prediction: the label and every label's probability, or a score (regression)."""

    label: Optional[str] = None
    probabilities: dict[str, float] = field(default_factory=dict)
    score: Optional[float] = None
    truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        if self.score is not None:
            return {"score": self.score}
        return {"label": self.label, "probabilities": self.probabilities}


@dataclass
class LoadedStudent:
    """A loaded student: the model (eval mode; or an ONNX Runtime session), its tokenizer and what it
    predicts. ``runtime`` is ``torch`` or ``onnx``."""

    model: Optional[torch.nn.Module]
    tokenizer: Any
    labels: tuple[str, ...]
    is_regression: bool
    is_pair: bool
    max_length: int
    text_columns: tuple[str, ...]
    directory: Path
    info: dict[str, Any]
    runtime: str = "torch"
    session: Any = None  # onnxruntime.InferenceSession, for runtime "onnx"

    @property
    def device(self) -> torch.device:
        if self.model is None:
            return torch.device("cpu")  # ONNX Runtime takes and gives host arrays
        return next(self.model.parameters()).device

    def logits(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The logits for a tokenised batch (``input_ids``, ``attention_mask`` ...), on the CPU, float."""
        if self.session is not None:
            names = [i.name for i in self.session.get_inputs()]
            return torch.from_numpy(self.session.run(["logits"], {n: inputs[n].cpu().numpy() for n in names})[0])
        if "token_type_ids" in inputs and not _takes_token_types(self.model):
            inputs = {k: v for k, v in inputs.items() if k != "token_type_ids"}
        return self.model(**{k: v.to(self.device) for k, v in inputs.items()}).logits.float().cpu()

    def predict(
        self, texts: Union[Text, Sequence[Text]], *, batch_size: int = 32, progress: bool = False
    ) -> list[Prediction]:
        """Predictions for ``texts`` (a string, a list of strings, or of (text, pair) tuples), in order."""
        return list(self.iter_predict(texts, batch_size=batch_size, progress=progress))

    def iter_predict(
        self, texts: Union[Text, Sequence[Text]], *, batch_size: int = 32, progress: bool = False
    ) -> Iterator[Prediction]:
        items = [texts] if isinstance(texts, (str, tuple)) else list(texts)
        if not items:
            raise UsageError("nothing to predict: the input holds no texts")
        for item in items:
            self._check(item)
        bar = None
        if progress:
            from .progress import progress as progress_bar

            bar = progress_bar(total=len(items), desc="predict", unit="text")
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            yield from self._predict_batch(chunk)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()

    def _check(self, item: Text) -> None:
        if not _is_text(item):
            raise ArgumentError(f"expected text (a string) or a pair of two strings, got {item!r}"[:200])
        pair = isinstance(item, tuple)
        if pair != self.is_pair:
            raise UsageError(
                f"this student reads {'sentence pairs' if self.is_pair else 'single texts'} "
                f"({', '.join(self.text_columns)}), got {'a pair' if pair else 'a single text'}"
            )

    @torch.inference_mode()
    def _predict_batch(self, chunk: list[Text]) -> Iterator[Prediction]:
        first = [item[0] if isinstance(item, tuple) else item for item in chunk]
        second = [item[1] for item in chunk] if self.is_pair else None
        full = self.tokenizer(first, second, truncation=False, verbose=False)["input_ids"]
        encoded = self.tokenizer(
            first, second, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
        )
        logits = self.logits(
            {key: value for key, value in encoded.items() if key in ("input_ids", "attention_mask", "token_type_ids")}
        )
        for row, ids in zip(logits, full):
            truncated = len(ids) > self.max_length
            if self.is_regression:
                yield Prediction(score=float(row.squeeze(-1)), truncated=truncated)
            else:
                probabilities = row.softmax(-1).tolist()
                yield Prediction(
                    label=self.labels[int(row.argmax())],
                    truncated=truncated,
                    probabilities=dict(zip(self.labels, probabilities)),
                )


def _takes_token_types(model: torch.nn.Module) -> bool:
    import inspect

    return "token_type_ids" in inspect.signature(model.forward).parameters


def student_directory(path: Union[str, Path]) -> Path:
    """The student package in ``path``: a run directory (its ``student/``), the package itself, or an
    ONNX export of it."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"{path} does not exist; pass a run directory or its student/ directory")
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory; pass a run directory or its student/ directory")
    directory = path / STUDENT_DIR if (path / STUDENT_DIR).is_dir() else path
    missing = [f"{name} ({what})" for name, what in REQUIRED.items() if not (directory / name).is_file()]
    if missing:
        where = "a run directory (with student/) nor a student directory" if directory == path else str(directory)
        raise UsageError(
            f"{path} is not {where}: it has no {', '.join(missing)}. A run writes its student to "
            f"<run>/student; runs of kdplug before 0.2 wrote no standalone student"
        )
    return directory


def load_student(
    path: Union[str, Path],
    *,
    device: Union[str, torch.device, None] = None,
    runtime: str = "auto",
    verify: bool = True,
) -> LoadedStudent:
    """The student in ``path`` (a run directory, its ``student/``, or an ONNX export of it), in eval
    mode on ``device`` (default: CUDA when available), with its tokenizer, label names and maximum
    length. ``runtime``: ``torch`` (the package's weights; a quantized package is rebuilt in int8 on
    the CPU), ``onnx`` (an export's ``model.onnx`` through ONNX Runtime) or ``auto`` (ONNX where
    ``path`` is an ONNX export, else PyTorch). ``verify``: check every file against the package's
    checksums first (see :mod:`kdplug.integrity`); the tokenizer is checked either way."""
    from .integrity import check_tokenizer, refuse_package_code, verify_package

    if not isinstance(path, (str, Path)):
        raise ArgumentError(
            f"load_student takes a path (str or pathlib.Path) to a run directory or its student/ directory, "
            f"got {type(path).__name__}"
        )
    if runtime not in RUNTIMES:
        raise UsageError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    directory = student_directory(path)
    refuse_package_code(directory)  # checksums or not: they prove who wrote a package, not that its code is safe
    if verify:
        verify_package(directory)
    info = _read_info(directory)
    has_onnx, has_weights = (directory / ONNX_FILE).is_file(), any(directory.glob("*.safetensors"))
    if runtime == "auto":
        runtime = "onnx" if has_onnx and not has_weights else "torch"
    if runtime == "onnx" and not has_onnx:
        raise UsageError(
            f"{directory} holds no {ONNX_FILE}: export it first (kdplug export {path} --format onnx --output DIR) "
            f"and load DIR with runtime onnx, or use the PyTorch runtime"
        )
    if runtime == "torch" and not has_weights:
        raise UsageError(f"{directory} is an ONNX export (no PyTorch weights): use the onnx runtime")
    tokenizer = _tokenizer(directory)
    check_tokenizer(tokenizer, info, directory)
    model, session = None, None
    if runtime == "onnx":
        session = _onnx_session(directory / ONNX_FILE, device)
    else:
        model = _torch_model(directory, info, device)
    columns = tuple(info.get("text_columns") or (("text", "text_pair") if info.get("is_pair") else ("text",)))
    return LoadedStudent(
        model=model,
        tokenizer=tokenizer,
        labels=tuple(info.get("labels") or ()),
        is_regression=bool(info.get("is_regression")),
        is_pair=bool(info.get("is_pair")),
        max_length=int(info["max_length"]),
        text_columns=columns,
        directory=directory,
        info=info,
        runtime=runtime,
        session=session,
    )


def _tokenizer(directory: Path) -> Any:
    """The package's tokenizer; files it cannot be built from (a ``tokenizer.json`` gone, where
    nothing else describes the tokenizer) are a damaged package, not a library's traceback."""
    from transformers import AutoTokenizer

    from .integrity import repair_advice

    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        if (directory / "tokenizer.json").is_file():
            raise damaged(directory, "its tokenizer", exc) from None
        raise UsageError(
            f"{directory}: tokenizer.json is missing, and nothing else in the package describes its tokenizer; "
            f"the package is damaged or incomplete. {repair_advice(directory)}"
        ) from None


def _torch_model(directory: Path, info: dict[str, Any], device: Union[str, torch.device, None]) -> torch.nn.Module:
    from . import model_types
    from .quantize import apply_recipe

    model_types.register_model_types()
    from safetensors import SafetensorError
    from transformers import AutoModelForSequenceClassification

    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(directory), trust_remote_code=False)
    except (SafetensorError, OSError) as exc:
        raise damaged(directory, "its weights", exc) from None
    except (KeyError, ValueError) as exc:
        raise UsageError(
            f"{directory} holds a model type transformers does not know ({exc}); install the kdplug "
            f"plugin that provides the {info.get('student')!r} student"
        ) from None
    recipe = info.get("quantization")
    if recipe:
        if device is not None and torch.device(device).type != "cpu":
            raise UsageError(f"{directory} is an int8 student (dynamic quantization), which runs on the CPU only")
        return apply_recipe(model.eval(), recipe).eval()
    device = (
        torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    return model.to(device).eval()


def _onnx_session(path: Path, device: Union[str, torch.device, None]) -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise UsageError(
            "the onnx runtime needs the onnxruntime package: pip install onnxruntime (kdplug's deploy extra)"
        ) from None
    providers = ["CPUExecutionProvider"]
    if device is not None and torch.device(device).type == "cuda":
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise UsageError("this onnxruntime has no CUDA provider: install onnxruntime-gpu, or use --device cpu")
        providers.insert(0, "CUDAExecutionProvider")
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidGraph, InvalidProtobuf

    try:
        return onnxruntime.InferenceSession(str(path), providers=providers)
    except (InvalidProtobuf, InvalidGraph) as exc:  # a cut or altered file; other failures keep their own message
        raise damaged(path.parent, path.name, exc) from None


def _read_info(directory: Path) -> dict[str, Any]:
    try:
        info = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise damaged(directory, INFO_FILE, exc) from None
    if not isinstance(info, dict) or "max_length" not in info:
        raise damaged(directory, INFO_FILE, ValueError("it lacks max_length"))
    return info


def damaged(directory: Path, what: str, exc: BaseException) -> UsageError:
    """The error for a package file that cannot be read (a truncated download, a damaged disk)."""
    reason = str(exc).strip().splitlines()[0].rstrip(": ") if str(exc).strip() else type(exc).__name__
    from .integrity import repair_advice

    return UsageError(
        f"{directory}: {what} cannot be read ({reason}); the package is damaged or incomplete. "
        f"{repair_advice(directory)}"
    )


def predict(
    path: Union[str, Path, LoadedStudent],
    texts: Union[Text, Iterable[Text]],
    *,
    batch_size: int = 32,
    device: Union[str, torch.device, None] = None,
    runtime: str = "auto",
    verify: bool = True,
) -> list[Prediction]:
    """Predictions of the student in ``path`` for ``texts`` (strings, or (text, pair) tuples)."""
    items = [texts] if isinstance(texts, (str, tuple)) else list(texts) if _iterable(texts) else [texts]
    wrong = [item for item in items if not _is_text(item)]
    if wrong:  # before the student loads
        raise ArgumentError(
            f"predict takes texts: a string, a list of strings, or of (text, pair) tuples; got "
            f"{type(wrong[0]).__name__} {wrong[0]!r}"[:200]
        )
    if not isinstance(path, (str, Path, LoadedStudent)):
        raise ArgumentError(
            f"predict takes a run directory or student directory (str or pathlib.Path) or a LoadedStudent, "
            f"got {type(path).__name__}"
        )
    student = (
        path if isinstance(path, LoadedStudent) else load_student(path, device=device, runtime=runtime, verify=verify)
    )
    return student.predict(items, batch_size=batch_size)


def _iterable(value: Any) -> bool:
    return not isinstance(value, (bytes, bytearray)) and hasattr(value, "__iter__")


def _is_text(item: Any) -> bool:
    return isinstance(item, str) or (
        isinstance(item, tuple) and len(item) == 2 and all(isinstance(part, str) for part in item)
    )

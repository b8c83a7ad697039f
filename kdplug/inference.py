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
import numbers
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch

from .errors import ArgumentError, UsageError
from .layout import INFO_FILE, MODEL_CONFIG_FILE, ONNX_FILE, STUDENT_DIR, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE

RUNTIMES = ("auto", "torch", "onnx")
#: what a student directory must hold, and what each file is
REQUIRED = {
    MODEL_CONFIG_FILE: "the model's config",
    TOKENIZER_CONFIG_FILE: "the tokenizer",
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
        self,
        texts: Union[Text, Sequence[Text]],
        *,
        batch_size: int = 32,
        progress: bool = False,
        tokens_per_batch: Optional[int] = None,
    ) -> list[Prediction]:
        """Predictions for ``texts`` (a string, a list of strings, or of (text, pair) tuples), in order.
        ``tokens_per_batch``: batches by a budget of padded tokens, the texts sorted by length (see
        :mod:`kdplug.token_budget`), instead of ``batch_size`` texts in their order."""
        return list(
            self.iter_predict(texts, batch_size=batch_size, progress=progress, tokens_per_batch=tokens_per_batch)
        )

    def iter_predict(
        self,
        texts: Union[Text, Sequence[Text]],
        *,
        batch_size: int = 32,
        progress: bool = False,
        tokens_per_batch: Optional[int] = None,
    ) -> Iterator[Prediction]:
        """:meth:`predict`, one prediction at a time; the arguments are checked on the call, not on
        the first ``next()``."""
        items = text_items(texts)
        batch_size = check_batch_size(batch_size)
        tokens_per_batch = check_tokens_per_batch(tokens_per_batch)
        check_flag("progress", progress)
        for item in items:
            self._check_pairing(item)
        return self._predictions(items, batch_size, progress, tokens_per_batch)

    def _predictions(
        self, items: list[Text], batch_size: int, progress: bool, tokens_per_batch: Optional[int]
    ) -> Iterator[Prediction]:
        from .token_budget import WINDOW

        bar = None
        if progress:
            from .progress import progress as progress_bar

            bar = progress_bar(total=len(items), desc="predict", unit="text")
        step = batch_size if tokens_per_batch is None else WINDOW
        for start in range(0, len(items), step):
            chunk = items[start : start + step]
            if tokens_per_batch is None:
                yield from self._predict_batch(chunk)
            else:
                yield from self._predict_by_tokens(chunk, tokens_per_batch)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()

    def _predict_by_tokens(self, chunk: list[Text], tokens_per_batch: int) -> list[Prediction]:
        """``chunk``'s predictions from batches of at most ``tokens_per_batch`` padded tokens, in order."""
        from .token_budget import budget_batches

        first, second = self._texts(chunk)
        ids = self.tokenizer(first, second, truncation=True, max_length=self.max_length, verbose=False)["input_ids"]
        predictions: list[Any] = [None] * len(chunk)
        for batch in budget_batches([len(row) for row in ids], range(len(chunk)), tokens_per_batch):
            for row, prediction in zip(batch, self._predict_batch([chunk[i] for i in batch])):
                predictions[row] = prediction
        return predictions

    def _texts(self, chunk: list[Text]) -> tuple[list[str], Optional[list[str]]]:
        """The first texts of ``chunk`` and, for a pair student, the second."""
        first = [item[0] if isinstance(item, tuple) else item for item in chunk]
        return first, [item[1] for item in chunk] if self.is_pair else None

    def _check_pairing(self, item: Text) -> None:
        pair = isinstance(item, tuple)
        if pair != self.is_pair:
            advice = " (several texts go in a list, not a tuple)" if pair else ""
            raise UsageError(
                f"this student reads {'sentence pairs' if self.is_pair else 'single texts'} "
                f"({', '.join(self.text_columns)}), got {'a pair' if pair else 'a single text'}{advice}"
            )

    @torch.inference_mode()
    def _predict_batch(self, chunk: list[Text]) -> Iterator[Prediction]:
        first, second = self._texts(chunk)
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
    from .integrity import check_tokenizer, refuse_outside_links, refuse_package_code, verify_package

    check_path("load_student", path)
    device = check_device(device)
    check_runtime(runtime)
    check_flag("verify", verify)
    directory = student_directory(path)
    refuse_package_code(directory)  # checksums or not: they prove who wrote a package, not that its code is safe
    refuse_outside_links(directory)  # a tokenizer.json linked elsewhere is another file than the one packaged
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
        if (directory / TOKENIZER_FILE).is_file():
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
    tokens_per_batch: Optional[int] = None,
) -> list[Prediction]:
    """Predictions of the student in ``path`` for ``texts``: a string (one prediction), or a list
    (or any ordered iterable) of strings, or of (text, pair) tuples. Every argument is checked
    before the student loads. ``tokens_per_batch``: see :meth:`LoadedStudent.predict`."""
    items = text_items(texts)
    batch_size = check_batch_size(batch_size)
    tokens_per_batch = check_tokens_per_batch(tokens_per_batch)
    if isinstance(path, LoadedStudent):
        if device is not None or runtime != "auto":
            raise UsageError(
                f"device= and runtime= choose how predict loads a student, and this one is loaded already "
                f"({path.runtime} on {path.device}): pass its path instead, or load it with "
                f"kdplug.load_student(path, device=..., runtime=...)"
            )
        return path.predict(items, batch_size=batch_size, tokens_per_batch=tokens_per_batch)
    check_path("predict", path)
    student = load_student(path, device=device, runtime=runtime, verify=verify)
    return student.predict(items, batch_size=batch_size, tokens_per_batch=tokens_per_batch)


# -- the arguments' checks: each says what was passed and what to pass -------------------------------

#: what ``texts`` may be, for the messages
TEXTS = "a string, or a list of strings, or of (text, pair) tuples"


def text_items(texts: Any) -> list[Text]:
    """``texts`` as a list of inputs, each a string or a (text, pair) tuple of strings.

    A string is one text, never its characters; a tuple is one pair. A table (a DataFrame iterates
    its column names, a Dataset its rows as dicts), a mapping (its keys) and a set (no order to give
    the predictions back in) are refused rather than iterated."""
    if isinstance(texts, (str, tuple)):
        items = [texts]
    elif (columns := _columns(texts)) is not None:
        raise ArgumentError(
            f"predict takes texts: {TEXTS}; got a table ({type(texts).__name__}): pass one column, "
            f"texts[{(columns or ['text'])[0]!r}], or a list of (text, pair) tuples"
        )
    elif isinstance(texts, Mapping):
        raise ArgumentError(f"predict takes texts: {TEXTS}; got a dict: pass list(texts.values()) or the texts")
    elif isinstance(texts, AbstractSet):
        raise ArgumentError(f"predict takes texts: {TEXTS}; got a set, which has no order: pass sorted(texts)")
    elif isinstance(texts, Iterable) and not isinstance(texts, (bytes, bytearray)):
        items = list(texts)
    else:
        raise ArgumentError(f"predict takes texts: {TEXTS}; got {_describe(texts)}")
    for index, item in enumerate(items):
        if not _is_text(item):
            raise ArgumentError(f"predict takes texts: {TEXTS}; got {_describe(item)}{_item_hint(item, index, items)}")
    if not items:
        raise UsageError(f"nothing to predict: texts holds no texts; pass {TEXTS}")
    return items


def _columns(value: Any) -> Optional[list[str]]:
    """The column names of a table (a pandas DataFrame, a datasets Dataset), None for anything else."""
    names = getattr(value, "column_names", None)
    if names is None and not isinstance(value, Mapping):
        names = getattr(value, "columns", None)
    return None if names is None or isinstance(value, Mapping) else [str(name) for name in names]


def _item_hint(item: Any, index: int, items: list) -> str:
    where = f" (item {index} of {len(items)})" if len(items) > 1 else ""
    if isinstance(item, tuple) and all(isinstance(part, str) for part in item):
        return f"{where}: a tuple is one (text, pair) input; pass several texts as a list"
    if isinstance(item, list) and len(item) == 2 and all(isinstance(part, str) for part in item):
        return f"{where}: a pair is a tuple, (text, pair)"
    if isinstance(item, (bytes, bytearray)):
        return f"{where}: decode bytes first (text.decode('utf-8'))"
    return where


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as a whole number of at least 1 (not a bool, a float or a string)."""
    return _positive_whole("batch_size", batch_size, 32, "the number of texts per forward pass")


def check_tokens_per_batch(tokens: Any) -> Optional[int]:
    """``tokens_per_batch``: None (batches of ``batch_size`` texts) or a whole number of at least 1."""
    if tokens is None:
        return None
    return _positive_whole("tokens_per_batch", tokens, 2048, "padded tokens per forward pass, or None")


def _positive_whole(name: str, value: Any, example: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentError(
            f"{name}= takes a whole number of at least 1, such as {example}; got {_describe(value)}"
            + _whole_number_hint(name, value)
        )
    if value < 1:
        raise UsageError(f"{name}= must be at least 1 ({meaning}), got {value}")
    return int(value)


def _whole_number_hint(name: str, value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return f": pass {name}={int(number)}" if number.is_integer() and number >= 1 and not isinstance(value, bool) else ""


def check_path(function: str, path: Any) -> None:
    """``path`` names a directory: a str or path-like, and not empty (which would mean the current directory)."""
    if not isinstance(path, (str, os.PathLike)):
        what = (
            "a run directory or student directory (str or pathlib.Path) or a LoadedStudent"
            if function == "predict"
            else "a path (str or pathlib.Path) to a run directory or its student/ directory"
        )
        raise ArgumentError(f"{function} takes {what}, got {type(path).__name__}")
    if not str(path).strip():
        raise UsageError(f"{function} got an empty path: pass a run directory or its student/ directory")


def check_device(device: Any) -> Optional[torch.device]:
    """``device`` as a torch.device this machine has (None: the default, CUDA when available)."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise ArgumentError(f"device= takes 'cpu', 'cuda', 'cuda:1' ... or a torch.device; got {_describe(device)}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"device {device!r} is not a device torch knows: pass cpu, cuda, cuda:1 ...") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UsageError(f"device {device!r}: this machine has no CUDA device torch can use; use cpu")
        if parsed.index is not None and parsed.index >= count:
            raise UsageError(
                f"device {device!r}: this machine has {count} CUDA device{'s' if count > 1 else ''} "
                f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
            )
    return parsed


def check_runtime(runtime: Any) -> None:
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        raise UsageError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")


def check_flag(name: str, value: Any) -> None:
    """A yes/no argument is True or False: a string such as 'no' would read as true."""
    if not isinstance(value, bool):
        raise ArgumentError(f"{name}= takes True or False, got {_describe(value)}")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def _is_text(item: Any) -> bool:
    return isinstance(item, str) or (
        isinstance(item, tuple) and len(item) == 2 and all(isinstance(part, str) for part in item)
    )

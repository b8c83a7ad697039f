"""The one Task implementation every first-party task uses, and the metrics it reports.

A task is data plus a metric; what differs between GLUE tasks, the user's own files and the
demo task is only where the examples come from. So :class:`DataTask` holds the
:class:`kdplug.types.Task` attributes and a ``reader(split, limit) -> list[Example]``, and each
task module supplies a small spec and a reader.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from kdplug.errors import ConfigError, DataError, UsageError, close_matches
from kdplug.types import Example

from .columns import ExampleTable


def _skm():
    # scikit-learn and scipy cost a second to import: loaded when a metric is first computed, so
    # that loading the plugins (every kdplug command) and checking a run's options stay fast
    from sklearn import metrics

    return metrics


def _stats():
    from scipy import stats

    return stats


#: metric name -> fn(predictions, references) -> float, all in [0, 1] (or [-1, 1] for correlations)
METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": lambda pred, ref: float(_skm().accuracy_score(ref, pred)),
    # binary F1 of class 1 (MRPC "equivalent", QQP "duplicate"), as GLUE reports it
    "f1": lambda pred, ref: float(_skm().f1_score(ref, pred, pos_label=1, average="binary", zero_division=0)),
    "macro_f1": lambda pred, ref: float(_skm().f1_score(ref, pred, average="macro", zero_division=0)),
    "matthews": lambda pred, ref: float(_skm().matthews_corrcoef(ref, pred)),
    "pearson": lambda pred, ref: float(_stats().pearsonr(pred, ref)[0]) if _varies(pred, ref) else 0.0,
    "spearman": lambda pred, ref: float(_stats().spearmanr(pred, ref)[0]) if _varies(pred, ref) else 0.0,
}


def _varies(*arrays: np.ndarray) -> bool:
    # A constant prediction has no correlation with anything; scipy would return NaN (and warn),
    # which makes every later checkpoint compare as "not better". Count it as 0: no information.
    return all(np.ptp(array) > 0 for array in arrays)


Reader = Callable[[str, Optional[int]], list[Example]]


@dataclass
class DataTask:
    """A :class:`kdplug.types.Task` whose examples come from ``reader(split, limit)``.

    ``reader`` returns at most ``limit`` examples of ``split`` (all when ``limit`` is None), in
    file order; splits are loaded once and kept. ``source`` says where the data comes from
    (a directory, the hub, the generator and its seed): it ends up in logs and run configs.
    """

    name: str
    labels: tuple[str, ...]
    is_pair: bool
    metrics: tuple[str, ...]
    main_metric: str
    reader: Reader = field(repr=False)
    is_regression: bool = False
    dev_splits: tuple[str, ...] = ("dev",)
    max_train_examples: Optional[int] = None
    max_dev_examples: Optional[int] = None
    source: str = ""
    text_columns: tuple[str, ...] = ()  # the input columns as the task's files name them
    hub_dataset: Optional[str] = None  # the data set's hub id, for model cards ("nyu-mll/glue")
    _loaded: dict[str, Sequence[Example]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = [name for name in self.metrics if name not in METRICS]
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown metrics {unknown}; known: {sorted(METRICS)}")
        if self.main_metric not in self.metrics:
            raise ValueError(f"task {self.name!r}: main_metric {self.main_metric!r} is not in {self.metrics}")
        if self.is_regression == bool(self.labels):
            raise ValueError(f"task {self.name!r}: a regression task has no labels, a classification task needs them")

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", *self.dev_splits)

    def load_split(self, split: str) -> Sequence[Example]:
        if split not in self.splits:
            raise UsageError(f"task {self.name!r} has no split {split!r}; its splits are {', '.join(self.splits)}.")
        if split not in self._loaded:
            limit = self.max_train_examples if split == "train" else self.max_dev_examples
            examples = self.reader(split, limit)
            if not examples:
                raise DataError(
                    f"split {split!r} of task {self.name!r} has no examples (source: {self.source or 'unknown'})."
                )
            self._loaded[split] = ExampleTable.of(examples)  # kept for the task's life: column-wise, compact
        loaded = self._loaded[split]
        return loaded if isinstance(loaded, ExampleTable) else list(loaded)  # a table cannot be changed

    def compute_metrics(self, predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
        """Every metric of the task; ``predictions`` are class indices, or floats for regression."""
        pred, ref = np.asarray(predictions), np.asarray(references)
        if pred.ndim != 1 or pred.shape != ref.shape or pred.size == 0:
            raise ValueError(
                f"task {self.name!r}: expected two equally long non-empty 1-d sequences "
                f"(class indices: argmax the logits first), got shapes {pred.shape} and {ref.shape}"
            )
        if self.is_regression:
            pred, ref = pred.astype(float), ref.astype(float)
        else:
            pred, ref = pred.astype(int), ref.astype(int)
        return {name: METRICS[name](pred, ref) for name in self.metrics}


# --------------------------------------------------------------------------------------------
# Helpers shared by the task factories
# --------------------------------------------------------------------------------------------


def reject_unknown_options(task: str, options: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """A task factory's ``**options`` leftovers are typos in ``task_options``: say so, with a fix."""
    if not options:
        return
    allowed = sorted(allowed)
    option = sorted(options)[0]
    suggestions = close_matches(option, allowed)
    hint = f" Did you mean {suggestions[0]!r}?" if suggestions else ""
    raise ConfigError(f"task {task!r} has no option {option!r}.{hint} Its options are: {', '.join(allowed)}.")


def check_count(option: str, value: Any, *, allow_none: bool = True) -> Optional[int]:
    """A positive integer option (``max_train_examples``, ``num_train`` ...)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"option {option} must be a positive integer{' or null' if allow_none else ''}, got {value!r}."
        )
    return value


def label_index(
    value: str,
    label_values: Sequence[str],
    *,
    column: str,
    path: str,
    line: int,
    hint: str = "Fix the label, or check that this is the task's file.",
) -> int:
    """The class index of a label as a file spells it."""
    if value in label_values:
        return label_values.index(value)
    raise DataError(
        f"label {value!r} in column {column!r} is not in the label set "
        f"{', '.join(repr(label) for label in label_values)}. {hint}",
        path=path,
        line=line,
    )


def parse_score(value: str, *, column: str, path: str, line: int) -> float:
    """A regression target; NaN and infinities are data errors too."""
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        raise DataError(
            f"expected a number in column {column!r} (a regression target), found {value!r}.", path=path, line=line
        )
    return score


def require_examples(examples: list, *, path: str) -> list:
    if not examples:
        raise DataError(
            "no examples: the file has no data lines after its header. Check that you passed the right file.", path=path
        )
    return examples

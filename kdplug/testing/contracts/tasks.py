"""The task contract: splits, labels, metrics, bad input."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from ...errors import OfflineError, UsageError
from ...registry import Registry
from ...types import Example
from .harness import ContractReport, _begin, _list, _Note, _Skip, one_thread, require

# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------

TASK_CHECKS = (
    "name resolves",
    "builds",
    "declares its attributes",
    "every split loads",
    "labels in range",
    "compute_metrics returns the main metric",
    "deterministic under a seed",
)


@one_thread
def check_task(
    name: str,
    *,
    data_dir: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
    registry: Optional[Registry] = None,
) -> ContractReport:
    """The task contract. A task that needs files it was not given (or a hub it cannot reach)
    is skipped with its own message: pass ``data_dir`` (and ``options``) to check it."""
    registry, report, rec = _begin("task", name, registry)
    options = dict(options or {})

    def build():
        try:
            return registry.create("task", name, data_dir=data_dir, **options)
        except (OfflineError, UsageError) as exc:
            if data_dir is None:
                raise _Skip(f"needs data: {exc} (pass a data directory to check it)") from exc
            raise

    task = rec.run("builds", build, fatal=True)
    rec.run("declares its attributes", lambda: _check_attributes(task), fatal=True)
    splits: dict[str, list] = {}
    rec.run("every split loads", lambda: _load_splits(task, splits), fatal=True)
    rec.run("labels in range", lambda: _check_labels(task, splits))
    rec.run("compute_metrics returns the main metric", lambda: _check_metrics(task, splits))

    def deterministic() -> None:
        again = registry.create("task", name, data_dir=data_dir, **options)
        for split, examples in splits.items():
            require(again.load_split(split) == examples, f"a second build loads a different {split} split")

    rec.run("deterministic under a seed", deterministic)
    report.results += rec.results
    return report


def _check_attributes(task: Any) -> None:
    require(isinstance(task.name, str) and task.name, "name must be a non-empty string")
    require(isinstance(task.labels, tuple), f"labels must be a tuple, got {type(task.labels).__name__}")
    require(
        task.is_regression == (not task.labels),
        f"is_regression={task.is_regression} but labels={task.labels!r}: a regression task has no labels, "
        f"a classification task at least two",
    )
    require(
        task.is_regression or len(task.labels) >= 2, f"a classification task needs >= 2 labels, got {task.labels!r}"
    )
    require(isinstance(task.dev_splits, tuple) and task.dev_splits, "dev_splits must be a non-empty tuple")
    require(isinstance(task.main_metric, str) and task.main_metric, "main_metric must name a metric")


def _load_splits(task: Any, splits: dict[str, list]) -> _Note:
    """Loads train and every dev split into ``splits`` (what the later checks read)."""
    for split in ("train", *task.dev_splits):
        examples = task.load_split(split)
        require(
            isinstance(examples, Sequence) and not isinstance(examples, str) and len(examples) > 0,
            f"load_split({split!r}) returned no examples (it must return a list or another sequence of examples)",
        )
        bad = next((e for e in examples if not isinstance(e, Example)), None)
        require(bad is None, f"load_split({split!r}) returned a {type(bad).__name__}, not kdplug.types.Example")
        for e in examples:
            require(isinstance(e.text_a, str) and e.text_a, f"{split}: an example with an empty text_a: {e!r}")
            require(
                (e.text_b is not None) == task.is_pair,
                f"{split}: is_pair={task.is_pair} but an example has text_b={e.text_b!r}",
            )
        splits[split] = examples
    return _Note(", ".join(f"{s}: {len(e)}" for s, e in splits.items()))


def _check_labels(task: Any, splits: dict[str, list]) -> None:
    for split, examples in splits.items():
        for index, e in enumerate(examples):
            if task.is_regression:
                require(
                    isinstance(e.label, (int, float)) and not isinstance(e.label, bool) and math.isfinite(e.label),
                    f"{split} example {index}: label {e.label!r} is not a finite number",
                )
            else:
                require(
                    isinstance(e.label, int) and not isinstance(e.label, bool) and 0 <= e.label < len(task.labels),
                    f"{split} example {index}: label {e.label!r} is not a class index in 0..{len(task.labels) - 1}",
                )


def _check_metrics(task: Any, splits: dict[str, list]) -> _Note:
    """Perfect predictions score finite numbers, the main metric among them, and no lower than wrong ones."""
    references = [float(e.label) if task.is_regression else e.label for e in splits[task.dev_splits[0]]]
    if task.is_regression:
        wrong = [-r for r in references]
    else:
        wrong = [(r + 1) % len(task.labels) for r in references]
    perfect = task.compute_metrics(list(references), list(references))
    worse = task.compute_metrics(wrong, list(references))
    for result in (perfect, worse):
        require(
            isinstance(result, Mapping) and task.main_metric in result,
            f"compute_metrics returned {result!r}, without the main metric {task.main_metric!r}",
        )
        bad = [k for k, v in result.items() if not (isinstance(v, (int, float)) and math.isfinite(v))]
        require(not bad, f"compute_metrics gave non-finite or non-numeric values for {_list(bad)}")
    require(
        perfect[task.main_metric] >= worse[task.main_metric],
        f"{task.main_metric} of perfect predictions ({perfect[task.main_metric]:.4g}) is below that of wrong "
        f"ones ({worse[task.main_metric]:.4g}): the main metric must be higher-is-better",
    )
    return _Note(f"{task.main_metric}: perfect {perfect[task.main_metric]:.3g}, wrong {worse[task.main_metric]:.3g}")

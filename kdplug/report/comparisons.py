"""Comparing methods across runs: runs grouped into comparable setups, pairs of methods chosen,
and every pair's difference computed on the seeds both ran (:mod:`kdplug.compare`). Numbers only:
the report's prose is written by :mod:`kdplug.report.sections` from what this returns."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import compare
from ..config import set_values
from ..layout import BASELINE_PREDICTIONS_FILE
from ..zoo import ZooEntry
from .runs import RESOLVED_FROM_WEIGHTS, Run, resolved_config

#: configuration keys that make two runs a different setup, never paired: another dev set, or dev
#: scores chosen another way; every other key that is not ignored (projector, recipe, their
#: options, eta, lam, temperature, lr, epochs, the transfer set, and the FACTOR_KEYS) is the method
SETUP_KEYS = ("task", "task_options", "data_dir", "data_fingerprint", "best_checkpoint")
#: keys of the models that runs on one dev set may differ in (an ablation of the student's options,
#: another student or teacher): labels always name them where they differ within a group
FACTOR_KEYS = (
    "teacher",
    "teacher_options",
    "teachers",
    "layer_teacher",
    "student",
    "student_options",
    "max_length",
    "teacher_epochs",
    "teacher_lr",
    "teacher_batch_size",
)
#: keys that change neither the setup nor the method
IGNORED_KEYS = (
    "seed",
    "teacher_seed",
    "output",
    "cache_dir",
    "num_workers",
    "checkpoint_every",
    "keep_checkpoints",
    "precision",
    "zoo",
    "baseline",
    "report_to",
    "measure_speed",
)
#: with more methods than this in a group, each is compared with the best one only
ALL_PAIRS_UP_TO = 4
#: the default recipe of runs recorded before metrics.json named it (student.default_recipe)
DEFAULT_RECIPE = "standard"


#: re-creates a run's task from its configuration (for metrics kdplug has no weighted form of)
TaskFactory = Callable[[dict[str, Any]], Any]


@dataclass
class Method:
    label: str
    values: dict[str, Any]  # the method's configuration keys (zoo: the entry's row)
    results: dict[str, dict[int, compare.SeedResult]] = field(default_factory=dict)  # split -> seed -> result
    entry: Optional[ZooEntry] = None
    notes: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)  # its run directories (a baseline student has none of its own)
    reference: bool = False  # a --baseline student: the method others are measured against
    origin: str = ""  # the directory its runs came from: its label where nothing in its configuration differs

    @property
    def representative(self) -> Optional[Run]:
        """The run the report's figures show for this method: its lowest seed."""
        return min(self.runs, key=lambda run: run.seed if run.seed is not None else math.inf, default=None)

    def add(
        self, seed: int, dev: dict[str, dict[str, float]], predictions: dict[str, dict[str, list]], where: str
    ) -> None:
        for split, scores in dev.items():
            seeds = self.results.setdefault(split, {})
            if seed in seeds:
                self.notes.append(f"{self.label}: seed {seed} appears twice; {where} is left out")
                return
            record = predictions.get(split) or {}
            seeds[seed] = compare.SeedResult(
                seed,
                scores,
                np.asarray(record["predictions"]) if "predictions" in record else None,
                np.asarray(record["labels"]) if "labels" in record else None,
            )

    def mean(self, split: str, metric: str) -> Optional[float]:
        values = [r.scores[metric] for r in self.results.get(split, {}).values() if metric in r.scores]
        return statistics.fmean(values) if values else None


@dataclass
class Group:
    title: str
    main_metric: str
    best_checkpoint: str
    setup: dict[str, Any]
    methods: dict[str, Method] = field(default_factory=dict)  # key -> method, in order of appearance
    zoo: Optional[tuple[str, int, str]] = None  # (paper, table, task)
    config: dict[str, Any] = field(default_factory=dict)  # one run's configuration: to re-create the task


def _key(values: Any) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _method_label(values: dict[str, Any], default_recipe: str) -> str:
    label = str(values.get("projector", "?"))
    recipe = values.get("recipe")
    return label + (f" / {recipe}" if recipe not in (None, default_recipe, label) else "")  # not "tinybert / tinybert"


def _distinguish(
    labels: dict[str, str], values: dict[str, dict[str, Any]], origins: Optional[dict[str, str]] = None
) -> dict[str, str]:
    """Labels made unique by the keys in which same-labelled items differ: ``rkd (lr=0.001)``; where
    no value differs (the same configuration run by two versions of kdplug, or on two machines), by
    the directories they came from: ``rkd [before]``."""
    result = dict(labels)
    for label in set(labels.values()):
        same = [k for k, v in labels.items() if v == label]
        if len(same) < 2:
            continue
        keys = sorted({key for k in same for key in values[k]})
        differing = [key for key in keys if len({_key(values[k].get(key)) for k in same}) > 1]
        if differing:
            for k in same:
                result[k] = label + " (" + ", ".join(f"{key}={values[k].get(key)}" for key in differing) + ")"
    for label in set(result.values()) if origins else ():
        same = [k for k, v in result.items() if v == label]
        if len(same) > 1:
            for k, where in zip(same, shortest_unique_suffixes([origins[k] for k in same])):
                result[k] = f"{label} [{where}]"
    return result


def shortest_unique_suffixes(paths: list[str]) -> list[str]:
    """Each path by as few of its last parts as tell it from the others (``a/points`` and ``b/points``)."""
    parts = [Path(path).parts for path in paths]
    for n in range(1, max(map(len, parts), default=0) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return list(paths)


def _identity(values: dict[str, Any]) -> str:
    """A method's configuration, by its keys that are set (:func:`kdplug.config.set_values`)."""
    return _key(set_values(values))


def _method_values(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a run's configuration that make its method (neither its setup nor ignored)."""
    return {k: v for k, v in config.items() if k not in SETUP_KEYS and k not in IGNORED_KEYS}


def _method_key(group: Group, identity: str, source: str, seeds: set[int], placed: dict) -> str:
    """The method a directory's runs of one configuration join: the configuration's, unless it has one
    of their seeds already (the same configuration run again, by another version of kdplug or on
    another machine: a method of its own, told apart by its directory)."""
    slot = (id(group), identity, source)
    if slot not in placed:
        taken = group.methods.get(identity)
        clash = taken is not None and any(seeds & set(by_seed) for by_seed in taken.results.values())
        placed[slot] = _key([identity, source]) if clash else identity
    return placed[slot]


def name_factors(group: Group) -> None:
    """Title a group by its teacher and student, and label its methods by the model keys they differ
    in (``rkd (student_options={...})``): an ablation's factor, not a method's own setting."""
    methods = list(group.methods.values())
    common = {k: methods[0].values.get(k) for k in FACTOR_KEYS if len({_key(m.values.get(k)) for m in methods}) == 1}
    teacher = Path(str(common["teacher"])).name if "teacher" in common else "several teachers"
    if common.get("teachers"):  # an ensemble: its members, not the unused teacher key
        teacher = " + ".join(Path(str(entry.get("teacher"))).name for entry in common["teachers"])
    student = common.get("student", "several students")
    group.title = f"{group.title}: {teacher} → {student}"
    varying = [k for k in FACTOR_KEYS if k not in common]
    if varying:
        for method in methods:
            method.label += " (" + ", ".join(f"{k}={_short(method.values.get(k))}" for k in varying) + ")"


def _short(value: Any) -> str:
    """A factor's value for a label: a path by its last part, a dict as ``{key: value}``."""
    if isinstance(value, str) and ("/" in value or "\\" in value):
        return Path(value).name
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def comparison_groups(runs: list[Run]) -> list[Group]:
    """Runs grouped into comparable sets: zoo runs by paper table and task column (methods = the
    paper's rows), others by setup (methods = the remaining keys); a run's ``--baseline`` student
    counts as one more method (its metrics, and its predictions from ``baseline_predictions.json``)."""
    groups: dict[str, Group] = {}
    placed: dict[tuple, str] = {}  # (group, configuration, directory) -> the method its runs joined
    resolved = [(run, resolved_config(run)) for run in runs]
    seeds_of = _seeds_by_configuration(resolved)
    for run, config in resolved:
        student_dev = run.metrics.get("student", {}).get("dev")
        if run.seed is None or not student_dev:
            continue
        if run.entry is not None:
            _add_zoo_run(groups, run, config, student_dev)
        else:
            _add_setup_run(groups, run, config, student_dev, seeds_of, placed)
    result = list(groups.values())
    _name_groups(result)
    return result


def _seeds_by_configuration(resolved: list[tuple[Run, dict]]) -> dict[tuple[str, str, str], set[int]]:
    """(setup, configuration, directory) -> the seeds run there."""
    seeds_of: dict[tuple[str, str, str], set[int]] = {}
    for run, config in resolved:
        where = (
            _key({k: config.get(k) for k in SETUP_KEYS}),
            _identity(_method_values(config)),
            str(run.source or run.path),
        )
        seeds_of.setdefault(where, set()).add(run.seed)
    return seeds_of


def _add_zoo_run(groups: dict[str, Group], run: Run, config: dict, student_dev: dict) -> None:
    """A zoo run joins its paper table's group (one teacher and student) as the paper's row."""
    if run.entry.measure != "student":
        return  # teacher rows: the teacher's score, not a method's
    setup = {k: config.get(k) for k in (*SETUP_KEYS, *FACTOR_KEYS)}
    zoo_key = (run.entry.paper, run.entry.table, run.entry.task)
    title = f"{run.entry.paper} Table {run.entry.table}, {run.entry.task}"
    policy = str(config.get("best_checkpoint", "best"))
    group = groups.setdefault(
        _key(["zoo", zoo_key, setup]),
        Group(title, run.metrics.get("main_metric", "accuracy"), policy, setup, zoo=zoo_key, config=config),
    )
    method = group.methods.setdefault(run.entry.row, Method(run.entry.row, {"row": run.entry.row}, entry=run.entry))
    method.add(run.seed, student_dev, run.predictions(), run.label)
    method.runs.append(run)


def _add_setup_run(
    groups: dict[str, Group],
    run: Run,
    config: dict,
    student_dev: dict,
    seeds_of: dict[tuple[str, str, str], set[int]],
    placed: dict[tuple, str],
) -> None:
    """Any other run joins its setup's group as the method its configuration names, and its
    ``--baseline`` student as one more."""
    setup = {k: config.get(k) for k in SETUP_KEYS}
    values = _method_values(config)
    identity = _identity(values)
    group = groups.setdefault(
        _key(["setup", setup]),
        Group(
            f"{run.task} ({run.data})" if run.data != run.task else run.task,
            run.metrics.get("main_metric", "accuracy"),
            str(config.get("best_checkpoint", "best")),
            setup,
            config=config,
        ),
    )
    default_recipe = run.metrics.get("student", {}).get("default_recipe", DEFAULT_RECIPE)
    source = str(run.source or run.path)
    seeds = seeds_of[(_key(setup), identity, source)]
    key = _method_key(group, identity, source, seeds, placed)
    method = group.methods.setdefault(key, Method(_method_label(values, default_recipe), values, origin=source))
    method.add(run.seed, student_dev, run.predictions(), run.label)
    method.runs.append(run)
    baseline = run.metrics.get("baseline")
    if baseline and baseline.get("dev"):
        _add_baseline(group, run, baseline, values, default_recipe, seeds, placed)


def _add_baseline(
    group: Group,
    run: Run,
    baseline: dict,
    values: dict,
    default_recipe: str,
    seeds: set[int],
    placed: dict[tuple, str],
) -> None:
    """The run's ``--baseline`` student as a reference method: the run's values with the
    baseline's projector and recipe, and the settings its stage resolved."""
    source = str(run.source or run.path)
    stages = run.metrics.get("stages", {})
    prefix = f"baseline-{baseline['projector']}"  # older runs named their one stage so
    stage = next((v for k, v in stages.items() if k == prefix or k.startswith(prefix + "-")), {})
    weights = stage.get("weights") or {}
    base_values = {
        **values,
        "projector": baseline["projector"],
        "projector_options": {},
        "recipe": baseline.get("recipe", default_recipe),
        "recipe_options": {},
        "lr": stage.get("lr", values.get("lr")),
        "epochs": stage.get("epochs", values.get("epochs")),
        **{key: weights.get(weight) for key, weight in RESOLVED_FROM_WEIGHTS.items()},
    }
    key = _method_key(group, _identity(base_values), source, seeds, placed)
    existing = group.methods.get(key)
    if existing is None:
        existing = group.methods[key] = Method(
            _method_label(base_values, default_recipe), base_values, reference=True, origin=source
        )
    if all(run.seed not in by_seed for by_seed in existing.results.values()):
        existing.add(run.seed, baseline["dev"], run.predictions(BASELINE_PREDICTIONS_FILE), f"{run.label} (baseline)")


def _name_groups(groups: list[Group]) -> None:
    """Titles and method labels that tell the groups, and each group's methods, apart."""
    for group in groups:
        if group.zoo is None:
            name_factors(group)
    titles = _distinguish(
        {str(i): g.title for i, g in enumerate(groups)}, {str(i): g.setup for i, g in enumerate(groups)}
    )
    for i, group in enumerate(groups):
        group.title = titles[str(i)]
        labels = _distinguish(
            {k: m.label for k, m in group.methods.items()},
            {k: m.values for k, m in group.methods.items()},
            {k: m.origin for k, m in group.methods.items()},
        )
        for key, method in group.methods.items():
            method.label = labels[key]


def method_pairs(group: Group) -> list[tuple[Method, Method]]:
    """(A, B) pairs to compare as A − B. Zoo: A is the row the paper scores higher. Otherwise B is
    the reference: a method that reads no teacher (the run's --baseline, e.g. nkd) if present, else
    the one listed first; with many methods, A is the best."""
    methods = list(group.methods.values())
    split = next(iter(methods[0].results), "dev") if methods else "dev"
    if group.zoo is None and len(methods) > ALL_PAIRS_UP_TO:
        best = max(methods, key=lambda m: _or(m.mean(split, group.main_metric), -math.inf))
        return [(best, m) for m in methods if m is not best]
    pairs = []
    for i, earlier in enumerate(methods):
        for later in methods[i + 1 :]:
            if group.zoo is not None:
                higher = earlier.entry.main_score()[2] >= later.entry.main_score()[2]
                pairs.append((earlier, later) if higher else (later, earlier))
            elif later.reference and not earlier.reference:
                pairs.append((earlier, later))
            else:
                pairs.append((later, earlier))
    return pairs


def _or(value: Optional[float], default: float) -> float:
    return default if value is None else value


def _metric_function(
    group: Group, metric: str, notes: list[str], task_factory: Optional[TaskFactory]
) -> Optional[compare.WeightedMetric]:
    """The weighted form of ``metric``; for a metric kdplug does not know, the task's own
    ``compute_metrics`` (re-created from a run's configuration), resample by resample."""
    if metric in compare.WEIGHTED_METRICS:
        return compare.WEIGHTED_METRICS[metric]
    if task_factory is None:
        notes.append(f"{metric}: kdplug has no weighted form of it and no task to compute it; t-interval only")
        return None
    try:
        task = task_factory(group.config)
    except Exception as exc:  # noqa: BLE001 - a task that cannot be re-created here: no bootstrap
        notes.append(f"{metric}: the task could not be re-created here ({exc}); t-interval only")
        return None
    return compare.weighted_metric(lambda pred, ref: float(task.compute_metrics(list(pred), list(ref))[metric]))


@dataclass
class PairComparison:
    """One pair of methods on one dev metric; ``paper`` the paper's two scores (zoo groups)."""

    a: Method
    b: Method
    split: str
    metric: str
    result: compare.Comparison
    paper: Optional[tuple[float, float]] = None

    def record(self, group: Group) -> dict[str, Any]:
        record = {
            "group": group.title,
            "split": self.split,
            "best_checkpoint": group.best_checkpoint,
            **self.result.to_dict(),
        }
        if self.paper is not None:
            record["paper"] = {
                "a": self.paper[0],
                "b": self.paper[1],
                "ordering": compare.ordering(*self.paper, self.result),
            }
        return record


@dataclass
class GroupComparison:
    group: Group
    pairs: list[PairComparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def compare_group(
    group: Group, *, resamples: int = 2000, level: float = 0.95, task_factory: Optional[TaskFactory] = None
) -> GroupComparison:
    """Every pair of ``group``'s methods (:func:`method_pairs`) on every dev metric both have:
    per-seed differences, intervals, verdict, seeds needed; for zoo groups, the paper's scores."""
    out = GroupComparison(group)
    functions: dict[str, Optional[compare.WeightedMetric]] = {}
    for a, b in method_pairs(group):
        for split in a.results:
            if split not in b.results:
                continue
            metrics = [
                m
                for m in next(iter(a.results[split].values())).scores
                if any(m in r.scores for r in b.results[split].values())
            ]
            metrics.sort(key=lambda m: m != group.main_metric)
            for metric in metrics:
                if metric not in functions:
                    functions[metric] = _metric_function(group, metric, out.notes, task_factory) if resamples else None
                try:
                    result = compare.compare(
                        a.results[split],
                        b.results[split],
                        metric,
                        name_a=a.label,
                        name_b=b.label,
                        metric_fn=functions[metric],
                        level=level,
                        resamples=resamples if functions[metric] else 0,
                    )
                except ValueError:
                    out.notes.append(f"{a.label} and {b.label} share no seed on {split}; not compared")
                    continue
                paper = None
                if group.zoo is not None and (split, metric) == a.entry.main_score()[:2]:
                    paper = (a.entry.main_score()[2], b.entry.main_score()[2])
                out.pairs.append(PairComparison(a, b, split, metric, result, paper))
    for method in group.methods.values():
        out.notes += method.notes
    return out

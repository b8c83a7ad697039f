"""Grid sweeps: one run per point of a grid over configuration keys, and a results table.

A sweep directory holds ``sweep.yaml`` (the base configuration and the grid), one run directory
per point under ``points/`` and ``results.md`` / ``results.json``. Points run one after another
in this process (``kdplug.engine.pipeline.run``) with the same cache, so the fine-tuned teacher
and its outputs are computed once; ``--shard i/n`` runs every n-th point, so n workers can share
one sweep directory; ``launchers.py`` sends points to submitit jobs (SLURM). A point whose run
completed (status ``completed`` and ``metrics.json``) is not run again; one that left checkpoints
resumes from them; any other (failed, never started) runs afresh: an interrupted sweep resumes
where it stopped.

Points that differ only by ``seed`` form one group, reported as mean ± std (sample standard
deviation); the best group by mean dev score of the task's main metric is marked. A seed axis
varies the students only: the teacher is fine-tuned with the base seed (``teacher_seed``) and
shared, as with ``kdplug run --seeds``.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .config import RunConfig, apply, dump_yaml, parse_value, parse_yaml, set_values
from .errors import ConfigError, KdplugError, UsageError
from .interrupt import RunInterrupted
from .layout import CHECKPOINT_DIR, CONFIG_FILE, METRICS_FILE, POINTS_DIR, SWEEP_FILE
from .storage import check_own_directory, file_lock, write_atomic

RESULTS_MD, RESULTS_JSON = "results.md", "results.json"
#: held while sweep.yaml or the results are written: the shards of one sweep write them in turn
SWEEP_LOCK = "kdplug_sweep.lock"


def split_values(text: str) -> list[str]:
    """``1e-5,2e-5`` -> two values; commas inside brackets stay (``[1,5,9],[2,6,10]``)."""
    values, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    values.append(current)
    return [v.strip() for v in values if v.strip()]


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``--grid KEY=V1,V2`` options -> {key: [values]}, each value read as YAML."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise ConfigError(f"--grid expects KEY=V1,V2,... (e.g. --grid lr=1e-5,2e-5), got {item!r}")
        grid[key.strip()] = [parse_value(v) for v in split_values(text)]
    return grid


def load_grid_file(path: str | Path) -> tuple[dict[str, Any], dict[str, list[Any]], Optional[str]]:
    """A sweep file: ``{zoo: NAME?, config: {KEY: VALUE}?, grid: {KEY: [VALUES]}}``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist")
    data = parse_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
    unknown = set(data) - {"zoo", "config", "grid"}
    if not isinstance(data, dict) or unknown:
        raise ConfigError(f"{path}: a sweep file has the keys zoo, config and grid; unexpected: {sorted(unknown)}")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"{path}: grid must map each key to a non-empty list of values")
    return dict(data.get("config") or {}), dict(grid), data.get("zoo")


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_id(point: dict[str, Any]) -> str:
    """A directory name that reads as the point: ``lr=2e-05,seed=1``."""

    def show(value: Any) -> str:
        text = json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else str(value)
        return "".join(c if c.isalnum() or c in "-_.=+" else "_" for c in text)

    return ",".join(f"{key.replace('_options.', '.')}={show(value)}" for key, value in point.items()) or "base"


def parse_shard(text: Optional[str]) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4): the second of four workers (1-based)."""
    if not text:
        return 1, 1
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard expects I/N (e.g. --shard 1/4), got {text!r}") from None
    if not 1 <= index <= count:
        raise ConfigError(f"--shard {text}: I must lie between 1 and N")
    return index, count


@dataclass
class Sweep:
    directory: Path
    base: dict[str, Any]  # RunConfig values every point starts from
    grid: dict[str, list[Any]]
    zoo: Optional[str] = None
    points: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.points = grid_points(self.grid)
        ids = [point_id(p) for p in self.points]
        if len(set(ids)) != len(ids):
            raise ConfigError("the grid has repeated points; remove duplicate values")

    def config(self, point: dict[str, Any]) -> RunConfig:
        config = RunConfig()
        apply(config, self.base, source="sweep base")
        apply(config, point, source=f"grid point {point_id(point)}")
        if "seed" in self.grid and config.teacher_seed is None:
            # one fine-tuned teacher for every seed: the seeds vary the students only (kdplug run --seeds)
            config.teacher_seed = int(self.base.get("seed", RunConfig.seed))
        if self.zoo:
            config.zoo = self.zoo
        config.output = str(self.directory / POINTS_DIR / point_id(point))
        return config.validate()

    def write_spec(self) -> None:
        """sweep.yaml: what every shard must agree on; a different grid in the same directory is an error."""
        spec = yaml.safe_dump({"zoo": self.zoo, "base": self.base, "grid": self.grid}, sort_keys=False)
        path = self.directory / SWEEP_FILE
        check_own_directory(self.directory, SWEEP_FILE, writes=f"{SWEEP_FILE}, {POINTS_DIR}/ and {RESULTS_MD}")
        self.directory.mkdir(parents=True, exist_ok=True)
        with file_lock(self.directory / SWEEP_LOCK):
            if path.is_file() and parse_yaml(path.read_text(), str(path)) != parse_yaml(spec, "the sweep"):
                raise UsageError(
                    f"{self.directory} holds another sweep ({path} differs); choose another --output or delete it"
                )
            write_atomic(path, spec)

    def checked_configs(self, registry) -> list[tuple[dict[str, Any], RunConfig]]:
        """Every point's configuration, each name and value checked, before the first run starts."""
        from .engine.preflight import resolve_components

        configs = [(p, self.config(p)) for p in self.points]
        for _, config in configs:
            resolve_components(config, registry)
        return configs

    def pending(self) -> list[str]:
        """The ids of the points with no completed run yet."""
        from .engine.rundir import is_completed

        return [point_id(p) for p in self.points if not is_completed(self.directory / POINTS_DIR / point_id(p))]

    def warm_teachers(self, registry, point_ids: list[str], echo: Callable[[str], None] = print) -> int:
        """Fine-tune and cache, once each, the teachers the given points need; returns how many.

        Points that differ only in the student or the method share a teacher: one warm-up serves
        them all, and their jobs then only read the store.
        """
        from .engine.inputs import warm_teacher
        from .engine.preflight import reads_teacher, resolve_components

        setups: dict[str, RunConfig] = {}
        for point in self.points:
            if point_id(point) in point_ids:
                config = self.config(point)
                resolve_components(config, registry)
                setup = {k: getattr(config, k) for k in TEACHER_KEYS}
                setup["teacher_seed"] = config.seed if config.teacher_seed is None else config.teacher_seed
                key = json.dumps(setup, sort_keys=True, default=str)
                # one warm-up per teacher, by a point that also needs the teacher's outputs if any does
                if key not in setups or (reads_teacher(config, registry) and not reads_teacher(setups[key], registry)):
                    setups[key] = config
        for number, config in enumerate(setups.values(), 1):
            names = " + ".join(member.name for member in config.members())
            echo(f"teacher {number}/{len(setups)}: {names} on {config.task}, before the jobs start")
            warm_teacher(config, registry, echo=lambda text: echo(f"    {text}"))
        return len(setups)

    def run(
        self,
        registry,
        *,
        shard: tuple[int, int] = (1, 1),
        only: Optional[list[str]] = None,
        echo: Callable[[str], None] = print,
    ) -> Results:
        """Run this worker's points (``shard``, or the point ids in ``only``), skipping completed ones."""
        configs = self.checked_configs(registry)
        self.write_spec()
        index, count = shard
        mine = [c for c in configs if point_id(c[0]) in only] if only is not None else configs[index - 1 :: count]
        echo(
            f"sweep {self.directory}: {len(self.points)} points, this worker runs {len(mine)}"
            + (f" (shard {index}/{count})" if count > 1 else "")
        )
        failures = run_each([(point_id(point), config) for point, config in mine], registry, keep_going=True, echo=echo)
        results = collect(self.directory)
        results.failures.update(failures)
        results.write(self.directory)
        return results


def run_each(
    items: list[tuple[str, RunConfig]],
    registry,
    *,
    overwrite: bool = False,
    keep_going: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, str]:
    """Run each ``(label, config)`` into its ``config.output``: a completed run of the same
    configuration is skipped, an interrupted one continues from its checkpoints, anything else of
    the same configuration starts afresh (``--overwrite``: every one does). A stop request or a
    usage error ends the loop; with ``keep_going``, another failure is recorded and the next run
    starts. Returns the failures, by label. Sweeps and ``kdplug run --seeds`` both run this way."""
    from .engine.pipeline import run
    from .engine.rundir import is_completed

    failures: dict[str, str] = {}
    for number, (label, config) in enumerate(items, 1):
        output = Path(config.output)
        same = same_config(output, config)
        if same and is_completed(output) and not overwrite:
            echo(f"[{number}/{len(items)}] {label}: done already, skipped ({output})")
            continue
        resume = same and (output / CHECKPOINT_DIR).is_dir() and not overwrite
        echo(f"[{number}/{len(items)}] {label}" + (": resuming" if resume else ""))
        try:  # an unfinished run of this very configuration without checkpoints is ours to start again
            run(config, registry, overwrite=overwrite or same, resume=resume, echo=lambda text: echo(f"    {text}"))
        except (UsageError, RunInterrupted):
            raise  # a stop request ends the loop; the same command again continues it
        except KdplugError as exc:
            if not keep_going:
                raise
            failures[label] = str(exc)  # one failed run does not lose the others
            echo(f"    failed: {exc}")
    return failures


def same_config(run_dir: Path, config: RunConfig) -> bool:
    """Whether ``run_dir`` holds a run of exactly ``config`` (its config.yaml; a key an earlier version
    did not write is the same as one written as null)."""
    path = run_dir / CONFIG_FILE
    return path.is_file() and set_values(parse_yaml(path.read_text(encoding="utf-8"), str(path))) == set_values(
        parse_yaml(dump_yaml(config), "the configuration")
    )


#: the configuration keys that decide which fine-tuned teacher (and teacher outputs) a run uses
TEACHER_KEYS = (
    "task",
    "task_options",
    "data_dir",
    "teacher",
    "teacher_options",
    "teachers",  # an ensemble: one warm-up prepares each of its members
    "layer_teacher",
    "max_length",
    "teacher_epochs",
    "teacher_lr",
    "teacher_batch_size",
    "teacher_seed",
    "patience",  # early stopping ends the teacher's fine-tuning too
    "min_epochs",
    "precision",
    "weight_decay",
    "warmup_ratio",
    "cache_dir",
    "transfer",
    "augment",
    "augment_factor",
    "augment_options",
)  # + the transfer set it labels


# -- results -----------------------------------------------------------------------------------


@dataclass
class Point:
    id: str
    values: dict[str, Any]
    run_dir: Path
    score: Optional[float]  # the main metric on the first dev split, as a fraction
    metrics: dict[str, Any]


@dataclass
class Results:
    keys: list[str]
    main_metric: str
    split: str
    points: list[Point]
    failures: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)

    def groups(self) -> list[dict[str, Any]]:
        """Points that differ only by seed, with mean and std of their scores; best first marked."""
        grouped: dict[str, dict[str, Any]] = {}
        for point in self.points:
            values = {k: v for k, v in point.values.items() if k != "seed"}
            group = grouped.setdefault(point_id(values), {"values": values, "scores": [], "seeds": [], "runs": []})
            if point.score is not None:
                group["scores"].append(point.score)
                group["seeds"].append(point.values.get("seed", point.metrics.get("config", {}).get("seed")))
                group["runs"].append(str(point.run_dir))
        rows = []
        for group in grouped.values():
            scores = group["scores"]
            group["mean"] = statistics.fmean(scores) if scores else None
            group["std"] = statistics.stdev(scores) if len(scores) > 1 else None
            rows.append(group)
        best = max((g for g in rows if g["mean"] is not None), key=lambda g: g["mean"], default=None)
        for group in rows:
            group["best"] = group is best
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "main_metric": self.main_metric,
            "split": self.split,
            "keys": self.keys,
            "groups": self.groups(),
            "points": [
                {"id": p.id, "values": p.values, "run_dir": str(p.run_dir), "score": p.score} for p in self.points
            ],
            "failures": self.failures,
            "pending": self.pending,
        }

    def markdown(self) -> str:
        keys = [k for k in self.keys if k != "seed"]
        header = keys + ["seeds", f"{self.split} {self.main_metric}", "best"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for group in self.groups():
            cells = [format_value(group["values"].get(k)) for k in keys]
            cells.append(", ".join(str(s) for s in group["seeds"]) or "–")
            cells.append(format_score(group["mean"], group["std"]))
            cells.append("**best**" if group["best"] else "")
            lines.append("| " + " | ".join(cells) + " |")
        text = [
            "# Sweep results\n",
            f"Dev score: {self.main_metric} on {self.split} (×100); mean ± std over "
            f"seeds where a point ran with several. {len(self.points)} points finished.\n",
            *lines,
        ]
        if self.pending:
            text.append(f"\nNot run yet (another shard, or interrupted): {', '.join(self.pending)}")
        if self.failures:
            text.append("\nFailed points:\n" + "\n".join(f"- {k}: {v}" for k, v in self.failures.items()))
        return "\n".join(text) + "\n"

    def write(self, directory: Path) -> None:
        with file_lock(directory / SWEEP_LOCK):
            write_atomic(directory / RESULTS_JSON, json.dumps(self.to_json(), indent=2, default=str))
            write_atomic(directory / RESULTS_MD, self.markdown())


def format_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def format_score(mean: Optional[float], std: Optional[float]) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean * 100:.2f} ± {std * 100:.2f}" if std is not None else f"{mean * 100:.2f}"


def main_score(metrics: dict[str, Any]) -> tuple[Optional[float], str, str]:
    """(score, split, metric) of a run's student: the main metric on its first dev split."""
    dev = metrics.get("student", {}).get("dev", {})
    metric = metrics.get("main_metric", "accuracy")
    if not dev:
        return None, "dev", metric
    split = next(iter(dev))
    return dev[split].get(metric), split, metric


def collect(directory: Path) -> Results:
    """The results of every finished point of the sweep in ``directory``."""
    spec_path = directory / SWEEP_FILE
    if not spec_path.is_file():
        raise UsageError(f"{directory} is not a sweep directory (no {SWEEP_FILE})")
    spec = parse_yaml(spec_path.read_text(encoding="utf-8"), str(spec_path))
    points, pending = [], []
    metric, split = "accuracy", "dev"
    for values in grid_points(spec["grid"]):
        run_dir = directory / POINTS_DIR / point_id(values)
        metrics_file = run_dir / METRICS_FILE
        if not metrics_file.is_file():
            pending.append(point_id(values))
            continue
        metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
        score, split, metric = main_score(metrics)
        points.append(Point(point_id(values), values, run_dir, score, metrics))
    return Results(list(spec["grid"]), metric, split, points, pending=pending)

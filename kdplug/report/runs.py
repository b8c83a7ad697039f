"""Collecting runs for a report: run directories (and the groups ``--seeds`` and sweeps write),
read back with the values kdplug chose filled in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..config import parse_yaml
from ..errors import UsageError
from ..layout import CONFIG_FILE, METRICS_FILE, POINTS_DIR, PREDICTIONS_FILE, SEED_DIR_PREFIX, SEEDS_FILE, SWEEP_FILE
from ..zoo import Zoo, ZooEntry


@dataclass
class Run:
    path: Path
    label: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    entry: Optional[ZooEntry] = None
    #: the directory named on the command line that it came from (a --seeds output, a sweep, or itself)
    source: Optional[Path] = None

    @property
    def task(self) -> str:
        return self.metrics.get("task") or self.config.get("task", "?")

    @property
    def data(self) -> str:
        """The data it read: its folder's name and the first 8 digits of its fingerprint (metrics.json's
        ``data``); a run of an older kdplug, which recorded none, by its data folder's name alone."""
        record = self.metrics.get("data") or {}
        name = record.get("name") or (Path(str(self.config["data_dir"])).name if self.config.get("data_dir") else "")
        digits = str(record.get("fingerprint") or "")[:8]
        return " ".join(filter(None, [name or self.task, digits and f"#{digits}"]))

    @property
    def data_fingerprint(self) -> Optional[str]:
        return (self.metrics.get("data") or {}).get("fingerprint")

    @property
    def stopped(self) -> Optional[str]:
        """Why the run stopped before it finished (metrics.json's ``status`` and ``error``), or None."""
        status = self.metrics.get("status", "completed")  # runs of older kdplug versions wrote no status
        if status == "completed":
            return None
        return f"{status}: {self.metrics.get('error') or 'no reason recorded'}"

    def score(self, split: str, metric: str, measure: str = "student") -> Optional[float]:
        """A dev score of the student (or the teacher), as a fraction."""
        if measure == "teacher":
            dev = self.metrics.get("teacher", {}).get("dev") or self.metrics.get("teacher", {}).get(
                "finetuned", {}
            ).get("dev", {})
        else:
            dev = self.metrics.get("student", {}).get("dev", {})
        value = dev.get(split, {}).get(metric)
        return float(value) if value is not None else None

    @property
    def seed(self) -> Optional[int]:
        seed = self.config.get("seed", self.metrics.get("config", {}).get("seed"))
        return int(seed) if seed is not None else None

    def predictions(self, name: str = PREDICTIONS_FILE) -> dict[str, dict[str, list]]:
        """The final student's (or, with ``BASELINE_PREDICTIONS_FILE``, the ``--baseline`` student's)
        dev predictions and labels per split ({} for runs without the file)."""
        path = self.path / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def expand_run_dirs(paths: list[str | Path]) -> list[tuple[Path, Path]]:
    """Run directories, each with the path it was found under; a ``kdplug run --seeds`` output
    (``seed-*/``) or a sweep (``points/*/``) stands for its finished runs."""
    expanded = []
    for raw in paths:
        path = Path(raw)
        is_group = (path / SEEDS_FILE).is_file() or (path / SWEEP_FILE).is_file()
        if is_group and not (path / METRICS_FILE).is_file():
            inner = sorted(path.glob(f"{SEED_DIR_PREFIX}*/{METRICS_FILE}")) + sorted(
                path.glob(f"{POINTS_DIR}/*/{METRICS_FILE}")
            )
            expanded += [(m.parent, path) for m in inner] or [(path, path)]
        else:
            expanded.append((path, path))
    return expanded


def load_runs(paths: list[str | Path], zoo: Optional[Zoo] = None) -> list[Run]:
    runs = []
    for path, source in expand_run_dirs(paths):
        metrics_file = path / METRICS_FILE
        if not metrics_file.is_file():
            raise UsageError(
                f"{path} is not a finished run directory (no metrics.json); pass directories "
                f"written by 'kdplug run', 'kdplug zoo run' or 'kdplug sweep' (points/*)"
            )
        metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
        config_file = path / CONFIG_FILE
        config = parse_yaml(config_file.read_text(encoding="utf-8"), str(config_file)) if config_file.is_file() else {}
        config = config or metrics.get("config", {})
        runs.append(Run(path, path.name, config, metrics, source=source.resolve()))
    seen: dict[str, int] = {}
    for run in runs:  # unique, short labels
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.path.parent.name}/{run.path.name}"
    for run in runs:
        name = run.config.get("zoo")
        if name:
            try:
                run.entry = (zoo or Zoo()).get(name)
            except UsageError:
                run.entry = None  # a zoo entry renamed or a zoo not installed: the run is still reported
    return runs


#: method keys a run may leave to kdplug (None), read back from what the run actually used
RESOLVED_FROM_STAGE = ("lr", "epochs")
RESOLVED_FROM_WEIGHTS = {"eta": "eta", "lam": "lam", "temperature": "temperature", "ce_weight": "ce"}


def resolved_config(run: Run) -> dict[str, Any]:
    """The run's configuration with the values kdplug chose filled in (``lr=None`` -> the lr its
    student trained at), so that methods are told apart, and labelled, by what actually ran."""
    config = {**run.metrics.get("config", {}), **run.config}
    config["data_fingerprint"] = run.data_fingerprint  # data edited in place is another setup
    if not config.get("teachers"):  # one teacher: as recorded before ensembles existed
        config.pop("teachers", None)
        if config.get("layer_teacher") is None:
            config.pop("layer_teacher", None)
    student = run.metrics.get("student", {})
    if config.get("recipe") is None and student.get("recipe"):
        config["recipe"] = student["recipe"]
    stages = [
        stage
        for name, stage in run.metrics.get("stages", {}).items()
        if name != "teacher_heads" and not name.startswith("baseline-") and "lr" in stage
    ]
    if stages:
        first = stages[0]
        for key in RESOLVED_FROM_STAGE:
            if config.get(key) is None and first.get(key) is not None:
                config[key] = first[key]
        for key, weight in RESOLVED_FROM_WEIGHTS.items():
            if config.get(key) is None and (first.get("weights") or {}).get(weight) is not None:
                config[key] = first["weights"][weight]
    return config

"""The run directory: resolved config, metrics, the student's weights and the log.

A run directory is marked as kdplug's by ``kdplug_run.json`` (its status: running, completed,
failed or interrupted). kdplug writes into an existing directory only when it is empty or such a
run directory, and ``--overwrite`` removes only the entries a run writes (:data:`RUN_ENTRIES`):
a user's own files, a data directory placed there by mistake, are never deleted. Files are
written atomically (temporary file, then rename), so an interrupted run never leaves a
half-written metrics.json or config behind.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from ..config import RunConfig, dump_yaml
from ..errors import UsageError
from ..layout import (  # noqa: F401
    BASELINE_PREDICTIONS_FILE,
    CONFIG_FILE,
    LOG_FILE,
    MARKER_FILE,
    METRICS_FILE,
    PREDICTIONS_FILE,
    RUN_ENTRIES,
    STUDENT_DIR,
)
from ..storage import write_atomic
from ..version import __version__

RUNNING, COMPLETED, FAILED, INTERRUPTED = "running", "completed", "failed", "interrupted"


def run_status(path: Path) -> Optional[str]:
    """The status of the run in ``path``; None when ``path`` holds no kdplug run."""
    marker = path / MARKER_FILE
    if marker.is_file():
        try:
            return json.loads(marker.read_text(encoding="utf-8")).get("status", RUNNING)
        except (OSError, ValueError):
            return RUNNING
    if (path / CONFIG_FILE).is_file() or (path / METRICS_FILE).is_file():  # written before the marker existed
        return COMPLETED if (path / METRICS_FILE).is_file() else RUNNING
    return None


def is_completed(path: Path) -> bool:
    return run_status(path) == COMPLETED and (path / METRICS_FILE).is_file()


def remove_run_entries(path: Path) -> None:
    """Delete what a run wrote in ``path`` (and nothing else)."""
    for name in RUN_ENTRIES:
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


def default_output(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = lambda text: "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(text).name)  # noqa: E731
    return Path("runs") / f"{stamp}-{safe(config.task)}-{safe(config.student)}-{safe(config.projector)}"


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path, *, overwrite: bool = False) -> RunDirectory:
        """A run directory at ``path``: new, empty, or replacing a run (never anything else)."""
        if (
            cls.check_new(path, overwrite=overwrite) is not None
        ):  # a failed run, or --overwrite: only the run's own entries go
            remove_run_entries(path)
        path.mkdir(parents=True, exist_ok=True)
        run_dir = cls(path)
        run_dir.set_status(RUNNING)
        return run_dir

    @staticmethod
    def check_new(path: Path, *, overwrite: bool = False) -> Optional[str]:
        """Raise a UsageError unless a new run may be written to ``path``; the status of the run it
        would replace (None: a new or empty directory)."""
        if path.exists() and not path.is_dir():
            raise UsageError(f"output {path} exists and is not a directory; choose another --output")
        if path.is_dir():
            status = run_status(path)
            others = sorted(entry.name for entry in path.iterdir() if entry.name not in RUN_ENTRIES)
            if status is None and others:
                raise UsageError(
                    f"output directory {path} holds files kdplug did not write (e.g. {others[0]}); kdplug writes "
                    f"only into a new or empty directory, or one holding an earlier run: choose another --output"
                )
            if status in (RUNNING, COMPLETED, INTERRUPTED) and not overwrite:
                hint = f"continue it with 'kdplug run --resume {path}', " if status != COMPLETED else ""
                raise UsageError(
                    f"output directory {path} already holds a run ({status}); {hint}choose another "
                    f"--output, or pass --overwrite to replace it"
                )
            return status
        return None

    def set_status(self, status: str, **details: Any) -> None:
        record = {"kdplug": __version__, "status": status, "updated": time.strftime("%Y-%m-%d %H:%M:%S"), **details}
        write_atomic(self.path / MARKER_FILE, json.dumps(record, indent=1))

    def write_config(self, config: RunConfig) -> None:
        write_atomic(self.path / CONFIG_FILE, dump_yaml(config))

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        write_atomic(self.path / METRICS_FILE, json.dumps(metrics, indent=2, default=_jsonable))

    def write_predictions(self, predictions: dict[str, dict[str, list]], name: str = PREDICTIONS_FILE) -> None:
        """The final student's dev predictions and the gold labels, per split, in example order
        (what paired bootstrap comparisons between runs resample)."""
        write_atomic(self.path / name, json.dumps(predictions))

    def attach_log(self) -> logging.Handler:
        handler = logging.FileHandler(self.path / LOG_FILE, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("kdplug").addHandler(handler)
        return handler


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

"""The run directory: resolved config, metrics, the student's weights and the log.

A run directory is marked as kdplug's by ``kdplug_run.json`` (its status: running, completed,
failed or interrupted). kdplug writes into an existing directory only when it is empty or such a
run directory, and ``--overwrite`` removes only the entries a run writes (:data:`RUN_ENTRIES`):
a user's own files, a data directory placed there by mistake, are never deleted. Files are
written atomically (temporary file, then rename), so an interrupted run never leaves a
half-written metrics.json or config behind.

One process writes a run directory at a time: the run holds :data:`LOCK_FILE` for its whole life
(the main process under DDP), and a second ``kdplug run --overwrite`` or ``--resume`` of a
directory a live run holds is refused, naming that process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from ..config import RunConfig, dump_yaml
from ..errors import UsageError
from ..layout import (
    CONFIG_FILE,
    LOCK_FILE,
    LOG_FILE,
    MARKER_FILE,
    METRICS_FILE,
    PREDICTIONS_FILE,
    RUN_ENTRIES,
    RUN_FOLDERS,
)
from ..storage import WriterLock, check_directory_path, open_own_file, write_atomic
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
    """Delete what a run wrote in ``path`` (and nothing else): a folder where a run writes a file, or a
    file where it writes a folder, is not the run's, and stops the removal before anything goes."""
    for name in RUN_ENTRIES:
        entry = path / name
        if entry.is_symlink() or not entry.exists() or entry.is_dir() == (name in RUN_FOLDERS):
            continue
        what = "a folder" if entry.is_dir() else "a file"
        raise UsageError(
            f"{entry} is {what}, where a run writes {'a folder' if name in RUN_FOLDERS else 'a file'}: kdplug did not "
            f"write it and will not delete it. Move it away, or choose another --output"
        )
    for name in RUN_ENTRIES:
        if name == LOCK_FILE:  # held by this process now: removing it would let another take a second one
            continue
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
        self._lock: Optional[WriterLock] = None

    @classmethod
    def create(cls, path: Path, *, overwrite: bool = False) -> RunDirectory:
        """A run directory at ``path``: new, empty, or replacing a run (never anything else), locked
        for this process until :meth:`release`."""
        cls.check_new(path, overwrite=overwrite)  # before the lock file is written into a directory
        path.mkdir(parents=True, exist_ok=True)
        run_dir = cls(path)
        run_dir._take_lock()
        try:
            # again under the lock: a run that finished a moment ago is seen as it is now
            if cls._replaced_status(path, overwrite=overwrite) is not None:
                remove_run_entries(path)  # a failed run, or --overwrite: only the run's own entries go
            run_dir.set_status(RUNNING)
        except BaseException:
            run_dir.release()
            raise
        return run_dir

    @classmethod
    def reopen(cls, path: Path) -> RunDirectory:
        """The run directory at ``path``, to continue its run (``--resume``), locked for this process."""
        run_dir = cls(path)
        run_dir._take_lock()
        try:
            check_no_links(path)  # what the run goes on writing there (its log, its files) is its own
            run_dir.set_status(RUNNING)
        except BaseException:
            run_dir.release()
            raise
        return run_dir

    def _take_lock(self) -> None:
        self._lock = WriterLock(self.path / LOCK_FILE).acquire(
            f"run directory {self.path}", "wait for it to finish, or choose another --output"
        )

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @staticmethod
    def check_not_held(path: Path) -> None:
        """Raise a UsageError when a live kdplug process is writing the run in ``path``."""
        holder = WriterLock.holder(path / LOCK_FILE)
        if holder is not None:
            raise UsageError(
                f"run directory {path} is being written by {holder}; wait for it to finish, or choose another --output"
            )

    @classmethod
    def check_new(cls, path: Path, *, overwrite: bool = False) -> Optional[str]:
        """Raise a UsageError unless a new run may be written to ``path``; the status of the run it
        would replace (None: a new or empty directory)."""
        check_directory_path(path, "output")
        if path.is_dir():
            cls.check_not_held(path)
            check_no_links(path)  # a new run writes there too: a `checkpoints` link would write (and delete) elsewhere
        return cls._replaced_status(path, overwrite=overwrite)

    @staticmethod
    def _replaced_status(path: Path, *, overwrite: bool) -> Optional[str]:
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
        handler = _OwnFileHandler(self.path / LOG_FILE, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("kdplug").addHandler(handler)
        return handler


def check_no_links(path: Path) -> None:
    """A :class:`UsageError` where one of the names a run writes in ``path`` is a symbolic link: kdplug
    makes none there, and writing through one would change a file outside the run directory."""
    for name in RUN_ENTRIES:
        if (path / name).is_symlink():
            raise UsageError(
                f"{path / name} is a symbolic link (to {os.readlink(path / name)}), which kdplug did not make; it "
                f"writes through no link: remove it, or start a new run in another --output"
            )


class _OwnFileHandler(logging.FileHandler):
    """The run's log, appended to, never through a symbolic link."""

    def _open(self):
        return open_own_file(Path(self.baseFilename), "run log")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

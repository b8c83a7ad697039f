"""Training checkpoints: everything needed to continue a stage exactly where it stopped.

A checkpoint holds the trainable module (student, projector, loss parameters), the best
weights so far, optimizer and scheduler, every RNG state, the position in the epoch and the
history. It is written into a temporary directory and renamed over the previous one, so a
kill at any moment leaves the last complete checkpoint intact. Tensors go to safetensors;
optimizer and scheduler states, which hold plain tensors and numbers, are read back with
``torch.load(weights_only=True)``: nothing is unpickled.

Every file is recorded with its checksum, and with the configuration that trained it; a stage is
resumed only from a checkpoint whose files all pass and whose configuration is the run's, else
the run stops (exit 2) saying which file or which setting, never training a different student.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..config import LOCAL_KEYS, PLACEMENT_OPTIONS, renamed_prompted_teacher
from ..errors import KdplugError, UsageError
from ..fingerprint import of_file
from ..storage import (
    complete_copy,
    raise_as_storage_error,
    replace_directory,
    staging_directory,
    verify,
    write_checksums,
)
from . import faults

MODEL, BEST, OPTIMIZER, RNG, STATE, WRITTEN_BY = (
    "model.safetensors",
    "best.safetensors",
    "optimizer.pt",
    "rng.safetensors",
    "state.json",
    "written_by.json",
)


class CheckpointError(KdplugError):
    """A checkpoint could not be written (the previous one is intact) or read."""


class UnusableCheckpoint(UsageError):
    """A checkpoint that must not be resumed: a file missing or changed, or another configuration's."""


@dataclass
class Progress:
    """Where a stage is: ``epoch`` in progress (1-based) and the batches of it already done."""

    epoch: int = 1
    step: int = 0
    history: list[dict] = field(default_factory=list)
    best_score: Optional[float] = None
    best_epoch: int = 0
    best_dev: dict = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    count: int = 0
    complete: bool = False
    warned: list[str] = field(default_factory=list)  # codes of the health findings already reported
    warnings: list[str] = field(default_factory=list)
    stopped_early: Optional[int] = None  # the epoch after which early stopping ended the stage
    python_rng: Any = None
    numpy_rng: Any = None


def capture_rng() -> tuple[dict[str, torch.Tensor], Any, Any]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda{i}"] = state
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    return (
        tensors,
        [python_state[0], list(python_state[1]), python_state[2]],
        [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
    )


def restore_rng(tensors: dict[str, torch.Tensor], python_state: Any, numpy_state: Any) -> None:
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda"))]
        if states:
            torch.cuda.set_rng_state_all(states)
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))


def _tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (tied embeddings): store independent copies
    return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}


class Checkpointer:
    """Checkpoints of every stage of one run, under ``<run dir>/checkpoints/<stage>``."""

    def __init__(
        self,
        root: Path,
        *,
        every_steps: int = 0,
        enabled: bool = True,
        how_to_continue: Optional[str] = None,
        written_by: Optional[dict[str, Any]] = None,
    ) -> None:
        self.root = root
        self.every_steps = every_steps
        self.enabled = enabled
        #: what a stopped or failed run tells the user to do next (scratch checkpoints say otherwise)
        self.how_to_continue = how_to_continue or f"continue with 'kdplug run --resume {root.parent}'"
        #: the settings that decide what the stages train (see :func:`training_settings`); a
        #: checkpoint of other settings is never resumed
        self.written_by = None if written_by is None else json.loads(json.dumps(written_by, default=str))

    def directory(self, stage: str) -> Path:
        return self.root / stage.replace("/", "_")

    def save(
        self,
        stage: str,
        progress: Progress,
        model_state: dict,
        best_state: Optional[dict],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
    ) -> Path:
        target = self.directory(stage)
        staging = staging_directory(target.parent, target.name)
        try:
            faults.fire_at("checkpoint-write")
            save_file(_tensors(model_state), str(staging / MODEL))
            if best_state is not None:
                save_file(_tensors(best_state), str(staging / BEST))
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, staging / OPTIMIZER)
            rng, progress.python_rng, progress.numpy_rng = capture_rng()
            save_file(rng, str(staging / RNG))
            (staging / STATE).write_text(json.dumps(asdict(progress)))
            if self.written_by is not None:
                (staging / WRITTEN_BY).write_text(json.dumps(self.written_by, indent=1))
            write_checksums(staging)  # of every file: what load() verifies before anything is resumed
            replace_directory(staging, target, between=lambda: faults.fire_at("checkpoint-swap"))
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            kept = (
                f"the previous checkpoint {target} is intact"
                if self._complete(target) is not None
                else "no earlier checkpoint exists"
            )
            raise_as_storage_error(
                exc,
                f"the checkpoint of stage {stage!r}",
                kept,
                how_to_continue=f"free space (or raise the limit) and {self.how_to_continue}",
            )
            raise
        return target

    @staticmethod
    def _complete(target: Path) -> Optional[Path]:
        """The stage's checkpoint, or the previous one when a kill struck between the two renames
        that put a new one in place."""
        return complete_copy(target, lambda path: (path / STATE).is_file())

    def load(self, stage: str) -> Optional[tuple[Progress, dict, Optional[dict], dict, dict]]:
        """``(progress, model state, best state, optimizer+scheduler states, rng tensors)`` or None.

        Raises :class:`UnusableCheckpoint` when a file is missing or changed, or when another
        configuration wrote the checkpoint."""
        directory = self._complete(self.directory(stage)) if self.enabled else None
        if directory is None:
            return None
        problems = verify(directory)
        if problems:
            self._refuse(stage, directory, "; ".join(problems))
        self._check_written_by(stage, directory)
        try:
            progress = Progress(**json.loads((directory / STATE).read_text()))
            model_state = load_file(str(directory / MODEL))
            best_state = load_file(str(directory / BEST)) if (directory / BEST).is_file() else None
            optimizer = torch.load(directory / OPTIMIZER, weights_only=True)
            rng = load_file(str(directory / RNG))
        except Exception as exc:  # files that pass their checksums but not their reader: a kdplug of another version
            self._refuse(stage, directory, f"its files cannot be read ({unreadable_reason(exc, OPTIMIZER)})")
        return progress, model_state, best_state, optimizer, rng

    def check_resumable(self) -> None:
        """Every checkpoint already under the root was written by this configuration and data: a resumed
        run learns it before any work (the teacher's fine-tuning, its outputs), not on reaching the stage."""
        if self.written_by is None or not self.root.is_dir():
            return
        for record in sorted(self.root.rglob(WRITTEN_BY)):
            self._check_written_by(record.parent.name, record.parent)

    def _check_written_by(self, stage: str, directory: Path) -> None:
        if self.written_by is None:
            return
        try:
            recorded = json.loads((directory / WRITTEN_BY).read_text())
        except (OSError, ValueError):
            self._refuse(stage, directory, f"{WRITTEN_BY} (the configuration that trained it) is missing")
        recorded = renamed_prompted_teacher(recorded) or recorded  # written before prompted-lm had its name
        current = {key: value for key, value in self.written_by.items() if key != DATA or DATA in recorded}
        differences = settings_difference(recorded, current)  # (a checkpoint older than its data record: not it)
        if differences:
            data = (
                " The data were read again from config.yaml's data_dir, a path relative to the current directory "
                "where it is relative: resume from the directory the run started in, with the data it read"
                if recorded.get(DATA) != current.get(DATA)
                else ""
            )
            raise UnusableCheckpoint(
                f"the checkpoint of stage {stage!r} ({directory}) was written by another configuration: "
                f"{differences}. Resume with the configuration that wrote it (drop the --set that changes it), "
                f"or start the run again with --overwrite.{data}"
            )

    def _refuse(self, stage: str, directory: Path, problem: str) -> None:
        raise UnusableCheckpoint(
            f"the checkpoint of stage {stage!r} ({directory}) cannot be resumed: {problem}. Train that stage again: "
            f"remove {directory} and {self.how_to_continue} (the stages before it are kept); or start the run "
            f"again with --overwrite"
        )


def unreadable_reason(exc: BaseException, pickled: str) -> str:
    """Why a checkpoint file could not be read, in one line. torch's refusal to unpickle objects beyond
    tensors (``weights_only``) advises loading with ``weights_only=False``, which would run whatever code the
    file names: kdplug never does, and says so instead."""
    if type(exc).__name__ == "UnpicklingError":
        return (
            f"{pickled} holds Python objects besides tensors, which kdplug does not unpickle, since unpickling can "
            f"run code; kdplug writes none such, so the file was written by other code"
        )
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


#: settings that change where and how a run is written or watched, never what it trains
_NOT_TRAINING = (
    *LOCAL_KEYS,
    "checkpoint_every",
    "keep_checkpoints",
    "measure_speed",
    "teacher_tokens_per_batch",  # how the teacher's and the evaluation's batches are cut: the same outputs
    "eval_tokens_per_batch",
)


#: the key of ``written_by`` that holds the fingerprint of the examples the run read
DATA = "content of the data"


def training_settings(config: Any) -> dict[str, Any]:
    """The configuration's settings that decide what its stages train (a key set to null is unset), and the
    content of the vocabulary corpus, which is read again on resume (an edited file is another vocabulary)."""
    settings = {key: value for key, value in config.to_dict().items() if value is not None and key not in _NOT_TRAINING}
    if isinstance(settings.get("teacher_options"), dict):
        settings["teacher_options"] = _computing(settings["teacher_options"])
    for index, entry in enumerate(settings.pop("teachers", None) or []):  # per member, so a change names it
        entry = entry if isinstance(entry, dict) else {"teacher": entry}
        settings[f"teachers[{index}]"] = entry.get("teacher")
        settings[f"teachers[{index}].weight"] = entry.get("weight", 1.0)
        settings[f"teachers[{index}].teacher_options"] = _computing(entry.get("teacher_options") or {})  # placement
    corpus = getattr(config, "trim_vocab_corpus", None)
    if corpus:
        path = Path(corpus).expanduser()
        settings["content of trim_vocab_corpus"] = f"sha256 {of_file(str(path))[:16]}" if path.is_file() else "missing"
    return settings


def _computing(options: dict[str, Any]) -> dict[str, Any]:
    """A teacher's options but those that say where its modules go."""
    return {key: value for key, value in options.items() if key not in PLACEMENT_OPTIONS}


def settings_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """``"lr 0.001 there, 0.0005 now; ..."`` for every setting that differs; empty when none does."""
    keys = sorted(set(recorded) | set(current), key=lambda key: (key not in current, key))
    return "; ".join(
        f"{key} {recorded.get(key, 'unset')} there, {current.get(key, 'unset')} now"
        for key in keys
        if recorded.get(key) != current.get(key)
    )

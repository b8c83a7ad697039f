"""The teacher's outputs on the run's transfer set: computed (or reused from the cache) once, on the
first stage that distils, stored like any split's, and what that cost, for metrics.json."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..types import Task, Teacher
from .cache import TeacherCache
from .teacher import build_cache, launch_processes, teacher_encoding, teacher_fingerprints
from .trainer import Trainer


@dataclass(kw_only=True)
class TransferOutputs:
    """Calling it gives the teacher's outputs on ``transfer`` (an engine.transfer.TransferSet), with
    its layer vectors where ``layers`` (they are added to a cache opened without them); ``info``
    records the examples, the seconds, whether they were reused and the cache's record."""

    transfer: Any
    teacher: Teacher
    extractor: Any
    trainer: Trainer
    task: Task
    max_length: int
    root: Path
    precision: str
    cache: Optional[TeacherCache] = None
    info: dict[str, Any] = field(default_factory=dict)

    def __call__(self, layers: bool = False) -> TeacherCache:
        if self.cache is None or (layers and not self.cache.has_layers):
            started = time.perf_counter()
            encoding = teacher_encoding(self.teacher)
            split = self.transfer.encode(
                encoding,
                self.max_length,
                is_regression=self.task.is_regression,
                processes=launch_processes(self.trainer.accelerator),
            )
            self.cache = build_cache(
                self.teacher,
                self.extractor,
                self.trainer,
                self.task,
                "transfer",
                split,
                root=self.root,
                precision=self.precision,
                layers=layers,
                **teacher_fingerprints(self.teacher),
            )
            seconds = time.perf_counter() - started
            self.info.update(
                {
                    "examples": len(split),
                    "teacher_seconds": round(seconds, 2),
                    "reused": not self.cache.built,
                    "cache": self.cache.record(),
                }
            )
        return self.cache

"""The run directory: resolved config, metrics, the student's weights and the log.

Files are written atomically (temporary file, then rename), so an interrupted run never leaves
a half-written metrics.json or config behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from safetensors.torch import save_model
from torch import nn

from ..config import RunConfig, dump_yaml
from ..errors import UsageError

CONFIG_FILE, METRICS_FILE, LOG_FILE, STUDENT_DIR = "config.yaml", "metrics.json", "log.txt", "student"
PREDICTIONS_FILE = "predictions.json"


def default_output(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = lambda text: "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(text).name)  # noqa: E731
    return Path("runs") / f"{stamp}-{safe(config.task)}-{safe(config.student)}-{safe(config.projector)}"


def write_atomic(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)


class RunDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path, *, overwrite: bool = False) -> "RunDirectory":
        if path.exists() and not path.is_dir():
            raise UsageError(f"output {path} exists and is not a directory; choose another --output")
        if path.is_dir() and not overwrite and ((path / CONFIG_FILE).exists() or (path / METRICS_FILE).exists()):
            raise UsageError(
                f"output directory {path} already holds a run; choose another --output, or pass --overwrite "
                f"to replace it")
        if path.is_dir() and overwrite and ((path / CONFIG_FILE).exists() or (path / METRICS_FILE).exists()):
            shutil.rmtree(path)  # stale checkpoints must not leak into the new run
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    def write_config(self, config: RunConfig) -> None:
        write_atomic(self.path / CONFIG_FILE, dump_yaml(config))

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        write_atomic(self.path / METRICS_FILE, json.dumps(metrics, indent=2, default=_jsonable))

    def write_predictions(self, predictions: dict[str, dict[str, list]]) -> None:
        """The final student's dev predictions and the gold labels, per split, in example order
        (what paired bootstrap comparisons between runs resample)."""
        write_atomic(self.path / PREDICTIONS_FILE, json.dumps(predictions))

    def save_student(self, student: nn.Module, description: dict[str, Any]) -> Path:
        """Weights in safetensors; plus ``save_pretrained`` output where the student has it."""
        directory = self.path / STUDENT_DIR
        directory.mkdir(exist_ok=True)
        if hasattr(student, "save_pretrained"):
            student.save_pretrained(str(directory))
        if not (directory / "model.safetensors").exists():
            save_model(student, str(directory / "model.safetensors"))
        write_atomic(directory / "kdplug_student.json", json.dumps(description, indent=2, default=_jsonable))
        return directory

    def attach_log(self) -> logging.Handler:
        handler = logging.FileHandler(self.path / LOG_FILE, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("kdplug").addHandler(handler)
        return handler


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)

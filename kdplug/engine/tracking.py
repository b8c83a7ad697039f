"""Experiment tracking through Accelerate's trackers: TensorBoard, Weights & Biases, MLflow.

``--report-to tensorboard|wandb|mlflow|all|none`` (or a comma list). Logged: every loss term of
every training step (``<stage>/train/ce``, ``.../kd``, ``.../ild``, ``.../loss``) and the
learning rate, each epoch's dev metrics (``<stage>/dev/<split>/<metric>``), the attention
heatmaps of ALP and Universal-KD as images, and the run's configuration as hyper-parameters.
Steps count within each stage, so a resumed run continues its curves where they stopped.
Trackers write under ``<run>/tracking`` (TensorBoard events, an MLflow SQLite store and its
artifacts, W&B's own directory), so everything about a run stays in its directory; a
``MLFLOW_TRACKING_URI`` in the environment (a team's MLflow server) is respected.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Optional

from ..config import TRACKERS, tracker_names
from ..errors import ConfigError, UsageError
from ..layout import TRACKING_DIR

PROJECT = "kdplug"


def parse_report_to(value: Optional[str]) -> list[str]:
    """``"tensorboard,wandb"`` -> the trackers; ``none`` -> none; ``all`` -> every installed one."""
    names = tracker_names(value)
    if names == ["all"]:
        return [name for name, package in TRACKERS.items() if importlib.util.find_spec(package) is not None]
    missing = [name for name in names if importlib.util.find_spec(TRACKERS[name]) is None]
    if missing:
        raise ConfigError(
            f"--report-to {', '.join(missing)} needs the {', '.join(TRACKERS[m] for m in missing)} "
            f"package: pip install {' '.join(TRACKERS[m] for m in missing)}"
        )
    if "wandb" in names and not wandb_can_log():
        raise ConfigError(
            "--report-to wandb needs a Weights & Biases login (wandb login, or WANDB_API_KEY), or "
            "WANDB_MODE=offline to write the run locally and 'wandb sync' it later"
        )
    return names


def wandb_can_log() -> bool:
    """Offline mode, an API key in the environment, or a login in ~/.netrc (what wandb itself reads)."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")


def hyper_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The run's configuration flattened to what every tracker accepts: numbers, strings, booleans."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            for option, item in value.items():
                flat[f"{key}.{option}"] = item
        else:
            flat[key] = value
    return {
        key: value if isinstance(value, (int, float, str, bool)) else json.dumps(value, default=str)
        for key, value in flat.items()
    }


def _mlflow_store_in(directory: Path) -> None:
    """Without a server, MLflow's default store is ./mlflow.db in the working directory: keep it in the run."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{(directory / 'mlflow.db').resolve()}")


class Tracking:
    """The run's trackers, through its Accelerator (which logs on the main process only)."""

    def __init__(self, accelerator: Any, names: list[str], run_dir: Path, config: dict[str, Any]) -> None:
        self.accelerator, self.names = accelerator, names
        directory = run_dir / TRACKING_DIR
        init_kwargs = {
            "wandb": {"name": run_dir.name, "dir": str(directory)},
            "mlflow": {"run_name": run_dir.name, "logging_dir": (directory / "mlartifacts").resolve().as_uri()},
            "tensorboard": {},
        }
        try:  # before any training: a tracker that cannot write is a message now, not a traceback later
            directory.mkdir(parents=True, exist_ok=True)
            if "mlflow" in names:
                _mlflow_store_in(directory)
            accelerator.init_trackers(
                PROJECT, config=hyper_parameters(config), init_kwargs={name: init_kwargs[name] for name in names}
            )
        except OSError as exc:
            raise UsageError(
                f"--report-to {','.join(names)}: cannot write the tracking directory {directory} "
                f"({(exc.strerror or str(exc)).lower()}); fix its permissions or run with --report-to none"
            ) from None

    def log_step(self, stage: str, step: int, terms: dict[str, float], lr: float) -> None:
        values = {f"{stage}/train/{term}": value for term, value in terms.items()}
        values[f"{stage}/lr"] = lr
        self.accelerator.log(values, step=step)

    def log_epoch(self, stage: str, step: int, epoch: int, metrics: dict[str, dict[str, float]]) -> None:
        values = {
            f"{stage}/dev/{split}/{name}": value for split, scores in metrics.items() for name, value in scores.items()
        }
        values[f"{stage}/epoch"] = epoch
        self.accelerator.log(values, step=step)

    def log_image(self, tag: str, path: Path, step: int = 0) -> None:
        """A figure the run wrote (e.g. attention.png), on every tracker."""
        if not self.accelerator.is_main_process or not path.is_file():
            return
        import matplotlib.image

        image = matplotlib.image.imread(str(path))[..., :3]  # (height, width, RGB) floats in [0, 1]
        for name in self.names:
            tracker = self.accelerator.get_tracker(name, unwrap=False)
            if name == "tensorboard":
                tracker.log_images({tag: image[None]}, step=step, dataformats="NHWC")  # (1, H, W, 3)
            elif hasattr(tracker, "log_images"):  # W&B
                tracker.log_images({tag: [image]}, step=step)
            else:  # MLflow keeps figures as artifacts
                import mlflow

                mlflow.log_image(image, f"{tag}.png")

    def finish(self) -> None:
        self.accelerator.end_training()

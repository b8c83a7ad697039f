"""What a run hands over when it ends: the student package, the closing table, and how often the
student agrees with its teacher."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ..capabilities import StudentCapabilities, capabilities
from ..config import RunConfig, command_line
from ..layout import STUDENT_DIR
from ..progress import human_count
from ..timing import RETIME, plus_minus
from ..types import ProjectorCapabilities, RecipeCapabilities, Task, text_columns
from . import package, preflight
from .cache import TeacherCache
from .recipe import EngineContext
from .rundir import RunDirectory
from .speed import Speed
from .trainer import predictions_from_logits

log = logging.getLogger("kdplug")


@dataclass
class Row:
    """One line of the closing table."""

    model: str
    parameters: Optional[int]  # None: a served teacher, whose weights are not in this process
    dev: dict[str, dict[str, float]]
    speed: Optional[Speed] = None
    speedup: Optional[float] = None


def agreement(predictions: list, cache: TeacherCache) -> float:
    """The share of examples on which the student predicts the teacher's class."""
    teacher = predictions_from_logits(torch.from_numpy(cache.logits[:].copy()), is_regression=False)
    return float((torch.tensor(predictions) == teacher).float().mean())


def write_student_package(
    run_dir: RunDirectory,
    config: RunConfig,
    task: Task,
    student: nn.Module,
    context: EngineContext,
    metrics: dict[str, Any],
    max_length: int,
) -> None:
    """``<run>/student/``: weights, config, tokenizer, labels and the model card (see engine/package.py)."""
    from transformers import PreTrainedModel

    tokenizer = capabilities(StudentCapabilities, student).tokenizer or context.tokenizer
    speed = metrics.get("speed", {})
    info = package.package_info(
        config=config,
        task=task,
        columns=text_columns(task),
        max_length=max_length,
        student_name=config.student,
        init=metrics["student"].get("init"),
        dev=metrics["student"]["dev"],
        speed=speed,
    )
    citations = [
        citation
        for declaration, name in ((ProjectorCapabilities, config.projector), (RecipeCapabilities, config.recipe))
        if (citation := preflight.declared(context.registry, declaration, name).citation)
    ]
    card = package.model_card(
        config=config,
        task=task,
        metrics=metrics,
        speed=speed,
        command=command_line(config),
        citations=list(dict.fromkeys(citations)),
        student_class=type(student).__name__,
        huggingface_family=isinstance(student, PreTrainedModel)
        and type(student).__module__.startswith("transformers."),
    )
    package.write_package(run_dir.path / STUDENT_DIR, student, tokenizer, info, card)


def format_table(rows: list[Row], task: Task) -> str:
    split = task.dev_splits[0]
    keys = sorted({key for row in rows for key in row.dev.get(split, {})}, key=lambda k: (k != task.main_metric, k))
    timed = any(row.speed is not None for row in rows)
    header = ["model", "params"] + [f"{split} {k}" for k in keys]
    if timed:
        header += ["weights", "ms/example (b=1)", "examples/s (b=32)", "speed-up"]
    body = []
    for row in rows:
        cells = [row.model, "served" if row.parameters is None else human_count(row.parameters)]
        cells += [f"{row.dev[split][k] * 100:.2f}" if k in row.dev.get(split, {}) else "" for k in keys]
        if timed:
            speed = row.speed
            cells += (
                [
                    f"{speed.weights_mb:.1f} MB",
                    f"{speed.latency_ms:.2f} {plus_minus(speed.latency_spread)}",
                    f"{speed.throughput:.0f} {plus_minus(speed.throughput_spread)}",
                    f"{row.speedup:.2f}x" if row.speedup else "",
                ]
                if speed
                else ["", "", "", ""]
            )
        body.append(cells)
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [line(header), line(["-" * w for w in widths])] + [line(r) for r in body]
    doubts = sorted({row.speed.unreliable for row in rows if row.speed is not None and row.speed.unreliable})
    if doubts:
        lines.append(f"the speed columns are not reliable: {'; '.join(doubts)}. Time the run again {RETIME}")
    return "\n".join(lines)

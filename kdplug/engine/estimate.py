"""How long a run will take, before it starts: a few real steps timed on this machine, now.

``kdplug run --dry-run`` builds the models anyway; timing a handful of their steps on the run's
own batches costs a few seconds and gives the only honest figure: it already includes this
machine's speed, its load and the thread count the run would use. What it cannot include is said
with the figure: the distillation terms (a projector, the losses: a small share for a BiLSTM, more
for a BERT student matching every layer) and early stopping (which can only shorten a stage).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from itertools import chain, islice, repeat
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from .data import Collator
from .objective import model_forward
from .speed import served_remotely

#: steps timed after one warm-up step
TIMED_STEPS = 3


def step_seconds(model: nn.Module, loader, *, train: bool, placed: bool = False) -> float:
    """The median seconds of one step of ``model`` on the first batches of ``loader``: forward,
    backward and an optimizer step when ``train``, a forward pass without gradients otherwise.
    ``model`` is copied: its weights are not changed. ``placed``: a teacher sharded by a device map
    (only ever timed without gradients), timed as it is, not copied."""
    model = model.eval() if placed else copy.deepcopy(model).train(train)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5) if train else None
    times = []
    batches = chain.from_iterable(repeat(loader))  # a split of one batch is timed on that batch again
    for index, batch in enumerate(islice(batches, TIMED_STEPS + 1)):
        started = time.perf_counter()
        with torch.set_grad_enabled(train):
            outputs = model_forward(model, batch)
            logits = outputs.logits if hasattr(outputs, "logits") else outputs[0]
            if optimizer is not None:
                logits.float().pow(2).mean().backward()  # any scalar: the cost is the backward pass
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        if index:  # the first step allocates and warms up
            times.append(time.perf_counter() - started)
    return statistics.median(times) if times else 0.0


def epoch_seconds(model: nn.Module, trainer, train, dev: dict, examples: int, batch_size: int) -> dict[str, Any]:
    """One epoch of training ``model`` on ``examples`` examples and its evaluation on ``dev``."""
    loader, _ = trainer.loader(train, shuffle=True, batch_size=batch_size)
    train_step = step_seconds(model, loader, train=True)
    dev_batches = sum(math.ceil(len(split) / batch_size) for split in dev.values())
    first_dev = next(iter(dev.values()))
    eval_step = step_seconds(model, trainer.loader(first_dev, shuffle=False, batch_size=batch_size)[0], train=False)
    return {
        "step_seconds": round(train_step, 4),
        "seconds_per_epoch": round(math.ceil(examples / batch_size) * train_step + dev_batches * eval_step, 2),
    }


def fewest_epochs(epochs: int, patience: int, min_epochs: int) -> int:
    """The epochs a stage runs at the least: early stopping waits for ``min_epochs`` and for
    ``patience`` epochs without an improvement after the first."""
    return min(epochs, max(min_epochs, patience + 1)) if patience else epochs


def teacher_seconds(finetune: Any, outputs: Any, config: Any, inputs: Any, name: str) -> dict[str, tuple[float, float]]:
    """The fewest and the most seconds of ``name``'s fine-tuning and outputs, where they are not stored
    yet. The teacher is fine-tuned already unless its fine-tuning is planned, so ``inputs.teacher`` is the
    model each of the two times."""
    trainer, teacher, train, dev = inputs.trainer, inputs.teacher, inputs.train, inputs.dev
    parts = {}
    if isinstance(finetune, dict) and not finetune["stored"]:
        epoch = epoch_seconds(teacher.model, trainer, train, dev, len(train), config.teacher_batch_size)
        fewest = fewest_epochs(finetune["epochs"], finetune.get("patience", 0), finetune.get("min_epochs", 0))
        seconds = epoch["seconds_per_epoch"]
        parts[f"{name} fine-tuning"] = (seconds * fewest, seconds * finetune["epochs"])
    remote = served_remotely(teacher.model)  # timing it would send requests
    if isinstance(outputs, dict) and any(value != "cached" for value in outputs.values()) and not remote:
        seconds = pass_seconds(teacher.model, trainer, [train, *dev.values()], placed=teacher.placed_on is not None)
        parts[f"{name} outputs"] = (seconds, seconds)
    return parts


def pass_seconds(model: nn.Module, trainer: Any, splits: list, *, placed: bool = False) -> float:
    """The teacher pass over ``splits`` cut as the run cuts it (:func:`~kdplug.engine.teacher.pass_plan`:
    batches of a count, or of a token budget): the seconds per padded token of a few batches spread over
    the first split, times the padded tokens of every batch (what a token budget saves is padding)."""
    from .teacher import pass_plan

    plans = [[batch for window in pass_plan(trainer, split, range(len(split))) for batch in window] for split in splits]
    first, batches = splits[0], plans[0]
    picked = batches[:: max(1, len(batches) // (TIMED_STEPS + 1))][: TIMED_STEPS + 1]  # the first one warms up
    loader = DataLoader(first, batch_sampler=picked, collate_fn=Collator(first.pad_id, first.is_regression))
    per_batch = step_seconds(model, loader, train=False, placed=placed)
    lengths = [np.asarray(split.lengths) for split in splits]  # once: a split computes them on each access
    per_token = per_batch / statistics.mean(_padded(lengths[0], batch) for batch in picked[1:] or picked)
    return per_token * sum(_padded(length, batch) for length, plan in zip(lengths, plans) for batch in plan)


def _padded(lengths: np.ndarray, batch: list[int]) -> int:
    return len(batch) * int(lengths[batch].max())


def left_to_resume(checkpoint: Path, stage: dict[str, Any]) -> tuple[float, float]:
    """The fewest and the most seconds a stage has left when its run is resumed: none where its checkpoint
    says it completed, the epochs from the one it stopped in where it has one (the whole stage without)."""
    planned = stage["estimate"]
    try:
        state = json.loads((checkpoint / "state.json").read_text())
    except (OSError, ValueError):  # no checkpoint (or one the run will refuse): the stage from its start
        return planned["fewest_seconds"], planned["seconds"]
    if state.get("complete"):
        return 0.0, 0.0
    done = max(int(state.get("epoch", 1)) - 1, 0)  # the epoch it stopped in is trained again from its last step
    per_epoch = planned["seconds_per_epoch"]
    return per_epoch * max(planned["fewest_epochs"] - done, 1), per_epoch * max(stage["epochs"] - done, 1)

"""The training loop: device-agnostic (Accelerate), teacher outputs read from the cache.

One loop serves every stage: teacher fine-tuning, distillation, CE-only stages. It keeps the
best dev checkpoint (or the last, by ``best_checkpoint``) and restores it at the end, as the
papers report best dev scores.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from ..errors import KdplugError
from ..types import Task
from .cache import TeacherCache
from .data import Collator, EncodedSplit, LengthGroupedBatchSampler
from .objective import DistillationModule, model_forward

log = logging.getLogger(__name__)


class NonFiniteLossError(KdplugError):
    """Training produced NaN or inf: stopping beats training on garbage."""


@dataclass
class StageResult:
    name: str
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    dev: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"best_epoch": self.best_epoch, "dev": self.dev, "history": self.history,
                "seconds": round(self.seconds, 2)}


def build_accelerator(precision: str) -> Accelerator:
    """fp32 training on CPU unless asked otherwise; bf16/fp16 mixed precision on request."""
    mixed = {"auto": "no", "fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    if precision == "auto" and torch.cuda.is_available():
        mixed = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mixed == "fp16" and not torch.cuda.is_available():
        mixed = "no"  # fp16 autocast training is a GPU feature; keep CPU runs exact
    return Accelerator(mixed_precision=mixed, cpu=not torch.cuda.is_available())


def inference_autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for frozen-model inference where the device supports it."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if device.type == "cuda":
        dtype = torch.float16 if precision == "fp16" or not torch.cuda.is_bf16_supported() else torch.bfloat16
        return torch.autocast("cuda", dtype=dtype)
    if precision in ("auto", "bf16"):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_optimizer(module: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, parameter in module.named_parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim < 2 or "norm" in name.lower() else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:  # fused AdamW: one kernel per step instead of one per parameter
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=lr)


def predictions_from_logits(logits: torch.Tensor, is_regression: bool) -> torch.Tensor:
    return logits.squeeze(-1).float() if is_regression else logits.argmax(dim=-1)


class Trainer:
    def __init__(self, accelerator: Accelerator, task: Task, *, batch_size: int, seed: int,
                 weight_decay: float = 0.01, warmup_ratio: float = 0.1, best_checkpoint: str = "best",
                 num_workers: int = 0) -> None:
        self.accelerator = accelerator
        self.task = task
        self.batch_size = batch_size
        self.seed = seed
        self.weight_decay = weight_decay
        self.warmup_ratio = warmup_ratio
        self.best_checkpoint = best_checkpoint
        self.num_workers = num_workers

    # -- data -------------------------------------------------------------------------------
    def loader(self, split: EncodedSplit, *, shuffle: bool, batch_size: Optional[int] = None) -> tuple[DataLoader, LengthGroupedBatchSampler]:
        sampler = LengthGroupedBatchSampler(split.lengths, batch_size or self.batch_size, shuffle=shuffle, seed=self.seed)
        loader = DataLoader(split, batch_sampler=sampler, collate_fn=Collator(split.pad_id, split.is_regression),
                            num_workers=self.num_workers)
        return loader, sampler

    def progress(self, iterable, total: int, desc: str):
        # disable=None: bars on a terminal only, so CI logs and files are not flooded
        return tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True,
                    disable=None if self.accelerator.is_local_main_process else True)

    # -- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, model: nn.Module, split: EncodedSplit, desc: str = "predict") -> torch.Tensor:
        """Predictions of ``model`` (a student, teacher or DistillationModule's student) for every
        example of ``split``, in the split's order."""
        loader, _ = self.loader(split, shuffle=False, batch_size=self.batch_size * 2)
        loader = self.accelerator.prepare_data_loader(loader)
        model = self.accelerator.unwrap_model(model)
        model = model.student if isinstance(model, DistillationModule) else model
        model.to(self.accelerator.device)
        was_training = model.training
        model.eval()
        outputs, indices = [], []
        for batch in self.progress(loader, len(loader), desc):
            logits = model_forward(model, batch).logits
            preds = predictions_from_logits(logits, self.task.is_regression)
            preds, index = self.accelerator.gather_for_metrics((preds, batch["index"]))
            outputs.append(preds.cpu())
            indices.append(index.cpu())
        model.train(was_training)
        merged = torch.empty(len(split), dtype=outputs[0].dtype)
        merged[torch.cat(indices)] = torch.cat(outputs)
        return merged

    def evaluate(self, model: nn.Module, dev_splits: dict[str, EncodedSplit]) -> dict[str, dict[str, float]]:
        results = {}
        for name, split in dev_splits.items():
            predictions = self.predict(model, split, desc=f"evaluate {name}")
            results[name] = self.task.compute_metrics(predictions.tolist(), split.labels)
        return results

    def main_score(self, metrics: dict[str, dict[str, float]]) -> float:
        first = metrics[self.task.dev_splits[0]] if self.task.dev_splits[0] in metrics else next(iter(metrics.values()))
        return first[self.task.main_metric]

    # -- training ---------------------------------------------------------------------------
    def fit(self, name: str, module: DistillationModule, train: EncodedSplit, dev_splits: dict[str, EncodedSplit], *,
            epochs: int, lr: float, teacher_cache: Optional[TeacherCache] = None) -> StageResult:
        """Train ``module`` for ``epochs``; on return it holds the kept (best or last) weights."""
        started = time.perf_counter()
        result = StageResult(name)
        needs_teacher = module.needs_teacher
        if needs_teacher and teacher_cache is None:
            raise KdplugError(f"stage {name!r} needs teacher outputs but no teacher cache was given")
        loader, sampler = self.loader(train, shuffle=True)
        optimizer = make_optimizer(module, lr, self.weight_decay)
        steps = epochs * len(loader)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(self.warmup_ratio * steps), steps)
        module, optimizer, loader, scheduler = self.accelerator.prepare(module, optimizer, loader, scheduler)
        best_score, best_state = -math.inf, None
        objective = self.accelerator.unwrap_model(module).objective
        for epoch in range(1, epochs + 1):
            sampler.set_epoch(epoch)
            if hasattr(objective, "set_epoch"):  # schedules over epochs, e.g. annealing KD
                objective.set_epoch(epoch, epochs)
            module.train()
            sums: dict[str, float] = {}
            count = 0
            bar = self.progress(loader, len(loader), f"{name} epoch {epoch}/{epochs}")
            for step, batch in enumerate(bar, start=1):
                teacher = {}
                if needs_teacher:
                    logits, layers = teacher_cache.fetch(batch["index"], self.accelerator.device)
                    teacher = {"teacher_logits": logits, "teacher_layers": layers}
                with self.accelerator.autocast():
                    terms = module(batch, **teacher)
                loss = terms["loss"]
                if not torch.isfinite(loss):
                    values = {k: float(v.detach()) for k, v in terms.items()}
                    raise NonFiniteLossError(
                        f"stage {name!r}, epoch {epoch}, step {step}: the loss is not finite ({values}). "
                        f"Lower the learning rate or the temperature; the weights before this step are kept.")
                self.accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                for key, value in terms.items():
                    sums[key] = sums.get(key, 0.0) + float(value.detach())
                count += 1
                bar.set_postfix(loss=f"{sums['loss'] / count:.4f}", refresh=False)
            metrics = self.evaluate(module, dev_splits)
            score = self.main_score(metrics)
            record = {"epoch": epoch, "train": {k: v / max(count, 1) for k, v in sums.items()}, "dev": metrics}
            result.history.append(record)
            log.info("%s epoch %d/%d: train loss %.4f, dev %s", name, epoch, epochs, record["train"].get("loss", 0.0),
                     _format(metrics))
            if self.best_checkpoint == "last" or score > best_score:
                best_score, result.best_epoch, result.dev = score, epoch, metrics
                best_state = copy.deepcopy(self.accelerator.unwrap_model(module).state_dict())
        unwrapped = self.accelerator.unwrap_model(module)
        if best_state is not None:
            unwrapped.load_state_dict(best_state)
        self.accelerator.free_memory()
        result.seconds = time.perf_counter() - started
        return result


def _format(metrics: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in values.items()) for split, values in metrics.items())

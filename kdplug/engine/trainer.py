"""The training loop: device-agnostic (Accelerate), teacher outputs read from the cache.

One loop serves every stage: teacher fine-tuning, distillation, CE-only stages. It keeps the
best dev checkpoint (or the last, by ``best_checkpoint``) and restores it at the end, as the
papers report best dev scores.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from accelerate import Accelerator, PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, send_to_device, set_seed
from torch import nn
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from .. import interrupt
from ..errors import KdplugError
from ..interrupt import RunInterrupted
from ..progress import human_duration, progress
from ..types import StageResult, Task
from . import faults, health
from .batches import ProcessShards, training_loader
from .cache import TeacherCache
from .checkpoint import Checkpointer, Progress, restore_rng
from .data import Collator, EncodedSplit, LengthGroupedBatchSampler, WithTransfer, budget_loader
from .objective import DistillationModule, model_forward

log = logging.getLogger(__name__)


class NonFiniteLossError(KdplugError):
    """Training produced NaN or inf: stopping beats training on garbage."""


def process_state() -> PartialState:
    """This process's place in a multi-process run (one process: index 0 of 1).

    Created with the same device choice as the Accelerator, or a CPU run under ``torchrun``
    would not see its peers.
    """
    return PartialState(cpu=not torch.cuda.is_available())


def build_accelerator(
    precision: str, log_with: Optional[list[str]] = None, project_dir: Optional[Path] = None
) -> Accelerator:
    """fp32 training on CPU unless asked otherwise; bf16/fp16 mixed precision on request;
    ``log_with`` names Accelerate trackers writing under ``project_dir`` (see tracking.py)."""
    mixed = {"auto": "no", "fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    if precision == "auto" and torch.cuda.is_available():
        mixed = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mixed == "fp16" and not torch.cuda.is_available():
        mixed = "no"  # fp16 autocast training is a GPU feature; keep CPU runs exact
    if AcceleratorState._shared_state.get("_mixed_precision", mixed) != mixed:
        # Accelerate keeps one precision a process and refuses another; a process's next run (the
        # Python API) may ask for one: its state is dropped (not the process group, PartialState's)
        AcceleratorState._reset_state()
    # split_batches: batch_size is the global batch, whatever the number of processes, so a
    # multi-GPU run keeps the papers' hyper-parameters; the evaluation loaders only: training cuts
    # its global batches itself (engine/batches.py), as Accelerate drops or repeats a partial one
    return Accelerator(
        mixed_precision=mixed,
        cpu=not torch.cuda.is_available(),
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        # a stage may leave parameters out of its loss (a BiLSTM's layer poolers under a logit-only
        # method): DDP must not wait for their gradients, as Hugging Face's Trainer does by default
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        log_with=log_with or None,
        project_dir=str(project_dir) if project_dir else None,
    )


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls are fast on ``device``: a GPU, or a CPU with bf16 instructions (AVX512-BF16,
    AMX; on Arm, its BF16 extension). Elsewhere oneDNN emulates them: the teacher cache took 6x as long
    under bf16 autocast as in fp32 on an AMD EPYC with AVX2 only (benchmarks/kd_overhead.py). oneDNN's
    own check accepts any AVX-512 CPU, which emulates bf16 too, so x86 is read from the CPU's flags."""
    if device.type != "cpu":
        return True
    flags = x86_flags()
    if flags is not None:
        return bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@functools.lru_cache(maxsize=1)  # read per batch by the teacher in the loop; the CPU does not change
def x86_flags() -> Optional[dict]:
    """The x86 CPU's instruction-set flags as PyTorch's dispatcher sees them; None on another CPU."""
    try:
        capability = torch._C._cpu._get_cpu_capability()
    except (AttributeError, RuntimeError):  # an older PyTorch: the kernel's flags
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
                names = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), None)
        except OSError:
            return None
        return None if names is None else dict.fromkeys(names, True)
    return capability if capability.get("architecture") in ("x86_64", "x86") else None


def inference_precision(precision: str, device: torch.device) -> str:
    """The dtype a frozen model (the teacher: its cache, its evaluation, in the loop) runs in on
    ``device``: ``fp32``, ``bf16`` or ``fp16``. Under ``auto``, bf16 where the device runs it
    natively, fp16 on a GPU without bf16, fp32 on a CPU that would only emulate bf16 (slower, and
    no smaller where it is kept: the cache stores half precision either way)."""
    if precision == "fp32":
        return "fp32"
    if device.type == "cuda":
        return "fp16" if precision == "fp16" or not torch.cuda.is_bf16_supported() else "bf16"
    if precision == "bf16" or (precision == "auto" and native_bf16(device)):
        return "bf16"
    return "fp32"  # fp16 autocast is a GPU feature


def inference_autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast for frozen-model inference in :func:`inference_precision`'s dtype."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(inference_precision(precision, device))
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


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
    def __init__(
        self,
        accelerator: Accelerator,
        task: Task,
        *,
        batch_size: int,
        seed: int,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        best_checkpoint: str = "best",
        num_workers: int = 0,
        teacher_tokens_per_batch: Optional[int] = None,
        eval_tokens_per_batch: Optional[int] = None,
    ) -> None:
        self.accelerator = accelerator
        self.task = task
        self.batch_size = batch_size
        self.seed = seed
        self.weight_decay = weight_decay
        self.warmup_ratio = warmup_ratio
        self.best_checkpoint = best_checkpoint
        self.num_workers = num_workers
        #: the teacher pass's and evaluation's batches by a budget of padded tokens (None: by count)
        self.teacher_tokens_per_batch, self.eval_tokens_per_batch = teacher_tokens_per_batch, eval_tokens_per_batch
        self.tracking: Any = None  # engine.tracking.Tracking, when the run reports to trackers

    # -- data -------------------------------------------------------------------------------
    def loader(
        self, split: EncodedSplit | WithTransfer, *, shuffle: bool, batch_size: Optional[int] = None
    ) -> tuple[DataLoader, LengthGroupedBatchSampler]:
        mixed = shuffle and hasattr(split, "epoch_pool")  # labelled + a transfer set's share per epoch
        sampler = LengthGroupedBatchSampler(
            split.lengths,
            batch_size or self.batch_size,
            shuffle=shuffle,
            seed=self.seed,
            pool=split.epoch_pool if mixed else None,
            epoch_size=split.epoch_size if mixed else None,
        )
        # its own generator: creating an iterator must not draw from the global RNG, or a resumed
        # run would see different dropout masks than an uninterrupted one
        loader = DataLoader(
            split,
            batch_sampler=sampler,
            collate_fn=Collator(split.pad_id, split.is_regression),
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.seed),
        )
        return loader, sampler

    def progress(self, iterable, total: int, desc: str):
        # on a terminal or in a notebook only, so CI logs and files are not flooded
        return progress(iterable, total=total, desc=desc, enabled=self.accelerator.is_local_main_process)

    # -- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def predict(self, model: nn.Module, split: EncodedSplit, desc: str = "predict") -> torch.Tensor:
        """Predictions of ``model`` (a student, teacher or DistillationModule's student) for every
        example of ``split``, in the split's order."""
        loader = self.prediction_loader(split)
        model = self.accelerator.unwrap_model(model)
        model = model.student if isinstance(model, DistillationModule) else model
        model.to(self.accelerator.device)
        was_training = model.training
        model.eval()
        outputs, indices = [], []
        for batch in self.progress(loader, len(loader), desc):
            logits = model_forward(model, send_to_device(batch, self.accelerator.device)).logits
            preds = predictions_from_logits(logits, self.task.is_regression)
            preds, index = self.accelerator.gather_for_metrics((preds, batch["index"]))
            outputs.append(preds.cpu())
            indices.append(index.cpu())
        model.train(was_training)
        merged = torch.empty(len(split), dtype=outputs[0].dtype)
        merged[torch.cat(indices)] = torch.cat(outputs)
        return merged

    def prediction_loader(self, split: EncodedSplit) -> DataLoader:
        """Evaluation's batches: twice training's count in the data's order, or by the token budget
        (one process: a launch of several shares count batches, as Accelerate cuts them)."""
        if self.eval_tokens_per_batch is None or self.accelerator.num_processes > 1:
            return self.accelerator.prepare_data_loader(
                self.loader(split, shuffle=False, batch_size=self.batch_size * 2)[0]
            )
        return budget_loader(split, self.eval_tokens_per_batch)

    def evaluate(
        self, model: nn.Module, dev_splits: dict[str, EncodedSplit], predictions: Optional[dict[str, list]] = None
    ) -> dict[str, dict[str, float]]:
        """Metrics per split; with ``predictions`` (a dict), also fills it with each split's predictions."""
        results = {}
        for name, split in dev_splits.items():
            predicted = self.predict(model, split, desc=f"evaluate {name}").tolist()
            results[name] = self.task.compute_metrics(predicted, split.labels)
            if predictions is not None:
                predictions[name] = predicted
        return results

    def main_score(self, metrics: dict[str, dict[str, float]]) -> float:
        first = metrics[self.task.dev_splits[0]] if self.task.dev_splits[0] in metrics else next(iter(metrics.values()))
        return first[self.task.main_metric]

    # -- training ---------------------------------------------------------------------------
    def fit(
        self,
        name: str,
        module: DistillationModule,
        train: EncodedSplit,
        dev_splits: dict[str, EncodedSplit],
        *,
        epochs: int,
        lr: float,
        teacher_cache: Optional[TeacherCache] = None,
        checkpoints: Optional[Checkpointer] = None,
        patience: int = 0,
        min_epochs: int = 0,
        live_teacher: Optional[Callable[[dict, torch.device], Any]] = None,
        keep_last: bool = False,
    ) -> StageResult:
        """Train ``module`` for ``epochs``; on return it holds the kept (best or last) weights.

        With ``checkpoints``, the stage is checkpointed every ``checkpoints.every_steps`` steps
        and at every epoch end, continues from its checkpoint if one exists, and is skipped
        (its final weights loaded) if it already completed. With ``patience``, the stage ends
        early once that many epochs in a row have not improved the best dev score (see
        :func:`stop_early`), though not before epoch ``min_epochs``. ``live_teacher(batch, device)``
        gives the teacher's per-token signals of a batch, for a projector that distils them
        (``needs_tokens``). ``keep_last``: the stage trains nothing its dev score measures; keep its
        last epoch and skip the health checks.
        """
        started = time.perf_counter()
        if module.needs_teacher and teacher_cache is None:
            raise KdplugError(f"stage {name!r} needs teacher outputs but no teacher cache was given")
        if module.needs_tokens and live_teacher is None:
            raise KdplugError(f"stage {name!r} distils per-token signals but no live teacher was given")
        saved = checkpoints.load(name) if checkpoints is not None else None
        if saved is not None and saved[0].complete:
            log.info("stage %s: complete in its checkpoint, reusing it", name)
            module.load_state_dict(saved[1])
            return stage_result(name, saved[0], started)
        first_dev = dev_splits.get(self.task.dev_splits[0]) or next(iter(dev_splits.values()))
        plan = StagePlan(
            name=name,
            epochs=epochs,
            lr=lr,
            dev_splits=dev_splits,
            teacher_cache=teacher_cache,
            live_teacher=live_teacher,
            checkpoints=checkpoints,
            patience=patience,
            min_epochs=min_epochs,
            keep_last=keep_last,
            baseline=health.constant_baseline(self.task, first_dev.labels) if patience else None,
        )
        run = self._start(plan, module, train, saved)
        for epoch in range(run.progress.epoch, epochs + 1):
            epoch_started = self._train_epoch(run, epoch)
            if self._end_epoch(run, epoch, epoch_started):
                break
            if epoch < epochs:
                self._save(run)
        if run.best_state is not None:
            run.unwrapped.load_state_dict(run.best_state)
        self._save(run, complete=True)
        self.accelerator.free_memory()
        return stage_result(name, run.progress, started)

    def _start(self, plan: StagePlan, module: DistillationModule, train: EncodedSplit, saved: Any) -> StageRun:
        """The stage's optimizer, schedule and data, prepared for the device; continued from its
        checkpoint (``saved``) where it has one."""
        # a stage's randomness depends on the seed and its name only, so a resumed run that
        # skips earlier stages draws the same dropout masks as an uninterrupted one
        set_seed(self.seed + zlib.crc32(plan.name.encode()) % 100_000)
        _, sampler = self.loader(train, shuffle=True)
        state = self.accelerator.state
        loader, shards = training_loader(
            train, sampler, rank=state.process_index, processes=state.num_processes, num_workers=self.num_workers
        )
        optimizer = make_optimizer(module, plan.lr, self.weight_decay)
        steps = plan.epochs * len(loader)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(self.warmup_ratio * steps), steps)
        progress, best_state, pending_rng = Progress(), None, None
        if saved is not None:
            progress, model_state, best_state, optimizers, rng = saved
            module.load_state_dict(model_state)
            optimizer.load_state_dict(optimizers["optimizer"])
            scheduler.load_state_dict(optimizers["scheduler"])
            pending_rng = (rng, progress.python_rng, progress.numpy_rng)
            log.info("stage %s: resuming at epoch %d, step %d", plan.name, progress.epoch, progress.step)
        module, optimizer, scheduler = self.accelerator.prepare(module, optimizer, scheduler)
        return StageRun(
            plan=plan,
            module=module,
            unwrapped=self.accelerator.unwrap_model(module),
            optimizer=optimizer,
            scheduler=scheduler,
            loader=loader,
            shards=shards,
            progress=progress,
            best_state=best_state,
            pending_rng=pending_rng,
            fault=faults.planned(plan.name),
        )

    def _train_epoch(self, run: StageRun, epoch: int) -> float:
        """One epoch's steps (the rest of it, for the epoch a resumed stage stopped in); when it started."""
        plan, progress, loader = run.plan, run.progress, run.loader
        skip = progress.step if epoch == progress.epoch else 0
        run.shards.set_epoch(epoch, skip)
        if hasattr(run.unwrapped.objective, "set_epoch"):  # schedules over epochs, e.g. annealing KD
            run.unwrapped.objective.set_epoch(epoch, plan.epochs)
        run.module.train()
        epoch_started = time.perf_counter()
        bar = self.progress(loader, len(loader) - skip, f"{plan.name} epoch {epoch}/{plan.epochs}")
        iterator = iter(bar)
        if run.pending_rng is not None:  # after the iterator exists: creating one may draw random numbers
            restore_rng(*run.pending_rng)
            run.pending_rng = None
        for step, batch in enumerate(iterator, start=skip + 1):
            terms = self._step(run, send_to_device(batch, self.accelerator.device), epoch, step)
            if self.tracking is not None:
                at = (epoch - 1) * len(loader) + step
                self.tracking.log_step(plan.name, at, terms, run.scheduler.get_last_lr()[0])
            for key, value in terms.items():
                progress.sums[key] = progress.sums.get(key, 0.0) + value
            progress.count += 1
            progress.epoch, progress.step = epoch, step
            faults.fire(run.fault, epoch, step)
            bar.set_postfix(loss=f"{progress.sums['loss'] / progress.count:.4f}", refresh=False)
            every = plan.checkpoints.every_steps if plan.checkpoints is not None else 0
            if interrupt.requested() or (every and step % every == 0 and step < len(loader)):
                path = self._save(run)
                if interrupt.requested():
                    raise stopped_by_signal(plan, epoch, step, path)
        return epoch_started

    def _end_epoch(self, run: StageRun, epoch: int, epoch_started: float) -> bool:
        """The epoch's dev scores recorded, logged and checked, the best weights kept; whether early
        stopping ends the stage here."""
        plan, progress = run.plan, run.progress
        predictions: dict[str, list] = {}
        metrics = self.evaluate(run.module, plan.dev_splits, predictions)
        score = self.main_score(metrics)
        record = {
            "epoch": epoch,
            "train": {k: v / max(progress.count, 1) for k, v in progress.sums.items()},
            "dev": metrics,
        }
        first_split = predictions.get(self.task.dev_splits[0])
        if self.task.labels and first_split:
            record["predicted_classes"] = len(set(first_split))
        record["seconds"] = round(time.perf_counter() - epoch_started, 2)  # a resumed epoch: since the resume
        progress.history.append(record)
        log.info(
            "%s epoch %d/%d: train loss %.4f, %s (%s%s)",
            plan.name,
            epoch,
            plan.epochs,
            record["train"].get("loss", 0.0),
            _format(metrics),
            human_duration(record["seconds"]),
            time_left(progress.history, plan.epochs, early_stopping=bool(plan.patience)),
        )
        if self.tracking is not None:
            self.tracking.log_epoch(plan.name, epoch * len(run.loader), epoch, metrics)
        findings = health.check_epoch(
            plan.name,
            progress.history,
            epochs=plan.epochs,
            lr=plan.lr,
            labels=self.task.labels,
            predictions=first_split,
        )
        for finding in [] if plan.keep_last else findings:
            if finding.code not in progress.warned:
                progress.warned.append(finding.code)
                progress.warnings.append(finding.message)
                log.warning(finding.message)
        best = progress.best_score is None or score > progress.best_score
        if plan.keep_last or self.best_checkpoint == "last" or best:
            progress.best_score, progress.best_epoch, progress.best_dev = score, epoch, metrics
            run.best_state = copy.deepcopy(run.unwrapped.state_dict())
        progress.epoch, progress.step, progress.sums, progress.count = epoch + 1, 0, {}, 0
        return self._stops_early(plan, progress, epoch)

    def _stops_early(self, plan: StagePlan, progress: Progress, epoch: int) -> bool:
        """Whether early stopping ends the stage after ``epoch`` (and says so)."""
        if not (plan.patience and plan.min_epochs <= epoch < plan.epochs):
            return False
        if not stop_early([self.main_score(r["dev"]) for r in progress.history], plan.patience, plan.baseline):
            return False
        progress.stopped_early = epoch
        log.info(
            "%s: no dev improvement for %d epochs since epoch %d: stopping early (patience %d)",
            plan.name,
            plan.patience,
            progress.best_epoch,
            plan.patience,
        )
        return True

    def _save(self, run: StageRun, complete: bool = False) -> Optional[Path]:
        """Checkpoint the stage (the main process writes, every process waits); its directory."""
        checkpoints = run.plan.checkpoints
        if checkpoints is None:
            return None
        run.progress.complete = complete
        path = None
        if self.accelerator.is_main_process:
            path = checkpoints.save(
                run.plan.name, run.progress, run.unwrapped.state_dict(), run.best_state, run.optimizer, run.scheduler
            )
        self.accelerator.wait_for_everyone()
        return path

    def _step(self, run: StageRun, batch: dict, epoch: int, step: int) -> dict[str, float]:
        """One optimizer step on ``batch``, this process's share of a global batch; the loss terms
        of the global batch (each share's loss is weighted by its share: engine/batches.py)."""
        weight = batch.pop("weight")
        teacher = {}
        plan, unwrapped = run.plan, run.unwrapped
        if plan.teacher_cache is not None and unwrapped.needs_teacher:
            logits, layers = plan.teacher_cache.fetch(batch["index"], self.accelerator.device)
            teacher = {"teacher_logits": logits, "teacher_layers": layers}
        if plan.live_teacher is not None and unwrapped.needs_tokens:
            teacher["teacher_tokens"] = plan.live_teacher(batch, self.accelerator.device)
        with self.accelerator.autocast():
            terms = run.module(batch, **teacher)
        loss = terms["loss"]
        if not torch.isfinite(loss):
            values = {k: float(v.detach()) for k, v in terms.items()}
            last = plan.checkpoints.directory(plan.name) if plan.checkpoints is not None else None
            kept = (
                f"the last good checkpoint is {last}"
                if last is not None and last.exists()
                else "no checkpoint was written yet"
            )
            raise NonFiniteLossError(
                f"stage {plan.name!r}, epoch {epoch}, step {step}: the loss is not finite ({values}); {kept}. "
                f"Lower the learning rate or the temperature and resume or rerun."
            )
        self.accelerator.backward(loss * weight)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        if self.accelerator.num_processes > 1:  # log the loss of the global batch, not of this rank's share
            terms = {
                key: self.accelerator.reduce(value.detach() * weight, reduction="mean") for key, value in terms.items()
            }
        return {key: float(value.detach()) for key, value in terms.items()}


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    """What :meth:`Trainer.fit` was asked to train a stage with (see its docstring)."""

    name: str
    epochs: int
    lr: float
    dev_splits: dict[str, EncodedSplit]
    teacher_cache: Optional[TeacherCache]
    live_teacher: Optional[Callable[[dict, torch.device], Any]]
    checkpoints: Optional[Checkpointer]
    patience: int
    min_epochs: int
    keep_last: bool
    #: the dev score of one constant prediction, below which early stopping waits (with ``patience``)
    baseline: Optional[float]


@dataclass(kw_only=True)
class StageRun:
    """A stage in training: the module, optimizer, schedule and data as prepared for the device, and
    where it stands (its progress, the best weights so far, random states still to restore)."""

    plan: StagePlan
    module: Any  # the DistillationModule, wrapped for the device
    unwrapped: DistillationModule
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loader: Any
    shards: ProcessShards
    progress: Progress
    best_state: Optional[dict] = None
    #: the random states of a resumed stage, restored once its first batch iterator exists
    pending_rng: Optional[tuple] = None
    #: a fault planned for this stage (tests: engine/faults.py)
    fault: Any = None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def stage_result(name: str, progress: Progress, started: float) -> StageResult:
    """What training the stage ``name`` gave, from where it stands."""
    return StageResult(
        name,
        history=progress.history,
        best_epoch=progress.best_epoch,
        dev=progress.best_dev,
        seconds=time.perf_counter() - started,
        warnings=progress.warnings,
        stopped_early=progress.stopped_early,
    )


def stopped_by_signal(plan: StagePlan, epoch: int, step: int, path: Optional[Path]) -> RunInterrupted:
    """The error that ends a stage stopped by a signal: where it stopped and how to continue."""
    how = (
        f"checkpoint written to {path}; {plan.checkpoints.how_to_continue}."
        if plan.checkpoints is not None
        else "no checkpoint (checkpoints are off): run it again to start over."
    )
    return RunInterrupted(
        f"stopped by signal {interrupt.requested()} in stage {plan.name!r} at epoch {epoch}, step {step}; {how}",
        interrupt.requested(),
    )


def stop_early(scores: list[float], patience: int, baseline: Optional[float]) -> bool:
    """Whether a stage whose dev scores so far are ``scores`` should stop: the best one is
    ``patience`` or more epochs old. A model that has not yet beaten ``baseline`` (one constant
    prediction: the majority class) has not started learning, and a slow starter (a truncated
    BERT sits at the majority class for its first epochs) is left to train."""
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))  # the first epoch with the best score
    learned = baseline is None or scores[best] > baseline
    return learned and len(scores) - 1 - best >= patience


def time_left(history: list[dict], epochs: int, *, early_stopping: bool) -> str:
    """``"; 2 min 10 s left"`` for the stage's remaining epochs at the mean pace of those timed so far
    (``at most`` where early stopping may end it sooner); empty after the last epoch."""
    remaining = epochs - history[-1]["epoch"]
    timed = [record["seconds"] for record in history if "seconds" in record]
    if remaining <= 0 or not timed:
        return ""
    estimate = human_duration(remaining * sum(timed) / len(timed))
    return f"; {'at most ' if early_stopping else ''}{estimate} left for {remaining} more epoch{'s' * (remaining > 1)}"


def _format(metrics: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{split} {k} {v:.4f}" for split, values in metrics.items() for k, v in values.items())

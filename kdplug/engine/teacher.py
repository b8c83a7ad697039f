"""The teacher side of a run: fine-tune once and store, then cache its outputs once.

A teacher that is not fine-tuned on the task is fine-tuned by the ordinary training loop and
stored under ``<cache>/teachers/<fingerprint>``; the fingerprint covers the base weights, the
tokenizer, the task's training data and the fine-tuning settings, so a later run with the same
inputs loads it instead of training again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader

from .. import fingerprint
from ..storage import atomic_directory, complete_copy, move_aside, verify
from ..token_budget import WINDOW, window_batches
from ..types import LayerExtractor, LayerSpec, Task, Teacher, TokenSignals, num_outputs
from . import cache as cache_module
from . import faults, shares
from .data import Collator, EncodedSplit, encode
from .objective import DistillationModule, WeightedObjective, layer_vectors, model_forward
from .trainer import Trainer, inference_autocast, inference_precision

log = logging.getLogger(__name__)

FINETUNED_MARKER = "kdplug_finetuned.json"


def finetune_key(
    teacher: Teacher, task: Task, train: EncodedSplit, dev: dict[str, EncodedSplit], settings: dict[str, Any]
) -> str:
    """What a fine-tuned teacher depends on: base weights, tokenizer, training data, the dev data
    its best epoch is chosen on, and the settings. The label names too: a teacher is saved with them,
    and two data sets with the same texts and label indices but other names are different tasks."""
    return fingerprint.of_values(
        "teacher-finetune",
        fingerprint.of_module(teacher.model),
        fingerprint.of_tokenizer(teacher.tokenizer),
        task.name,
        list(task.labels),
        fingerprint.of_token_ids(train.input_ids),
        fingerprint.of_values(train.labels),
        {
            name: [fingerprint.of_token_ids(split.input_ids), fingerprint.of_values(split.labels)]
            for name, split in dev.items()
        },
        settings,
    )


def teacher_store(root: Path) -> Path:
    return root / "teachers"


def stored_teacher_dir(root: Path, key: str) -> Optional[Path]:
    """The stored fine-tuned teacher for ``key``, if there is an intact one.

    A damaged copy (a file missing or failing its checksum) is reported, moved aside and
    treated as absent, so the caller fine-tunes again instead of failing in every later run.
    """
    directory = complete_copy(teacher_store(root) / key, lambda path: (path / FINETUNED_MARKER).is_file())
    if directory is None:
        return None
    problems = verify(directory)
    if problems:
        moved = move_aside(directory)
        log.warning(
            "the stored fine-tuned teacher %s is damaged (%s); moved it to %s and fine-tuning the teacher again",
            directory,
            "; ".join(problems),
            moved,
        )
        return None
    return directory


def stored_summary(directory: Path) -> dict[str, Any]:
    """What the stored teacher's fine-tuning recorded (history, best epoch, dev metrics)."""
    try:
        return json.loads((directory / FINETUNED_MARKER).read_text())
    except (OSError, ValueError):
        return {}


def finetune(
    teacher: Teacher,
    extractor: LayerExtractor,
    trainer: Trainer,
    task: Task,
    train: EncodedSplit,
    dev: dict[str, EncodedSplit],
    *,
    epochs: int,
    lr: float,
    task_loss,
    regression: bool,
    checkpoints=None,
    patience: int = 0,
    min_epochs: int = 0,
) -> dict[str, Any]:
    """Fine-tune the teacher in place with CE (MSE for regression); return the stage summary."""
    objective = WeightedObjective(
        eta=0.0, lam=0.0, task_loss=task_loss, kd_loss=None, ild_loss=None, regression=regression
    )
    module = DistillationModule(teacher.model, extractor, None, objective)
    result = trainer.fit(
        "teacher",
        module,
        train,
        dev,
        epochs=epochs,
        lr=lr,
        checkpoints=checkpoints,
        patience=patience,
        min_epochs=min_epochs,
    )
    return {
        **result.summary(),
        "epochs": epochs,
        "patience": patience,
        **({"min_epochs": min_epochs} if min_epochs else {}),
    }


def store(teacher: Teacher, root: Path, key: str, summary: dict[str, Any]) -> Path:
    """Save a fine-tuned teacher atomically, with checksums, under ``root/teachers/key``."""
    if teacher.save_pretrained is None:
        raise RuntimeError("this teacher has no save_pretrained; it cannot be stored for reuse")
    target = teacher_store(root) / key
    with atomic_directory(target, f"the fine-tuned teacher {target}") as staging:
        faults.fire_at("teacher-store")
        teacher.save_pretrained(str(staging))
        marker_path = staging / FINETUNED_MARKER
        marker = json.loads(marker_path.read_text()) if marker_path.is_file() else {}
        marker.update(
            {
                "source": teacher.source,
                "pretrained": teacher.pretrained,
                "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                **summary,
            }
        )
        marker_path.write_text(json.dumps(marker, indent=1, default=str))
    return target


def teacher_encoding(teacher: Teacher) -> Any:
    """What the teacher reads its examples with: its own encoder where it has one (a prompted
    language model's prompt), else its tokenizer."""
    return teacher.encoder if teacher.encoder is not None else teacher.tokenizer


def teacher_splits(
    teacher: Teacher, task: Task, max_length: int, train: EncodedSplit, dev: dict[str, EncodedSplit]
) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
    """The data as the teacher reads it: ``train`` and ``dev`` themselves (the plain text, as the
    students read it) for a teacher that reads with its tokenizer, else the same examples, in the
    same order, encoded by its encoder."""
    if teacher.encoder is None:
        return train, dev

    def encoded(name: str) -> EncodedSplit:
        return encode(task.load_split(name), teacher.encoder, max_length, is_regression=task.is_regression)

    return encoded("train"), {name: encoded(name) for name in dev}


def freeze(teacher: Teacher) -> Teacher:
    teacher.model.eval()
    teacher.model.requires_grad_(False)
    return teacher


class LiveTeacher:
    """The teacher in the loop, for methods that distil per-token signals (the cache keeps one
    vector per layer): its signals for each training batch, computed without gradient, in eval
    mode, in :func:`~kdplug.engine.trainer.inference_precision`'s dtype, and never wrapped by
    Accelerate (so DDP neither syncs nor shards it)."""

    def __init__(self, teacher: Teacher, extractor: LayerExtractor, precision: str) -> None:
        self.teacher, self.model, self.extractor, self.precision = teacher, teacher.model, extractor, precision
        self.device: Optional[torch.device] = None  # where the model was placed, on the first batch

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], device: torch.device) -> TokenSignals:
        if device != self.device:  # once, not a walk over the parameters on every batch
            self.inputs_on = place_teacher(self.teacher, device)
            self.model.eval()
            self.device = device
        if self.inputs_on != device:  # a sharded teacher reads its inputs where its first layer is
            batch = {key: value.to(self.inputs_on) if torch.is_tensor(value) else value for key, value in batch.items()}
        with inference_autocast(self.precision, device):
            _, signals = self.extractor.forward_with_tokens(
                self.model, lambda: model_forward(self.model, batch), batch["attention_mask"]
            )
        return signals if self.teacher.placed_on is None else _moved(signals, device)


def _moved(signals: TokenSignals, device: torch.device) -> TokenSignals:
    """A sharded teacher's signals, each layer's from its own device, on ``device``."""

    def moved(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [tensor.to(device) for tensor in tensors]

    return dataclasses.replace(
        signals,
        mask=signals.mask.to(device),
        hidden=moved(signals.hidden),
        queries=moved(signals.queries),
        keys=moved(signals.keys),
        values=moved(signals.values),
    )


def place_teacher(teacher: Teacher, device: torch.device) -> torch.device:
    """Where the teacher runs: ``device``, the model moved there; a teacher its factory placed itself
    (sharded by a device map, some layers offloaded: ``Teacher.placed_on``) is never moved, and
    reads its inputs on its first layer's device, as Accelerate's hooks expect."""
    if teacher.placed_on is not None:
        return torch.device(teacher.placed_on)
    teacher.model.to(device)
    return device


def matchable_specs(extractor: LayerExtractor, model: torch.nn.Module) -> tuple[list[LayerSpec], list[int]]:
    """The teacher's matchable layer specs and their positions in the extractor's output."""
    specs = extractor.layer_specs(model)
    positions = [i for i, spec in enumerate(specs) if spec.matchable]
    return [specs[i] for i in positions], positions


def _teacher_batches(
    teacher: Teacher,
    extractor: LayerExtractor,
    trainer: Trainer,
    split: EncodedSplit,
    precision: str,
    positions: list[int],
    rows: range,
) -> Iterator[cache_module.CacheBatch]:
    """The teacher's outputs on the examples ``rows`` of ``split``, in the data's order: batch by
    batch, or with a token budget window by window (each window's batches sorted by length, their
    outputs put back in order); the layers at ``positions`` (none: the layer vectors are not
    computed at all)."""
    plan = pass_plan(trainer, split, rows)
    loader = DataLoader(
        split,
        batch_sampler=[batch for window in plan for batch in window],
        collate_fn=Collator(split.pad_id, split.is_regression),
        num_workers=trainer.num_workers,
        pin_memory=trainer.accelerator.device.type == "cuda",  # so the copies to the device need not wait
    )
    device = trainer.accelerator.device
    outputs = _on_host_one_behind(_teacher_outputs(teacher, extractor, trainer, loader, precision, positions), device)
    if trainer.teacher_tokens_per_batch is None:
        yield from outputs
        return
    for window in plan:
        yield in_order([next(outputs) for _ in window])


def _teacher_outputs(
    teacher: Teacher, extractor: LayerExtractor, trainer: Trainer, loader: DataLoader, precision: str, positions
) -> Iterator[cache_module.CacheBatch]:
    device = place_teacher(teacher, trainer.accelerator.device)
    with torch.no_grad(), inference_autocast(precision, device):
        for batch in loader:
            batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            outputs = model_forward(teacher.model, batch)
            layers = layer_vectors(extractor, teacher.model, outputs, batch) if positions else []
            yield batch["index"], outputs.logits.float(), [layers[i].float() for i in positions]


def _on_host_one_behind(batches: Iterator[cache_module.CacheBatch], device: torch.device):
    """On CUDA, each batch's outputs copied to (pinned) host memory without waiting, and handed on
    once the next batch is queued on the device: the cache writes and hashes one batch while the GPU
    computes the next. Elsewhere the batches as they come. The values are the same either way."""
    if device.type != "cuda":
        yield from batches
        return
    waiting = None
    for index, logits, layers in batches:
        copied = (
            index.to("cpu", non_blocking=True),
            logits.to("cpu", non_blocking=True),
            # fp16 on the device, as the cache stores them: half the bytes cross, the same bytes are stored
            [layer.half().to("cpu", non_blocking=True) for layer in layers],
        )
        done = torch.cuda.Event()
        done.record()
        if waiting is not None:
            waiting[1].synchronize()
            yield waiting[0]
        waiting = (copied, done)
    if waiting is not None:
        waiting[1].synchronize()
        yield waiting[0]


def pass_plan(trainer: Trainer, split: EncodedSplit, rows: range) -> list[list[list[int]]]:
    """The teacher pass's batches over ``rows``, in windows: one batch a window of
    :func:`pass_batch_size` examples in the data's order, or, with ``teacher_tokens_per_batch``,
    each window of :data:`~kdplug.token_budget.WINDOW` examples sorted by length and cut by the budget."""
    tokens = trainer.teacher_tokens_per_batch
    if tokens is None:
        size = pass_batch_size(trainer)
        return [[list(range(start, min(start + size, rows.stop)))] for start in range(rows.start, rows.stop, size)]
    return window_batches(split.lengths, rows, tokens)


def pass_steps(trainer: Trainer, num_examples: int) -> int:
    """What the teacher pass yields over ``num_examples``: its batches, or its windows."""
    step = pass_batch_size(trainer) if trainer.teacher_tokens_per_batch is None else WINDOW
    return (num_examples + step - 1) // step


def in_order(batches: list[cache_module.CacheBatch]) -> cache_module.CacheBatch:
    """The outputs of a window's batches as one batch in the order of the examples' indices."""
    index = torch.cat([batch[0] for batch in batches])
    order = torch.argsort(index)
    logits = torch.cat([batch[1] for batch in batches])[order]
    layers = [torch.cat([batch[2][i] for batch in batches])[order] for i in range(len(batches[0][2]))]
    return index[order], logits, layers


def pass_batch_size(trainer: Trainer) -> int:
    """The teacher pass's batch size: twice training's, since no gradients are kept."""
    return trainer.batch_size * 2


def launch_processes(accelerator) -> shares.Processes:
    """The processes of this launch, as the teacher pass shares its work among them."""
    if accelerator.num_processes == 1:
        return shares.ONE_PROCESS
    return shares.Processes(accelerator.process_index, accelerator.num_processes, shares.broadcast)


#: the teacher's part of its cache keys (see :func:`kdplug.fingerprint.of_teacher_model`)
teacher_fingerprint = fingerprint.of_teacher_model


def logits_key(teacher_fingerprint: str, tokenizer_fingerprint: str, split: EncodedSplit, precision: str) -> str:
    """The key of a split's cached logits: teacher weights, tokenizer, token ids and precision (no layers)."""
    return fingerprint.of_values(
        "teacher-logits",
        teacher_fingerprint,
        tokenizer_fingerprint,
        split.token_fingerprint or fingerprint.of_token_ids(split.input_ids),
        precision,
    )


def layers_key(logits: str, specs: list[LayerSpec]) -> str:
    """The key of a split's cached layer vectors: its logits' key and the layers."""
    return fingerprint.of_values("teacher-layers", logits, [(s.index, s.width, s.kind) for s in specs])


def teacher_fingerprints(teacher: Teacher) -> dict[str, str]:
    """The teacher's part of its cache keys: its weights' and its tokenizer's fingerprints (computed
    once by whoever opens several splits)."""
    return {
        "teacher_fingerprint": teacher_fingerprint(teacher.model),
        "tokenizer_fingerprint": fingerprint.of_tokenizer(teacher.tokenizer),
    }


@dataclass(frozen=True, kw_only=True)
class SplitKeys:
    """The keys of a split's cached teacher outputs (``layers``: None where they hold no layer
    vectors), the dtype the teacher runs in, and its matchable layers with their positions in its
    extractor's output."""

    logits: str
    layers: Optional[str]
    dtype: str
    specs: list[LayerSpec]
    positions: list[int]


def split_keys(
    teacher: Teacher,
    extractor: LayerExtractor,
    split: EncodedSplit,
    *,
    precision: str,
    device: Any,
    layers: bool,
    teacher_fingerprint: str,
    tokenizer_fingerprint: str,
) -> SplitKeys:
    """The keys under which the teacher's outputs on ``split`` are cached: what the teacher pass
    (:func:`build_cache`) stores them under and the dry run looks them up by."""
    specs, positions = matchable_specs(extractor, teacher.model)
    dtype = inference_precision(precision, device)  # keyed by what ran, not by the option
    logits = logits_key(teacher_fingerprint, tokenizer_fingerprint, split, dtype)
    return SplitKeys(
        logits=logits,
        layers=layers_key(logits, specs) if layers else None,
        dtype=dtype,
        specs=specs,
        positions=positions,
    )


def build_cache(
    teacher: Teacher,
    extractor: LayerExtractor,
    trainer: Trainer,
    task: Task,
    split_name: str,
    split: EncodedSplit,
    *,
    root: Path,
    precision: str,
    teacher_fingerprint: str,
    tokenizer_fingerprint: str,
    layers: bool = True,
) -> cache_module.TeacherCache:
    """The teacher's outputs on ``split``: its logits, and its layer vectors when ``layers``."""
    keys = split_keys(
        teacher,
        extractor,
        split,
        precision=precision,
        device=trainer.accelerator.device,
        layers=layers,
        teacher_fingerprint=teacher_fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint,
    )
    size = pass_batch_size(trainer)
    return cache_module.open_or_build(
        root / "teacher-cache",
        keys.logits,
        layers_key=keys.layers,
        num_examples=len(split),
        num_outputs=num_outputs(task),
        specs=keys.specs,
        compute=lambda with_layers, rows: _teacher_batches(
            teacher, extractor, trainer, split, precision, keys.positions if with_layers else [], rows
        ),
        description={"teacher": teacher.source, "task": task.name, "split": split_name, "precision": keys.dtype},
        progress=lambda it, n: trainer.progress(it, pass_steps(trainer, n), f"teacher cache {split_name}"),
        processes=launch_processes(trainer.accelerator),
        # shares cut where the pass's batches (or windows) are: each rank computes what one process would
        align=size if trainer.teacher_tokens_per_batch is None else WINDOW,
    )


class TeacherOutputs:
    """The teacher's cached outputs on every dev split and on train, each opened (or computed and
    stored) on first use: dev first, so the teacher is checked before its train outputs, the
    expensive part on a large data set, are computed. Calling it gives ``(train, dev)``.

    ``layers``: whether they include the teacher's layer vectors (the run reads them: see
    :func:`kdplug.engine.preflight.reads_teacher_layers`); a stage that turns out to read them
    anyway asks with ``layers=True``, which adds them beside the logits already stored."""

    def __init__(
        self,
        *,
        teacher: Teacher,
        extractor: LayerExtractor,
        trainer: Trainer,
        task: Task,
        train: EncodedSplit,
        dev: dict[str, EncodedSplit],
        root: Path,
        precision: str,
        layers: bool = True,
    ) -> None:
        self.teacher, self.extractor, self.trainer, self.task = teacher, extractor, trainer, task
        self.train, self.dev = train, dev
        self.root, self.precision, self.layers = root, precision, layers
        self._train: Optional[cache_module.TeacherCache] = None
        self._dev: Optional[dict[str, cache_module.TeacherCache]] = None
        self._fingerprints: Optional[dict[str, str]] = None

    def _common(self) -> dict[str, Any]:
        if self._fingerprints is None:
            self._fingerprints = teacher_fingerprints(self.teacher)
        return {"root": self.root, "precision": self.precision, "layers": self.layers, **self._fingerprints}

    def require_layers(self) -> None:
        """From now on, the layer vectors too: the splits opened without them are opened again
        (their logits entries reused, the layers computed and stored once)."""
        if self.layers:
            return
        log.info("a stage reads the teacher's layer vectors: caching them beside its logits")
        self.layers = True
        self._train, self._dev = None, None

    def dev_caches(self) -> dict[str, cache_module.TeacherCache]:
        if self._dev is None:
            self._dev = {
                name: build_cache(self.teacher, self.extractor, self.trainer, self.task, name, split, **self._common())
                for name, split in self.dev.items()
            }
        return self._dev

    def train_cache(self) -> cache_module.TeacherCache:
        if self._train is None:
            self._train = build_cache(
                self.teacher, self.extractor, self.trainer, self.task, "train", self.train, **self._common()
            )
        return self._train

    def record(self) -> dict[str, Any]:
        """Per split opened so far: bytes of logits and of layers, and whether each was reused."""
        opened = {**({"train": self._train} if self._train is not None else {}), **(self._dev or {})}
        return {name: cache.record() for name, cache in opened.items()}

    def __call__(self, layers: bool = False) -> tuple[cache_module.TeacherCache, dict[str, cache_module.TeacherCache]]:
        if layers:
            self.require_layers()
        dev = self.dev_caches()
        return self.train_cache(), dev

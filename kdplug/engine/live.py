"""The run's side of a stage (:class:`~kdplug.engine.stage.StageSource`): the teacher's outputs
opened or computed, its pseudo classifiers warmed up, the transfer set's share added, and the stage
trained. The dry run's counterpart is :class:`kdplug.engine.plan.PlannedSource`."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from ..capabilities import StudentCapabilities, capabilities
from ..config import RunConfig
from ..types import StageResult, Teacher, num_outputs
from . import variation
from .cache import ConcatCache
from .checkpoint import Checkpointer
from .data import EncodedSplit, WithTransfer
from .heads import warmed_up_heads
from .inputs import RunInputs, transfer_outputs
from .objective import TeacherHeads
from .stage import Stage
from .teacher import TeacherOutputs, freeze, launch_processes
from .transfer_outputs import TransferOutputs

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class LiveSource:
    """A stage's teacher side in a run, for one teacher: its outputs (``caches``, and on the
    transfer set), its heads, warmed up on first use, and each of its layers' input-dependent share
    of energy (engine/variation.py), measured when a stage first matches its layers. A ``--baseline``
    context shares its run's (the same teacher); an assistant's (TAKD) is its own."""

    config: RunConfig
    inputs: RunInputs
    teacher: Teacher
    caches: TeacherOutputs
    #: the teacher's outputs on the run's transfer set, computed on first use (None without one)
    transfer_outputs: Optional[TransferOutputs]
    #: whether an assistant's caches hold its layer vectors from the start (as the run's did)
    cache_layers: bool
    heads: Optional[TeacherHeads] = None
    layer_variation: dict[int, float] = field(default_factory=dict)
    #: an ensemble's member whose layers the stages match (None: ``teacher``)
    layer_teacher: Optional[Teacher] = None

    @classmethod
    def of_run(cls, config: RunConfig, inputs: RunInputs) -> LiveSource:
        """The run's teacher side, over the outputs its ``inputs`` opened."""
        return cls(
            config=config,
            inputs=inputs,
            teacher=inputs.teacher,
            caches=inputs.caches,
            transfer_outputs=inputs.transfer_outputs,
            cache_layers=inputs.caches.layers,
            layer_teacher=inputs.layer_teacher,
        )

    @property
    def transfer_info(self) -> dict[str, Any]:
        """What caching the teacher's outputs on the transfer set cost (seconds, reused or built)."""
        return self.transfer_outputs.info if self.transfer_outputs is not None else {}

    def teacher_cache(self, layers: bool = False) -> tuple[Any, dict[str, Any]]:
        return self.caches(layers=layers)

    def teacher_heads(self, stages: dict[str, dict]) -> TeacherHeads:
        """Each head is selected on a held-out tenth of the training set, never on dev."""
        if self.heads is None:
            train_cache, _ = self.teacher_cache(layers=True)  # the heads read the teacher's layer vectors
            config, task = self.config, self.inputs.task
            heads, summary = warmed_up_heads(
                self.inputs.cache_root,
                train_cache,
                self.inputs.train.labels,
                num_outputs=num_outputs(task),
                is_regression=task.is_regression,
                epochs=config.head_epochs,
                lr=config.head_lr,
                batch_size=config.batch_size,
                seed=config.seed,
            )
            stages["teacher_heads"] = summary
            self.heads = heads
        return self.heads

    def near_constant_layers(self, projector: Optional[nn.Module], train_cache: Any, name: str) -> Optional[str]:
        """The warning (logged now), None if none: see engine/variation.py."""
        matched = variation.matched_teacher_layers(projector, len(train_cache.specs) if train_cache else 0)
        if not matched:
            return None
        if not self.layer_variation:
            self.layer_variation.update(variation.input_dependent_shares(train_cache))
        warning = variation.near_constant_warning(name, projector, matched, self.layer_variation)
        if warning:
            log.warning(warning)
        return warning

    def with_transfer(self, student: nn.Module, train: EncodedSplit, cache: Any) -> tuple[Any, Any, int]:
        """The labelled split followed by the transfer set (read with the student's tokenizer), and both caches."""
        inputs = self.inputs
        if inputs.transfer is None:
            return train, cache, len(train)
        tokenizer = capabilities(StudentCapabilities, student).tokenizer or inputs.tokenizer
        transfer = inputs.transfer.encode(
            tokenizer,
            inputs.max_length,
            is_regression=inputs.task.is_regression,
            processes=launch_processes(inputs.trainer.accelerator),
        )
        ratio = self.config.transfer_ratio
        data = WithTransfer(train, transfer, per_epoch=None if ratio is None else round(ratio * len(train)))
        return data, ConcatCache(cache, self.transfer_outputs(layers=cache.has_layers)), data.epoch_size

    def run(
        self, name: str, stage: Stage, checkpoints: Optional[Checkpointer], note: str = ""
    ) -> tuple[StageResult, dict[str, Any]]:
        log.info("stage %s: %s%s", name, stage.describe(), note)
        result = self.inputs.trainer.fit(
            name,
            stage.module,
            stage.train,
            stage.dev,
            epochs=stage.epochs,
            lr=stage.lr,
            teacher_cache=stage.teacher_cache,
            checkpoints=checkpoints,
            patience=stage.patience,
            min_epochs=stage.min_epochs,
            live_teacher=stage.live_teacher,
            keep_last=stage.keep_last,
        )
        record = {**result.summary(), **stage.settings()}
        if stage.warnings:
            record["warnings"] = [*stage.warnings, *record.get("warnings", [])]
        return result, record

    def for_teacher(self, teacher: Teacher, extractor: Any) -> LiveSource:
        """Its outputs are cached now (keyed by a fingerprint of its weights, tokenizer and data, so a
        reloaded model reuses them), read with its own tokenizer where it has one, so the next stage
        starts from the same state whether the teacher was stored or trained; its heads are warmed
        up separately."""
        freeze(teacher)
        inputs, config = self.inputs, self.config
        train, dev = inputs.splits_with(teacher.tokenizer)
        caches = TeacherOutputs(
            teacher=teacher,
            extractor=extractor,
            trainer=inputs.trainer,
            task=inputs.task,
            train=train,
            dev=dev,
            root=inputs.cache_root,
            precision=config.precision,
            layers=self.cache_layers,
        )
        caches()
        transfer = inputs.transfer
        return dataclasses.replace(
            self,
            teacher=teacher,
            caches=caches,
            transfer_outputs=None
            if transfer is None
            else transfer_outputs(
                config, transfer, teacher, extractor, inputs.trainer, inputs.task, inputs.max_length, inputs.cache_root
            ),
            heads=None,
            layer_variation={},
            layer_teacher=None,
        )

"""What a recipe's ``run(ctx)`` receives: the :class:`RecipeContext` protocol.

A recipe (see the ``kdplug_register_recipes`` hook) trains the student in stages through this
context alone: it creates components by name, reads the run's settings, trains a stage and records
facts, and never sees the engine behind it (its config, registry or caches). The engine implements
it (``kdplug.engine.recipe``), and the dry run plans with it. Plugins import it from here, from
:mod:`kdplug.api` or, as before, from :mod:`kdplug.types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

from .settings import Settings
from .types import LayerSpec, StageResult, Task, Teacher, Weights

if TYPE_CHECKING:  # annotations only: `import kdplug` and `kdplug --help` do not load torch
    from torch import nn


@runtime_checkable
class RecipeContext(Protocol):
    """What a recipe's ``run(ctx)`` receives: everything a training schedule may use, and nothing of
    the engine behind it. kdplug hands recipes a strict view of this protocol: an attribute that is
    not declared here raises an ``AttributeError`` that names the protocol.

    Attributes:
        task: the run's task.
        teacher: the teacher students learn from (fine-tuned, frozen).
        settings: the run's configuration, read-only (``settings.epochs``, ``settings.student`` ...).
        tokenizer: the tokenizer the run's data is read with (the teacher's).
        max_length: tokens per example.
        teacher_precision: the dtype the teacher's outputs are computed in (``"fp32"``, ``"bf16"``,
            ``"fp16"``: what ``settings.precision`` resolved to on this device); key what a recipe
            stores from them by it.
    """

    task: Task
    teacher: Teacher
    settings: Settings
    tokenizer: Any
    max_length: int
    teacher_precision: str

    def has(self, kind: str, name: str) -> bool:
        """Whether a component ``kind`` (``"student"``, ``"teacher"`` ...) named ``name`` is registered."""
        ...

    def new_student(self, name: Optional[str] = None, **options: Any) -> nn.Module:
        """A fresh student: the run's (with its options, seeded with the run's seed), or ``name``'s."""
        ...

    def new_projector(self, student: nn.Module, name: Optional[str] = None, **options: Any) -> nn.Module:
        """The run's projector (or ``name``) for ``student`` and the teacher."""
        ...

    def new_loss(self, name: str, **options: Any) -> Any:
        """A registered loss, e.g. ``new_loss("kd", temperature=5)``."""
        ...

    def new_kd_loss(self, temperature: float) -> Any:
        """The run's loss on the logits at ``temperature``: ``kd_loss`` with ``kd_loss_options``
        (default Hinton's ``kd``; e.g. logit standardisation or ``dist``), MSE for regression.
        Recipes with KD terms of their own (DIH) use it, so the run's choice reaches them."""
        ...

    def new_teacher(self, name: str, **options: Any) -> Teacher:
        """A registered teacher (or checkpoint directory, hub id) for the run's task, e.g. a TAKD assistant."""
        ...

    def weights(
        self,
        projector: Optional[nn.Module],
        *,
        eta: Optional[float] = None,
        lam: Optional[float] = None,
        temperature: Optional[float] = None,
        ce: Optional[float] = None,
    ) -> Weights:
        """A stage's weights: each value given here, else the run's setting, else the projector's default."""
        ...

    def teacher_layer_specs(self) -> list[LayerSpec]:
        """The teacher's matchable layers, in order (what its pseudo classifiers and caches hold)."""
        ...

    def teacher_heads(self) -> Any:
        """The teacher's pseudo classifiers (one per layer), warmed up or reused on first use."""
        ...

    def train_stage(
        self,
        name: str,
        student: nn.Module,
        projector: Optional[nn.Module] = None,
        *,
        weights: Optional[Weights] = None,
        objective: Optional[nn.Module] = None,
        epochs: Optional[int] = None,
        lr: Optional[float] = None,
        patience: Optional[int] = None,
    ) -> StageResult:
        """Train ``student`` (with ``projector``) under ``objective`` (a module whose forward takes a
        :class:`StepState` and returns the loss terms) or the weighted objective of ``weights``.
        Checkpointed, resumable, recorded in metrics.json under ``name``."""
        ...

    def with_teacher(self, teacher: Teacher) -> RecipeContext:
        """A context that distils from ``teacher`` instead (e.g. a trained assistant); its outputs
        are computed and cached now."""
        ...

    def record(self, stage: str, **facts: Any) -> None:
        """Add facts to what metrics.json records of ``stage`` (created if the stage did not run)."""
        ...

    def stage_record(self, stage: str) -> Mapping[str, Any]:
        """What metrics.json records of ``stage`` so far (read-only)."""
        ...

    def store_directory(self, kind: str, key: str) -> Path:
        """Where a recipe keeps what it trained for reuse by later runs (``<cache>/<kind>/<key>``); write
        it with :func:`kdplug.storage.atomic_directory`."""
        ...

    def data_fingerprint(self) -> str:
        """A fingerprint of the run's tokenised training and dev data (for keys of what a recipe stores)."""
        ...

    def teacher_fingerprint(self) -> str:
        """A fingerprint of what students learn from (for keys of what a recipe stores): the teacher's
        weights (:func:`kdplug.fingerprint.of_teacher_model`); for an ensemble, its members' (each as its cache keys
        know it: its weights and its data as it reads it, a prompted member's prompt with it) and their weights."""
        ...

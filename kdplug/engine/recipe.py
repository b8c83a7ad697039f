"""What a recipe can do: build students and projectors, run stages, warm up teacher heads.

A recipe plugin's ``run(ctx)`` drives a :class:`RecipeContext`; the context does the work
(caching, devices, checkpoints, metrics), so a recipe is only its schedule.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from accelerate.utils import set_seed
from torch import nn

from .. import find_layer_extractor
from ..config import RunConfig
from ..errors import UsageError
from ..registry import Registry
from ..types import ProjectionRequest, Task, Teacher, matchable_layers, num_outputs
from . import fingerprint
from .cache import TeacherCache
from .checkpoint import Checkpointer
from .data import EncodedSplit, encode
from .heads import warmed_up_heads
from .objective import DistillationModule, TeacherHeads, WeightedObjective
from .teacher import build_cache, freeze
from .trainer import StageResult, Trainer

log = logging.getLogger(__name__)

DEFAULT_LR = 5e-5
DEFAULT_TEMPERATURE = 1.0


@dataclass
class Weights:
    """The resolved objective weights of a stage: L = (1-eta-lam)·CE + eta·KD + lam·ILD."""

    eta: float
    lam: float
    temperature: float

    def as_dict(self) -> dict[str, float]:
        return {"ce": round(1.0 - self.eta - self.lam, 6), "eta": self.eta, "lam": self.lam, "temperature": self.temperature}


@dataclass
class RecipeContext:
    config: RunConfig
    registry: Registry
    task: Task
    teacher: Teacher
    trainer: Trainer
    train: EncodedSplit
    dev: dict[str, EncodedSplit]
    caches: Any  # callable () -> (train cache, dev caches) built on first use
    cache_root: Any
    stages: dict[str, dict] = field(default_factory=dict)
    checkpoints: Optional[Checkpointer] = None
    _heads: Optional[TeacherHeads] = None
    last_distillation: Optional[tuple[str, DistillationModule]] = None
    #: the tokenizer ``train`` and ``dev`` are encoded with (the run's teacher's); None = the teacher's
    tokenizer: Any = None

    def __post_init__(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = self.teacher.tokenizer

    # -- components -------------------------------------------------------------------------
    def new_student(self, name: Optional[str] = None, **options: Any) -> nn.Module:
        set_seed(self.config.seed)
        opts = {**self.config.student_options, **options} if name is None else options
        return self.registry.create("student", name or self.config.student, self.task, self.teacher, **opts)

    def new_projector(self, student: nn.Module, name: Optional[str] = None, **options: Any) -> nn.Module:
        opts = {**self.config.projector_options, **options} if name is None else options
        return self.registry.create("projector", name or self.config.projector, self.projection_request(student), **opts)

    def projection_request(self, student: nn.Module) -> ProjectionRequest:
        teacher_specs = matchable_layers(find_layer_extractor(self.teacher.model).layer_specs(self.teacher.model))
        student_specs = matchable_layers(find_layer_extractor(student).layer_specs(student))
        return ProjectionRequest(teacher_specs, student_specs, num_outputs(self.task), self.task.is_regression)

    def weights(self, projector: Optional[nn.Module], *, eta: Optional[float] = None, lam: Optional[float] = None,
                temperature: Optional[float] = None) -> Weights:
        """Explicit arguments, else the run's settings, else the projector's defaults."""
        defaults = dict(getattr(projector, "default_weights", {}) or {})
        pick = lambda explicit, configured, key, fallback: next(  # noqa: E731
            v for v in (explicit, configured, defaults.get(key), fallback) if v is not None)
        resolved = Weights(eta=float(pick(eta, self.config.eta, "eta", 0.0)),
                           lam=float(pick(lam, self.config.lam, "lam", 0.0)),
                           temperature=float(pick(temperature, self.config.temperature, "temperature", DEFAULT_TEMPERATURE)))
        if resolved.eta + resolved.lam > 1.0 + 1e-9:
            raise UsageError(f"eta + lam = {resolved.eta + resolved.lam:g} exceeds 1; the CE weight 1 - eta - lam would be negative")
        return resolved

    def objective(self, projector: Optional[nn.Module], weights: Weights) -> WeightedObjective:
        regression = self.task.is_regression
        task_loss = self._loss("mse") if regression else self._loss("ce")
        kd_loss = self._loss("mse") if regression else self._loss("kd", temperature=weights.temperature)
        ild_name = getattr(projector, "ild_loss", None)
        ild_loss = self._loss(ild_name) if ild_name else None
        return WeightedObjective(eta=weights.eta, lam=weights.lam, task_loss=task_loss, kd_loss=kd_loss,
                                 ild_loss=ild_loss, regression=regression)

    def _loss(self, name: str, **options: Any):
        return self.registry.create("loss", name, **options)

    # -- teacher side -----------------------------------------------------------------------
    def teacher_cache(self) -> tuple[TeacherCache, dict[str, TeacherCache]]:
        return self.caches()

    def teacher_heads(self) -> TeacherHeads:
        """The teacher's pseudo classifiers, warmed up (or reused) on first use."""
        if self._heads is None:
            train_cache, dev_caches = self.teacher_cache()
            first = self.task.dev_splits[0]
            heads, summary = warmed_up_heads(
                self.cache_root, train_cache, self.train.labels, dev_caches[first], self.dev[first].labels,
                num_outputs=num_outputs(self.task), is_regression=self.task.is_regression,
                epochs=self.config.head_epochs, lr=self.config.head_lr, batch_size=self.config.batch_size,
                seed=self.config.seed)
            self.stages["teacher_heads"] = summary
            self._heads = heads
        return self._heads

    def with_teacher(self, teacher: Teacher) -> "RecipeContext":
        """A context that distils from ``teacher`` instead, e.g. a trained teaching assistant (TAKD).

        The teacher is frozen; its outputs are cached on first use like the run's teacher's (keyed
        by a fingerprint of its weights, tokenizer and data, so a reloaded model reuses its cache),
        read with its own tokenizer where it has one (``teacher.tokenizer``). Its heads are warmed
        up separately. The data, settings and the record of stages are shared with this context;
        students built by the new context (``new_student``) see ``teacher`` as their teacher.
        """
        freeze(teacher)
        train, dev = self.splits_with(teacher.tokenizer)
        built: dict[str, Any] = {}

        def caches() -> tuple[TeacherCache, dict[str, TeacherCache]]:
            if not built:
                common = {"root": self.cache_root, "precision": self.config.precision,
                          "teacher_fingerprint": fingerprint.of_module(teacher.model),
                          "tokenizer_fingerprint": fingerprint.of_tokenizer(teacher.tokenizer)}
                built["dev"] = {name: build_cache(teacher, self.trainer, self.task, name, split, **common)
                                for name, split in dev.items()}
                built["train"] = build_cache(teacher, self.trainer, self.task, "train", train, **common)
            return built["train"], built["dev"]

        return dataclasses.replace(self, teacher=teacher, caches=caches, _heads=None, last_distillation=None)

    # -- stages -----------------------------------------------------------------------------
    def splits_for(self, student: nn.Module) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
        """The data as this student reads it: re-encoded when it brings its own tokenizer."""
        return self.splits_with(getattr(student, "tokenizer", None))

    def splits_with(self, tokenizer: Any) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
        """The data encoded with ``tokenizer`` (None: the run's encoding)."""
        if tokenizer is None or tokenizer is self.tokenizer:
            return self.train, self.dev
        max_length = self.train_max_length
        train = encode(self.task.load_split("train"), tokenizer, max_length, is_regression=self.task.is_regression)
        dev = {name: encode(self.task.load_split(name), tokenizer, max_length, is_regression=self.task.is_regression)
               for name in self.task.dev_splits}
        return train, dev

    @property
    def train_max_length(self) -> int:
        from .data import default_max_length

        return self.config.max_length or default_max_length(self.task)

    def train_stage(self, name: str, student: nn.Module, projector: Optional[nn.Module] = None, *,
                    weights: Optional[Weights] = None, objective: Optional[nn.Module] = None,
                    epochs: Optional[int] = None, lr: Optional[float] = None) -> StageResult:
        """Train ``student`` (with ``projector``) under ``objective`` or the weighted one."""
        if name in self.stages:
            raise UsageError(f"the recipe runs two stages named {name!r}; stage names must be unique")
        weights = weights or self.weights(projector)
        objective = objective or self.objective(projector, weights)
        if weights.lam == 0:
            projector = None  # its pairs would be weighted by 0: skip the work (and the heads' warm-up)
        # the projector or the objective itself (e.g. DIH's) may read the teacher's pseudo classifiers
        needs_heads = any(getattr(part, "needs_teacher_heads", False) for part in (projector, objective))
        heads = self.teacher_heads() if needs_heads else None
        module = DistillationModule(student, find_layer_extractor(student), projector, objective, heads)
        needs_teacher = module.needs_teacher
        train_cache = self.teacher_cache()[0] if needs_teacher else None
        train, dev = self.splits_for(student)
        check_vocabulary(student, name, [train, *dev.values()])
        lr = lr or self.config.lr or getattr(student, "default_lr", None) or DEFAULT_LR
        epochs = epochs or self.config.epochs
        log.info("stage %s: student %s, projector %s, weights %s, %d epochs, lr %g", name, type(student).__name__,
                 type(projector).__name__ if projector is not None else None, weights.as_dict(), epochs, lr)
        result = self.trainer.fit(name, module, train, dev, epochs=epochs, lr=lr, teacher_cache=train_cache,
                                  checkpoints=self.checkpoints)
        if projector is not None:
            self.last_distillation = (name, module)  # for the attention and layer records
        self.stages[name] = {**result.summary(), "weights": weights.as_dict(), "lr": lr, "epochs": epochs}
        return result

    def distill(self, name: str, student: nn.Module, projector: Optional[nn.Module], **weights: Any) -> StageResult:
        return self.train_stage(name, student, projector, weights=self.weights(projector, **weights))


def check_vocabulary(model: nn.Module, stage: str, splits: list[EncodedSplit]) -> None:
    """Token ids beyond the model's embedding table mean its tokenizer is not the one it was
    built for; say so instead of failing inside an embedding lookup."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(model, "embeddings", None)
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None:
        return
    largest = max((max(ids) for split in splits for ids in split.input_ids if ids), default=-1)
    if largest >= rows:
        raise UsageError(
            f"stage {stage!r}: the student's embedding table has {rows} rows, but its input is tokenised with ids up "
            f"to {largest}: the student and the tokenizer reading its data (the teacher's, unless the student "
            f"carries its own 'tokenizer') do not match. Build the student from this teacher, or give it its own "
            f"tokenizer (e.g. --set student_options.tokenizer=sentencepiece for bilstm/gated-cnn).")

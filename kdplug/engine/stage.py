"""A stage before it trains: what :meth:`EngineContext.train_stage` resolves from a recipe's
request (:class:`StageRequest`): the objective and its losses, the teacher's outputs or the teacher
run live, the data with the transfer set's share, the learning rate, epochs and early stopping, and
the check that the student's vocabulary covers the ids it will read. What it reads of the run's
teacher side comes through :class:`StageSource`, live in a run (engine/live.py) and planned in a
dry run (engine/plan.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from torch import nn

from .. import fingerprint
from ..capabilities import ObjectiveCapabilities, ProjectorCapabilities, StudentCapabilities, capabilities
from ..config import RunConfig
from ..errors import UsageError
from ..types import StageResult, Task, Teacher, Weights, reads_teacher_layers
from . import preflight
from .checkpoint import Checkpointer
from .data import EncodedSplit, WithTransfer
from .ensemble import at_temperature
from .objective import DistillationModule, TeacherHeads, WeightedObjective
from .schedule import DEFAULT_LR, default_epochs, family_default, resolve_min_epochs, resolve_patience, stopping_rule
from .teacher import LiveTeacher


@dataclass(frozen=True, kw_only=True)
class StageRequest:
    """A recipe's request to train a stage: the arguments of :meth:`kdplug.types.RecipeContext.train_stage`
    (see its docstring), declared once: the engine's context turns a call into one of these."""

    name: str
    student: nn.Module
    projector: Optional[nn.Module] = None
    weights: Optional[Weights] = None
    objective: Optional[nn.Module] = None
    epochs: Optional[int] = None
    lr: Optional[float] = None
    patience: Optional[int] = None


class StageSource(Protocol):
    """What a stage reads of the run's teacher side, and where it goes to train: for one teacher
    (the run's, or a recipe's assistant: :meth:`for_teacher`). A run's (engine/live.py) opens or
    computes the teacher's outputs and trains; a dry run's (engine/plan.py) holds their shapes and
    records the stage instead."""

    teacher: Teacher

    def teacher_cache(self, layers: bool = False) -> tuple[Any, dict[str, Any]]:
        """The teacher's outputs on train and dev; with its layer vectors where ``layers``."""
        ...

    def teacher_heads(self, stages: dict[str, dict]) -> Optional[TeacherHeads]:
        """The teacher's pseudo classifiers, warmed up (or reused) on first use; what that did goes to ``stages``."""
        ...

    def near_constant_layers(self, projector: Optional[nn.Module], train_cache: Any, name: str) -> Optional[str]:
        """The warning for the teacher layers ``projector`` (called ``name``) matches whose vectors barely vary."""
        ...

    def with_transfer(self, student: nn.Module, train: EncodedSplit, cache: Any) -> tuple[Any, Any, int]:
        """A distilling stage's data and teacher outputs, the transfer set's share added, and its examples per epoch."""
        ...

    def run(
        self, name: str, stage: Stage, checkpoints: Optional[Checkpointer], note: str = ""
    ) -> tuple[StageResult, dict[str, Any]]:
        """Train ``stage`` (or plan it): its result and what metrics.json (or the plan) records of it.
        ``note``: added to the stage's line in the log (a ``--baseline`` stage's)."""
        ...

    def for_teacher(self, teacher: Teacher, extractor: Any) -> StageSource:
        """The same for ``teacher`` (frozen now), whose layers ``extractor`` reads."""
        ...


@dataclass(kw_only=True)
class Stage:
    """A stage ready to train: what :func:`prepare_stage` resolved."""

    module: DistillationModule
    projector: Optional[nn.Module]
    weights: Weights
    train: Any
    dev: dict[str, EncodedSplit]
    teacher_cache: Any
    epochs: int
    lr: float
    patience: int
    examples: int
    live_teacher: Optional[LiveTeacher] = None
    #: no term of the objective reaches the classifier, so the dev score cannot pick an epoch
    keep_last: bool = False
    #: early stopping does not end the stage before this epoch
    min_epochs: int = 0
    #: the losses of the weighted objective's terms that are on (``kd``, ``ild``): name and options
    losses: dict[str, dict] = field(default_factory=dict)
    #: found before training (e.g. near-constant teacher layers), recorded with the trainer's
    warnings: list[str] = field(default_factory=list)

    def settings(self) -> dict[str, Any]:
        settings = {"weights": self.weights.as_dict(), "lr": self.lr, "epochs": self.epochs, "patience": self.patience}
        if self.losses:
            settings["losses"] = self.losses
        if self.patience:
            settings["min_epochs"] = self.min_epochs
        if self.live_teacher is not None:
            settings["teacher_in_the_loop"] = True
        if self.keep_last:
            settings["kept"] = "last epoch (no term trains the classifier, so dev scores cannot choose)"
        # which teacher layers each student layer learns from
        matching = capabilities(ProjectorCapabilities, self.projector).matching
        if matching is not None:
            settings["matching"] = matching
        return settings

    def describe(self) -> str:
        student = type(self.module.student).__name__
        matcher = capabilities(ProjectorCapabilities, self.projector).name or type(self.projector).__name__
        matching = f", layers matched by {matcher}" if self.projector is not None else ""
        stopping = stopping_rule(self.patience, self.min_epochs, self.epochs)
        if self.keep_last:
            stopping = ", keeping the last epoch (no term trains the classifier)"
        live = ", the teacher run on every batch for its per-token signals" if self.live_teacher is not None else ""
        weights = ", ".join(f"{k} {v:g}" for k, v in self.weights.as_dict().items())
        losses = "".join(f", {term} loss {spec['name']}" for term, spec in self.losses.items())
        return (
            f"{student} student{matching}; weights {weights}{losses}; {self.epochs} epochs at lr {self.lr:g} over "
            f"{self.examples} examples per epoch{live}{stopping}"
        )


def prepare_stage(context: Any, request: StageRequest) -> Stage:
    """Everything a stage trains with, resolved and checked (see :meth:`EngineContext.train_stage`):
    ``context`` is the recipe's (engine/recipe.py), whose ``source`` gives the teacher's side."""
    config, source, name, student = context.config, context.source, request.name, request.student
    if name in context.stages:
        raise UsageError(f"the recipe runs two stages named {name!r}; stage names must be unique")
    check_positions(student, name, context.max_length)
    projector, objective = request.projector, request.objective
    weights = request.weights or context.weights(projector)
    # no term reaches the classifier (TinyBERT's and MiniLMv2's first stage): its dev score says
    # nothing of the stage, so keep the last epoch and train every epoch
    blind = objective is None and weights.ce == 0 and weights.eta == 0
    losses = stage_losses(config, context.task, projector, weights) if objective is None else {}
    objective = objective or weighted_objective(context, projector, weights)
    if weights.lam == 0:
        projector = None  # its pairs would be weighted by 0: skip the work (and the heads' warm-up)
    # the projector or the objective itself (e.g. DIH's) may read the teacher's pseudo classifiers
    needs_heads = bool(
        capabilities(ProjectorCapabilities, projector).needs_teacher_heads
        or capabilities(ObjectiveCapabilities, objective).needs_teacher_heads
    )
    heads = source.teacher_heads(context.stages) if needs_heads else None
    module = DistillationModule(student, context.extractor(student), projector, objective, heads)
    needs_teacher = module.needs_teacher
    needs_layers = needs_heads or (projector is not None and reads_teacher_layers(projector))
    train_cache = source.teacher_cache(layers=needs_layers)[0] if needs_teacher else None
    projector_name = capabilities(ProjectorCapabilities, projector).name or config.projector
    flat_layers = source.near_constant_layers(projector, train_cache, projector_name)
    train, dev = context.splits_for(student)
    examples = len(train)
    if needs_teacher:  # a transfer set only teaches through the teacher's outputs
        train, train_cache, examples = source.with_transfer(student, train, train_cache)
        train_cache = at_temperature(train_cache, weights.temperature)  # an ensemble's target at the stage's
    parts = [train.labelled, train.transfer] if isinstance(train, WithTransfer) else [train]
    check_vocabulary(student, name, [*parts, *dev.values()])
    live = live_teacher(context, student, name) if module.needs_tokens else None
    lr = request.lr or config.lr or family_default(capabilities(StudentCapabilities, student).default_lr, DEFAULT_LR)
    chosen = not (request.epochs or config.epochs)
    epochs = request.epochs or config.epochs or default_epochs(student, examples, config.batch_size)
    patience = request.patience
    patience = 0 if blind else patience if patience is not None else resolve_patience(config.patience, chosen)
    min_epochs = resolve_min_epochs(config.min_epochs, epochs) if patience else 0
    return Stage(
        module=module,
        projector=projector,
        weights=weights,
        train=train,
        dev=dev,
        teacher_cache=train_cache,
        epochs=epochs,
        lr=lr,
        patience=patience,
        examples=examples,
        live_teacher=live,
        keep_last=blind,
        min_epochs=min_epochs,
        losses=losses,
        warnings=[flat_layers] if flat_layers else [],
    )


def kd_loss_choice(config: RunConfig, task: Task) -> tuple[str, dict]:
    """The KD term's loss and its options: the run's ``kd_loss`` (else kd), the MSE of the scores
    for a regression."""
    if task.is_regression:
        if config.kd_loss or config.kd_loss_options:
            raise UsageError(
                f"kd_loss / kd_loss_options choose the loss on a classifier's logits, but task "
                f"{task.name!r} is a regression (its KD term is the MSE of the scores); drop them"
            )
        return "mse", {}
    return config.kd_loss or preflight.DEFAULT_KD_LOSS, dict(config.kd_loss_options)


def ild_loss_choice(config: RunConfig, projector: Optional[nn.Module]) -> Optional[tuple[str, dict]]:
    """The loss on ``projector``'s pairs and its options: the run's ``ild_loss`` (e.g. a loss plugin)
    over the projector's own; None where there is none (no projector, or one that returns terms)."""
    if projector is not None and config.ild_loss:
        return config.ild_loss, dict(config.ild_loss_options)
    declared = capabilities(ProjectorCapabilities, projector)
    if declared.ild_loss:
        return declared.ild_loss, dict(declared.ild_loss_options or {})
    return None


def stage_losses(config: RunConfig, task: Task, projector: Optional[nn.Module], weights: Weights) -> dict[str, dict]:
    """The losses of a weighted stage's terms that are on, for its record: KD's where eta > 0, with
    its temperature, the layer loss where lam > 0."""
    losses: dict[str, dict] = {}
    if weights.eta > 0:
        name, options = kd_loss_choice(config, task)
        temperature = {} if task.is_regression else {"temperature": weights.temperature}
        losses["kd"] = {"name": name, **temperature, **options}
    ild = ild_loss_choice(config, projector) if weights.lam > 0 else None
    if ild is not None:
        losses["ild"] = {"name": ild[0], **ild[1]}
    return losses


def weighted_objective(context: Any, projector: Optional[nn.Module], weights: Weights) -> WeightedObjective:
    """CE on the labels, KD on the teacher's logits and the layer loss on ``projector``'s pairs, as ``weights`` say."""
    regression = context.task.is_regression
    ild = ild_loss_choice(context.config, projector)
    return WeightedObjective(
        eta=weights.eta,
        lam=weights.lam,
        ce=weights.ce,
        task_loss=context.new_loss("mse" if regression else "ce"),
        kd_loss=context.new_kd_loss(weights.temperature),
        ild_loss=None if ild is None else context.new_loss(ild[0], **ild[1]),
        regression=regression,
    )


def live_teacher(context: Any, student: nn.Module, stage: str) -> LiveTeacher:
    """The teacher run on every batch, for a projector that distils per-token signals: both
    models read the same tokens, so the student must read with the teacher's tokenizer."""
    own = capabilities(StudentCapabilities, student).tokenizer
    if own is not None and fingerprint.of_tokenizer(own) != fingerprint.of_tokenizer(context.tokenizer):
        raise UsageError(
            f"stage {stage!r}: {context.config.projector} compares the two models token by token, but the student "
            f"reads with a tokenizer of its own (not the teacher's), so their tokens do not line up; use a student "
            f"built from the teacher (bert-k) or one that shares its tokenizer"
        )
    teacher = getattr(context, "layer_teacher", context.teacher)  # an ensemble's: its layer teacher
    if teacher is not context.teacher and fingerprint.of_tokenizer(teacher.tokenizer) != fingerprint.of_tokenizer(
        context.tokenizer
    ):
        raise UsageError(
            f"stage {stage!r}: {context.config.projector} runs the layer teacher on the students' tokens, but the "
            f"ensemble's layer teacher reads with another tokenizer than its first member, whose tokenizer encodes "
            f"the students' text; list the layer teacher first in teachers (and set layer_teacher=0)"
        )
    return LiveTeacher(teacher, context.extractor(teacher.model), context.config.precision)


def check_positions(model: nn.Module, stage: str, max_length: int) -> None:
    """The run's ``max_length`` is bounded by the teacher's positions; a student reading its own
    tokenizer (an encoder chosen for a decoder teacher) may hold fewer: say so instead of failing
    inside its position embeddings."""
    limit = preflight.position_limit(model)
    if limit is not None and max_length > limit:
        raise UsageError(
            f"stage {stage!r}: the student {type(model).__name__} holds {limit} positions, but the run reads up to "
            f"{max_length} tokens an example; pass --set max_length={limit} (or less), or choose a student with more "
            f"positions"
        )


def check_vocabulary(model: nn.Module, stage: str, splits: list[EncodedSplit]) -> None:
    """Token ids beyond the model's embedding table mean its tokenizer is not the one it was
    built for; say so instead of failing inside an embedding lookup."""
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # not a Hugging Face model, or one that does not say
        embeddings = getattr(model, "embeddings", None)
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None:
        return
    largest = max((largest_id(split) for split in splits), default=-1)
    if largest >= rows:
        raise UsageError(
            f"stage {stage!r}: the student's embedding table has {rows} rows, but its input is tokenised with ids up "
            f"to {largest}: the student and the tokenizer reading its data (the teacher's, unless the student "
            f"carries its own 'tokenizer') do not match. Build the student from this teacher, or give it its own "
            f"tokenizer (e.g. --set student_options.tokenizer=sentencepiece for bilstm/gated-cnn)."
        )


def largest_id(split: EncodedSplit) -> int:
    table = split.input_ids
    if hasattr(table, "ids"):  # a memory-mapped token table: one pass over the flat array
        return int(table.ids.max()) if len(table.ids) else -1
    return max((max(ids) for ids in table if ids), default=-1)

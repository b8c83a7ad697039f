"""The engine's recipe context: what a recipe's ``run(ctx)`` drives.

:class:`EngineContext` implements the public protocol :class:`kdplug.types.RecipeContext` over a
run's inputs (:class:`~kdplug.engine.inputs.RunInputs`, held whole) and a stage source, the
teacher's side of each stage (:class:`~kdplug.engine.stage.StageSource`): live in a run
(engine/live.py), planned in a dry run (engine/plan.py). The defaults live in schedule.py, stage
preparation in stage.py, ``--baseline`` in baseline.py. Recipes receive the context through
:class:`RecipeView`, which lets through the protocol and nothing else: the boundary holds by
contract, not by convention.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from accelerate.utils import set_seed
from torch import nn

from .. import fingerprint
from ..capabilities import ProjectorCapabilities, StudentCapabilities, capabilities
from ..config import RunConfig
from ..errors import UsageError
from ..registry import Registry
from ..storage import building_under
from ..types import (
    LayerSpec,
    ProjectionRequest,
    RecipeContext,
    Settings,
    StageResult,
    Task,
    Teacher,
    TokenSpec,
    Weights,
    matchable_layers,
    num_outputs,
)
from .checkpoint import Checkpointer
from .data import EncodedSplit
from .ensemble import member_fingerprint
from .inputs import RunInputs
from .live import LiveSource
from .objective import DistillationModule, TeacherHeads
from .schedule import DEFAULT_TEMPERATURE
from .speed import served_remotely
from .stage import StageRequest, StageSource, kd_loss_choice, prepare_stage
from .trainer import Trainer, count_parameters, inference_precision

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class EngineContext:
    """The engine's side of :class:`kdplug.types.RecipeContext` (see the module docstring): the run's
    ``inputs``, the teacher's side of its stages (``source``: the run's teacher, or an assistant's
    after :meth:`with_teacher`) and the record of its stages."""

    config: RunConfig
    registry: Registry
    inputs: RunInputs
    source: StageSource
    checkpoints: Optional[Checkpointer] = None
    stages: dict[str, dict] = field(default_factory=dict)
    last_distillation: Optional[tuple[str, DistillationModule]] = None
    #: put before every stage's name: a ``--baseline`` schedule's are ``baseline-<projector>-<stage>``
    stage_prefix: str = ""
    #: added to every stage's line (a ``--baseline`` schedule's: the run's settings it does not use)
    stage_note: str = ""
    _size_checked: bool = False
    _trimmed: dict = field(default_factory=dict)  # tokenizer id -> (trimmed tokenizer, kept ids)

    @classmethod
    def for_run(
        cls, config: RunConfig, registry: Registry, inputs: RunInputs, checkpoints: Optional[Checkpointer] = None
    ) -> EngineContext:
        """The context of a run's recipe over the ``inputs`` it computed once."""
        source = LiveSource.of_run(config, inputs)
        return cls(config=config, registry=registry, inputs=inputs, source=source, checkpoints=checkpoints)

    # -- the run, read-only -------------------------------------------------------------------
    @property
    def task(self) -> Task:
        return self.inputs.task

    @property
    def teacher(self) -> Teacher:
        """The teacher students learn from: the run's, or an assistant's (:meth:`with_teacher`)."""
        return self.source.teacher

    @property
    def trainer(self) -> Trainer:
        return self.inputs.trainer

    @property
    def train(self) -> EncodedSplit:
        return self.inputs.train

    @property
    def dev(self) -> dict[str, EncodedSplit]:
        return self.inputs.dev

    @property
    def tokenizer(self) -> Any:
        """The tokenizer ``train`` and ``dev`` are encoded with (the run's teacher's)."""
        return self.inputs.tokenizer

    @property
    def max_length(self) -> int:
        """Tokens per example (the run's max_length, or the task's default within the teacher's limit)."""
        return self.inputs.max_length

    @property
    def transfer(self) -> Any:
        """The run's transfer set (engine.transfer.TransferSet), None without one."""
        return self.inputs.transfer

    @property
    def settings(self) -> Settings:
        return Settings(self.config.to_dict())

    def has(self, kind: str, name: str) -> bool:
        return bool(self.registry.names(kind, name)) or any(
            e.match(name) is not None for e in self.registry.entries(kind)
        )

    def record(self, stage: str, **facts: Any) -> None:
        self.stages.setdefault(self.stage_prefix + stage, {}).update(facts)

    def stage_record(self, stage: str) -> Any:
        return MappingProxyType(self.stages.get(self.stage_prefix + stage, {}))

    def store_directory(self, kind: str, key: str) -> Path:
        return Path(self.inputs.cache_root) / kind / key

    @property
    def teacher_precision(self) -> str:
        return inference_precision(self.config.precision, self.trainer.accelerator.device)

    def data_fingerprint(self) -> str:
        return fingerprint.of_values(
            fingerprint.of_token_ids(self.train.input_ids),
            self.train.labels,
            {name: fingerprint.of_token_ids(split.input_ids) for name, split in self.dev.items()},
        )

    @property
    def layer_teacher(self) -> Teacher:
        """The teacher whose layers students match: ``teacher``, or in an ensemble its layer teacher."""
        return getattr(self.source, "layer_teacher", None) or self.teacher

    def teacher_fingerprint(self) -> str:
        members = getattr(getattr(self.source, "caches", None), "members", None)
        if members and members[0].teacher is self.teacher:  # the run's ensemble (not an assistant after it)
            return fingerprint.of_values(
                "teacher-ensemble",
                [member_fingerprint(member) for member in members],
                [member.member.weight for member in members],
            )
        key = fingerprint.of_teacher_model(self.teacher.model)
        caches = getattr(self.source, "caches", None)  # not through capabilities(): the run's own outputs
        if self.teacher.encoder is not None and getattr(caches, "teacher", None) is self.teacher:
            # a prompted teacher's prompt and shots are in the data it reads, not in its weights
            train = caches.train
            return fingerprint.of_values(
                "teacher-prompted", key, train.token_fingerprint or fingerprint.of_token_ids(train.input_ids)
            )
        return key

    def teacher_layer_specs(self) -> list[LayerSpec]:
        model = self.layer_teacher.model
        return list(matchable_layers(self.extractor(model).layer_specs(model)))

    # -- components -------------------------------------------------------------------------
    def extractor(self, model: nn.Module):
        """The layer extractor of ``model``, from the run's registry."""
        return self.registry.find_layer_extractor(model)

    def new_student(self, name: Optional[str] = None, **options: Any) -> nn.Module:
        set_seed(self.config.seed)
        opts = {**self.config.student_options, **options} if name is None else options
        factory, source = self.registry.model_reference("student", name or self.config.student)
        with building_under(Path(self.inputs.cache_root)):  # what it stores (a trained tokenizer) goes to the cache
            student = self.registry.create("student", factory, self.task, self.teacher, **{**opts, **source})
        if name is None and self.config.trim_vocab:
            trim_vocabulary(student, self.tokenizer, self, self._trimmed)
        if name is None and not self._size_checked:
            self._size_checked = True
            warn_if_not_smaller(student, self.teacher.model, self.config.student)
        return student

    def new_loss(self, name: str, **options: Any) -> Any:
        return self.registry.create("loss", name, **options)

    def new_kd_loss(self, temperature: float) -> Any:
        name, options = kd_loss_choice(self.config, self.task)
        if self.task.is_regression:
            return self.new_loss(name)
        return self.new_loss(name, temperature=temperature, **options)

    def new_teacher(self, name: str, **options: Any) -> Teacher:
        factory, source = self.registry.model_reference("teacher", name)
        return self.registry.create("teacher", factory, self.task, **{**options, **source})

    def new_projector(self, student: nn.Module, name: Optional[str] = None, **options: Any) -> nn.Module:
        opts = {**self.config.projector_options, **options} if name is None else options
        return self.registry.create(
            "projector", name or self.config.projector, self.projection_request(student), **opts
        )

    def projection_request(self, student: nn.Module) -> ProjectionRequest:
        teacher_model = self.layer_teacher.model
        teacher_extractor, student_extractor = self.extractor(teacher_model), self.extractor(student)
        return ProjectionRequest(
            teacher_layers=matchable_layers(teacher_extractor.layer_specs(teacher_model)),
            student_layers=matchable_layers(student_extractor.layer_specs(student)),
            num_outputs=num_outputs(self.task),
            is_regression=self.task.is_regression,
            seed=self.config.seed,
            teacher_tokens=token_spec(teacher_extractor, teacher_model),
            student_tokens=token_spec(student_extractor, student),
        )

    def weights(self, projector: Optional[nn.Module], **given: Optional[float]) -> Weights:
        return stage_weights(self.config, projector, **given)

    def teacher_cache(self, layers: bool = False) -> tuple[Any, dict[str, Any]]:
        """The teacher's outputs on train and dev; with its layer vectors where ``layers`` (or the run reads them)."""
        return self.source.teacher_cache(layers=layers)

    def teacher_heads(self) -> Optional[TeacherHeads]:
        """The teacher's pseudo classifiers, warmed up (or reused) on first use (None in a dry run)."""
        return self.source.teacher_heads(self.stages)

    def adopt(self, other: EngineContext) -> None:
        """Take over what ``other``, a context over the same teacher side (the baseline's), checked once: the size."""
        self._size_checked = self._size_checked or other._size_checked

    def with_teacher(self, teacher: Teacher) -> EngineContext:
        """A context that distils from ``teacher`` instead, e.g. a trained teaching assistant (TAKD).

        The teacher is frozen; its outputs are cached now like the run's teacher's, read with its
        own tokenizer where it has one (``teacher.tokenizer``). Its heads are warmed up separately.
        The data, settings and the record of stages are shared with this context; students built
        by the new context (``new_student``) see ``teacher`` as their teacher.
        """
        source = self.source.for_teacher(teacher, self.extractor(teacher.model))
        return dataclasses.replace(self, source=source, last_distillation=None)

    # -- stages -----------------------------------------------------------------------------
    def splits_for(self, student: nn.Module) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
        """The data as this student reads it: re-encoded when it brings its own tokenizer."""
        return self.inputs.splits_with(capabilities(StudentCapabilities, student).tokenizer)

    def train_stage(
        self, name: str, student: nn.Module, projector: Optional[nn.Module] = None, **options
    ) -> StageResult:
        """Train ``student`` as :meth:`kdplug.types.RecipeContext.train_stage` says (the arguments:
        :class:`~kdplug.engine.stage.StageRequest`), or plan it in a dry run."""
        stray = sorted(set(options) - STAGE_OPTIONS)
        if stray:  # a recipe author reads their own call, not the engine's dataclass
            raise TypeError(
                f"train_stage() got an unexpected keyword argument {', '.join(map(repr, stray))}; "
                f"besides name, student and projector it takes {', '.join(sorted(STAGE_OPTIONS))}"
            )
        request = StageRequest(name=self.stage_prefix + name, student=student, projector=projector, **options)
        stage = prepare_stage(self, request)
        result, record = self.source.run(request.name, stage, self.checkpoints, self.stage_note)
        if stage.projector is not None:
            self.last_distillation = (request.name, stage.module)  # for the attention and layer records
        self.stages[request.name] = record
        return result


#: the keywords of train_stage beyond its positional arguments
STAGE_OPTIONS = frozenset(f.name for f in dataclasses.fields(StageRequest)) - {"name", "student", "projector"}


def stage_weights(
    config: RunConfig,
    projector: Optional[nn.Module],
    *,
    eta: Optional[float] = None,
    lam: Optional[float] = None,
    temperature: Optional[float] = None,
    ce: Optional[float] = None,
) -> Weights:
    """The weights of a stage: each of ``eta``, ``lam``, ``temperature`` given here, else the run's
    setting, else the projector's default. The CE weight is ``ce`` if given; when the recipe
    passes ``eta`` or ``lam`` it defines the stage, so CE is 1 − eta − lam (two-stage's stage 1
    has none, whatever the run says); otherwise the run's ``ce_weight``, else 1 − eta − lam."""
    defaults = dict(capabilities(ProjectorCapabilities, projector).default_weights or {})

    def pick(*candidates: Optional[float]) -> Optional[float]:
        return next((float(v) for v in candidates if v is not None), None)

    eta_value = pick(eta, config.eta, defaults.get("eta"), 0.0)
    lam_value = pick(lam, config.lam, defaults.get("lam"), 0.0)
    convex = round(1.0 - eta_value - lam_value, 9)  # 1 - 0.7 - 0.3 is 5.6e-17, not 0
    ce_value = (
        pick(ce, convex)
        if eta is not None or lam is not None
        else pick(ce, config.ce_weight, defaults.get("ce"), convex)
    )
    if ce_value < -1e-9:
        raise UsageError(
            f"eta + lam = {eta_value + lam_value:g} exceeds 1, so the CE weight 1 - eta - lam would "
            f"be negative; lower them or set ce_weight"
        )
    temperature_value = pick(temperature, config.temperature, defaults.get("temperature"), DEFAULT_TEMPERATURE)
    return Weights(eta=eta_value, lam=lam_value, temperature=temperature_value, ce=max(ce_value, 0.0))


def token_spec(extractor: Any, model: nn.Module) -> Optional[TokenSpec]:
    """The shape of ``model``'s per-token signals, None when its extractor reads none (a pooled student)."""
    read = getattr(extractor, "token_spec", None)
    return read(model) if read is not None else None


def trim_vocabulary(student: nn.Module, tokenizer: Any, run: Any, trimmed: dict) -> None:
    """``trim_vocab``: the student keeps only the embedding rows of the tokens of the training split,
    the transfer set and ``trim_vocab_corpus`` (the dev splits are held out: the share of their tokens
    read as unknown is logged, recorded, and warned about when high) and reads with a tokenizer trimmed
    to match (kdplug/vocab.py). ``tokenizer``: the run's, for a student without its own; ``trimmed``
    keeps each tokenizer's trim (by id) for the students after the first. ``run``: the recipe context."""
    from ..vocab import TrimReport, kept_token_ids, measure_coverage, read_corpus, trim_embeddings, trim_tokenizer

    config, task = run.config, run.task
    tokenizer = capabilities(StudentCapabilities, student).tokenizer or tokenizer
    rows = student.get_input_embeddings().num_embeddings
    if rows != len(tokenizer):
        raise UsageError(
            f"trim_vocab: the student's embedding table has {rows} rows but its tokenizer "
            f"{len(tokenizer)} tokens; they do not belong together"
        )
    if id(tokenizer) not in trimmed:
        texts = [_text(e) for e in task.load_split("train")]
        if run.transfer is not None:
            texts += [a if b is None else (a, b) for a, b in run.transfer.texts()]
        corpus = read_corpus(config.trim_vocab_corpus, "trim_vocab_corpus") if config.trim_vocab_corpus else ()
        new_tokenizer, kept = trim_tokenizer(
            tokenizer, kept_token_ids(tokenizer, texts, corpus, config.trim_vocab_min_count)
        )
        held_out = [_text(e) for split in task.dev_splits for e in task.load_split(split)]
        coverage = measure_coverage(tokenizer, new_tokenizer, held_out, "dev texts")
        trimmed[id(tokenizer)] = new_tokenizer, kept, coverage
        warning = coverage.warning("Name a corpus of the texts it will serve: --set trim_vocab_corpus=FILE")
        if warning:
            log.warning("trim_vocab: %s", warning)
    trimmed_tokenizer, kept, coverage = trimmed[id(tokenizer)]
    trim_embeddings(student, kept)
    student.tokenizer = trimmed_tokenizer
    report = TrimReport(kept, rows, len(kept), student.get_input_embeddings().embedding_dim)
    init = dict(capabilities(StudentCapabilities, student).kdplug_init or {"init": "random"})
    student.kdplug_init = {**init, "vocabulary": {"before": rows, "after": len(kept), **coverage.record()}}
    log.info("trim_vocab: %s; %s", report.describe(), coverage.describe())


def _text(example: Any) -> Any:
    return example.text_a if example.text_b is None else (example.text_a, example.text_b)


def warn_if_not_smaller(student: nn.Module, teacher: nn.Module, name: str) -> None:
    """Distillation compresses: a student as large as its teacher is almost always a mistake
    (e.g. the paper-sized 23M BiLSTM under a 22.7M MiniLM teacher). A served teacher's size is the server's."""
    if served_remotely(teacher):
        return
    size, teacher_size = count_parameters(student), count_parameters(teacher)
    if size >= teacher_size:
        log.warning(
            "the student %s has %.1fM parameters, as many as the teacher (%.1fM) or more: distillation is "
            "meant to compress, and a large student trained from few labels overfits. Choose a smaller one "
            "(bilstm/gated-cnn: --set student_options.hidden_size=256; bert-k: fewer layers) or a larger "
            "teacher.",
            name,
            size / 1e6,
            teacher_size / 1e6,
        )


#: what a recipe may use of its context: the names :class:`kdplug.types.RecipeContext` declares
PROTOCOL_NAMES = frozenset(name for name in dir(RecipeContext) if not name.startswith("_")) | frozenset(
    getattr(RecipeContext, "__annotations__", {})
)


class RecipeView:
    """The view of a context that a recipe receives: the names of the public protocol
    :class:`kdplug.types.RecipeContext` pass through, any other is an ``AttributeError`` naming the
    protocol, so a recipe cannot come to depend on the engine (its config, registry or caches)."""

    __slots__ = ("_context",)

    def __init__(self, context: Any) -> None:
        object.__setattr__(self, "_context", context)

    def __getattr__(self, name: str) -> Any:
        if name not in PROTOCOL_NAMES:
            hint = {
                "config": "settings",
                "registry": "new_student/new_projector/new_loss/new_teacher/has",
                "stages": "record/stage_record",
                "cache_root": "store_directory",
                "teacher_cache": "teacher_layer_specs",
                "train_max_length": "max_length",
            }.get(name)
            raise AttributeError(
                f"a recipe's context has no {name!r}: recipes may use only what "
                f"kdplug.types.RecipeContext declares" + (f" (use {hint})" if hint else "")
            )
        value = getattr(self._context, name)
        if name == "with_teacher":
            return lambda teacher: RecipeView(value(teacher))
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a recipe's context is read-only (setting {name!r}); record facts with ctx.record")

    def __dir__(self) -> list[str]:
        return sorted(PROTOCOL_NAMES)


def run_recipe(context: EngineContext, options: dict[str, Any], returns: str) -> nn.Module:
    """The student that ``context``'s recipe (built with ``options``) trains, through a :class:`RecipeView`;
    ``returns`` names what it must return, for the error when it returns something else."""
    name = context.config.recipe
    student = context.registry.create("recipe", name, **options).run(RecipeView(context))
    if not isinstance(student, nn.Module):
        raise UsageError(f"recipe {name!r} returned {type(student).__name__}, not {returns}")
    return student

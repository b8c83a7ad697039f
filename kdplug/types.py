"""The small data types that cross the plugin boundary.

Every hook in :mod:`kdplug.hookspecs` speaks in these types, so a plugin never needs to import
the engine. They are deliberately plain: frozen dataclasses and ``typing.Protocol`` classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Optional,
    Protocol,
    runtime_checkable,
)

from .capabilities import (  # noqa: F401  declared there, re-exported: part of this module's contract
    AugmenterCapabilities,
    Capabilities,
    LayerExtractorCapabilities,
    ObjectiveCapabilities,
    ProjectorCapabilities,
    RecipeCapabilities,
    StudentCapabilities,
    TaskCapabilities,
    TeacherCapabilities,
    capabilities,
)
from .settings import Settings  # noqa: F401  declared there, re-exported: part of this module's contract

if TYPE_CHECKING:  # annotations only: `import kdplug` and `kdplug --help` do not load torch
    import torch
    from torch import nn

# --------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------

LAYER_KINDS = ("embedding", "transformer", "lstm", "conv", "other")


@dataclass(frozen=True)
class LayerSpec:
    """One layer's representation as a projector sees it.

    ``index`` counts from 0 (0 = the embedding output for Transformers, which projectors never
    match: its [CLS] vector is the same for every input). ``width`` is the vector's size.
    """

    index: int
    width: int
    kind: str = "other"

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"LayerSpec.kind must be one of {LAYER_KINDS}, got {self.kind!r}")
        if self.width <= 0:
            raise ValueError(f"LayerSpec.width must be positive, got {self.width}")

    @property
    def matchable(self) -> bool:
        """Whether distillation may match this layer (every layer but the embeddings)."""
        return self.kind != "embedding"


def matchable_layers(specs: Sequence[LayerSpec]) -> tuple[LayerSpec, ...]:
    return tuple(spec for spec in specs if spec.matchable)


class LayerExtractor(Protocol):
    """Turns a model's forward outputs into one vector per layer (see the layer-extractor hook)."""

    def supports(self, model: nn.Module) -> bool: ...

    def layer_specs(self, model: nn.Module) -> list[LayerSpec]: ...

    def __call__(self, model: nn.Module, outputs: Any) -> list[torch.Tensor]:
        """Return one ``(batch, spec.width)`` tensor per spec, in the order of ``layer_specs``."""
        ...

    # Optional, for Transformers: the per-token signals that token-level methods distil.
    #
    # def token_spec(self, model) -> TokenSpec | None:
    #     the shape of the model's signals; None when it has none (a pooled BiLSTM).
    # def forward_with_tokens(self, model, forward: Callable[[], Any], mask) -> tuple[Any, TokenSignals]:
    #     run ``forward()`` (the model's forward on one batch) and return its outputs with the
    #     model's signals for that batch (``mask``: its attention mask).


@dataclass(frozen=True)
class TokenSpec:
    """The shape of a Transformer's per-token signals (see :class:`TokenSignals`): ``layers``
    Transformer blocks of width ``width`` with ``heads`` attention heads."""

    layers: int
    width: int
    heads: int


@dataclass(frozen=True)
class ModelShape:
    """What a model will be, as far as distillation methods see it, known before it is built: its
    matchable layers (as its layer extractor will report them, the embedding layer left out) and
    its per-token signals (None for a pooled student). Teacher and student factories may declare
    it, read from a config in milliseconds (see the teacher and student hooks), so that the
    projector's options are checked against both models before the teacher is loaded or
    fine-tuned (see :meth:`ProjectionRequest.from_shapes`)."""

    layers: tuple[LayerSpec, ...]
    tokens: Optional[TokenSpec] = None

    @classmethod
    def transformer(cls, layers: int, width: int, heads: Optional[int] = None) -> ModelShape:
        """``layers`` Transformer blocks of ``width`` (and ``heads`` attention heads, where known)."""
        blocks = tuple(LayerSpec(index, width, "transformer") for index in range(1, layers + 1))
        return cls(blocks, TokenSpec(layers, width, heads) if heads else None)

    @property
    def width(self) -> int:
        """The width of the last layer (the one whose vector a student as wide as its teacher matches)."""
        return self.layers[-1].width


@dataclass
class TokenSignals:
    """One model's per-token signals for one batch, for methods that distil token by token
    (TinyBERT, MiniLMv2). The teacher's carry no gradient; the student's do.

    Attributes:
        mask: ``(batch, L)`` bool, True at real tokens (False at padding).
        hidden: ``layers + 1`` tensors ``(batch, L, width)``: the embedding output, then the
            output of each Transformer block.
        queries, keys, values: one ``(batch, L, width)`` tensor per block: the outputs of its
            self-attention's query, key and value projections, all heads side by side.
        heads: attention heads per block (a head is ``width / heads`` wide).
    """

    mask: torch.Tensor
    hidden: list[torch.Tensor]
    queries: list[torch.Tensor]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    heads: int

    def attention_scores(self, layer: int) -> torch.Tensor:
        """Block ``layer``'s (1-based) attention scores before the softmax, QKᵀ/√d_head per head:
        ``(batch, heads, L, L)`` (TinyBERT's A), in float32; no mask added. For absolute-position
        encoders (BERT, RoBERTa): a relative-position encoder's extra score terms are not in it."""
        query, key = self.queries[layer - 1].float(), self.keys[layer - 1].float()
        batch, length, width = query.shape
        size = width // self.heads
        query = query.view(batch, length, self.heads, size).transpose(1, 2)  # (B, h, L, d_head)
        key = key.view(batch, length, self.heads, size).transpose(1, 2)
        return query @ key.transpose(-1, -2) / size**0.5


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One labelled input. ``text_b`` is None for single-sentence tasks.

    ``label`` is the class index (classification) or the float target (regression).
    """

    text_a: str
    label: float | int
    text_b: Optional[str] = None


@runtime_checkable
class Task(Protocol):
    """A data set plus its metric. Returned by task factories (see the task hook).

    Attributes:
        name: registry name, e.g. ``"sst2"``.
        labels: class names in the label order of the data set (GLUE's order for GLUE tasks);
            empty for regression.
        is_regression: one output, MSE in place of CE/KL.
        is_pair: each example has ``text_b``.
        main_metric: the key of :meth:`compute_metrics` used to pick the best checkpoint.
        dev_splits: the evaluation splits, the first is the one model selection uses
            (MNLI: ``("dev_matched", "dev_mismatched")``).

    What else a task may declare (``text_columns``, ``hub_dataset``): :class:`TaskCapabilities`.
    """

    name: str
    labels: tuple[str, ...]
    is_regression: bool
    is_pair: bool
    main_metric: str
    dev_splits: tuple[str, ...]

    def load_split(self, split: str) -> Sequence[Example]: ...  # a list, or any sequence of examples

    def compute_metrics(self, predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
        """``predictions`` are class indices (classification) or floats (regression)."""
        ...


def num_outputs(task: Task) -> int:
    """Width of a model's output layer for ``task``: 1 for regression, else the class count."""
    return 1 if task.is_regression else len(task.labels)


def text_columns(task: Task) -> tuple[str, ...]:
    """The task's input column names: its own, else ``text`` (and ``text_pair`` for pairs)."""
    columns = tuple(capabilities(TaskCapabilities, task).text_columns or ())
    return columns or (("text", "text_pair") if task.is_pair else ("text",))


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass
class Teacher:
    """A teacher as a teacher factory returns it.

    Attributes:
        model: a module whose forward takes ``input_ids``, ``attention_mask`` (and optionally
            ``token_type_ids``) and returns an object with ``.logits`` (``(batch, C)``) plus
            whatever its layer extractor needs (for Hugging Face models: ``hidden_states``).
        tokenizer: a Hugging Face tokenizer (callable on text or text pairs).
        source: the hub id or directory it was loaded from; part of every fingerprint.
        finetuned: True when ``model`` is already fine-tuned on the task; otherwise the engine
            fine-tunes it first (and stores the result for later runs).
        save_pretrained: writes the model and tokenizer to a directory such that the same
            factory, given that directory as ``source``, loads it back.
        pretrained: the pre-trained checkpoint (hub id or directory) the teacher was, or will be,
            fine-tuned from; students that start from pre-trained weights (PKD's BERT-k) load
            them from here. None when unknown (a teacher passed already fine-tuned that does not
            name its base model): never a fine-tuned checkpoint.
        extra: facts about the teacher the run records in metrics.json (e.g. how a fine-tuned
            checkpoint's labels were matched to the task's).
        notes: what the user should read before the run goes on (printed once, and recorded).
        finetuning: how the engine fine-tunes it where not every weight (LoRA: ``{"method": ...,
            "lora": {...}}``); part of the stored teacher's key, shown and recorded. Empty: every weight.
        default_lr: the fine-tuning learning rate when ``teacher_lr`` is unset (None: 5e-5).
        after_finetuning: called once it is fine-tuned and stored (a LoRA teacher merges its adapter).
        encoder: how it reads an example where not ``tokenizer`` on the plain text (a prompted
            model's prompt): called like a tokenizer, with a ``pad_token_id``. Its cached outputs
            are computed on this encoding; students read the plain text. None: ``tokenizer``.
        placed_on: set where the factory placed the model itself (sharded over devices by a device
            map, some layers offloaded): the device its inputs go to, as Accelerate's hooks expect
            (its first GPU; the CPU where it has none). The engine then never moves it. None: the
            engine puts it on the run's device.
    """

    model: nn.Module
    tokenizer: Any
    source: str
    finetuned: bool = False
    save_pretrained: Optional[Callable[[str], None]] = None
    pretrained: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    finetuning: dict[str, Any] = field(default_factory=dict)
    default_lr: Optional[float] = None
    after_finetuning: Optional[Callable[[], None]] = None
    encoder: Any = None
    placed_on: Optional[str] = None


@runtime_checkable
class Student(Protocol):
    """A student is an ``nn.Module`` whose forward takes ``input_ids``, ``attention_mask`` (and
    optionally ``token_type_ids``) and returns an object with ``.logits``, and may have a
    ``save_pretrained(dir)`` method. What else it may declare (its own ``tokenizer``, ``kdplug_init``,
    the family's training defaults such as ``default_lr``): :class:`StudentCapabilities`."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> Any: ...


# --------------------------------------------------------------------------------------------
# Projectors and losses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectionRequest:
    """What a projector factory is told about the two models.

    ``teacher_layers`` and ``student_layers`` hold only matchable layers (no embedding layer),
    in order; the student's last entry is its output layer. ``seed`` is the run's seed, for a
    projector that draws something once per run (a random layer map). ``teacher_tokens`` and
    ``student_tokens`` describe each model's per-token signals, None for a model without them
    (a pooled BiLSTM or CNN student).
    """

    teacher_layers: tuple[LayerSpec, ...]
    student_layers: tuple[LayerSpec, ...]
    num_outputs: int
    is_regression: bool = False
    seed: int = 0
    teacher_tokens: Optional[TokenSpec] = None
    student_tokens: Optional[TokenSpec] = None

    @classmethod
    def from_shapes(cls, teacher: ModelShape, student: ModelShape, task: Task, seed: int = 0) -> ProjectionRequest:
        """The request a projector will get for these two models on ``task``, from their shapes."""
        return cls(
            matchable_layers(teacher.layers),
            matchable_layers(student.layers),
            num_outputs(task),
            task.is_regression,
            seed=seed,
            teacher_tokens=teacher.tokens,
            student_tokens=student.tokens,
        )


@dataclass
class DistillInputs:
    """One batch as a projector sees it. Teacher tensors carry no gradient.

    Attributes:
        teacher_layers: ``n`` tensors ``(batch, width_i)``, matching ``request.teacher_layers``.
        student_layers: ``m`` tensors ``(batch, width_j)``, matching ``request.student_layers``.
        teacher_logits / student_logits: ``(batch, C)``.
        teacher_head_logits: ``(batch, n, C)`` logits of the teacher's warmed-up pseudo
            classifiers (one per teacher layer), present when the projector asked for them.
        teacher_tokens / student_tokens: both models' per-token signals, present when the
            projector says ``needs_tokens`` (the engine then runs the teacher on every batch).
    """

    teacher_layers: list[torch.Tensor]
    student_layers: list[torch.Tensor]
    teacher_logits: torch.Tensor
    student_logits: torch.Tensor
    teacher_head_logits: Optional[torch.Tensor] = None
    teacher_tokens: Optional[TokenSignals] = None
    student_tokens: Optional[TokenSignals] = None


@dataclass
class ProjectedPairs:
    """What a projector returns: ``P`` pairs to compare with its ILD loss.

    ``student`` and ``teacher`` are ``(batch, P, D)``. ``weights`` (``(batch, P)``), when set,
    scales each pair's per-example loss (attention on the losses). ``attention`` (``(batch, P,
    n)``), when set, is what the report draws: how much each matched student layer drew on each
    teacher layer.

    ``terms`` (``(batch, P)``) is for methods whose pairs are not two vectors of one width
    (TinyBERT's per-token hidden states and attention maps): each example's loss for each pair,
    computed by the projector, whose ``ild_loss`` is then None. The engine reduces them as
    every pair loss does: weighted, averaged over the batch, summed over the pairs.
    """

    student: Optional[torch.Tensor] = None
    teacher: Optional[torch.Tensor] = None
    weights: Optional[torch.Tensor] = None
    attention: Optional[torch.Tensor] = None
    terms: Optional[torch.Tensor] = None


class Projector(Protocol):
    """An ``nn.Module`` built by a projector factory: ``forward(inputs: DistillInputs) ->
    ProjectedPairs | None`` (None: a logit-only method).

    The class attributes it may declare (``ild_loss``, ``default_weights``, ``needs_tokens`` ...),
    with their defaults and meanings: :class:`ProjectorCapabilities`.
    """

    ild_loss: Optional[str]
    needs_teacher_heads: bool
    default_weights: Mapping[str, float]

    def __call__(self, inputs: DistillInputs) -> Optional[ProjectedPairs]: ...


def reads_teacher_layers(component: Any) -> bool:
    """Whether a projector or recipe (its class or an instance) reads the teacher's layer vectors:
    what it says in ``reads_teacher_layers``, and True where it says nothing (a method kdplug does
    not know gets the layers rather than an empty list)."""
    return capabilities(ProjectorCapabilities, component).reads_teacher_layers is not False


@dataclass
class StepState:
    """Everything an objective may use for one batch (teacher tensors carry no gradient).

    ``labelled`` ``(batch,)`` is True where the example has a gold label (examples of an
    unlabelled transfer set have none); CE-like terms must only count those rows. None means
    every row is labelled. ``labelled_weight``, set when the batch is one process's share of a
    global batch that holds labelled rows, scales the CE over this share's labelled rows to its part of
    the global batch's labelled mean (engine/batches.py); such a share without a labelled row still
    gets a CE term (zero), as every process must return the same terms.
    """

    student_logits: torch.Tensor
    student_layers: list[torch.Tensor]
    labels: torch.Tensor
    teacher_logits: Optional[torch.Tensor]
    teacher_layers: Optional[list[torch.Tensor]]
    teacher_head_logits: Optional[torch.Tensor]
    pairs: Optional[ProjectedPairs]
    labelled: Optional[torch.Tensor] = None
    labelled_weight: Optional[float] = None

    def labelled_loss(
        self, task_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], regression: bool = False
    ) -> Optional[torch.Tensor]:
        """``task_loss(logits, labels)`` (CE, or MSE for regression) over the rows that have a gold
        label; None when the batch has none (a batch drawn from an unlabelled transfer set)."""
        logits = self.student_logits.squeeze(-1) if regression else self.student_logits  # (B, 1) -> (B,)
        labels = self.labels
        if self.labelled is not None:
            if not bool(self.labelled.any()):
                return None if self.labelled_weight is None else logits.sum() * 0.0
            logits, labels = logits[self.labelled], labels[self.labelled]
        loss = task_loss(logits, labels)
        return loss if self.labelled_weight is None else loss * self.labelled_weight


# --------------------------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------------------------


@dataclass
class Weights:
    """The resolved objective weights of a stage: L = ce·CE + eta·KD + lam·ILD, KD at ``temperature``."""

    eta: float
    lam: float
    temperature: float
    ce: float

    def as_dict(self) -> dict[str, float]:
        return {"ce": round(self.ce, 6), "eta": self.eta, "lam": self.lam, "temperature": self.temperature}


@dataclass
class StageResult:
    """What training a stage gave: per-epoch history, the kept (best) epoch and its dev metrics."""

    name: str
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    dev: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    #: the epoch after which early stopping ended the stage (None: it ran every epoch)
    stopped_early: Optional[int] = None

    def summary(self) -> dict[str, Any]:
        summary = {
            "best_epoch": self.best_epoch,
            "dev": self.dev,
            "history": self.history,
            "seconds": round(self.seconds, 2),
        }
        if self.stopped_early is not None:
            summary["stopped_early"] = self.stopped_early
        if self.warnings:
            summary["warnings"] = self.warnings
        return summary


# --------------------------------------------------------------------------------------------
# Augmentation
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Augmenter(Protocol):
    """Makes a new input from one sentence: built by an augmenter factory (see the augmenter hook).

    ``prepare(sentences)`` (optional) is called once before any copy, with every training sentence
    (a read-only sequence, repeats included), e.g. to learn which words share a part of speech; with
    ``prepare_share(sentences)`` (the work on a share of the distinct sentences, JSON-serialisable)
    and ``prepare_join(shares)`` too, each process of a launch prepares a share. ``__call__(text,
    rng)`` returns one augmented copy of ``text``, drawing every random choice from ``rng`` (a
    ``random.Random``), so the same seed gives the same set, whichever process makes the copy.
    """

    def __call__(self, text: str, rng: Any) -> str: ...


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


class Register(Protocol):
    """The callback every registration hook receives.

    ``register(name, factory, description="")``. ``name`` may hold one ``{int}``-style field,
    e.g. ``"bert-{layers}"``: then ``bert-4`` calls ``factory(..., layers=4)``.
    """

    def __call__(self, name: str, factory: Callable[..., Any], description: str = "") -> None: ...


def __getattr__(name: str) -> Any:
    """``RecipeContext``, which plugins import from here, declared in :mod:`kdplug.recipe_context`
    (imported on first use: that module is built on the types above)."""
    if name == "RecipeContext":
        from .recipe_context import RecipeContext

        return RecipeContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

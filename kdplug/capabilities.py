"""What a component may declare about itself, and the one function the engine reads it with.

A component tells the engine what it needs by attributes of its class (or of its factory): a
projector that reads no teacher output says ``reads_teacher = False``, the recipe of runs that
name none says ``is_default = True``. Each kind's attributes are declared here, with their type,
their default and what they mean. A plugin's class may inherit its kind's declaration, for the
defaults and an editor's completion (``class MyProjector(nn.Module, ProjectorCapabilities)``), or
set only the attributes it needs. The engine reads them through :func:`capabilities` alone, so a
name it misspells fails at once instead of reading a default for ever. docs/hooks.md lists them
(tests/core/test_capabilities.py keeps the two the same). Plugins import these from
:mod:`kdplug.types`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Optional, TypeVar, cast


class Capabilities:
    """What a component of any kind may declare (here, on its factory)."""

    stores: ClassVar[Mapping[str, str]] = {}
    """``{folder: title}``: the folders it keeps under kdplug's cache directory, which ``kdplug cache`` lists and
    clears (and no other); it finds the run's cache directory with ``kdplug.api.cache_root()``, and writes each
    entry with ``atomic_directory`` (what kdplug did not write is never listed or cleared)."""

    check_options: ClassVar[Optional[Callable[..., None]]] = None
    """``check_options(*args, **options)``: raises UsageError for option values it rules out, without building
    anything (before the models load). One whose ``placeholders`` attribute is True reads the options alone and
    is called also where the positional arguments are placeholders (None), before the run directory is made."""


class TeacherCapabilities(Capabilities):
    """What a teacher factory may declare."""

    loads_checkpoints: ClassVar[bool] = False
    """True for the factory that loads any checkpoint directory or hub id given as ``source`` (``--teacher DIR``)."""
    shape: ClassVar[Optional[Callable[..., Any]]] = None
    """``shape(task, **options)``: the ``ModelShape`` the teacher will have, read without its weights (None:
    unknown)."""
    has_layers: ClassVar[bool] = True
    """False for a teacher whose layers kdplug never sees (a model served over HTTP): a run whose method reads the
    teacher's layer vectors is refused before the teacher is built."""


class StudentCapabilities(Capabilities):
    """What a student factory (``loads_checkpoints``, ``shape``, ``token_signals``) or the model it
    builds (the rest) may declare."""

    loads_checkpoints: ClassVar[bool] = False
    """True for the factory that loads any checkpoint directory or hub id given as ``source`` (``--student DIR``)."""
    shape: ClassVar[Optional[Callable[..., Any]]] = None
    """``shape(task, teacher_shape, **options)``: the ``ModelShape`` the student will have, without building it
    (None: unknown)."""
    token_signals: ClassVar[bool] = True
    """False for a student that pools each sentence into one vector per layer: token-level methods (TinyBERT,
    MiniLMv2) refuse it."""
    tokenizer: Any = None
    """The student's own tokenizer (None: the teacher's)."""
    kdplug_init: Optional[Mapping[str, Any]] = None
    """Where the student's initial weights came from, which the run records (None: ``{"init": "random"}``); a
    ``"tokenizer"`` entry says why it reads the vocabulary it reads, where that was chosen for it (the dry run
    prints it)."""
    default_lr: ClassVar[Optional[float]] = None
    """The family's learning rate where the run sets none (None: kdplug's)."""
    default_epochs: ClassVar[Optional[int]] = None
    """The least epochs the family trains where the run sets none (None: kdplug's)."""
    default_steps: ClassVar[Optional[int]] = None
    """The optimizer steps a run without ``epochs`` trains to, stopping early (None: kdplug's)."""
    max_default_epochs: ClassVar[Optional[int]] = None
    """The most epochs ``default_steps`` may take (None: kdplug's)."""
    from_scratch: ClassVar[bool] = False
    """True for a family without pre-trained weights: kdplug then points runs on few labels to transfer sets."""


class LayerExtractorCapabilities(Capabilities):
    """What a layer extractor may declare."""

    reads_inputs: ClassVar[bool] = False
    """True for an extractor called as ``extractor(model, outputs, inputs)``, with the batch's ``input_ids`` and
    ``attention_mask``: where it reads depends on them (a decoder's last real token)."""


class ProjectorCapabilities(Capabilities):
    """What a projector (its class, which is usually its factory) may declare."""

    name: ClassVar[Optional[str]] = None
    """The method's name in the run's messages (None: the registered name)."""
    ild_loss: ClassVar[Optional[str]] = None
    """The registered loss that compares the pairs (``"mse"``); None for a projector that returns
    ``ProjectedPairs.terms``."""
    ild_loss_options: ClassVar[Mapping[str, Any]] = {}
    """Keyword options for that loss (``{"reduction": "mean"}``)."""
    default_weights: ClassVar[Mapping[str, float]] = {}
    """``eta``, ``lam``, ``temperature`` (and optionally ``ce``) where the run does not set them."""
    default_recipe: ClassVar[Optional[str]] = None
    """The recipe of a run that names none (``"two-stage"`` for Universal-KD; None: the default recipe)."""
    reads_teacher: ClassVar[bool] = True
    """False for a method that reads no teacher output (nkd): the run then needs no teacher outputs."""
    reads_teacher_layers: ClassVar[bool] = True
    """False for a method that reads only the teacher's logits (rkd): its ``inputs.teacher_layers`` is empty, and a
    teacher cache that no method reads layers from holds none."""
    needs_teacher_heads: ClassVar[bool] = False
    """True when forward reads ``inputs.teacher_head_logits``: one pseudo classifier per teacher layer is warmed up
    first."""
    needs_tokens: ClassVar[bool] = False
    """True when forward reads both models' ``TokenSignals``: the teacher then runs on every batch (TinyBERT,
    MiniLMv2)."""
    pairs_per_example: ClassVar[bool] = True
    """False where the pairs describe the whole batch (CKA's Gram matrices): the run records no per-example pairs."""
    matching: Optional[Mapping[str, Any]] = None
    """(may be a property) Which teacher layers each student layer learns from, as JSON, recorded with the stage."""
    layer_map: Any = None
    """The teacher layers matched to each student layer, as ``projector_options.layer_map`` sets them (PKD, CKD,
    ALP, CKA)."""
    citation: ClassVar[Optional[str]] = None
    """The method's BibTeX entry, which the model card of a student it trained cites."""


class RecipeCapabilities(Capabilities):
    """What a recipe (its class, which is usually its factory) may declare."""

    is_default: ClassVar[bool] = False
    """True for the recipe of runs that name none and whose projector has no ``default_recipe`` (kdplug's
    ``standard``)."""
    uses_projector: ClassVar[bool] = True
    """False for a recipe whose stages train with a loss of its own, never the run's projector (DIH, TAKD,
    annealing)."""
    reads_teacher_layers: ClassVar[Optional[bool]] = None
    """Whether it reads the teacher's layer vectors: None leaves it to the projector (or, with ``uses_projector =
    False``, says True)."""
    uses_kd_loss: ClassVar[bool] = True
    """False for a recipe with a loss on the logits of its own: a run that sets ``kd_loss`` is refused."""
    citation: ClassVar[Optional[str]] = None
    """The method's BibTeX entry, which the model card of a student it trained cites."""


class ObjectiveCapabilities:
    """What a recipe's own objective (``ctx.train_stage(..., objective=...)``) may declare."""

    needs_teacher: ClassVar[bool] = True
    """False for an objective that reads no teacher output: its stage computes none."""
    needs_teacher_heads: ClassVar[bool] = False
    """True when it reads ``StepState.teacher_head_logits``: the teacher's pseudo classifiers are warmed up first."""


class TaskCapabilities(Capabilities):
    """What a task may declare besides the :class:`~kdplug.types.Task` protocol."""

    text_columns: ClassVar[tuple[str, ...]] = ()
    """The input columns of the task's files, one or two (``("sentence",)``); ``()``: ``text`` (and ``text_pair``)."""
    hub_dataset: ClassVar[Optional[str]] = None
    """The data set's Hugging Face hub id (``"nyu-mll/glue"``), which the student's model card names."""


class AugmenterCapabilities(Capabilities):
    """What an augmenter (or, for ``check_options``, its factory) may declare."""

    pair_schedule: ClassVar[str] = "cycle"
    """For sentence pairs: ``"cycle"`` augments the first, the second, then both; anything else always both."""
    mask_token: ClassVar[Optional[str]] = None
    """A token written in place of words; each tokenizer reads it as its mask or unknown token, never an end or pad."""
    reads_teacher_weights: ClassVar[bool] = False
    """It reads the teacher's weights (its word embeddings, its MLM head): refused before any work for a teacher
    whose weights are not in kdplug's process (``has_layers = False``: a served model)."""


#: each registry kind's declaration (a kind that declares nothing more than any component: Capabilities)
CAPABILITIES: Mapping[str, type[Capabilities]] = {
    "teacher": TeacherCapabilities,
    "student": StudentCapabilities,
    "layer_extractor": LayerExtractorCapabilities,
    "projector": ProjectorCapabilities,
    "loss": Capabilities,
    "task": TaskCapabilities,
    "recipe": RecipeCapabilities,
    "augmenter": AugmenterCapabilities,
}

Declaration = TypeVar("Declaration")


def capabilities(declaration: type[Declaration], component: Any) -> Declaration:
    """What ``component`` (a factory, a class or an instance) declares of ``declaration``'s
    attributes: each one it sets, else the declared default. Reading a name the declaration does
    not declare raises AttributeError (the engine's typo, caught on first use)."""
    return cast(Declaration, _Declared(declaration, component))


@functools.cache
def declared(declaration: type) -> Mapping[str, Any]:
    """The names ``declaration`` declares (its own and its bases'), each with its default."""
    names = [name for cls in reversed(declaration.__mro__) for name in inspect.get_annotations(cls)]
    return {name: getattr(declaration, name) for name in dict.fromkeys(names) if not name.startswith("_")}


class _Declared:
    """A component seen through a declaration: only declared names, with their defaults."""

    __slots__ = ("_component", "_declaration")

    def __init__(self, declaration: type, component: Any) -> None:
        self._declaration, self._component = declaration, component

    def __getattr__(self, name: str) -> Any:
        defaults = declared(self._declaration)
        if name not in defaults:
            raise AttributeError(
                f"{self._declaration.__name__} declares no capability {name!r}; it declares {', '.join(defaults)}"
            )
        return getattr(self._component, name, defaults[name])

"""Everything a run checks before it does any work: a mistake costs a second, not a fine-tuning.

Names and option names of every component, the recipe a run will use (and why), directories it
must write, and the sequence length against the models' limits. Each problem is a
:class:`~kdplug.errors.UsageError` (exit 2) that names the key, the value and what would work.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, TypeVar

import torch

from .. import hub
from ..capabilities import (
    CAPABILITIES,
    AugmenterCapabilities,
    ProjectorCapabilities,
    RecipeCapabilities,
    StudentCapabilities,
    TeacherCapabilities,
    capabilities,
)
from ..config import RunConfig, TeacherMember
from ..errors import KdplugError, OfflineError, UnknownComponentError, UsageError
from ..members import names
from ..model_types import register_model_types
from ..registry import Registry
from ..types import ProjectionRequest, Task, Teacher
from .stores import sections
from .tracking import parse_report_to


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "~", "/")) or name.count("/") > 1


Declaration = TypeVar("Declaration")


def declared(registry: Registry, declaration: type[Declaration], name: str) -> Declaration:
    """What the registered component ``name`` declares (e.g. ``declared(registry, ProjectorCapabilities,
    config.projector).default_recipe``): its factory read through :func:`kdplug.types.capabilities`."""
    kind = next(kind for kind, declares in CAPABILITIES.items() if declares is declaration)
    factory = registry.resolve(kind, name)[0].factory
    return capabilities(declaration, getattr(factory, "func", factory))  # functools.partial


def default_recipe(registry: Registry) -> str:
    """The recipe of a run whose projector names none: the registered recipe that says
    ``is_default = True`` (kdplug's ``standard``)."""
    for entry in registry.entries("recipe"):
        if capabilities(RecipeCapabilities, getattr(entry.factory, "func", entry.factory)).is_default:
            return entry.name
    raise UsageError(
        "no registered recipe is the default one (is_default = True): name one with --recipe "
        "(kdplug plugins --kind recipe)"
    )


def reads_teacher(config: RunConfig, registry: Registry) -> bool:
    """Whether the run reads the teacher's outputs: a recipe with its own loss does (DIH, TAKD,
    annealing: ``uses_projector = False``); otherwise the projector or the baseline does unless it
    says ``reads_teacher = False`` (nkd)."""
    if config.recipe and declared(registry, RecipeCapabilities, config.recipe).uses_projector is False:
        return True
    return any(
        declared(registry, ProjectorCapabilities, name).reads_teacher is not False
        for name in (config.projector, config.baseline)
        if name
    )


def reads_teacher_layers(config: RunConfig, registry: Registry) -> bool:
    """Whether the run reads the teacher's layer vectors, not only its logits: then its teacher
    cache holds them too. Each method of the run decides (``reads_teacher_layers``, see
    :func:`kdplug.types.reads_teacher_layers`): the run's recipe with its projector, and the
    ``--baseline`` with its own recipe."""
    if not reads_teacher(config, registry):
        return False
    methods = [(config.recipe or default_recipe(registry), config.projector)]
    if config.baseline:
        baseline_recipe = declared(registry, ProjectorCapabilities, config.baseline).default_recipe
        methods.append((baseline_recipe or default_recipe(registry), config.baseline))
    return any(_method_reads_layers(registry, recipe, projector) for recipe, projector in methods)


def _method_reads_layers(registry: Registry, recipe: str, projector: str) -> bool:
    """A recipe with its own loss answers for itself; otherwise the projector does, unless the
    recipe says it reads the layers besides."""
    says = declared(registry, RecipeCapabilities, recipe)
    if says.uses_projector is False:
        return says.reads_teacher_layers is not False
    if says.reads_teacher_layers:
        return True
    method = declared(registry, ProjectorCapabilities, projector)
    return method.reads_teacher is not False and method.reads_teacher_layers is not False


def resolve_components(config: RunConfig, registry: Registry) -> list[str]:
    """Check every name and option name; fill in the recipe when the run names none.

    Returns the notes the run prints first (which recipe runs, and why).
    """
    check_teachers(config, registry)
    check_model_reference(registry, "student", config.student, config.student_options)
    for kind in ("projector", "task"):
        registry.resolve(kind, getattr(config, kind))
    if config.baseline:
        registry.resolve("projector", config.baseline)
    notes = []
    if config.recipe is None:
        default = declared(registry, ProjectorCapabilities, config.projector).default_recipe
        config.recipe = default or default_recipe(registry)
        if default:
            notes.append(
                f"recipe {default}: the default of projector {config.projector!r} (pass --recipe to choose another)"
            )
    registry.resolve("recipe", config.recipe)
    if (
        declared(registry, RecipeCapabilities, config.recipe).uses_projector is False
        and config.projector != RunConfig().projector
    ):
        notes.append(f"recipe {config.recipe} trains with its own loss: --projector {config.projector} is not used")
    parse_report_to(config.report_to)  # a tracker whose package is missing: say so now
    # option names, against each factory's signature; values that need the models come later
    student, student_options = registry.model_reference("student", config.student)
    registry.check_options("student", student, None, None, **{**config.student_options, **student_options})
    registry.check_options("projector", config.projector, None, **config.projector_options)
    check_values = declared(registry, ProjectorCapabilities, config.projector).check_options
    if check_values is not None:  # values a projector can judge before the models are loaded
        check_values(**config.projector_options)
    registry.check_options("recipe", config.recipe, **config.recipe_options)
    notes += check_teacher_layers(config, registry)
    check_token_method(config, registry, student)
    if config.ild_loss:
        registry.resolve("loss", config.ild_loss)
        registry.check_options("loss", config.ild_loss, **config.ild_loss_options)
    elif config.ild_loss_options:
        raise UsageError("ild_loss_options are the options of ild_loss: set ild_loss too (--set ild_loss=NAME)")
    if config.kd_loss or config.kd_loss_options:
        check_kd_loss(config, registry)
    check_transfer_sources(config, registry)
    check_trim_vocab(config)
    return notes


def check_token_method(config: RunConfig, registry: Registry, student: str) -> None:
    """A projector that distils per-token signals (``needs_tokens``: TinyBERT, MiniLMv2) needs a
    student that has tokens and attention, and computes its own loss terms."""
    if not declared(registry, ProjectorCapabilities, config.projector).needs_tokens:
        return
    if declared(registry, StudentCapabilities, student).token_signals is False:
        raise UsageError(
            f"projector {config.projector!r} distils the teacher's per-token hidden states and attention, but "
            f"student {config.student!r} pools each sentence into one vector per layer: it has no tokens or "
            f"attention to match. Use a Transformer student (a registered one, or --student DIR) or a method for "
            f"pooled students ('kdplug plugins --kind student' and '--kind projector' list them)"
        )
    if config.ild_loss:
        raise UsageError(
            f"projector {config.projector!r} computes its own per-token loss terms, so ild_loss "
            f"{config.ild_loss!r} has nothing to compare; drop --set ild_loss"
        )


def check_teachers(config: RunConfig, registry: Registry) -> None:
    """Each teacher's name and option names: an ensemble's members each as the one teacher's, the errors
    naming the member (``teachers[1].teacher_options.base_url ...``)."""
    for member in config.members():
        with member_errors(config, member):
            check_model_reference(registry, "teacher", member.name, member.options)
            name, implied = registry.model_reference("teacher", member.name)
            registry.check_options("teacher", name, None, **{**member.options, **implied})


@contextlib.contextmanager
def member_errors(config: RunConfig, member: TeacherMember) -> Iterator[None]:
    """Within: a member's error, reworded to name the member, where the run has an ensemble."""
    try:
        yield
    except KdplugError as exc:
        if config.is_ensemble and len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (member_message(exc.args[0], member),)
        raise


def member_message(text: str, member: TeacherMember) -> str:
    """A single teacher's error said of ensemble member ``member``: its options are
    ``teachers[N].teacher_options``, set with ``--set teachers.N.teacher_options.KEY=VALUE``."""
    index = member.index
    text = text.replace("--set teacher_options.", f"--set teachers.{index}.teacher_options.")
    text = re.sub(r"(?<![.\w])teacher_options\b", f"teachers[{index}].teacher_options", text)
    if f"teachers[{index}]" not in text:
        text = f"teachers[{index}] ({member.name}): {text}"
    return text


def check_augmenter_reads(config: RunConfig, registry: Registry) -> None:
    """An augmenter that reads the teacher's weights needs them in this process: not a served teacher's."""
    if not declared(registry, AugmenterCapabilities, config.augment).reads_teacher_weights:
        return
    primary = config.members()[0]  # the augmenter reads the first member of an ensemble
    if not has_layers(registry, primary.name):
        raise UsageError(
            f"--augment {config.augment} reads the teacher's own weights (its word embeddings), and teacher "
            f"{primary.name!r} keeps them on its server; use another augmenter ('kdplug plugins --kind augmenter') "
            f"or --transfer FILE of unlabelled text of the task"
            + (", or list a member whose weights kdplug loads first" if config.is_ensemble else "")
        )


def has_layers(registry: Registry, name: str) -> bool:
    """Whether teacher ``name`` gives kdplug its layers (not a served model: ``has_layers = False``)."""
    return declared(registry, TeacherCapabilities, registry.model_reference("teacher", name)[0]).has_layers is not False


def layer_reader(config: RunConfig, registry: Registry) -> str:
    """What reads the teacher's layers, for the messages: the recipe, or the projector (and the baseline)."""
    method = config.recipe if declared(registry, RecipeCapabilities, config.recipe).uses_projector is False else None
    reader = f"recipe {method!r}" if method else f"projector {config.projector!r} (recipe {config.recipe!r})"
    return reader + (f" or the baseline {config.baseline!r}" if config.baseline and not method else "")


def check_teacher_layers(config: RunConfig, registry: Registry) -> list[str]:
    """A teacher whose layers kdplug never sees (``has_layers = False``: a served model) with a method
    that reads them (PKD, CKD, ALP, CKA, TinyBERT, MiniLMv2, Universal-KD's layer terms) is refused
    before the teacher is built, so before any request is sent. An ensemble's layers come from one
    member: ``layer_teacher``, or the one member that has layers (then set here). Returns the notes."""
    reads = reads_teacher_layers(config, registry)
    if not config.is_ensemble:
        if reads and not has_layers(registry, config.teacher):
            raise UsageError(
                f"teacher {config.teacher!r} gives kdplug only its label log-probabilities, never its layers (its "
                f"model runs outside this process), but {layer_reader(config, registry)} reads the teacher's layer "
                f"vectors. Use a projector or recipe that reads the logits alone (docs/llm-teachers.md lists them), "
                f"or a teacher that runs in this process for layer methods"
            )
        return []
    if not reads:
        if config.layer_teacher is None:
            return []
        return [f"layer_teacher={config.layer_teacher} is not used: {layer_reader(config, registry)} reads no layers"]
    members = config.members()
    with_layers = [member for member in members if has_layers(registry, member.name)]
    if config.layer_teacher is not None:
        chosen = members[config.layer_teacher]
        if chosen not in with_layers:
            raise UsageError(
                f"layer_teacher={chosen.index} names teachers[{chosen.index}] ({chosen.name}), which gives kdplug only "
                f"its label log-probabilities, never its layers (its model runs outside this process), but "
                f"{layer_reader(config, registry)} reads one teacher's layer vectors. " + _layer_fix(with_layers)
            )
        return []
    if len(with_layers) == 1:
        config.layer_teacher = with_layers[0].index
        return [
            f"layer methods read teachers[{config.layer_teacher}] ({with_layers[0].name}), the one member of the "
            f"ensemble that has layers (layer_teacher={config.layer_teacher})"
        ]
    if not with_layers:
        raise UsageError(
            f"{layer_reader(config, registry)} reads one teacher's layer vectors, and no member of the ensemble "
            f"gives kdplug its layers (their models run outside this process). " + _layer_fix(with_layers)
        )
    raise UsageError(
        f"{layer_reader(config, registry)} reads one teacher's layer vectors, and several members of the ensemble "
        f"have layers ({names(f'teachers[{m.index}] {m.name}' for m in with_layers)}): name one with --set "
        f"layer_teacher=N (N from 0, e.g. --set layer_teacher={with_layers[0].index}), or use a projector or recipe "
        f"that reads the logits alone (docs/llm-teachers.md lists them)"
    )


def _layer_fix(with_layers: list[TeacherMember]) -> str:
    named = names(f"--set layer_teacher={m.index} for {m.name}" for m in with_layers)
    return (
        f"Name a member that runs in this process ({named}), or use" if named else "Use"
    ) + " a projector or recipe that reads the logits alone (docs/llm-teachers.md lists them)"


def layer_member(config: RunConfig, registry: Registry) -> Optional[TeacherMember]:
    """The teacher whose layers the run's layer methods read (after :func:`resolve_components`): None when
    the run reads no layers; the one teacher; an ensemble's ``layer_teacher``."""
    if not reads_teacher_layers(config, registry):
        return None
    members = config.members()
    return members[config.layer_teacher or 0] if config.is_ensemble else members[0]


#: the loss on the logits where the run names none (kd_loss)
DEFAULT_KD_LOSS = "kd"


def check_kd_loss(config: RunConfig, registry: Registry) -> None:
    """The loss on the logits exists, takes the run's temperature, and the options given."""
    name = config.kd_loss or DEFAULT_KD_LOSS
    if "temperature" in config.kd_loss_options:
        raise UsageError(
            "kd_loss_options.temperature: the loss on the logits uses the run's temperature; set it "
            "with --set temperature=VALUE"
        )
    entry, _ = registry.resolve("loss", name)
    parameters = inspect.signature(entry.factory).parameters
    open_ended = any(p.kind is p.VAR_KEYWORD for p in parameters.values()) and (
        getattr(entry.factory, "__init__", None) is not torch.nn.Module.__init__  # a Module without options
    )
    if "temperature" not in parameters and not open_ended:
        raise UsageError(
            f"kd_loss {name!r} takes no temperature, so it is not a loss on the logits (it is called as "
            f"loss(temperature=τ, **kd_loss_options)); use kd or dist, or a plugin's logit loss"
        )
    registry.check_options("loss", name, option_key="kd_loss_options", temperature=1.0, **config.kd_loss_options)
    if declared(registry, RecipeCapabilities, config.recipe).uses_kd_loss is False:
        raise UsageError(
            f"recipe {config.recipe!r} has a loss on the logits of its own and does not use kd_loss / "
            f"kd_loss_options; drop them"
        )


def check_model_reference(registry: Registry, kind: str, name: str, options: Optional[dict] = None) -> None:
    """``name`` is a registered {kind}, an existing checkpoint directory, or a hub id that can be
    loaded now (cached, or the hub is up): checked in seconds, before any data is read.

    A plain name such as ``bert-base-uncased`` may be a hub id or a typo of a registered name; offline,
    kdplug cannot tell, so the error gives both the close names and what to do about the hub.
    """
    try:
        entry, _ = registry.resolve(kind, name)
        check_registered_hub_source(kind, name, entry.factory, options or {})
        return
    except UnknownComponentError as exc:
        unknown = exc
    loader = registry.checkpoint_loader(kind)
    if loader is not None and not (options or {}).get("trust_remote_code"):
        register_model_types()  # plugins' own model types (kdplug-bilstm) need no remote code
        hub.refuse_remote_code(str(Path(name).expanduser()) if looks_like_path(name) else name, kind)
    if Path(name).expanduser().is_dir() and loader is not None:
        return
    if looks_like_path(name):
        raise UsageError(
            f"{kind} checkpoint directory {name} does not exist; pass an existing directory written by "
            f"save_pretrained, a hub id, or a name from 'kdplug plugins'"
        )
    if loader is None or not hub.is_hub_id(name):
        raise unknown
    if hub.cached_file(name, "config.json") is not None:
        return  # a hub id whose files are in the local cache
    reason = hub.unreachable_reason()
    fix = (
        f"download it on a machine with network (hf download {name} --local-dir DIR), copy DIR here and pass "
        f"--{kind} DIR; or point HF_HUB_CACHE at a Hugging Face cache that holds it"
        + ("" if hub.offline_by_env() else " and set HF_HUB_OFFLINE=1, so that nothing tries the network")
        + f". The {loader!r} {kind} takes the same with options: --{kind} {loader} --set {kind}_options.source=ID "
        f"(and revision, trust_remote_code)"
    )
    if "/" in name:
        if reason is not None:
            raise OfflineError(
                f"cannot load {kind} {name!r}: {reason}, and it is not in the local Hugging Face cache "
                f"({hub.cache_directory()}). To use it, {fix}."
            )
        return
    # a plain name that no plugin registered: a hub id, or a typo of a registered name? Offline,
    # the hub cannot say; what to do about the hub comes first, the close registered names after
    if reason is not None:
        raise OfflineError(
            f"cannot load {kind} {name!r}: {reason}, and it is neither in the local Hugging Face cache "
            f"({hub.cache_directory()}) nor a registered {kind} name. If {name!r} is a Hugging Face hub id, {fix}. "
            f"If you meant a registered name: {unknown}"
        )
    if not hub.exists(name):
        raise UnknownComponentError(kind, name, registry.names(kind), note=f"Nor is {name!r} a model on the hub.")


def check_registered_hub_source(kind: str, name: str, factory: Any, options: dict) -> None:
    """A registered name that loads a hub id (``bert-base`` is ``bert-base-uncased``; ``hf`` with
    the option ``source``) can be loaded now: it is cached, or the hub is up. Offline, it stops
    here, before a run directory is made, not when the run builds its teacher."""
    source = options.get("source") or getattr(factory, "keywords", {}).get("source")
    if not isinstance(source, str) or options.get("revision") or not hub.is_hub_id(source):
        return
    if Path(source).expanduser().exists() or hub.cached_file(source, "config.json") is not None:
        return
    reason = hub.unreachable_reason()
    if reason is not None:
        raise OfflineError(
            f"cannot load {kind} {name!r} ({source} on the Hugging Face hub): {reason}, and it is not in the local "
            f"Hugging Face cache ({hub.cache_directory()}). To use it, download it on a machine with network "
            f"(hf download {source} --local-dir DIR), copy DIR here and pass --{kind} DIR; or point HF_HUB_CACHE "
            f"at a Hugging Face cache that holds it"
        )


def check_transfer_sources(config: RunConfig, registry: Registry) -> None:
    """Before any expensive work: every --transfer source exists in a known format, the augmenter
    exists, takes the options given and has what it needs installed."""
    from ..textio import input_format, open_text

    if (config.transfer or config.augment) and not reads_teacher(config, registry):
        raise UsageError(
            f"a transfer set has no gold labels, and {config.projector} learns from gold labels alone: it "
            f"would go unused. Distil with a projector that reads the teacher ('kdplug plugins --kind projector' "
            f"lists them), or drop --transfer/--augment"
        )
    for path in config.transfer:
        source = Path(path).expanduser()
        if not source.exists():
            raise UsageError(f"--transfer {path}: no such file or directory")
        if source.is_file():
            fmt = input_format(str(source), None)  # an unknown extension names the formats read
            with open_text(source, option=None):  # the first block: UTF-16 without its byte-order mark is refused
                pass
            if not has_texts(source, fmt):
                raise UsageError(
                    f"--transfer {path} holds no texts"
                    + (" (a header line alone)" if fmt in ("tsv", "csv") else "")
                    + "; a transfer set needs at least one: give another file or drop it"
                )
    if config.augment:
        registry.resolve("augmenter", config.augment)
        registry.check_options("augmenter", config.augment, None, **config.augment_options)
        check_augmenter_reads(config, registry)
        check_values = declared(registry, AugmenterCapabilities, config.augment).check_options
        if check_values is not None:  # values and requirements, where the augmenter can say before building
            check_values(**config.augment_options)
    elif config.augment_options:
        raise UsageError("augment_options are the options of an augmenter: set --augment NAME too")


def check_trim_vocab(config: RunConfig) -> None:
    """Before any expensive work: trim_vocab's corpus is a text file, its floor a count, both with trim_vocab."""
    if (config.trim_vocab_corpus or config.trim_vocab_min_count != 1) and not config.trim_vocab:
        raise UsageError("trim_vocab_corpus and trim_vocab_min_count go with trim_vocab=true")
    count = config.trim_vocab_min_count
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"trim_vocab_min_count is a number of occurrences, 1 or more; got {count!r}")
    if config.trim_vocab_corpus:
        from ..vocab import read_corpus

        read_corpus(str(Path(config.trim_vocab_corpus).expanduser()), "trim_vocab_corpus")


def has_texts(path: Path, fmt: str) -> bool:
    """Whether a transfer file has a line of text beyond a table's header: read only up to there,
    so a large file costs nothing here (the build reads it, or finds it in the cache)."""
    wanted = 2 if fmt in ("tsv", "csv") else 1
    found = 0
    with open(path, "rb") as handle:
        for line in handle:
            found += bool(line.strip())
            if found >= wanted:
                return True
    return False


def check_writable(directory: Path, what: str, option: str) -> None:
    """``directory`` (or the nearest existing parent it would be created in) accepts new files."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(
            f"the {what} {directory} cannot be created: {existing} is not a directory; choose another {option}"
        )
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise UsageError(
            f"the {what} {directory} is not writable ({exc.strerror.lower()} in {existing}); "
            f"choose another {option} or fix the permissions"
        ) from None


def sequence_length(config: RunConfig, task: Task, teacher: Teacher) -> int:
    """The run's maximum length: ``max_length`` if set (checked), else the papers' default (64 for
    single sentences, 128 for pairs) or the teacher's position limit, whichever is smaller."""
    from .data import default_max_length

    if config.max_length is None:
        limit = position_limit(teacher.model)
        default = default_max_length(task)
        return default if limit is None else min(default, limit)
    check_sequence_length(task, teacher, config.max_length)
    return config.max_length


def check_sequence_length(task: Task, teacher: Teacher, max_length: int) -> None:
    """``max_length`` fits the teacher's position embeddings and holds more than the special tokens."""
    tokenizer = teacher.tokenizer
    specials = tokenizer.num_special_tokens_to_add(pair=task.is_pair) if tokenizer is not None else 0
    words = 2 if task.is_pair else 1
    if max_length < specials + words:
        raise UsageError(
            f"max_length={max_length} leaves no room for text: the tokenizer adds {specials} special tokens "
            f"to each {'pair' if task.is_pair else 'sentence'}; use at least {specials + words} (kdplug's default is "
            f"{128 if task.is_pair else 64})"
        )
    limit = position_limit(teacher.model)
    if limit is not None and max_length > limit:
        raise UsageError(f"max_length={max_length} exceeds the teacher's {limit} positions; use at most {limit}")


def position_limit(model: Any) -> Optional[int]:
    """How many tokens a Hugging Face model's position embeddings hold (RoBERTa reserves two)."""
    config = getattr(model, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        return positions - 2
    return positions


def check_projectors(config: RunConfig, registry: Registry, task: Task) -> None:
    """The options that depend on the models (a layer map, layer numbers, relation heads, a head
    count that must divide a width), checked before the teacher is loaded or fine-tuned: the
    run's projector (and the baseline's) is built once, on the CPU, from the two models' shapes,
    which their factories read from configs in milliseconds, and dropped. Its own constructor
    judges its options, so the message is the one it would give mid-run. Skipped where a factory
    declares no shape (the projector is then checked when the models are built)."""
    names = [config.baseline] if config.baseline else []
    if declared(registry, RecipeCapabilities, config.recipe).uses_projector is not False:
        names.insert(0, config.projector)
    if not names:
        return
    member = layer_member(config, registry) or config.members()[0]  # an ensemble's: the layers read, or the first
    teacher, teacher_source = registry.model_reference("teacher", member.name)
    teacher_shape = registry.model_shape("teacher", teacher, task, **{**member.options, **teacher_source})
    if teacher_shape is None:
        return
    student, student_source = registry.model_reference("student", config.student)
    student_shape = registry.model_shape(
        "student", student, task, teacher_shape, **{**config.student_options, **student_source}
    )
    if student_shape is None:
        return
    request = ProjectionRequest.from_shapes(teacher_shape, student_shape, task, seed=config.seed)
    with torch.random.fork_rng(devices=[]):  # its initial weights must not move the run's random draws
        for name in names:
            registry.create(
                "projector", name, request, **(config.projector_options if name == config.projector else {})
            )


def check_component_options(config: RunConfig, registry: Registry, task: Task, teacher: Teacher) -> None:
    """The student's options against the loaded teacher (e.g. attributes of its config), before
    the teacher is fine-tuned or cached."""
    student, source = registry.model_reference("student", config.student)
    registry.check_options("student", student, task, teacher, **{**config.student_options, **source})


def writable_paths(config: RunConfig, output: Path, cache_root: Path, registry: Optional[Registry] = None) -> None:
    """The run's directory and its cache directory accept new files, and so does every folder of the
    cache that is already there which the engine or a registered component writes (``stores``): all
    that a run stores goes under its cache directory, so a write there never fails after the work."""
    check_writable(output, "output directory", "--output")
    check_writable(cache_root, "cache directory", "--cache-dir (or $KDPLUG_CACHE)")
    if registry is not None:
        for folder in sections(registry):
            if (cache_root / folder).exists() or (cache_root / folder).is_symlink():
                check_writable(cache_root / folder, "cache directory's folder", "--cache-dir (or $KDPLUG_CACHE)")
    if config.data_dir and os.path.abspath(output) == os.path.abspath(config.data_dir):
        raise UsageError(f"--output {output} is the data directory; a run writes its own directory, choose another")

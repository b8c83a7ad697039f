"""``kdplug run --dry-run``: everything a run would use, resolved and checked, and nothing trained.

The plan comes from the same code as the run: the components are built by their factories, the
teacher's fine-tuning settings and store key by the functions the run calls, and the recipe's own
``run(ctx)`` is executed against the run's own context over planned inputs (:func:`planned_inputs`)
and a :class:`PlannedSource`, so its stages are resolved exactly as
:func:`~kdplug.engine.stage.prepare_stage` resolves them (weights, epochs, learning rate, early stopping,
the vocabulary check) and then recorded instead of trained. What the recipe stores on its own
(TAKD's assistants) goes to a scratch directory that is removed afterwards: a dry run writes
nothing into the cache or the output directory.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from accelerate.utils import set_seed

from ..capabilities import ProjectorCapabilities, StudentCapabilities, capabilities
from ..config import RunConfig
from ..errors import PluginError
from ..layout import CHECKPOINT_DIR
from ..progress import human_count, human_duration
from ..registry import Registry
from ..storage import default_cache_root
from ..threads import apply as apply_threads
from ..threads import choose as choose_threads
from ..types import StageResult, Teacher, num_outputs
from . import estimate, preflight
from . import teacher as teacher_stage
from .baseline import train_baseline
from .cache import is_cached, layers_bytes, logits_bytes
from .ensemble_plan import plan_members, summed_cache_size
from .inputs import RunInputs, TaskAndTeacher, create_teacher, finetune_settings, load_task_and_teacher, teacher_seed
from .recipe import EngineContext, RecipeView
from .rundir import RunDirectory, default_output
from .speed import served_remotely
from .stage import Stage
from .trainer import Trainer, build_accelerator, count_parameters, inference_precision


class PlannedCache:
    """Stands for teacher outputs that the plan does not compute: the layers they would hold."""

    def __init__(self, specs: list, size: int) -> None:
        self.specs, self.size, self.built = specs, size, False

    @property
    def has_layers(self) -> bool:
        return bool(self.specs)

    def __len__(self) -> int:
        return self.size


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedOutputs:
    """A dry run's teacher outputs (its :class:`RunInputs`' ``caches``): none computed. ``ready``:
    the teacher they would come from is fine-tuned already (given, or stored), so their cache keys
    are known; ``layers``: they would hold its layer vectors from the start."""

    ready: bool
    layers: bool


@dataclasses.dataclass(kw_only=True)
class PlannedSource:
    """A stage's teacher side in a dry run (:class:`~kdplug.engine.stage.StageSource`): the shapes of
    the teacher's outputs, no heads, the transfer set's share as a count, and each stage resolved
    and recorded with an estimate of its time instead of trained."""

    config: RunConfig
    inputs: RunInputs
    teacher: Teacher
    #: the teacher's matchable layers: what its outputs would hold
    specs: list
    cache_layers: bool
    layer_teacher: Optional[Teacher] = None  # an ensemble's member whose layers students match (None: teacher)
    #: transfer examples a distillation stage would add to every epoch (estimated when not built)
    transfer_per_epoch: int = 0
    #: the transfer set is not built yet: its size is an upper bound (duplicates are dropped then)
    transfer_estimated: bool = False

    def teacher_cache(self, layers: bool = False) -> tuple[PlannedCache, dict[str, PlannedCache]]:
        specs = self.specs if layers or self.cache_layers else []
        return PlannedCache(specs, len(self.inputs.train)), {
            name: PlannedCache(specs, len(split)) for name, split in self.inputs.dev.items()
        }

    def teacher_heads(self, stages: dict[str, dict]) -> None:
        stages.setdefault(
            "teacher_heads",
            {
                "plan": f"warm up {len(self.specs)} pseudo classifiers on the teacher's cached layers "
                f"({self.config.head_epochs} epochs at lr {self.config.head_lr:g}), or reuse them from the cache"
            },
        )

    def near_constant_layers(self, projector, train_cache, name: str) -> None:
        """None: a plan computes no teacher outputs whose variation it could measure."""
        return None

    def with_transfer(self, student, train, cache) -> tuple[Any, Any, int]:
        return train, cache, len(train) + self.transfer_per_epoch

    def run(self, name: str, stage: Stage, checkpoints: Any, note: str = "") -> tuple[StageResult, dict[str, Any]]:
        """Recorded with an estimate of its time, not trained (and not logged: the plan is printed)."""
        timing = estimate.epoch_seconds(
            stage.module.student, self.inputs.trainer, stage.train, stage.dev, stage.examples, self.config.batch_size
        )
        fewest = estimate.fewest_epochs(stage.epochs, stage.patience, stage.min_epochs)
        record = {
            **stage.settings(),
            "examples_per_epoch": stage.examples,
            "projector": capabilities(ProjectorCapabilities, stage.projector).name if stage.projector else None,
            "reads_teacher": stage.module.needs_teacher,
            "plan": stage.describe() + self._transfer_caveat(stage),
            "estimate": {
                **timing,
                "fewest_epochs": fewest,
                "seconds": round(timing["seconds_per_epoch"] * stage.epochs, 1),
                "fewest_seconds": round(timing["seconds_per_epoch"] * fewest, 1),
            },
        }
        return StageResult(name), record

    def _transfer_caveat(self, stage: Stage) -> str:
        if not (self.transfer_estimated and stage.examples > len(self.inputs.train)):
            return ""
        return (
            " (the transfer set is not built yet: its size here is an upper bound, since duplicates are dropped "
            "when it is built, so the run may train more epochs of fewer examples)"
        )

    def for_teacher(self, teacher: Teacher, extractor: Any) -> PlannedSource:
        teacher_stage.freeze(teacher)
        specs, _ = teacher_stage.matchable_specs(extractor, teacher.model)
        return dataclasses.replace(self, teacher=teacher, specs=specs, layer_teacher=None)  # an assistant's own


def dry_run(
    config: RunConfig,
    registry: Registry,
    *,
    overwrite: bool = False,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Resolve and check everything ``config`` would use, print the plan, and return it."""
    notes = preflight.resolve_components(config, registry)
    threads = apply_threads(choose_threads(config.threads))  # as the run would: the timings below use them
    cache_root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_root()
    output = Path(config.output) if config.output else default_output(config)
    preflight.writable_paths(config, output, cache_root, registry)
    replaces = None if resume else RunDirectory.check_new(output, overwrite=overwrite)
    set_seed(teacher_seed(config))
    # an ensemble's first member is its primary teacher: it encodes the students' data (engine/ensemble.py)
    primary = config.member_config(config.members()[0]) if config.is_ensemble else config
    base = load_task_and_teacher(primary, registry, run=config)
    plan: dict[str, Any] = {
        "notes": notes + base.teacher.notes,
        "output": str(output),
        "cache": str(cache_root),
        "resume": resume,
        "replaces": replaces,
        "task": _task_plan(base.task, base.train, base.dev),
        "tokenizer": _tokenizer_plan(base.teacher.tokenizer, base.max_length),
    }
    inputs = planned_inputs(primary, registry, base, cache_root, plan)
    reads_teacher = preflight.reads_teacher(config, registry)
    plan["teacher_outputs"] = (
        cached_outputs(config, registry, inputs)
        if reads_teacher
        else f"not needed ({config.projector} reads no teacher output)"
    )
    transfer_size = _transfer_plan(config, inputs, plan)
    members: list[dict[str, Any]] = []
    if config.is_ensemble:  # each member planned as its one-teacher run's teacher, its notes named by it
        members, layer_teacher = plan_members(config, registry, cache_root, base.task, reads_teacher, transfer_size)
        plan["teacher"]["members"] = members
        plan["notes"] = notes + [note for member in members for note in member.pop("notes")]
        inputs = dataclasses.replace(inputs, layer_teacher=layer_teacher)
    elif transfer_size and reads_teacher:
        count_transfer_requests(base.teacher, base.max_length, transfer_size)
        plan["notes"] = notes + base.teacher.notes
    plan["check"] = (
        "the teacher's dev metric against the majority class; a weak teacher stops the run"
        if reads_teacher and not config.allow_weak_teacher
        else "off"
    )
    if reads_teacher:
        plan["teacher_cache"] = (
            summed_cache_size([member["teacher_cache"] for member in members])
            if members
            else cache_size(registry, base.teacher, inputs, transfer_size)
        )
    ratio = config.transfer_ratio
    per_epoch = 0 if not transfer_size else (round(ratio * len(base.train)) if ratio else transfer_size)
    context, student = _plan_stages(plan, config, registry, inputs, per_epoch)
    plan["student"] = _student_plan(config, student, context.tokenizer)
    plan["recipe"] = config.recipe
    plan["stages"] = context.stages
    plan["threads"] = threads.to_dict()
    plan["time"] = _time_plan(plan, config, inputs)
    echo(format_plan(plan, config))
    return plan


def planned_inputs(
    config: RunConfig, registry: Registry, base: TaskAndTeacher, cache_root: Path, plan: dict[str, Any]
) -> RunInputs:
    """A dry run's :class:`RunInputs`: the teacher fine-tuned where it is already (its plan in
    ``plan["teacher"]``), its outputs planned, the trainer's timing steps on this device."""
    finetuned = _plan_teacher(plan, config, registry, base, cache_root)
    accelerator = build_accelerator(config.precision)
    return RunInputs(
        task=base.task,
        teacher=finetuned or base.teacher,
        max_length=base.max_length,
        train=base.train,
        dev=base.dev,
        trainer=Trainer(
            accelerator,
            base.task,
            batch_size=config.batch_size,
            seed=config.seed,
            teacher_tokens_per_batch=config.teacher_tokens_per_batch,  # the teacher pass's batches, as the run's
        ),
        cache_root=cache_root,
        caches=PlannedOutputs(ready=finetuned is not None, layers=preflight.reads_teacher_layers(config, registry)),
        teacher_info=plan["teacher"],
    )


def _member_lines(members: list[dict[str, Any]]) -> list[str]:
    lines = []
    for member in members:
        cached = member["cached"]
        outputs = cached if isinstance(cached, str) else ", ".join(f"{k} {v}" for k, v in cached.items())
        lines.append(
            f"  member {member['index']} {member['name']} (weight {member['weight']:.3g}): {member['class']}, "
            f"{_size(member['parameters'])}; fine-tuning: {finetune_line(member['finetune'])}; "
            f"outputs: {outputs}"
            + ("; the layer teacher: layer methods read its layers" if member["layer_teacher"] else "")
        )
        if member.get("kind"):
            lines.append(f"            kind: {member['kind']}")
    return lines


def _task_plan(task, train, dev) -> dict[str, Any]:
    return {
        "name": task.name,
        "labels": list(task.labels),
        "regression": task.is_regression,
        "pairs": task.is_pair,
        "train": len(train),
        "dev": {name: len(split) for name, split in dev.items()},
        "main_metric": task.main_metric,
    }


def _tokenizer_plan(tokenizer, max_length: int) -> dict[str, Any]:
    return {
        "class": type(tokenizer).__name__,
        "vocabulary": len(tokenizer) if tokenizer is not None else None,
        "max_length": max_length,
    }


def _plan_teacher(
    plan: dict[str, Any], config: RunConfig, registry: Registry, base: TaskAndTeacher, cache_root: Path
) -> Optional[Teacher]:
    """The teacher: given fine-tuned, stored, or to be fine-tuned (``plan["teacher"]``); returns
    the fine-tuned teacher where there is one already, else None."""
    teacher, task = base.teacher, base.task
    plan["teacher"] = {
        "name": config.teacher,
        "source": teacher.source,
        "class": type(teacher.model).__name__,
        "parameters": None if served_remotely(teacher.model) else count_parameters(teacher.model),
        "outputs": num_outputs(task),
        "pretrained": teacher.pretrained,
        **teacher.extra,
    }
    plan["teacher"]["layers_read_by"] = layer_reading(registry, teacher.model)
    if teacher.finetuned:
        plan["teacher"]["finetune"] = "no: it comes ready for the task (fine-tuned, or used as it is)"
        return teacher
    settings = finetune_settings(config, teacher, base.train, base.max_length, teacher_seed(config))
    key = teacher_stage.finetune_key(teacher, task, base.train, base.dev, settings)
    stored = teacher_stage.stored_teacher_dir(cache_root, key)
    plan["teacher"]["finetune"] = {**settings, "stored": str(stored) if stored else None}
    return create_teacher(config, registry, task, source=str(stored)) if stored is not None else None


def layer_reading(registry: Registry, model) -> Optional[str]:
    """The layer extractor that will read ``model``, with what it reads (an encoder's [CLS], a
    decoder's last real token); None where none supports it (the run says so when it builds it)."""
    try:
        entry = registry.layer_extractor_entry(model)
    except PluginError:
        return None
    return f"{entry.name} ({entry.description})"


def _plan_stages(
    plan: dict[str, Any], config: RunConfig, registry: Registry, inputs: RunInputs, transfer_per_epoch: int
) -> tuple[EngineContext, Any]:
    """The stages, from the recipe itself: its ``run(ctx)`` against a context whose stages are
    planned (:class:`PlannedSource`), the ``--baseline`` student's first; what the recipe stores
    goes to a scratch directory."""
    device = inputs.trainer.accelerator.device
    plan["device"] = str(device)
    plan["teacher_precision"] = inference_precision(config.precision, device)
    teacher = inputs.teacher
    layers = inputs.layer_teacher or teacher  # an ensemble's layer teacher
    with tempfile.TemporaryDirectory(prefix="kdplug-dry-run-") as scratch:
        scratch_inputs = dataclasses.replace(inputs, cache_root=Path(scratch))
        source = PlannedSource(
            config=config,
            inputs=scratch_inputs,
            teacher=teacher,
            specs=teacher_stage.matchable_specs(registry.find_layer_extractor(layers.model), layers.model)[0],
            layer_teacher=inputs.layer_teacher,
            cache_layers=inputs.caches.layers,
            transfer_per_epoch=transfer_per_epoch,
            transfer_estimated=bool(plan["transfer"]) and not plan["transfer"].get("stored"),
        )
        context = EngineContext(config=config, registry=registry, inputs=scratch_inputs, source=source)
        if config.baseline:
            train_baseline(context)
        recipe = registry.create("recipe", config.recipe, **config.recipe_options)
        student = recipe.run(RecipeView(context))
    return context, student


def _student_plan(config: RunConfig, student, teacher_tokenizer) -> dict[str, Any]:
    return {
        "name": config.student,
        "class": type(student).__name__,
        "parameters": count_parameters(student),
        "init": capabilities(StudentCapabilities, student).kdplug_init or {"init": "random"},
        "tokenizer": "its own"
        if capabilities(StudentCapabilities, student).tokenizer not in (None, teacher_tokenizer)
        else "the teacher's",
    }


def _time_plan(plan: dict[str, Any], config: RunConfig, inputs: RunInputs) -> dict[str, Any]:
    """Seconds for the teacher's (each member's) fine-tuning and outputs where they are not stored yet, and
    the stages' sum, from steps timed on this machine now (see :mod:`kdplug.engine.estimate`)."""
    members = plan["teacher"].get("members")
    parts: dict[str, tuple[float, float]] = {}  # the fewest and the most seconds
    for member in members or []:
        parts.update(member["seconds"])
    if not members:
        finetune, outputs = plan["teacher"]["finetune"], plan["teacher_outputs"]
        parts.update(estimate.teacher_seconds(finetune, outputs, config, inputs, "teacher"))
    for name, stage in plan["stages"].items():
        if "estimate" in stage:
            parts[name] = (stage["estimate"]["fewest_seconds"], stage["estimate"]["seconds"])
            if plan["resume"]:  # a stage its checkpoint completed takes no time, one stopped in an epoch the rest
                parts[name] = estimate.left_to_resume(Path(plan["output"]) / CHECKPOINT_DIR / name, stage)
    return {
        "parts": {name: (round(low, 1), round(high, 1)) for name, (low, high) in parts.items()},
        "fewest_seconds": round(sum(low for low, _ in parts.values()), 1),
        "seconds": round(sum(high for _, high in parts.values()), 1),
    }


def _span(low: float, high: float) -> str:
    return human_duration(high) if abs(high - low) < 0.05 else f"{human_duration(low)} to {human_duration(high)}"


def cached_outputs(config: RunConfig, registry: Registry, inputs: RunInputs) -> dict[str, Any]:
    """Which of the teacher's outputs the cache holds (unknown until the teacher is fine-tuned):
    per split, its logits and, where the run reads them, its layer vectors."""
    if not inputs.caches.ready:
        return {"train": "computed after fine-tuning", **dict.fromkeys(inputs.dev, "computed after fine-tuning")}
    teacher, layers = inputs.teacher, inputs.caches.layers
    # as the teacher reads them
    train, dev = teacher_stage.teacher_splits(teacher, inputs.task, inputs.max_length, inputs.train, inputs.dev)
    extractor, fingerprints = registry.find_layer_extractor(teacher.model), teacher_stage.teacher_fingerprints(teacher)
    device, root = inputs.trainer.accelerator.device, inputs.cache_root
    found = {}
    for name, split in [("train", train), *dev.items()]:
        split_keys = teacher_stage.split_keys(
            teacher, extractor, split, precision=config.precision, device=device, layers=layers, **fingerprints
        )
        keys = {"logits": split_keys.logits, **({"layers": split_keys.layers} if layers else {})}
        cached = [kind for kind, key in keys.items() if is_cached(root / "teacher-cache", key)]
        found[name] = (
            "cached"
            if len(cached) == len(keys)
            else "computed once, then cached"
            if not cached
            else f"{' and '.join(cached)} cached, {' and '.join(k for k in keys if k not in cached)} computed once"
        )
    return found


def cache_size(registry: Registry, teacher: Teacher, inputs: RunInputs, transfer_examples: int) -> dict[str, Any]:
    """The bytes of the run's teacher outputs on disk, before any is computed: per split, examples x
    (outputs x 4 + the matchable layers' widths x 2, where the run reads layers). The layers'
    widths are the teacher's architecture's, fine-tuned or not (``teacher``: as configured)."""

    specs, _ = teacher_stage.matchable_specs(registry.find_layer_extractor(teacher.model), teacher.model)
    widths = [spec.width for spec in specs] if inputs.caches.layers else []
    splits = {"train": len(inputs.train), **{name: len(split) for name, split in inputs.dev.items()}}
    if transfer_examples:
        splits["transfer"] = transfer_examples
    outputs = num_outputs(inputs.task)
    sizes = {
        name: {"examples": n, "logits": logits_bytes(n, outputs), "layers": layers_bytes(n, widths)}
        for name, n in splits.items()
    }
    return {
        "bytes": sum(size["logits"] + size["layers"] for size in sizes.values()),
        "layers": bool(widths),
        "splits": sizes,
    }


def _transfer_plan(config: RunConfig, inputs: RunInputs, plan: dict[str, Any]) -> int:
    """The transfer set's size: the stored one's, else what the files hold plus the augmented copies
    (an upper bound: duplicates are dropped when it is built)."""
    if not (config.transfer or config.augment):
        plan["transfer"] = None
        return 0
    from . import transfer

    task = inputs.task
    train_examples = task.load_split("train")
    if inputs.caches.ready:
        stored = transfer.find_stored(
            config,
            task,
            inputs.teacher,
            train_examples,
            {name: task.load_split(name) for name in task.dev_splits},
            root=inputs.cache_root,
            seed=teacher_seed(config),
        )
        if stored is not None:
            plan["transfer"] = {"examples": len(stored), "stored": str(stored.directory)}
            return len(stored)
    from_files = sum(sum(1 for _ in transfer.read_transfer_file(path, task)) for path in config.transfer)
    augmented = transfer.augment_factor(config, task) * len(train_examples) if config.augment else 0
    plan["transfer"] = {
        "examples": f"up to {from_files + augmented}",
        "from_files": from_files,
        "augmented": augmented,
        "augment": config.augment,
        "stored": None,
    }
    return from_files + augmented


def _size(parameters: Optional[int]) -> str:
    return "its weights on its server" if parameters is None else f"{human_count(parameters)} parameters"


def count_transfer_requests(teacher: Teacher, max_length: int, examples: int) -> None:
    """A teacher that counts its requests (a served one) counts the transfer set's too, once its size is known."""
    plan_for = getattr(teacher.model, "kdplug_plan_for", None)  # not through capabilities(): the model's own
    if plan_for is not None:
        plan_for(max_length, transfer_examples=examples)


def cache_size_line(size: dict[str, Any], transfer: Optional[dict[str, Any]]) -> str:
    """``1,234,560 bytes: logits 64,272, layer vectors 1,170,288 (train 800 examples, dev 200)``."""
    splits = size["splits"]
    logits = sum(split["logits"] for split in splits.values())
    layers = sum(split["layers"] for split in splits.values())
    counts = ", ".join(f"{name} {split['examples']}" for name, split in splits.items())
    what = f"layer vectors {layers:,}" if size["layers"] else "no layer vectors (the run reads only the logits)"
    bound = "at most " if transfer and not transfer.get("stored") else ""
    return f"{bound}{size['bytes']:,} bytes: logits {logits:,}, {what} (examples: {counts})"


def finetune_line(finetune: Any) -> str:
    """What the plan says of the teacher's fine-tuning: why there is none, or its settings."""
    if isinstance(finetune, str):
        return finetune
    stopping = f", early stopping after {finetune['patience']}" if finetune.get("patience") else ""
    if finetune.get("min_epochs"):
        stopping += f", not before epoch {finetune['min_epochs']}"
    where = f"stored already: {finetune['stored']}" if finetune["stored"] else "not stored yet"
    method = f", {finetune['method']}" if finetune.get("method") else ""
    return (
        f"{finetune['epochs']} epochs at lr {finetune['lr']:g}, batch {finetune['batch_size']}{stopping}{method} "
        f"({where})"
    )


def _teacher_lines(plan: dict[str, Any], teacher: dict[str, Any]) -> list[str]:
    """The plan's lines about the teacher: an ensemble's members, then the primary teacher."""
    lines: list[str] = []
    if teacher.get("members"):
        lines.append(
            f"teachers    an ensemble of {len(teacher['members'])}: the target is the weighted mean of their "
            f"probabilities; the first reads the students' text"
        )
        lines += _member_lines(teacher["members"])
    lines.append(
        f"teacher     {teacher['name']}: {teacher['class']}, {_size(teacher['parameters'])}, from {teacher['source']}"
    )
    if teacher.get("kind"):
        lines.append(f"            kind: {teacher['kind']}")
    lines.append(f"            fine-tuning: {finetune_line(teacher['finetune'])}")
    lines.append(f"            check before distilling: {plan['check']}")
    layer_teacher = [member["index"] for member in teacher.get("members") or [] if member["layer_teacher"]]
    if teacher.get("layers_read_by") and (layer_teacher in ([], [0]) or not teacher.get("members")):
        lines.append(f"            layers read by {teacher['layers_read_by']}")  # not another member's
    outputs = plan["teacher_outputs"]
    cached = outputs if isinstance(outputs, str) else ", ".join(f"{k} {v}" for k, v in outputs.items())
    lines.append(f"            outputs: {cached}")
    if plan.get("teacher_cache"):
        lines.append(f"            cache size: {cache_size_line(plan['teacher_cache'], plan.get('transfer'))}")
    return lines


def format_plan(plan: dict[str, Any], config: RunConfig) -> str:
    """The plan as lines a person reads before starting a long run."""
    task, teacher, student = plan["task"], plan["teacher"], plan["student"]
    dev = ", ".join(f"{name} {size}" for name, size in task["dev"].items())
    labels = "regression" if task["regression"] else f"{len(task['labels'])} labels ({', '.join(task['labels'])})"
    lines = ["kdplug run --dry-run: the plan (nothing was trained, nothing written)"]
    lines += [f"  note: {note}" for note in plan["notes"]]
    lines.append(
        f"task        {task['name']}: {labels}{', sentence pairs' if task['pairs'] else ''}; train "
        f"{task['train']}, {dev}; model selection on {task['main_metric']}"
    )
    lines += _teacher_lines(plan, teacher)
    tokenizer = plan["tokenizer"]
    lines.append(
        f"tokenizer   {tokenizer['class']} ({tokenizer['vocabulary']} tokens), max length {tokenizer['max_length']}"
    )
    init = student["init"]
    origin = f"{init.get('init', 'random')}" + (f" from {init['from']}" if init.get("from") else "")
    lines.append(
        f"student     {student['name']}: {student['class']}, {human_count(student['parameters'])} parameters, "
        f"{origin}; reads text with {student['tokenizer']} tokenizer"
    )
    if init.get("tokenizer"):  # why the student reads a vocabulary of its own (a plugin chose it for the run)
        lines.append(f"            {init['tokenizer']}")
    transfer = plan["transfer"]
    if transfer:
        where = f"stored: {transfer['stored']}" if transfer.get("stored") else "built on first use"
        lines.append(f"transfer    {transfer['examples']} examples ({where})")
    lines.append(f"recipe      {plan['recipe']}")
    for name, stage in plan["stages"].items():
        guess = stage.get("estimate")
        timing = (
            f"; about {human_duration(guess['seconds_per_epoch'])} an epoch here now, "
            f"{_span(guess['fewest_seconds'], guess['seconds'])} in all"
            if guess
            else ""
        )
        lines.append(f"  stage {name}: {stage['plan']}{timing}")
    lines.append(
        f"device      {plan['device']}, precision {config.precision} (the teacher runs in {plan['teacher_precision']})"
    )
    state = (
        "resumes the run there"
        if plan["resume"]
        else f"replaces the {plan['replaces']} run there"
        if plan["replaces"]
        else "a new run directory"
    )
    lines.append(f"output      {plan['output']} ({state})")
    lines.append(f"cache       {plan['cache']}")
    threads, timing = plan["threads"], plan["time"]
    parts = ", ".join(f"{name} {_span(*seconds)}" for name, seconds in timing["parts"].items())
    lines.append(
        f"time        about {_span(timing['fewest_seconds'], timing['seconds'])}"
        f"{' left' if plan['resume'] else ''} ({parts}; the fewer where early "
        f"stopping ends each stage as soon as it may). Estimated from {estimate.TIMED_STEPS} steps of each model "
        f"timed here now on the run's batches, with "
        f"{threads['threads']} thread(s) ({threads['reason']}); the distillation terms come on top (a small share "
        f"for logit methods)"
    )
    return "\n".join(lines)

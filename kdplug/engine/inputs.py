"""The run's inputs, before any student trains: the task, the teacher (loaded; fine-tuned once and
stored, or reused; checked against the majority class), its cached outputs and the transfer set."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from ..config import RunConfig
from ..errors import DataError, UsageError
from ..logs import FILE_ONLY
from ..registry import Registry
from ..storage import building_under, default_cache_root, file_lock
from ..types import Example, Task, Teacher
from . import health, preflight
from . import teacher as teacher_stage
from .cache import TeacherCache
from .checkpoint import Checkpointer
from .data import EncodedSplit, encode
from .schedule import default_epochs, resolve_min_epochs, resolve_patience, stopping_rule
from .speed import served_remotely
from .tracking import Tracking
from .trainer import (
    Trainer,
    build_accelerator,
    count_parameters,
    inference_precision,
    predictions_from_logits,
    process_state,
)
from .transfer_outputs import TransferOutputs

if TYPE_CHECKING:
    from .transfer import TransferSet

log = logging.getLogger("kdplug")


def create_teacher(config: RunConfig, registry: Registry, task: Task, **extra: Any) -> Teacher:
    """The teacher ``config`` names: a registered name, a checkpoint directory or a hub id."""
    name, source = registry.model_reference("teacher", config.teacher)
    root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_root()
    with building_under(root):  # what it stores (a served teacher's answers) goes to the run's cache
        return registry.create("teacher", name, task, **{**config.teacher_options, **source, **extra})


def broadcast_object(value):
    """The main process's ``value`` on every rank (e.g. a time-stamped default output path)."""
    if process_state().num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


@dataclass(frozen=True, kw_only=True)
class RunEnvironment:
    """Where a run computes its inputs: the device, the cache, the checkpoints of the teacher's
    fine-tuning, this process's rank, where messages go and the trackers (if any)."""

    accelerator: Accelerator
    cache_root: Path
    checkpoints: Checkpointer
    main_process: bool = True
    echo: Callable[[str], None] = print
    tracker: Optional[Tracking] = None


@dataclass(frozen=True, kw_only=True)
class TaskAndTeacher:
    """The task, the teacher as configured (not fine-tuned yet), the sequence length and the
    tokenised train and dev splits: what both a run and its dry run start from."""

    task: Task
    teacher: Teacher
    max_length: int
    train: EncodedSplit
    dev: dict[str, EncodedSplit]


@dataclass(frozen=True, kw_only=True)
class RunInputs:
    """What a run computes once, before any student trains, built whole by :func:`prepare_inputs`
    (the dry run's by :func:`kdplug.engine.plan.planned_inputs`): the task, the teacher (fine-tuned,
    frozen), the tokenised splits, the students' trainer, the cache's root, the teacher's outputs
    (opened or computed on first use; planned in a dry run), what metrics.json records of the
    teacher, and the transfer set with the teacher's outputs on it (both None without one).
    ``dev_caches`` are the teacher's dev outputs where the run judged it (None: it does not read the
    teacher)."""

    task: Task
    teacher: Teacher
    max_length: int
    train: EncodedSplit
    dev: dict[str, EncodedSplit]
    trainer: Trainer
    cache_root: Path
    caches: Any  # teacher_stage.TeacherOutputs, or the dry run's plan.PlannedOutputs
    teacher_info: dict[str, Any] = field(default_factory=dict)
    dev_caches: Optional[dict[str, TeacherCache]] = None
    transfer: Optional[TransferSet] = None
    transfer_outputs: Optional[TransferOutputs] = None
    #: an ensemble's member whose layers layer methods read (None: ``teacher``'s, or no ensemble)
    layer_teacher: Optional[Teacher] = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the splits are encoded with: the teacher's."""
        return self.teacher.tokenizer

    def splits_with(self, tokenizer: Any) -> tuple[EncodedSplit, dict[str, EncodedSplit]]:
        """The data encoded with ``tokenizer`` (None: the run's encoding)."""
        if tokenizer is None or tokenizer is self.tokenizer:
            return self.train, self.dev
        task = self.task

        def encoded(name: str) -> EncodedSplit:
            return encode(task.load_split(name), tokenizer, self.max_length, is_regression=task.is_regression)

        return encoded("train"), {name: encoded(name) for name in task.dev_splits}


def teacher_seed(config: RunConfig) -> int:
    """The seed of everything teacher-side (its fine-tuning, the transfer set): ``teacher_seed``, else ``seed``."""
    return config.seed if config.teacher_seed is None else config.teacher_seed


def prepare_inputs(
    config: RunConfig,
    registry: Registry,
    env: RunEnvironment,
    loaded: Optional[tuple[Task, dict[str, list[Example]]]] = None,
    record: Callable[[dict[str, Any]], None] = lambda facts: None,
    *,
    warm: bool = False,
) -> RunInputs:
    """The run's inputs: the task and data (``loaded`` by :func:`load_task`, or loaded now), the
    teacher fine-tuned (or reused) and frozen, its outputs (opened on first use), the teacher judged
    against the majority class where the run reads it, and the transfer set. ``record`` receives
    what metrics.json records as soon as it is known, so that a run that fails later keeps it.
    ``warm`` (:func:`warm_teacher`): the teacher's outputs computed now instead of judged, and no
    transfer set where the run does not read the teacher."""
    set_seed(teacher_seed(config))
    if config.is_ensemble:
        from .ensemble import prepare_ensemble_inputs

        return prepare_ensemble_inputs(config, registry, env, loaded, record, warm=warm)
    base = load_task_and_teacher(config, registry, loaded)
    task, max_length, train, dev = base.task, base.max_length, base.train, base.dev
    trainer = student_trainer(config, env, task)
    record({"task": task.name, "main_metric": task.main_metric, "config": config.to_dict()})
    teacher, info = prepare_teacher(config, registry, base, env)
    freeze_and_describe(teacher, info, config.precision, env)
    record({"teacher": info})
    caches = teacher_outputs(
        teacher, base, registry, trainer, env, config.precision, layers=preflight.reads_teacher_layers(config, registry)
    )
    extractor = caches.extractor
    reads_teacher, dev_caches = preflight.reads_teacher(config, registry), None
    if reads_teacher and warm:
        caches()
        env.echo(f"teacher outputs cached for train and {', '.join(dev)}")
    elif reads_teacher:
        dev_caches = caches.dev_caches()
        check_teacher(config, task, dev, dev_caches, info, env.echo)
    transfer = build_transfer_set(config, registry, task, teacher, env) if reads_teacher or not warm else None
    return RunInputs(
        task=task,
        teacher=teacher,
        max_length=max_length,
        train=train,
        dev=dev,
        trainer=trainer,
        cache_root=env.cache_root,
        caches=caches,
        teacher_info=info,
        dev_caches=dev_caches,
        transfer=transfer,
        transfer_outputs=None
        if transfer is None
        else transfer_outputs(config, transfer, teacher, extractor, trainer, task, max_length, env.cache_root),
    )


def freeze_and_describe(teacher: Teacher, info: dict[str, Any], precision: str, env: RunEnvironment) -> None:
    """The prepared teacher frozen, and what metrics.json records of it beside its preparation: its size
    (a served one's is the server's: not shown as 0) and the precision ``auto`` resolved to."""
    teacher_stage.freeze(teacher)
    info["parameters"] = count_parameters(teacher.model)
    if served_remotely(teacher.model):
        info["served_remotely"] = True
    info["precision"] = inference_precision(precision, env.accelerator.device)


def teacher_outputs(
    teacher: Teacher,
    base: TaskAndTeacher,
    registry: Registry,
    trainer: Trainer,
    env: RunEnvironment,
    precision: str,
    *,
    layers: bool,
) -> teacher_stage.TeacherOutputs:
    """The teacher's outputs on the data as it reads it (its prompt, its tokenizer), opened on first use."""
    train, dev = teacher_stage.teacher_splits(teacher, base.task, base.max_length, base.train, base.dev)
    return teacher_stage.TeacherOutputs(
        teacher=teacher,
        extractor=registry.find_layer_extractor(teacher.model),
        trainer=trainer,
        task=base.task,
        train=train,
        dev=dev,
        root=env.cache_root,
        precision=precision,
        layers=layers,
    )


def transfer_outputs(
    config: RunConfig,
    transfer: TransferSet,
    teacher: Teacher,
    extractor: Any,
    trainer: Trainer,
    task: Task,
    max_length: int,
    cache_root: Path,
) -> TransferOutputs:
    """The teacher's outputs on the transfer set, computed on first use."""
    return TransferOutputs(
        transfer=transfer,
        teacher=teacher,
        extractor=extractor,
        trainer=trainer,
        task=task,
        max_length=max_length,
        root=cache_root,
        precision=config.precision,
    )


def student_trainer(config: RunConfig, env: RunEnvironment, task: Task) -> Trainer:
    """The trainer of the run's students (and of the teacher's cached outputs)."""
    trainer = Trainer(
        env.accelerator,
        task,
        batch_size=config.batch_size,
        seed=config.seed,
        weight_decay=config.weight_decay,
        warmup_ratio=config.warmup_ratio,
        best_checkpoint=config.best_checkpoint,
        num_workers=config.num_workers,
        teacher_tokens_per_batch=config.teacher_tokens_per_batch,
        eval_tokens_per_batch=config.eval_tokens_per_batch,
    )
    trainer.tracking = env.tracker
    return trainer


def prepare_teacher(
    config: RunConfig, registry: Registry, inputs: TaskAndTeacher, env: RunEnvironment
) -> tuple[Teacher, dict[str, Any]]:
    """The teacher fine-tuned on the task: as given, reused from the store, or fine-tuned now and
    stored; and what metrics.json records of it.

    Fine-tuning runs under a lock on its key, so a second run that needs the same teacher waits
    for the first and reuses what it stored instead of fine-tuning again.
    """
    teacher = inputs.teacher
    info: dict[str, Any] = {
        "name": config.teacher,
        "source": teacher.source,
        "pretrained": teacher.pretrained,
        **teacher.extra,
    }
    for note in teacher.notes:
        env.echo(note)
    if teacher.finetuned:
        info["finetuned"] = {"given": True}
        return teacher, info
    settings = finetune_settings(config, teacher, inputs.train, inputs.max_length, teacher_seed(config))
    key = teacher_stage.finetune_key(teacher, inputs.task, inputs.train, inputs.dev, settings)
    store = teacher_stage.teacher_store(env.cache_root)
    lock = file_lock(store / f"{key}.lock") if env.main_process else nullcontext()
    with lock:  # the other ranks of a multi-process run follow the main one's decision
        stored = broadcast_object(teacher_stage.stored_teacher_dir(env.cache_root, key) if env.main_process else None)
        if stored is not None:
            env.echo(f"teacher: reusing the fine-tuned teacher {stored}")
            summary = teacher_stage.stored_summary(stored)
            info["finetuned"] = {
                "reused": str(stored),
                **{k: summary[k] for k in ("best_epoch", "dev", "history", "seconds") if k in summary},
            }
            reloaded = create_teacher(config, registry, inputs.task, source=str(stored))
            reloaded.pretrained = teacher.pretrained
            return reloaded, info
        summary = finetune_teacher(config, registry, inputs, env, settings)
        if env.main_process:
            teacher_stage.store(teacher, env.cache_root, key, summary)
        env.accelerator.wait_for_everyone()
    if teacher.after_finetuning is not None:  # stored as trained (a LoRA adapter); now, e.g., merged
        teacher.after_finetuning()
    info["finetuned"] = {**summary, "stored": str(store / key)}
    return teacher, info


def finetune_teacher(
    config: RunConfig, registry: Registry, inputs: TaskAndTeacher, env: RunEnvironment, settings: dict[str, Any]
) -> dict[str, Any]:
    """Fine-tune the teacher now, as ``settings`` (:func:`finetune_settings`) say; its summary."""
    teacher, task = inputs.teacher, inputs.task
    epochs, patience, min_epochs = settings["epochs"], settings.get("patience", 0), settings.get("min_epochs", 0)
    stopping = stopping_rule(patience, min_epochs, epochs)
    method = f", {settings['method']}" if settings.get("method") else ""
    env.echo(
        f"teacher: fine-tuning {teacher.source} on {task.name} ({epochs} epochs at lr {settings['lr']:g}"
        f"{stopping}{method})"
    )
    trainer = Trainer(
        env.accelerator,
        task,
        batch_size=config.teacher_batch_size,
        seed=settings["seed"],
        weight_decay=config.weight_decay,
        warmup_ratio=config.warmup_ratio,
        eval_tokens_per_batch=config.eval_tokens_per_batch,
    )
    trainer.tracking = env.tracker
    return teacher_stage.finetune(
        teacher,
        registry.find_layer_extractor(teacher.model),
        trainer,
        task,
        inputs.train,
        inputs.dev,
        epochs=epochs,
        lr=settings["lr"],
        task_loss=registry.create("loss", "mse" if task.is_regression else "ce"),
        regression=task.is_regression,
        checkpoints=env.checkpoints,
        patience=patience,
        min_epochs=min_epochs,
    )


#: the teacher's fine-tuning learning rate where neither the run nor the teacher says one (every weight)
DEFAULT_TEACHER_LR = 5e-5


def finetune_settings(
    config: RunConfig, teacher: Teacher, train: EncodedSplit, max_length: int, seed: int
) -> dict[str, Any]:
    """How the teacher is fine-tuned (part of the stored teacher's key): epochs (the run's, else
    enough for 300 steps), lr (the run's, else the teacher's own default, else 5e-5), batch size,
    length, seed, early stopping where kdplug chose the epochs, and the teacher's own way of
    fine-tuning (``Teacher.finetuning``: LoRA's settings)."""
    epochs = (
        default_epochs(teacher.model, len(train), config.teacher_batch_size)
        if config.teacher_epochs is None
        else config.teacher_epochs
    )
    patience = resolve_patience(config.patience, config.teacher_epochs is None)
    min_epochs = resolve_min_epochs(config.min_epochs, epochs) if patience else 0
    # a warm-up no longer than patience + 1 epochs changes nothing, and leaves earlier teachers' keys as they were
    warm_up = {"min_epochs": min_epochs} if min_epochs > patience + 1 else {}
    return {
        "epochs": epochs,
        "lr": config.teacher_lr or teacher.default_lr or DEFAULT_TEACHER_LR,
        "batch_size": config.teacher_batch_size,
        "max_length": max_length,
        "seed": seed,
        **({"patience": patience, **warm_up} if patience else {}),
        **getattr(teacher, "finetuning", {}),  # how, where not every weight (LoRA); absent for full fine-tuning
    }


def load_task(config: RunConfig, registry: Registry) -> tuple[Task, dict[str, list[Example]]]:
    """The task and its examples (train, then each dev split), read once and checked: what a run
    calls before it makes its run directory, so that missing or too little data leaves none."""
    task = registry.create("task", config.task, data_dir=config.data_dir, **config.task_options)
    examples = {name: task.load_split(name) for name in ("train", *task.dev_splits)}
    if preflight.reads_teacher(config, registry) and not config.allow_weak_teacher:
        check_enough_to_judge_a_teacher(config, task, examples)
    return task, examples


def load_task_and_teacher(
    config: RunConfig,
    registry: Registry,
    loaded: Optional[tuple[Task, dict[str, list[Example]]]] = None,
    *,
    run: Optional[RunConfig] = None,
) -> TaskAndTeacher:
    """The task (``loaded`` by :func:`load_task`, or loaded now), the teacher as configured, the
    sequence length and the tokenised train and dev splits. ``run``: the ensemble's configuration where
    ``config`` is a member's, whose projectors are checked against its layer teacher, not this member."""
    task, examples = loaded or load_task(config, registry)
    preflight.check_projectors(run or config, registry, task)  # before the teacher is loaded (or fine-tuned)
    teacher = create_teacher(config, registry, task)
    max_length = preflight.sequence_length(config, task, teacher)
    plan_for = getattr(teacher.model, "kdplug_plan_for", None)
    if plan_for is not None:  # a served teacher counts its requests with the texts cut to max_length, as sent
        plan_for(max_length)
    preflight.check_component_options(config, registry, task, teacher)
    encoded = {
        name: encode(split, teacher.tokenizer, max_length, is_regression=task.is_regression)
        for name, split in examples.items()
    }
    train, dev = encoded.pop("train"), encoded
    for name, split in [("train", train), *dev.items()]:
        if len(split) == 0:
            raise UsageError(f"task {task.name!r}: the {name} split is empty; check --data-dir and the task options")
    return TaskAndTeacher(task=task, teacher=teacher, max_length=max_length, train=train, dev=dev)


#: the fewest dev examples on which a teacher's score says whether it beats the majority class
MIN_DEV_EXAMPLES = 10
#: the fewest training examples per class from which a teacher can learn the class
MIN_TRAIN_PER_CLASS = 2


def check_enough_to_judge_a_teacher(config: RunConfig, task: Task, examples: dict[str, list[Example]]) -> None:
    """Refuse, before any model is loaded, data too small to fine-tune a teacher or to judge it
    against the majority class: a run on it would train for minutes and then stop on a verdict
    that a handful of examples cannot give."""
    first = task.dev_splits[0]
    problems = []
    if 0 < len(examples[first]) < MIN_DEV_EXAMPLES:
        problems.append(f"the {first} split has {len(examples[first])} examples (at least {MIN_DEV_EXAMPLES})")
    if task.labels and examples["train"]:
        counts = Counter(int(example.label) for example in examples["train"])
        few = [f"{name!r} {counts[i]}" for i, name in enumerate(task.labels) if counts[i] < MIN_TRAIN_PER_CLASS]
        if few:
            problems.append(f"training examples per class: {', '.join(few)} (at least {MIN_TRAIN_PER_CLASS} of each)")
    if problems:
        where = f" in {config.data_dir}" if config.data_dir else ""
        raise DataError(
            f"task {task.name!r}{where}: too few examples to fine-tune a teacher and tell whether it beats "
            f"the majority class: {'; '.join(problems)}. Add labelled examples (kdplug's examples/reviews has "
            f"232 for training and 80 for dev), or pass --set allow_weak_teacher=true to distil without judging "
            f"the teacher"
        )


def check_teacher(
    config: RunConfig,
    task: Task,
    dev: dict[str, EncodedSplit],
    dev_caches: dict[str, TeacherCache],
    info: dict[str, Any],
    echo: Callable[[str], None],
) -> None:
    """The teacher's dev metrics beside the majority class's, recorded in ``info``; a teacher that is
    not clearly better (or predicts one class) stops the run before any distillation, unless
    ``allow_weak_teacher``: distilling it would teach the student its mistakes."""
    first = task.dev_splits[0]
    predictions = {
        name: predictions_from_logits(torch.from_numpy(cache.logits[:].copy()), task.is_regression).tolist()
        for name, cache in dev_caches.items()
    }
    info["dev"] = {name: task.compute_metrics(predictions[name], dev[name].labels) for name in dev_caches}
    check = health.check_teacher(task, predictions[first], dev[first].labels, info["dev"][first][task.main_metric])
    info["check"] = {**check, "allowed": bool(config.allow_weak_teacher) and not check["passed"]}
    what = "majority class" if task.labels else "constant prediction"
    figures = (
        f"teacher: dev {task.main_metric} {check['teacher'] * 100:.2f} on {first} ({len(dev[first])} examples); "
        f"the {what} scores {check['majority_class'] * 100:.2f}"
    )
    log.info("%s", figures, extra=FILE_ONLY)
    if check["passed"]:
        echo(figures)
        return
    problems = "; ".join(check["problems"])
    if config.allow_weak_teacher:
        echo(f"{figures}. WARNING: {problems}; going on because allow_weak_teacher is set")
        log.warning(
            "the teacher is weak (%s); allow_weak_teacher is set, distilling it anyway", problems, extra=FILE_ONLY
        )
        return
    here = "finetuned" in info and "given" not in info["finetuned"]  # kdplug fine-tuned it (or reused its own)
    kept = (
        "The fine-tuned teacher and its outputs are kept in the cache. "
        if here
        else "Its dev outputs are kept in the cache. "
    )
    raise WeakTeacherError(
        f"{figures}. The teacher is not worth distilling: {problems}. Likely causes: "
        f"{health.weak_teacher_causes(task, check, prompted=info.get('prompted'), finetuned_here=here)}. {kept}"
        f"To distil it anyway: --set allow_weak_teacher=true"
    )


class WeakTeacherError(UsageError):
    """The teacher does not beat the majority class on dev: distilling it would not help."""


def build_transfer_set(config: RunConfig, registry: Registry, task: Task, teacher: Teacher, env: RunEnvironment):
    """The run's transfer set (engine/transfer.py), or None when it has none. Its teacher outputs
    are cached by the first stage that distils."""
    if not (config.transfer or config.augment):
        return None
    from . import transfer

    # built under a lock (parallel runs build it once); the processes of a launch share the augmenting
    return transfer.build_or_load(
        config,
        registry,
        task,
        teacher,
        task.load_split("train"),
        {name: task.load_split(name) for name in task.dev_splits},
        root=env.cache_root,
        seed=teacher_seed(config),
        echo=env.echo,
        processes=teacher_stage.launch_processes(env.accelerator),
    )


def warm_teacher(config: RunConfig, registry: Registry, *, echo: Callable[[str], None] = print) -> None:
    """Fine-tune (or find) the teacher that a run of ``config`` needs and store its outputs, training
    no student: what a sweep does once before its jobs fan out, so they all reuse the two."""
    import tempfile

    preflight.resolve_components(config, registry)
    cache_root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_root()
    cache_root.mkdir(parents=True, exist_ok=True)
    accelerator = build_accelerator(config.precision)
    # the fine-tuning's own checkpoints are scratch here: the fine-tuned teacher lands in the store
    with tempfile.TemporaryDirectory(prefix=".warm-", dir=cache_root) as scratch:
        how = "run the same command again (the teacher's fine-tuning starts over)"
        checkpoints = Checkpointer(Path(scratch), how_to_continue=how)
        env = RunEnvironment(accelerator=accelerator, cache_root=cache_root, checkpoints=checkpoints, echo=echo)
        inputs = prepare_inputs(config, registry, env, warm=True)
    if inputs.transfer_outputs is not None:
        inputs.transfer_outputs(layers=preflight.reads_teacher_layers(config, registry))
        echo(f"teacher outputs cached for the transfer set ({len(inputs.transfer)} examples)")

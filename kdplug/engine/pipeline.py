"""``kdplug run``: task -> teacher (fine-tuned once) -> teacher cache -> recipe -> evaluation -> run directory."""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from accelerate.utils import set_seed
from torch import nn

from .. import find_layer_extractor
from ..config import RunConfig, command_line
from ..errors import UsageError
from ..registry import Registry
from ..types import Task, Teacher, matchable_layers, text_columns
from .. import fingerprint
from ..hub import display_name
from . import analysis, faults, health, interrupt, package, preflight
from . import speed as speed_module
from . import teacher as teacher_stage
from ..storage import default_cache_root, file_lock, raise_as_storage_error
from .cache import TeacherCache
from .checkpoint import Checkpointer
from .data import EncodedSplit, encode
from .recipe import RecipeContext, count_parameters, default_epochs, resolve_patience
from .speed import Speed
from .tracking import TRACKING_DIR, Tracking, parse_report_to
from .interrupt import RunInterrupted
from .rundir import (BASELINE_PREDICTIONS_FILE, COMPLETED, CONFIG_FILE, FAILED, INTERRUPTED, RUNNING, STUDENT_DIR, RunDirectory,
                     default_output, is_completed)
from .trainer import Trainer, build_accelerator, predictions_from_logits, process_state

log = logging.getLogger("kdplug")

CHECKPOINT_DIR = "checkpoints"


@dataclass
class Row:
    """One line of the closing table."""

    model: str
    parameters: int
    dev: dict[str, dict[str, float]]
    speed: Optional[Speed] = None
    speedup: Optional[float] = None


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    rows: list[Row] = field(default_factory=list)


def create_teacher(config: RunConfig, registry: Registry, task: Task, **extra: Any) -> Teacher:
    """The teacher ``config`` names: a registered name, a checkpoint directory or a hub id."""
    name, source = registry.model_reference("teacher", config.teacher)
    return registry.create("teacher", name, task, **{**config.teacher_options, **source, **extra})


def run(config: RunConfig, registry: Registry, *, overwrite: bool = False, resume: bool = False,
        echo: Callable[[str], None] = print) -> RunResult:
    """Run ``config`` into a new run directory (or, with ``resume``, continue the run already in
    ``config.output`` from its checkpoints).

    Every name, option and directory is checked first. A run that fails leaves its directory
    usable: the error and traceback in log.txt, ``status: failed`` in metrics.json, and the same
    command run again replaces it.
    """
    started = time.perf_counter()
    notes = preflight.resolve_components(config, registry)
    cache_root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_root()
    # Under `accelerate launch` / `torchrun` every rank runs this; only the main one writes files
    # and prints, the others compute their shard and wait.
    main_process = process_state().is_main_process
    if config.output is None:
        config.output = str(broadcast_object(str(default_output(config))))
    output = Path(config.output)
    preflight.writable_paths(config, output, cache_root)
    run_dir = RunDirectory(output)
    if main_process and not resume:
        run_dir = RunDirectory.create(output, overwrite=overwrite)
    elif main_process:
        run_dir.set_status(RUNNING)
    process_state().wait_for_everyone()
    handler = run_dir.attach_log() if main_process else None
    say = echo if main_process else _silent
    for note in notes:
        say(note)
        log.info(note)
    closing: list[Callable[[], None]] = []  # what must end with the run, however it ends (trackers)
    metrics: dict[str, Any] = {}  # filled as the run goes: a failed run still records what it measured
    try:
        with interrupt.graceful_stop():
            result = _run(config, registry, run_dir, cache_root, started, say, main_process, closing, metrics)
        if main_process and not config.keep_checkpoints:
            shutil.rmtree(run_dir.path / CHECKPOINT_DIR, ignore_errors=True)
        return result
    except RunInterrupted as exc:
        if main_process:
            run_dir.set_status(INTERRUPTED, message=str(exc))
        raise
    except BaseException as exc:
        if main_process:
            record_failure(run_dir, exc, started, metrics)
        raise
    finally:
        for close in closing:
            close()
        if handler is not None:
            logging.getLogger("kdplug").removeHandler(handler)
            with suppress(OSError):  # a full disk must not replace the error being reported
                handler.close()


def record_failure(run_dir: RunDirectory, exc: BaseException, started: float,
                   measured: Optional[dict[str, Any]] = None) -> None:
    """log.txt gets the traceback, metrics.json and the marker say ``failed`` and why; metrics.json
    also keeps what the run ``measured`` before it failed (e.g. the teacher's check)."""
    message = str(exc) or type(exc).__name__
    log.error("the run failed: %s\n%s", message, "".join(traceback.format_exception(exc)).rstrip())
    failure = {"status": FAILED, "error": message, "error_type": type(exc).__name__,
               "wall_seconds": round(time.perf_counter() - started, 2)}
    # the disk that failed the run may fail this too: then the short record, else nothing (the
    # error itself still reaches the user)
    for record in ({**(measured or {}), **failure}, failure):
        try:
            run_dir.write_metrics(record)
            run_dir.set_status(FAILED, message=message)
            return
        except OSError:
            continue


def _silent(message: str) -> None:
    pass


def broadcast_object(value):
    """The main process's ``value`` on every rank (e.g. a time-stamped default output path)."""
    if process_state().num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


def resume_config(run_dir: Path) -> RunConfig:
    """The configuration of the interrupted run in ``run_dir``."""
    from ..config import build_config

    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(f"{run_dir} holds no run to resume (no {CONFIG_FILE}); pass the run directory "
                         f"that 'kdplug run' printed")
    if is_completed(run_dir) and not (run_dir / CHECKPOINT_DIR).exists():
        raise UsageError(f"the run in {run_dir} already completed; nothing to resume")
    config = build_config(file=str(run_dir / CONFIG_FILE))
    config.output = str(run_dir)
    return config


def prepare_teacher(config: RunConfig, registry: Registry, task: Task, teacher: Teacher, train, dev, *,
                    accelerator, cache_root: Path, checkpoints: Checkpointer, seed: int, main_process: bool,
                    max_length: int, echo: Callable[[str], None], tracker: Optional[Tracking] = None,
                    ) -> tuple[Teacher, dict[str, Any]]:
    """The teacher fine-tuned on the task: as given, reused from the store, or fine-tuned now and stored.

    Fine-tuning runs under a lock on its key, so a second run that needs the same teacher waits
    for the first and reuses what it stored instead of fine-tuning again.
    """
    info: dict[str, Any] = {"name": config.teacher, "source": teacher.source, "pretrained": teacher.pretrained,
                            **teacher.extra}
    for note in teacher.notes:
        echo(note)
    if teacher.finetuned:
        info["finetuned"] = {"given": True}
        return teacher, info
    settings = finetune_settings(config, teacher, train, max_length, seed)
    epochs, patience = settings["epochs"], settings.get("patience", 0)
    key = teacher_stage.finetune_key(teacher, task, train, dev, settings)
    lock = file_lock(teacher_stage.teacher_store(cache_root) / f"{key}.lock") if main_process else nullcontext()
    with lock:  # the other ranks of a multi-process run follow the main one's decision
        stored = broadcast_object(teacher_stage.stored_teacher_dir(cache_root, key) if main_process else None)
        if stored is not None:
            echo(f"teacher: reusing the fine-tuned teacher {stored}")
            summary = teacher_stage.stored_summary(stored)
            info["finetuned"] = {"reused": str(stored),
                                 **{k: summary[k] for k in ("best_epoch", "dev", "history", "seconds") if k in summary}}
            reloaded = create_teacher(config, registry, task, source=str(stored))
            reloaded.pretrained = teacher.pretrained
            return reloaded, info
        stopping = f", early stopping after {patience} epochs without a dev improvement" if patience else ""
        echo(f"teacher: fine-tuning {teacher.source} on {task.name} ({epochs} epochs at lr {config.teacher_lr:g}"
             f"{stopping})")
        trainer = Trainer(accelerator, task, batch_size=config.teacher_batch_size, seed=seed,
                          weight_decay=config.weight_decay, warmup_ratio=config.warmup_ratio)
        trainer.tracking = tracker
        summary = teacher_stage.finetune(
            teacher, trainer, task, train, dev, epochs=epochs, lr=config.teacher_lr,
            task_loss=registry.create("loss", "mse" if task.is_regression else "ce"), regression=task.is_regression,
            checkpoints=checkpoints, patience=patience)
        if main_process:
            teacher_stage.store(teacher, cache_root, key, summary)
        accelerator.wait_for_everyone()
    info["finetuned"] = {**summary, "stored": str(teacher_stage.teacher_store(cache_root) / key)}
    return teacher, info


def finetune_settings(config: RunConfig, teacher: Teacher, train: EncodedSplit, max_length: int,
                      seed: int) -> dict[str, Any]:
    """How the teacher is fine-tuned (part of the stored teacher's key): epochs (the run's, else
    enough for 300 steps), lr, batch size, length, seed, and early stopping where kdplug chose the
    epochs."""
    epochs = default_epochs(teacher.model, len(train), config.teacher_batch_size) if config.teacher_epochs is None \
        else config.teacher_epochs
    patience = resolve_patience(config.patience, config.teacher_epochs is None)
    return {"epochs": epochs, "lr": config.teacher_lr, "batch_size": config.teacher_batch_size,
            "max_length": max_length, "seed": seed, **({"patience": patience} if patience else {})}


def load_task_and_teacher(config: RunConfig, registry: Registry) -> tuple[Task, Teacher, int, EncodedSplit,
                                                                         dict[str, EncodedSplit]]:
    """The task, the teacher as configured, the sequence length and the tokenised train and dev splits."""
    task = registry.create("task", config.task, data_dir=config.data_dir, **config.task_options)
    teacher = create_teacher(config, registry, task)
    max_length = preflight.sequence_length(config, task, teacher)
    preflight.check_component_options(config, registry, task, teacher)
    train = encode(task.load_split("train"), teacher.tokenizer, max_length, is_regression=task.is_regression)
    dev = {name: encode(task.load_split(name), teacher.tokenizer, max_length, is_regression=task.is_regression)
           for name in task.dev_splits}
    for name, split in [("train", train), *dev.items()]:
        if len(split) == 0:
            raise UsageError(f"task {task.name!r}: the {name} split is empty; check --data-dir and the task options")
    return task, teacher, max_length, train, dev


def teacher_caches(config: RunConfig, teacher: Teacher, trainer: Trainer, task: Task, train: EncodedSplit,
                   dev: dict[str, EncodedSplit], cache_root: Path) -> teacher_stage.TeacherOutputs:
    """The teacher's outputs on train and every dev split, opened (or computed and stored) on first use."""
    return teacher_stage.TeacherOutputs(teacher, trainer, task, train, dev, root=cache_root, precision=config.precision)


def check_teacher(config: RunConfig, task: Task, dev: dict[str, EncodedSplit], dev_caches: dict[str, TeacherCache],
                  info: dict[str, Any], echo: Callable[[str], None]) -> None:
    """The teacher's dev metrics beside the majority class's, recorded in ``info``; a teacher that is
    not clearly better (or predicts one class) stops the run before any distillation, unless
    ``allow_weak_teacher``: distilling it would teach the student its mistakes."""
    first = task.dev_splits[0]
    predictions = {name: predictions_from_logits(torch.from_numpy(cache.logits[:].copy()), task.is_regression).tolist()
                   for name, cache in dev_caches.items()}
    info["dev"] = {name: task.compute_metrics(predictions[name], dev[name].labels) for name in dev_caches}
    check = health.check_teacher(task, predictions[first], dev[first].labels, info["dev"][first][task.main_metric])
    info["check"] = {**check, "allowed": bool(config.allow_weak_teacher) and not check["passed"]}
    what = "majority class" if task.labels else "constant prediction"
    figures = (f"teacher: dev {task.main_metric} {check['teacher'] * 100:.2f} on {first} ({len(dev[first])} examples); "
               f"the {what} scores {check['majority_class'] * 100:.2f}")
    if check["passed"]:
        echo(figures)
        return
    problems = "; ".join(check["problems"])
    if config.allow_weak_teacher:
        echo(f"{figures}. WARNING: {problems}; going on because allow_weak_teacher is set")
        log.warning("the teacher is weak (%s); allow_weak_teacher is set, distilling it anyway", problems)
        return
    raise WeakTeacherError(
        f"{figures}. The teacher is not worth distilling: {problems}. Likely causes: "
        f"{health.weak_teacher_causes(task, check)}. The fine-tuned teacher and its outputs are kept in the cache. "
        f"To distil it anyway: --set allow_weak_teacher=true")


class WeakTeacherError(UsageError):
    """The teacher does not beat the majority class on dev: distilling it would not help."""


def build_transfer_set(config: RunConfig, registry: Registry, task: Task, teacher: Teacher, cache_root: Path,
                       seed: int, echo: Callable[[str], None]):
    """The run's transfer set (engine/transfer.py), or None when it has none. Its teacher outputs
    are cached by the first stage that distils."""
    if not (config.transfer or config.augment):
        return None
    from . import transfer

    # built under a lock: the ranks of a multi-process run (and parallel runs) build it once
    return transfer.build_or_load(
        config, registry, task, teacher, task.load_split("train"), {name: task.load_split(name) for name in task.dev_splits},
        root=cache_root, seed=seed, teacher_fingerprint=fingerprint.of_module(teacher.model), echo=echo)


def agreement(predictions: list, cache: TeacherCache) -> float:
    """The share of examples on which the student predicts the teacher's class."""
    teacher = predictions_from_logits(torch.from_numpy(cache.logits[:].copy()), is_regression=False)
    return float((torch.tensor(predictions) == teacher).float().mean())


def warm_teacher(config: RunConfig, registry: Registry, *, echo: Callable[[str], None] = print) -> None:
    """Fine-tune (or find) the teacher that a run of ``config`` needs and store its outputs, training
    no student: what a sweep does once before its jobs fan out, so they all reuse the two."""
    import tempfile

    preflight.resolve_components(config, registry)
    cache_root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_root()
    cache_root.mkdir(parents=True, exist_ok=True)
    teacher_seed = config.seed if config.teacher_seed is None else config.teacher_seed
    set_seed(teacher_seed)
    accelerator = build_accelerator(config.precision)
    task, teacher, max_length, train, dev = load_task_and_teacher(config, registry)
    # the fine-tuning's own checkpoints are scratch here: the fine-tuned teacher lands in the store
    with tempfile.TemporaryDirectory(prefix=".warm-", dir=cache_root) as scratch:
        teacher, _ = prepare_teacher(config, registry, task, teacher, train, dev, accelerator=accelerator,
                                     cache_root=cache_root, checkpoints=Checkpointer(Path(scratch)),
                                     seed=teacher_seed, main_process=True, max_length=max_length, echo=echo)
    teacher_stage.freeze(teacher)
    if config.projector != "nkd" or config.baseline:
        trainer = Trainer(accelerator, task, batch_size=config.batch_size, seed=config.seed)
        teacher_caches(config, teacher, trainer, task, train, dev, cache_root)()
        echo(f"teacher outputs cached for train and {', '.join(dev)}")
        transfer_set = build_transfer_set(config, registry, task, teacher, cache_root, teacher_seed, echo)
        if transfer_set is not None:
            RecipeContext(config=config, registry=registry, task=task, teacher=teacher, trainer=trainer, train=train,
                          dev=dev, caches=None, cache_root=cache_root, max_length=max_length,
                          transfer=transfer_set).transfer_cache()
            echo(f"teacher outputs cached for the transfer set ({len(transfer_set)} examples)")


def _run(config: RunConfig, registry: Registry, run_dir: RunDirectory, cache_root: Path, started: float,
         echo: Callable[[str], None], main_process: bool, closing: list[Callable[[], None]],
         metrics: dict[str, Any]) -> RunResult:
    if main_process:
        run_dir.write_config(config)
    checkpoints = Checkpointer(run_dir.path / CHECKPOINT_DIR, every_steps=config.checkpoint_every)
    teacher_seed = config.seed if config.teacher_seed is None else config.teacher_seed
    set_seed(teacher_seed)
    trackers = parse_report_to(config.report_to)
    accelerator = build_accelerator(config.precision, log_with=trackers, project_dir=run_dir.path / TRACKING_DIR)
    echo(f"kdplug run -> {run_dir.path}  (device: {accelerator.device}, cache: {cache_root})")
    tracker = Tracking(accelerator, trackers, run_dir.path, config.to_dict()) if trackers else None
    if tracker is not None:
        closing.append(tracker.finish)

    task, teacher, max_length, train, dev = load_task_and_teacher(config, registry)
    trainer = Trainer(accelerator, task, batch_size=config.batch_size, seed=config.seed,
                      weight_decay=config.weight_decay, warmup_ratio=config.warmup_ratio,
                      best_checkpoint=config.best_checkpoint, num_workers=config.num_workers)
    trainer.tracking = tracker
    metrics.update({"task": task.name, "main_metric": task.main_metric, "config": config.to_dict()})

    teacher, teacher_info = prepare_teacher(config, registry, task, teacher, train, dev, accelerator=accelerator,
                                            cache_root=cache_root, checkpoints=checkpoints, seed=teacher_seed,
                                            main_process=main_process, max_length=max_length, echo=echo,
                                            tracker=tracker)
    teacher_stage.freeze(teacher)
    teacher_info["parameters"] = count_parameters(teacher.model)
    metrics["teacher"] = teacher_info
    caches = teacher_caches(config, teacher, trainer, task, train, dev, cache_root)
    dev_caches = None
    if config.projector != "nkd" or config.baseline:
        dev_caches = caches.dev_caches()
        check_teacher(config, task, dev, dev_caches, teacher_info, echo)
    rows = [Row(f"teacher ({display_name(config.teacher)})", teacher_info["parameters"], teacher_info.get("dev", {}))]

    transfer_set = build_transfer_set(config, registry, task, teacher, cache_root, teacher_seed, echo)
    context = RecipeContext(config=config, registry=registry, task=task, teacher=teacher, trainer=trainer,
                            max_length=max_length, transfer=transfer_set,
                            train=train, dev=dev, caches=caches, cache_root=cache_root, checkpoints=checkpoints)

    # -- the baseline, for the comparison table ------------------------------------------------
    baseline_predictions: dict[str, Any] = {}
    if config.baseline:
        echo(f"baseline: {config.student} with {config.baseline}")
        student, result = train_baseline(context)
        metrics["baseline"] = {"projector": config.baseline, "dev": result.dev, "parameters": count_parameters(student)}
        baseline_dev = context.splits_for(student)[1]
        trainer.evaluate(student, baseline_dev, baseline_predictions)  # for paired comparisons with the run's student
        baseline_predictions = {name: {"predictions": baseline_predictions[name], "labels": split.labels}
                                for name, split in baseline_dev.items()}
        rows.append(Row(f"{config.student} + {config.baseline}", count_parameters(student), result.dev))

    # -- the recipe -------------------------------------------------------------------------
    echo(f"recipe {config.recipe}: {config.student} <- {config.projector}")
    recipe = registry.create("recipe", config.recipe, **config.recipe_options)
    student = recipe.run(context)
    if not isinstance(student, nn.Module):
        raise UsageError(f"recipe {config.recipe!r} returned {type(student).__name__}, not the trained student module")
    student_dev = context.splits_for(student)[1]
    predictions: dict[str, list] = {}
    final = trainer.evaluate(student, student_dev, predictions)
    if context.last_distillation is not None and main_process:
        stage, module = context.last_distillation
        first = task.dev_splits[0]
        metrics["analysis"] = analysis.write(
            run_dir.path, stage, module, first, context.splits_for(student)[1][first], context.teacher_cache()[1][first],
            list(matchable_layers(find_layer_extractor(student).layer_specs(student))),
            batch_size=config.batch_size * 2, device=accelerator.device)
        if tracker is not None:
            tracker.log_image(f"{stage}/attention", run_dir.path / analysis.ATTENTION_PLOT)
    metrics["stages"] = context.stages
    if transfer_set is not None:
        metrics["transfer"] = {**transfer_set.meta, "directory": str(transfer_set.directory),
                               "teacher_cache": context.transfer_info}
    if dev_caches is not None and not task.is_regression:
        # how often the student predicts what the teacher predicts: what distillation optimises
        metrics["agreement"] = {name: agreement(predictions[name], dev_caches[name]) for name in student_dev}
    metrics["student"] = {"name": config.student, "projector": config.projector, "recipe": config.recipe,
                          "dev": final, "parameters": count_parameters(student),
                          "init": getattr(student, "kdplug_init", {"init": "random"})}
    label = f"{config.student} + {config.projector}"
    if config.recipe != "standard":
        label += f" ({config.recipe})"
    rows.append(Row(label, count_parameters(student), final))
    first = task.dev_splits[0]
    if config.measure_speed:
        echo("measuring inference speed: teacher and student, batch 1 and 32, on dev inputs")
        teacher_speed = speed_module.measure(teacher.model, dev[first], accelerator.device)
        student_speed = speed_module.measure(student, student_dev[first], accelerator.device)
        ratio = speed_module.speedup(teacher_speed, student_speed)
        rows[0].speed = teacher_speed
        for row in rows[1:]:  # the baseline has the student's architecture, so its speed
            row.speed, row.speedup = student_speed, ratio
        metrics["speed"] = {"teacher": teacher_speed.as_dict(), "student": student_speed.as_dict(),
                            "speedup": round(ratio, 3) if ratio else None}
    metrics["wall_seconds"] = round(time.perf_counter() - started, 2)
    metrics["processes"] = accelerator.num_processes
    if main_process:
        try:
            faults.fire_at("run-results")
            write_student_package(run_dir, config, task, student, context, metrics, max_length)
            run_dir.write_predictions({name: {"predictions": predictions[name], "labels": split.labels}
                                       for name, split in student_dev.items()})
            if baseline_predictions:
                run_dir.write_predictions(baseline_predictions, BASELINE_PREDICTIONS_FILE)
            run_dir.write_metrics({"status": COMPLETED, **metrics})
            run_dir.set_status(COMPLETED)
        except BaseException as exc:
            raise_as_storage_error(exc, f"the results into {run_dir.path}",
                                   f"the trained student is kept in {checkpoints.root}; free space (or raise the "
                                   f"limit) and finish with 'kdplug run --resume {run_dir.path}'")
            raise
    accelerator.wait_for_everyone()
    echo(format_table(rows, task))
    if metrics.get("agreement"):
        echo(f"the student predicts the teacher's class on {metrics['agreement'][first] * 100:.2f}% of {first}")
    echo(f"wall time {metrics['wall_seconds']:.1f}s; results in {run_dir.path}")
    return RunResult(run_dir.path, metrics, rows)


def write_student_package(run_dir: RunDirectory, config: RunConfig, task: Task, student: nn.Module,
                          context: RecipeContext, metrics: dict[str, Any], max_length: int) -> None:
    """``<run>/student/``: weights, config, tokenizer, labels and the model card (see engine/package.py)."""
    from transformers import PreTrainedModel

    tokenizer = getattr(student, "tokenizer", None) or context.tokenizer
    speed = metrics.get("speed", {})
    info = package.package_info(config=config, task=task, columns=text_columns(task), max_length=max_length,
                                student_name=config.student, init=metrics["student"].get("init"),
                                dev=metrics["student"]["dev"], speed=speed)
    citations = [citation for kind, name in (("projector", config.projector), ("recipe", config.recipe))
                 if (citation := preflight.factory_attribute(context.registry, kind, name, "citation"))]
    card = package.model_card(config=config, task=task, metrics=metrics, speed=speed,
                              command=command_line(config), citations=list(dict.fromkeys(citations)),
                              student_class=type(student).__name__,
                              huggingface_family=isinstance(student, PreTrainedModel)
                              and type(student).__module__.startswith("transformers."))
    package.write_package(run_dir.path / STUDENT_DIR, student, tokenizer, info, card)


def train_baseline(context: RecipeContext) -> tuple[nn.Module, Any]:
    """The ``--baseline`` student: the run's student trained with the baseline projector and its own
    default weights (the run's eta/lam are meant for the main projector)."""
    config = context.config
    student = context.new_student()
    projector = context.new_projector(student, name=config.baseline)
    defaults = dict(getattr(projector, "default_weights", {}) or {})
    weights = context.weights(projector, eta=defaults.get("eta", 0.0), lam=defaults.get("lam", 0.0))
    return student, context.train_stage(f"baseline-{config.baseline}", student, projector, weights=weights)


def human_count(count: int) -> str:
    """22700000 -> '22.7M', 41000 -> '41.0K'."""
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.1f}K"


def format_table(rows: list[Row], task: Task) -> str:
    split = task.dev_splits[0]
    keys = sorted({key for row in rows for key in row.dev.get(split, {})}, key=lambda k: (k != task.main_metric, k))
    timed = any(row.speed is not None for row in rows)
    header = ["model", "params"] + [f"{split} {k}" for k in keys]
    if timed:
        header += ["weights", "ms/example (b=1)", "examples/s (b=32)", "speed-up"]
    body = []
    for row in rows:
        cells = [row.model, human_count(row.parameters)]
        cells += [f"{row.dev[split][k] * 100:.2f}" if k in row.dev.get(split, {}) else "" for k in keys]
        if timed:
            speed = row.speed
            cells += ([f"{speed.weights_mb:.1f} MB", f"{speed.latency_ms:.2f}", f"{speed.throughput:.0f}",
                       f"{row.speedup:.2f}x" if row.speedup else "1.00x"] if speed else ["", "", "", ""])
        body.append(cells)
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])

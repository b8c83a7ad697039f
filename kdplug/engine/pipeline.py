"""``kdplug run``: task -> teacher (fine-tuned once) -> teacher cache -> recipe -> evaluation -> run directory."""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from accelerate.utils import set_seed
from torch import nn

from ..config import RunConfig
from ..errors import KdplugError, UsageError, debugging
from ..hub import display_name
from ..layout import CHECKPOINT_DIR
from ..logs import FILE_ONLY
from ..progress import human_duration
from ..registry import Registry
from ..storage import default_cache_root, raise_as_storage_error, write_failure_reason
from ..threads import apply as apply_threads
from ..threads import choose as choose_threads
from ..types import Example, RecipeCapabilities, Task, matchable_layers
from . import analysis, faults, interrupt, preflight
from . import speed as speed_module
from . import teacher as teacher_stage
from .checkpoint import Checkpointer, training_settings
from .inputs import (
    broadcast_object,
    build_transfer_set,
    check_teacher,
    load_task,
    load_task_and_teacher,
    prepare_teacher,
    teacher_caches,
)
from .interrupt import RunInterrupted
from .recipe import EngineContext, RecipeView, count_parameters
from .results import Row, agreement, format_table, write_student_package
from .rundir import (
    BASELINE_PREDICTIONS_FILE,
    COMPLETED,
    CONFIG_FILE,
    FAILED,
    INTERRUPTED,
    RunDirectory,
    default_output,
    is_completed,
)
from .tracking import TRACKING_DIR, Tracking, parse_report_to
from .trainer import Trainer, build_accelerator, inference_precision, process_state

log = logging.getLogger("kdplug")


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    rows: list[Row] = field(default_factory=list)


def run(
    config: RunConfig,
    registry: Registry,
    *,
    overwrite: bool = False,
    resume: bool = False,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Run ``config`` into a new run directory (or, with ``resume``, continue the run already in
    ``config.output`` from its checkpoints).

    Every name, option and directory is checked first. A run that fails leaves its directory
    usable: the error and traceback in log.txt, ``status: failed`` in metrics.json, and the same
    command run again replaces it.
    """
    started = time.perf_counter()
    notes = preflight.resolve_components(config, registry)
    threads = apply_threads(choose_threads(config.threads))
    cache_root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_root()
    # Under `accelerate launch` / `torchrun` every rank runs this; only the main one writes files
    # and prints, the others compute their shard and wait.
    main_process = process_state().is_main_process
    if config.output is None:
        config.output = str(broadcast_object(str(default_output(config))))
    output = Path(config.output)
    preflight.writable_paths(config, output, cache_root)
    loaded = load_task(config, registry)  # missing or too little data stops here, and leaves no run directory
    run_dir = RunDirectory(output)  # the other ranks write nothing in it
    if main_process:
        run_dir = RunDirectory.reopen(output) if resume else RunDirectory.create(output, overwrite=overwrite)
    process_state().wait_for_everyone()
    handler = run_dir.attach_log() if main_process else None
    say = echo if main_process else _silent
    for note in notes:
        say(note)
        log.info(note, extra=FILE_ONLY)
    closing: list[Callable[[], None]] = []  # what must end with the run, however it ends (trackers)
    metrics: dict[str, Any] = {}  # filled as the run goes: a failed run still records what it measured
    try:
        with interrupt.graceful_stop():
            metrics["threads"] = threads.to_dict()
            result = _run(config, registry, run_dir, cache_root, started, say, main_process, closing, metrics, loaded)
        if main_process and not config.keep_checkpoints:
            shutil.rmtree(run_dir.path / CHECKPOINT_DIR, ignore_errors=True)
        return result
    except RunInterrupted as exc:
        if main_process:
            run_dir.set_status(INTERRUPTED, message=str(exc))
        raise
    except BaseException as exc:
        if main_process:
            record_failure(run_dir, exc, started, metrics, handler)
            exc.kdplug_run_dir = run_dir.path  # what the command line's message may describe
        raise
    finally:
        for close in closing:
            close()
        if handler is not None:
            logging.getLogger("kdplug").removeHandler(handler)
            with suppress(OSError):  # a full disk must not replace the error being reported
                handler.close()
        run_dir.release()


def record_failure(
    run_dir: RunDirectory,
    exc: BaseException,
    started: float,
    measured: Optional[dict[str, Any]] = None,
    log_file: Optional[logging.Handler] = None,
) -> None:
    """log.txt gets the traceback, metrics.json and the marker say ``failed`` and why; metrics.json
    also keeps what the run ``measured`` before it failed (e.g. the teacher's check). An error kdplug
    explains (a usage error, a failed write) goes to log.txt alone: its message, which the command
    line prints, says it all; the terminal gets the traceback of anything else, or with --debug."""
    message = str(exc) or type(exc).__name__
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if explained(exc) and log_file is not None and not debugging():
        log_file.handle(
            log.makeRecord(log.name, logging.ERROR, __file__, 0, "the run failed: %s\n%s", (message, trace), None)
        )
    else:
        log.error("the run failed: %s\n%s", message, trace)
    failure = {
        "status": FAILED,
        "error": message,
        "error_type": type(exc).__name__,
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    # the disk that failed the run may fail this too: then the short record, else nothing (the
    # error itself still reaches the user)
    for record in ({**(measured or {}), **failure}, failure):
        try:
            run_dir.write_metrics(record)
            run_dir.set_status(FAILED, message=message)
            return
        except OSError:
            continue


def explained(exc: BaseException) -> bool:
    """Whether ``exc``'s message says what went wrong without its traceback: kdplug's own errors and
    failed writes (a full disk, a file-size limit, permissions)."""
    return isinstance(exc, KdplugError) or write_failure_reason(exc) is not None


def _silent(message: str) -> None:
    pass


def resume_config(run_dir: Path) -> RunConfig:
    """The configuration of the interrupted run in ``run_dir``."""
    from ..config import build_config

    RunDirectory.check_not_held(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(
            f"{run_dir} holds no run to resume (no {CONFIG_FILE}); pass the run directory that 'kdplug run' printed"
        )
    if is_completed(run_dir) and not (run_dir / CHECKPOINT_DIR).exists():
        raise UsageError(f"the run in {run_dir} already completed; nothing to resume")
    config = build_config(file=str(run_dir / CONFIG_FILE))
    config.output = str(run_dir)
    return config


def _run(
    config: RunConfig,
    registry: Registry,
    run_dir: RunDirectory,
    cache_root: Path,
    started: float,
    echo: Callable[[str], None],
    main_process: bool,
    closing: list[Callable[[], None]],
    metrics: dict[str, Any],
    loaded: tuple[Task, dict[str, list[Example]]],
) -> RunResult:
    if main_process:
        run_dir.write_config(config)
    checkpoints = Checkpointer(
        run_dir.path / CHECKPOINT_DIR, every_steps=config.checkpoint_every, written_by=training_settings(config)
    )
    teacher_seed = config.seed if config.teacher_seed is None else config.teacher_seed
    set_seed(teacher_seed)
    trackers = parse_report_to(config.report_to)
    accelerator = build_accelerator(config.precision, log_with=trackers, project_dir=run_dir.path / TRACKING_DIR)
    threads = metrics.get("threads", {})
    echo(
        f"kdplug run -> {run_dir.path}  (device: {accelerator.device}, threads: {threads.get('threads')} "
        f"({threads.get('reason')}; --threads N sets it), cache: {cache_root})"
    )
    tracker = Tracking(accelerator, trackers, run_dir.path, config.to_dict()) if trackers else None
    if tracker is not None:
        closing.append(tracker.finish)

    task, teacher, max_length, train, dev = load_task_and_teacher(config, registry, loaded)
    trainer = Trainer(
        accelerator,
        task,
        batch_size=config.batch_size,
        seed=config.seed,
        weight_decay=config.weight_decay,
        warmup_ratio=config.warmup_ratio,
        best_checkpoint=config.best_checkpoint,
        num_workers=config.num_workers,
    )
    trainer.tracking = tracker
    metrics.update({"task": task.name, "main_metric": task.main_metric, "config": config.to_dict()})

    teacher, teacher_info = prepare_teacher(
        config,
        registry,
        task,
        teacher,
        train,
        dev,
        accelerator=accelerator,
        cache_root=cache_root,
        checkpoints=checkpoints,
        seed=teacher_seed,
        main_process=main_process,
        max_length=max_length,
        echo=echo,
        tracker=tracker,
    )
    teacher_stage.freeze(teacher)
    teacher_info["parameters"] = count_parameters(teacher.model)
    teacher_info["precision"] = inference_precision(config.precision, accelerator.device)  # what auto resolved to
    metrics["teacher"] = teacher_info
    caches = teacher_caches(config, registry, teacher, trainer, task, train, dev, cache_root)
    dev_caches = None
    if preflight.reads_teacher(config, registry):
        dev_caches = caches.dev_caches()
        check_teacher(config, task, dev, dev_caches, teacher_info, echo)
    rows = [Row(f"teacher ({display_name(config.teacher)})", teacher_info["parameters"], teacher_info.get("dev", {}))]

    transfer_set = build_transfer_set(config, registry, task, teacher, cache_root, teacher_seed, echo)
    context = EngineContext(
        config=config,
        registry=registry,
        task=task,
        teacher=teacher,
        trainer=trainer,
        max_length=max_length,
        transfer=transfer_set,
        train=train,
        dev=dev,
        caches=caches,
        cache_root=cache_root,
        cache_layers=caches.layers,
        checkpoints=checkpoints,
    )

    # -- the baseline, for the comparison table ------------------------------------------------
    baseline_predictions: dict[str, Any] = {}
    if config.baseline:
        echo(f"baseline: {config.student} with {config.baseline}")
        student, baseline_recipe = train_baseline(context)
        baseline_dev = context.splits_for(student)[1]
        # the final student's dev scores, and its predictions for paired comparisons with the run's student
        scores = trainer.evaluate(student, baseline_dev, baseline_predictions)
        metrics["baseline"] = {
            "projector": config.baseline,
            "recipe": baseline_recipe,
            "dev": scores,
            "parameters": count_parameters(student),
        }
        baseline_predictions = {
            name: {"predictions": baseline_predictions[name], "labels": split.labels}
            for name, split in baseline_dev.items()
        }
        rows.append(Row(f"{config.student} + {config.baseline}", count_parameters(student), scores))

    # -- the recipe -------------------------------------------------------------------------
    echo(f"recipe {config.recipe}: {config.student} <- {config.projector}")
    recipe = registry.create("recipe", config.recipe, **config.recipe_options)
    student = recipe.run(RecipeView(context))
    if not isinstance(student, nn.Module):
        raise UsageError(f"recipe {config.recipe!r} returned {type(student).__name__}, not the trained student module")
    student_dev = context.splits_for(student)[1]
    predictions: dict[str, list] = {}
    final = trainer.evaluate(student, student_dev, predictions)
    if context.last_distillation is not None and main_process:
        stage, module = context.last_distillation
        first = task.dev_splits[0]
        metrics["analysis"] = analysis.write(
            run_dir.path,
            stage,
            module,
            first,
            context.splits_for(student)[1][first],
            context.teacher_cache()[1][first],
            list(matchable_layers(registry.find_layer_extractor(student).layer_specs(student))),
            batch_size=config.batch_size * 2,
            device=accelerator.device,
        )
        if tracker is not None:
            tracker.log_image(f"{stage}/attention", run_dir.path / analysis.ATTENTION_PLOT)
    metrics["stages"] = context.stages
    cached = {
        **caches.record(),
        **({"transfer": context.transfer_info["cache"]} if "cache" in context.transfer_info else {}),
    }
    if cached:  # per split: the bytes of logits and of layer vectors, and whether each was reused
        metrics["teacher"]["cache"] = cached
    if context.layer_variation:  # measured where a layer method matched the teacher's layers
        metrics["teacher"]["layer_variation"] = {str(layer): share for layer, share in context.layer_variation.items()}
    if transfer_set is not None:
        metrics["transfer"] = {
            **transfer_set.meta,
            "directory": str(transfer_set.directory),
            "teacher_cache": context.transfer_info,
        }
    if dev_caches is not None and not task.is_regression:
        # how often the student predicts what the teacher predicts: what distillation optimises
        metrics["agreement"] = {name: agreement(predictions[name], dev_caches[name]) for name in student_dev}
    metrics["student"] = {
        "name": config.student,
        "projector": config.projector,
        "recipe": config.recipe,
        "default_recipe": preflight.default_recipe(registry),
        "dev": final,
        "parameters": count_parameters(student),
        "init": getattr(student, "kdplug_init", {"init": "random"}),
    }
    label = f"{config.student} + {config.projector}"
    if not preflight.declared(registry, RecipeCapabilities, config.recipe).is_default:
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
        metrics["speed"] = {
            "teacher": teacher_speed.as_dict(),
            "student": student_speed.as_dict(),
            "speedup": round(ratio, 3) if ratio else None,
            "unreliable": teacher_speed.unreliable or student_speed.unreliable,
        }
    metrics["wall_seconds"] = round(time.perf_counter() - started, 2)
    metrics["processes"] = accelerator.num_processes
    if main_process:
        try:
            faults.fire_at("run-results")
            write_student_package(run_dir, config, task, student, context, metrics, max_length)
            run_dir.write_predictions(
                {
                    name: {"predictions": predictions[name], "labels": split.labels}
                    for name, split in student_dev.items()
                }
            )
            if baseline_predictions:
                run_dir.write_predictions(baseline_predictions, BASELINE_PREDICTIONS_FILE)
            run_dir.write_metrics({"status": COMPLETED, **metrics})
            run_dir.set_status(COMPLETED)
        except BaseException as exc:
            raise_as_storage_error(
                exc,
                f"the results into {run_dir.path}",
                f"the trained student is kept in {checkpoints.root}; free space (or raise the "
                f"limit) and finish with 'kdplug run --resume {run_dir.path}'",
            )
            raise
    accelerator.wait_for_everyone()
    echo(format_table(rows, task))
    if metrics.get("agreement"):
        echo(f"the student predicts the teacher's class on {metrics['agreement'][first] * 100:.2f}% of {first}")
    if cached:
        echo(cache_summary(cached))
    advice = transfer_advice(config, registry, student, len(train))
    if advice:
        echo(advice)
    echo(f"{stage_times(metrics)}; results in {run_dir.path}")
    return RunResult(run_dir.path, metrics, rows)


def cache_summary(cached: dict[str, Any]) -> str:
    """``teacher cache: 70,400 bytes of logits, 0 bytes of layer vectors (train: built; dev: reused)``:
    what the run's teacher outputs take on disk (metrics.json's ``teacher.cache`` has each split's)."""
    sizes = {
        kind: sum(split[kind]["bytes"] for split in cached.values() if split[kind] is not None)
        for kind in ("logits", "layers")
    }
    states = "; ".join(f"{name}: {_reuse(split)}" for name, split in cached.items())
    return f"teacher cache: {sizes['logits']:,} bytes of logits, {sizes['layers']:,} bytes of layer vectors ({states})"


def _reuse(split: dict[str, Any]) -> str:
    reused = {kind: split[kind]["reused"] for kind in ("logits", "layers") if split[kind] is not None}
    if len(set(reused.values())) == 1:
        return "reused" if reused["logits"] else "built"
    return ", ".join(f"{kind} {'reused' if was else 'built'}" for kind, was in reused.items())


def stage_times(metrics: dict[str, Any]) -> str:
    """``time: teacher fine-tuning 1 min 10 s, distill 42 s; wall 2 min 05 s``: where a run's time went."""
    parts = []
    finetuned = metrics.get("teacher", {}).get("finetuned", {})
    if "seconds" in finetuned and "reused" not in finetuned:
        parts.append(f"teacher fine-tuning {human_duration(finetuned['seconds'])}")
    parts += [
        f"{name} {human_duration(stage['seconds'])}"
        for name, stage in metrics.get("stages", {}).items()
        if "seconds" in stage
    ]
    wall = f"wall {human_duration(metrics['wall_seconds'])}"
    return f"time: {', '.join(parts)}; {wall}" if parts else f"time: {wall}"


#: below this many labelled examples a student trained from scratch gains most from a transfer set
FEW_LABELS = 5000
#: what ``--augment tang`` gave on the demo task (docs/transfer-sets.md, measured there)
TRANSFER_MEASURED = "on the demo task (800 sentences) it took BiLSTM + rkd from 92.30 to 94.42, its teacher 94.00"


def transfer_advice(config: RunConfig, registry: Registry, student: nn.Module, labelled: int) -> Optional[str]:
    """The closing hint for a student trained from scratch on few labels without a transfer set."""
    if config.transfer or config.augment or labelled >= FEW_LABELS:
        return None
    if not getattr(student, "from_scratch", False) or not preflight.reads_teacher(config, registry):
        return None
    return (
        f"tip: a student trained from scratch on {labelled} labelled examples learns more of the teacher from a "
        f"transfer set: add --augment tang (or --transfer FILE of unlabelled text of the task); "
        f"{TRANSFER_MEASURED}; see docs/transfer-sets.md"
    )


def train_baseline(context: EngineContext) -> tuple[nn.Module, str]:
    """The ``--baseline`` student and its recipe: the run's student trained by the baseline
    projector's own schedule and weights (see :meth:`EngineContext.for_baseline`), two stages for
    universal-*."""
    baseline = context.for_baseline()
    recipe = baseline.registry.create("recipe", baseline.config.recipe)
    student = recipe.run(RecipeView(baseline))
    if not isinstance(student, nn.Module):
        raise UsageError(
            f"recipe {baseline.config.recipe!r} returned {type(student).__name__}, not the trained student"
        )
    context.adopt(baseline)
    return student, baseline.config.recipe

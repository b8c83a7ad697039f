"""``kdplug run``: task -> teacher (fine-tuned once) -> teacher cache -> recipe -> evaluation -> run directory."""

from __future__ import annotations

import logging
import os
import shutil
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from torch import nn

from .. import fingerprint, interrupt
from ..capabilities import AugmenterCapabilities
from ..config import RunConfig
from ..errors import KdplugError, UsageError, debugging
from ..interrupt import RunInterrupted
from ..layout import BASELINE_PREDICTIONS_FILE, CHECKPOINT_DIR, CONFIG_FILE, TRACKING_DIR
from ..logs import FILE_ONLY
from ..progress import human_duration
from ..registry import Registry
from ..storage import default_cache_root, raise_as_storage_error, write_failure_reason
from ..threads import apply as apply_threads
from ..threads import choose as choose_threads
from ..types import Example, StudentCapabilities, Task, capabilities
from . import faults, preflight, shares
from .baseline import Baseline, run_baseline
from .checkpoint import DATA, Checkpointer, training_settings
from .evaluation import Evaluation, evaluate
from .inputs import RunEnvironment, RunInputs, broadcast_object, load_task, prepare_inputs
from .recipe import EngineContext, run_recipe
from .results import Row, format_table, write_student_package
from .rundir import COMPLETED, FAILED, INTERRUPTED, RunDirectory, default_output, is_completed
from .tracking import Tracking, parse_report_to
from .trainer import build_accelerator, inference_precision, process_state

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
    preflight.writable_paths(config, output, cache_root, registry)
    loaded = load_task(config, registry)  # missing or too little data stops here, and leaves no run directory
    run_dir = RunDirectory(output)  # the other ranks write nothing in it
    if main_process:
        run_dir = RunDirectory.reopen(output) if resume else RunDirectory.create(output, overwrite=overwrite)
    handler = run_dir.attach_log() if main_process else None
    say = echo if main_process else _silent
    if not main_process:  # the main process tells the run; the others speak only of trouble
        logging.getLogger("kdplug").setLevel(max(logging.WARNING, logging.getLogger("kdplug").level))
    for note in notes:
        say(note)
        log.info(note, extra=FILE_ONLY)
    session = RunSession(config, registry, run_dir, cache_root, started, say, main_process)
    try:
        # inside the try, after log.txt is attached: a rank lost here fails the run like any later step
        if process_state().num_processes > 1:  # every rank waits for the directory, and learns the others' pids
            shares.meet(process_state().num_processes)
        with interrupt.graceful_stop():
            session.metrics["threads"] = threads.to_dict()
            result = session.run(loaded)
        if main_process and not config.keep_checkpoints:
            shutil.rmtree(run_dir.path / CHECKPOINT_DIR, ignore_errors=True)
        return result
    except RunInterrupted as exc:
        if main_process:
            run_dir.set_status(INTERRUPTED, message=str(exc))
        raise
    except BaseException as exc:
        if main_process:
            record_failure(run_dir, exc, started, session.metrics, handler)
            exc.kdplug_run_dir = run_dir.path  # what the command line's message may describe
        raise
    finally:
        for close in session.closing:
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


def data_record(config: RunConfig, splits: dict[str, list[Example]]) -> dict[str, Any]:
    """What data the run read, for metrics.json: its folder's name (the task's, for data kdplug
    builds) and a fingerprint of its examples, so that data edited in place is told from its earlier
    version (``kdplug report`` never compares the two)."""
    name = Path(config.data_dir).expanduser().resolve().name if config.data_dir else config.task
    return {
        "name": name,
        "fingerprint": fingerprint.of_examples(splits),
        "examples": {split: len(examples) for split, examples in splits.items()},
    }


def explained(exc: BaseException) -> bool:
    """Whether ``exc``'s message says what went wrong without its traceback: kdplug's own errors and
    failed writes (a full disk, a file-size limit, permissions)."""
    return isinstance(exc, KdplugError) or write_failure_reason(exc) is not None


def _silent(message: str) -> None:
    pass


def resume_config(run_dir: Path, say: Callable[[str], None] = _silent) -> RunConfig:
    """The configuration of the interrupted run in ``run_dir`` (a prompted teacher spelt as before it
    had a name of its own respelt, which ``say`` tells)."""
    from ..config import build_config, renamed_prompted_teacher

    RunDirectory.check_not_held(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(
            f"{run_dir} holds no run to resume (no {CONFIG_FILE}); pass the run directory that 'kdplug run' printed"
        )
    if is_completed(run_dir) and not (run_dir / CHECKPOINT_DIR).exists():
        raise UsageError(f"the run in {run_dir} already completed; nothing to resume")
    config = build_config(file=str(run_dir / CONFIG_FILE))
    config.output = str(run_dir)
    renamed = renamed_prompted_teacher({"teacher": config.teacher, "teacher_options": config.teacher_options})
    if renamed:
        say(
            f"{CONFIG_FILE} names the prompted teacher as before it had a name of its own (teacher: {config.teacher}"
            f" with teacher_options.prompt): resumed as teacher: {renamed['teacher']}, teacher_options.source: "
            f"{renamed['teacher_options']['source']}"
        )
        config.teacher, config.teacher_options = renamed["teacher"], renamed["teacher_options"]
    return config


@dataclass
class RunSession:
    """One run, once its directory is open: the phases inputs -> baseline -> recipe -> evaluation
    -> results, and what they measured so far (a failed run still records it) and must close."""

    config: RunConfig
    registry: Registry
    run_dir: RunDirectory
    cache_root: Path
    started: float
    echo: Callable[[str], None]
    main_process: bool
    #: metrics.json, filled as the run goes
    metrics: dict[str, Any] = field(default_factory=dict)
    #: what must end with the run, however it ends (trackers)
    closing: list[Callable[[], None]] = field(default_factory=list)

    def run(self, loaded: tuple[Task, dict[str, list[Example]]]) -> RunResult:
        config, registry = self.config, self.registry
        if self.main_process:
            self.run_dir.write_config(config)
        self.metrics["data"] = data_record(config, loaded[1])
        env = self.environment()
        inputs = prepare_inputs(config, registry, env, loaded, record=self.metrics.update)
        context = EngineContext.for_run(config, registry, inputs, env.checkpoints)
        baseline = run_baseline(context, self.echo) if config.baseline else None
        if baseline is not None:
            self.metrics["baseline"] = baseline.record
        self.echo(f"recipe {config.recipe}: {config.student} <- {config.projector}")
        student = run_recipe(context, config.recipe_options, "the trained student module")
        evaluation = evaluate(context, inputs, student, baseline, env, self.run_dir.path, self.metrics.update)
        self.metrics["wall_seconds"] = round(time.perf_counter() - self.started, 2)
        self.metrics["processes"] = env.accelerator.num_processes
        if self.main_process:
            self.write_results(context, evaluation, baseline, env.checkpoints)
        env.accelerator.wait_for_everyone()
        self.report(inputs, evaluation)
        return RunResult(self.run_dir.path, self.metrics, evaluation.rows)

    def environment(self) -> RunEnvironment:
        """The run's checkpoints, device and trackers; announces the run."""
        config, path = self.config, self.run_dir.path
        written_by = {**training_settings(config), DATA: self.metrics["data"]["fingerprint"]}
        checkpoints = Checkpointer(path / CHECKPOINT_DIR, every_steps=config.checkpoint_every, written_by=written_by)
        checkpoints.check_resumable()
        trackers = parse_report_to(config.report_to)
        accelerator = build_accelerator(config.precision, log_with=trackers, project_dir=path / TRACKING_DIR)
        threads = self.metrics.get("threads", {})
        teacher = inference_precision(config.precision, accelerator.device)  # the README's figures depend on it
        self.echo(
            f"kdplug run -> {where_written(path)}  (device: {accelerator.device}, teacher in {teacher}, "
            f"threads: {threads.get('threads')} ({threads.get('reason')}; --threads N sets it), "
            f"cache: {self.cache_root})"
        )
        tracker = Tracking(accelerator, trackers, path, config.to_dict()) if trackers else None
        if tracker is not None:
            self.closing.append(tracker.finish)
        return RunEnvironment(
            accelerator=accelerator,
            cache_root=self.cache_root,
            checkpoints=checkpoints,
            main_process=self.main_process,
            echo=self.echo,
            tracker=tracker,
        )

    def write_results(
        self, context: EngineContext, evaluation: Evaluation, baseline: Optional[Baseline], checkpoints: Checkpointer
    ) -> None:
        """The student's package, the predictions and metrics.json, then the completed marker."""
        run_dir = self.run_dir
        try:
            faults.fire_at("run-results")
            write_student_package(
                run_dir, self.config, context.task, evaluation.student, context, self.metrics, context.max_length
            )
            run_dir.write_predictions(
                {
                    name: {"predictions": evaluation.predictions[name], "labels": split.labels}
                    for name, split in evaluation.dev.items()
                }
            )
            if baseline is not None and baseline.predictions:
                run_dir.write_predictions(baseline.predictions, BASELINE_PREDICTIONS_FILE)
            run_dir.write_metrics({"status": COMPLETED, **self.metrics})
            run_dir.set_status(COMPLETED)
        except BaseException as exc:
            raise_as_storage_error(
                exc,
                f"the results into {run_dir.path}",
                f"the trained student is kept in {checkpoints.root}; free space (or raise the "
                f"limit) and finish with 'kdplug run --resume {run_dir.path}'",
            )
            raise

    def report(self, inputs: RunInputs, evaluation: Evaluation) -> None:
        """The closing lines: the table, the agreement, the cache, a hint, where the time went."""
        echo, metrics, task = self.echo, self.metrics, inputs.task
        first = task.dev_splits[0]
        echo(format_table(evaluation.rows, task))
        if metrics.get("agreement"):
            echo(f"the student predicts the teacher's class on {metrics['agreement'][first] * 100:.2f}% of {first}")
        if evaluation.cached:
            echo(cache_summary(evaluation.cached))
        advice = transfer_advice(self.config, self.registry, evaluation.student, len(inputs.train))
        if advice:
            echo(advice)
        echo(f"{stage_times(metrics)}; results in {self.run_dir.path}")


def cache_summary(cached: dict[str, Any]) -> str:
    """``teacher cache: 70,400 bytes of logits, 0 bytes of layer vectors (train: built; dev: reused)``:
    what the run's teacher outputs take on disk (metrics.json's ``teacher.cache`` has each split's; an
    ensemble's, each member's: ``teacher 0: ...; teacher 1: ...``)."""
    if any("members" in split for split in cached.values()):
        count = max(len(split.get("members", [])) for split in cached.values())
        return "; ".join(
            cache_summary({name: split["members"][i] for name, split in cached.items() if "members" in split}).replace(
                "teacher cache:", f"teacher {i} cache:", 1
            )
            for i in range(count)
        )
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
    teacher = metrics.get("teacher", {})
    for record in teacher.get("members") or [teacher]:  # an ensemble's: each member's
        finetuned = record.get("finetuned", {})
        which = f"teacher {record['index']}" if "members" in teacher else "teacher"
        if "seconds" in finetuned and "reused" not in finetuned:
            parts.append(f"{which} fine-tuning {human_duration(finetuned['seconds'])}")
    parts += [
        f"{name} {human_duration(stage['seconds'])}"
        for name, stage in metrics.get("stages", {}).items()
        if "seconds" in stage
    ]
    wall = f"wall {human_duration(metrics['wall_seconds'])}"
    return f"time: {', '.join(parts)}; {wall}" if parts else f"time: {wall}"


#: below this many labelled examples the run suggests a transfer set: it was measured to help at 800 (the demo)
#: and 2,000 (movie snippets, tweets; docs/transfer-sets.md); at 7,000 snippets +0.97 over 3 seeds, not resolved
FEW_LABELS = 5000


def transfer_advice(config: RunConfig, registry: Registry, student: nn.Module, labelled: int) -> Optional[str]:
    """The closing hint for a student trained from scratch on few labels without a transfer set."""
    if config.transfer or config.augment or labelled >= FEW_LABELS:
        return None
    if not capabilities(StudentCapabilities, student).from_scratch or not preflight.reads_teacher(config, registry):
        return None
    weights_here = preflight.has_layers(registry, config.members()[0].name)  # not a served teacher's
    augmenters = " or ".join(
        f"--augment {name}"
        for name in registry.names("augmenter")
        if weights_here or not preflight.declared(registry, AugmenterCapabilities, name).reads_teacher_weights
    )
    add = f"{augmenters} (or --transfer FILE of unlabelled text of the task)" if augmenters else "--transfer FILE"
    return (
        f"tip: a student trained from scratch on {labelled} labelled examples may learn more of the teacher from a "
        f"transfer set: add {add}. Measured with a BiLSTM student on 2,000 labelled examples: +2.03 dev "
        "points on real movie snippets (a generated transfer set, 3 seeds) and +3.77 on tweets (10,000 "
        "unlabelled tweets, 3 seeds); docs/transfer-sets.md has the runs"
    )


def where_written(path: Path) -> str:
    """``path``, and the real directory it leads to where a symbolic link (of the user's) is on the way:
    the run writes there, and the first line says so."""
    real = os.path.realpath(path)
    return str(path) if real == os.path.abspath(path) else f"{path} (a link: written in {real})"

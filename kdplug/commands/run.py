"""``kdplug run``: one distillation run (no components given: the embedded offline demo)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from ..config import FIELDS, RunConfig, build_config
from ..errors import KdplugError, UsageError
from ..plugins import PluginManager
from ..seeds import parse_seeds, run_seeds, seed_configs
from . import report_failures

#: what ``kdplug run`` with no components does: the embedded, offline demo (see docs/cli.md)
DEMO_PRESET: dict[str, Any] = {
    "teacher": "minilm",
    "student": "bilstm",
    "projector": "rkd",
    "task": "demo",
    "baseline": "nkd",
    # the student's size, epochs and learning rate are the defaults; the teacher's are quicker
    # than the defaults for the demo: MiniLM-L6 reaches the same dev accuracy in 4 epochs at
    # lr 1e-4 and batch 16 (200 steps) as in 12 epochs at 5e-5 and batch 32, in a third of the time
    "teacher_epochs": 4,
    "teacher_lr": 1e-4,
    "teacher_batch_size": 16,
}

RUN_EXAMPLES = (
    """
examples:
  kdplug run                                  # the offline demo: MiniLM -> BiLSTM on the demo task
  kdplug run --teacher bert-base --student bilstm --projector universal-ca --task sst2 --data-dir glue/SST-2
  kdplug run --teacher textattack/bert-base-uncased-SST-2 --student bilstm --task sst2 --data-dir glue/SST-2
  kdplug run --teacher ./my-finetuned-bert --student bert-4 --projector alp --task mrpc --data-dir glue/MRPC
  kdplug run --teacher ./my-bert --task local --data-dir my_data --set task_options.text_column=review
  kdplug run --config my-setup.yaml --set seed=2 --dry-run   # print what would run, train nothing
  kdplug run --projector rkd --seeds 5 --output runs/rkd     # seeds 42..46 in runs/rkd/seed-*, one teacher
  kdplug run --teacher minilm --student bilstm --projector rkd --augment tang    # + 20 augmented copies per example
  kdplug run --teacher ./bert-sst2 --teacher ./roberta-sst2 --teacher-weights 2 1 --task sst2 --data-dir glue/SST-2
                        # an ensemble: the weighted mean of the teachers' probabilities; a member's options:
                        # --set teachers.1.teacher_options.KEY=VALUE; layer methods: --set layer_teacher=N

every configuration key (use with --set KEY=VALUE or in the YAML file):
  """
    + ", ".join(sorted(FIELDS))
    + "\n  component options: --set student_options.hidden_size=256 (likewise teacher_options, projector_options, "
    "task_options, recipe_options; an ensemble member's: --set teachers.N.teacher_options.KEY=VALUE, N from 0)"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="distil a student from a teacher on a task (no arguments: the offline demo)",
        description="Load or fine-tune the teacher on the task, distil the student, evaluate it on the dev "
        "split and write a run directory (config.yaml, metrics.json, student weights, log.txt). "
        "With no component given, runs the embedded demo: the real MiniLM-L6 teacher, a BiLSTM "
        "student without and with KD, on the generated demo task, offline.",
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_component_arguments(parser)
    _add_training_arguments(parser)
    _add_transfer_arguments(parser)
    _add_environment_arguments(parser)
    parser.set_defaults(handler=handle)


def _add_component_arguments(parser: argparse.ArgumentParser) -> None:
    """What to distil: the components, their data and where the settings come from."""
    parser.add_argument(
        "--teacher",
        action="append",
        help="a teacher name (see 'kdplug plugins'), a local checkpoint directory or a "
        "Hugging Face hub id (default: minilm); repeat it for an ensemble (--teacher A --teacher B: the target is "
        "the weighted mean of their probabilities; a member's options: --set teachers.N.teacher_options.KEY=VALUE)",
    )
    parser.add_argument(
        "--teacher-weights",
        dest="teacher_weights",
        nargs="+",
        metavar="W",
        help="an ensemble's weights, one positive number per --teacher, in their order (default: equal); "
        "they need not sum to 1",
    )
    parser.add_argument(
        "--student",
        help="a student name (bilstm, gated-cnn, bert-4, distilroberta ...), a local "
        "checkpoint directory or a hub id (default: bilstm)",
    )
    parser.add_argument("--projector", help="distillation method, e.g. nkd, rkd, pkd-skip, alp, universal-ca")
    parser.add_argument("--task", help="task name, e.g. sst2, mrpc, mnli, local, demo")
    parser.add_argument(
        "--recipe",
        help="training schedule, e.g. standard, two-stage (default: the projector's own: two-stage for "
        "universal-* and minilm-v2, tinybert for tinybert; else standard)",
    )
    parser.add_argument("--data-dir", dest="data_dir", help="local directory with the task's files (GLUE layout)")
    parser.add_argument("--config", help="YAML file of configuration keys (overridden by flags and --set)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any configuration key, e.g. --set lr=2e-5 --set projector_options.layer_map=[1,5,9]",
    )


def _add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the run goes and how the student trains."""
    parser.add_argument("--output", help="run directory (default: runs/<time>-<task>-<student>-<projector>)")
    parser.add_argument("--seed", type=int, help="random seed (default: 42)")
    parser.add_argument(
        "--seeds",
        metavar="N|S1,S2,...",
        help="run the same setup once per seed into OUTPUT/seed-<s>: N seeds from --seed on "
        "(42, 43, ... by default), or the listed ones; the teacher is fine-tuned once, with "
        "--seed, and shared; mean ± std go to OUTPUT/seeds.json",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        help="student training epochs (default: the student family's: at least 3, raised to reach its step "
        "budget, 300 optimizer steps for Transformers (at most 30 epochs) and 3,000 for BiLSTM/Gated-CNN (at "
        "most 50), with early stopping: see --set patience=N and min_epochs=N)",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="auto (default): the teacher (its cache, its evaluation, in the loop) in bf16 autocast where "
        "the device runs bf16 natively (a GPU with bf16, else fp16; a CPU with AVX512-BF16 or AMX), in fp32 on "
        "a CPU that would emulate it; training in fp32 on CPU and bf16/fp16 mixed precision on CUDA",
    )
    parser.add_argument("--baseline", help="also train the student with this projector (e.g. nkd) for the table")


def _add_transfer_arguments(parser: argparse.ArgumentParser) -> None:
    """Extra text the student learns the teacher's outputs on."""
    parser.add_argument(
        "--transfer",
        nargs="+",
        action="extend",
        metavar="PATH",
        help="unlabelled text the student also learns the teacher's outputs on: TSV/CSV/JSONL files "
        "with the task's text columns, plain .txt lines, or datasets directories "
        "(docs/transfer-sets.md)",
    )
    parser.add_argument(
        "--augment",
        metavar="NAME",
        help="build a transfer set by augmenting the training set: tang (Tang et al. 2019) or "
        "teacher-words (TinyBERT-style); options with --set augment_options.KEY=VALUE",
    )
    parser.add_argument(
        "--augment-factor",
        dest="augment_factor",
        type=int,
        metavar="N",
        help="augmented copies per training example (default: 20, 10 for sentence pairs, as Tang et al.)",
    )


def _add_environment_arguments(parser: argparse.ArgumentParser) -> None:
    """Tracking, the machine, the cache, and what to do with an existing, interrupted or planned run."""
    parser.add_argument(
        "--report-to",
        dest="report_to",
        metavar="TRACKERS",
        help="experiment tracking: tensorboard, wandb, mlflow (comma list), all or none (default): "
        "every loss term per step, dev metrics per epoch, attention heatmaps (docs/tracking.md)",
    )
    parser.add_argument(
        "--cache-dir",
        dest="cache_dir",
        help="fine-tuned teachers and teacher caches (default: $KDPLUG_CACHE or ~/.cache/kdplug)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="PyTorch intra-op threads (default: the usable cores that other processes leave free, at least 1; "
        "OMP_NUM_THREADS also sets it); metrics.json records the choice",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run in --output")
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted run from its last checkpoint "
        "(its config.yaml is used: an option given with it may change only where or how the run executes, "
        "such as --threads, --report-to or --set num_workers=N; one that changes what it trains is refused)",
    )
    parser.add_argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="resolve and check everything the run would use (teacher, student, tokenizer, task and "
        "its sizes, recipe, every stage's epochs, lr, weights and temperature, transfer set, "
        "output, what is cached, how long each part would take here, from a few timed steps), print the plan and "
        "exit, training nothing",
    )


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    if args.resume:
        from ..config import apply, parse_overrides
        from ..engine.pipeline import resume_config

        written = resume_config(Path(args.resume), say=print)
        config = apply(copy.deepcopy(written), resumed_teachers(args, written), source="command line")
        config = apply(config, resumed_flags(args, written), source="command line")
        config = apply(config, parse_overrides(args.overrides), source="--set")
        keep_written_spelling(written, config, manager)
        check_resume_settings(written, config)  # before validate: a changed ensemble is a change, not a conflict
        config.validate()
        report_failures(manager)
        if args.dry_run:
            from ..engine.plan import dry_run

            dry_run(config, manager.registry, resume=True)
            return 0
        from ..engine.pipeline import run

        with explained_failure(config):
            run(config, manager.registry, resume=True)
        return 0
    config = config_from_arguments(args)
    report_failures(manager)
    if args.dry_run:
        from ..engine.plan import dry_run

        seeds = parse_seeds(args.seeds, config.seed) if args.seeds is not None else None
        if seeds:
            config = seed_configs(config, seeds)[0]
            print(
                f"--seeds: {len(seeds)} runs ({', '.join(map(str, seeds))}) into {Path(config.output).parent}/seed-*; "
                f"the plan of the first:"
            )
        dry_run(config, manager.registry, overwrite=args.overwrite)
        return 0
    from ..engine.pipeline import run  # the engine (transformers, accelerate) only once the options are sound

    if args.seeds is not None:
        run_seeds(config, parse_seeds(args.seeds, config.seed), manager.registry, overwrite=args.overwrite)
        return 0
    with explained_failure(config):
        run(config, manager.registry, overwrite=args.overwrite)
    return 0


#: the flags that set a configuration key of the same name (``--teacher`` and ``--teacher-weights`` aside)
CONFIG_FLAGS = (
    "student",
    "projector",
    "task",
    "recipe",
    "data_dir",
    "output",
    "seed",
    "epochs",
    "precision",
    "baseline",
    "cache_dir",
    "report_to",
    "transfer",
    "augment",
    "augment_factor",
    "threads",
)


def config_from_arguments(args: argparse.Namespace) -> RunConfig:
    """The run that ``kdplug run``'s flags, ``--config`` and ``--set`` describe (no components: the demo's)."""
    flags = {key: getattr(args, key) for key in ("teacher", *CONFIG_FLAGS)}
    components_given = any(flags[k] for k in ("teacher", "student", "projector", "task")) or args.config
    if not components_given:
        print(
            "No components given: running the embedded demo (MiniLM-L6 teacher, BiLSTM student, demo task). "
            "See 'kdplug run --help' for your own setups."
        )
    flags.update(teacher_flags(args.teacher, args.teacher_weights, args.config))
    config = build_config(
        file=args.config, flags=flags, overrides=args.overrides, base=None if components_given else DEMO_PRESET
    )
    if args.augment_factor is not None and not config.augment:  # a configuration key may stay for a sweep's grid
        raise UsageError(
            f"--augment-factor {args.augment_factor} sets how many augmented copies --augment makes of each "
            f"example, and this run has no --augment: add --augment tang (or teacher-words), or drop --augment-factor"
        )
    return config


def teacher_flags(teachers: Optional[list[str]], weights: Optional[list[str]], config_file: Optional[str]) -> dict:
    """``--teacher`` given once: the one teacher, as always (a file's ``teachers`` list then gives way to it);
    given more often: an ensemble, in order, with ``--teacher-weights`` if given (else a file's ensemble takes
    them)."""
    numbers = [teacher_weight(text) for text in weights or []]
    count = len(teachers) if teachers else len(_file_teachers(config_file)) if weights else 0
    if weights and count < 2:
        raise UsageError(
            "--teacher-weights weighs an ensemble's members, and this run has one teacher: give two or more "
            "--teacher (--teacher A --teacher B --teacher-weights 2 1), or drop --teacher-weights"
        )
    if weights and len(numbers) != count:
        raise UsageError(
            f"--teacher-weights gives {len(numbers)} weight{'s' * (len(numbers) != 1)} for {count} teachers: give one "
            f"per teacher, in their order"
        )
    if not teachers:
        return {"teachers": _weighted(_file_teachers(config_file), numbers)} if weights else {}
    if len(teachers) == 1:
        return {"teacher": teachers[0], "teachers": []}
    return {"teacher": teachers[0], "teachers": _weighted([{"teacher": name} for name in teachers], numbers)}


def resumed_teachers(args: argparse.Namespace, written: RunConfig) -> dict:
    """``--teacher`` and ``--teacher-weights`` given with ``--resume``: what they set, checked against
    config.yaml as a ``--set`` is (the same teachers and weights go on; others are refused, never ignored)."""
    if not args.teacher and not args.teacher_weights:
        return {}
    if args.teacher:
        return teacher_flags(args.teacher, args.teacher_weights, None)
    numbers = [teacher_weight(text) for text in args.teacher_weights]
    if not written.teachers:
        raise UsageError(
            f"--teacher-weights weighs an ensemble's members, and the run in {args.resume} has one teacher: "
            f"drop --teacher-weights (an ensemble is a new run: --teacher A --teacher B without --resume)"
        )
    if len(numbers) != len(written.teachers):
        raise UsageError(
            f"--teacher-weights gives {len(numbers)} weight{'s' * (len(numbers) != 1)} for the "
            f"{len(written.teachers)} teachers of the run in {args.resume}: give one per teacher, in their order"
        )
    return {"teachers": _weighted(written.teachers, numbers)}


def resumed_flags(args: argparse.Namespace, written: RunConfig) -> dict:
    """The flags given with ``--resume``, checked against config.yaml as a ``--set`` is: the same values go on,
    those that only say where or how the run executes (``--threads``, ``--report-to``) apply, and any other is
    refused, never ignored; a flag that starts another run is refused outright."""
    for flag, given in (("--config", args.config), ("--seeds", args.seeds), ("--overwrite", args.overwrite)):
        if given:
            raise UsageError(
                f"{flag} starts a new run and --resume continues the run in {args.resume} as its config.yaml says: "
                f"drop {flag}, or drop --resume and give another --output"
            )
    return {key: getattr(args, key) for key in CONFIG_FLAGS if getattr(args, key) is not None}


def keep_written_spelling(written: RunConfig, resumed: RunConfig, manager: PluginManager) -> None:
    """A value given with ``--resume`` (a flag or a ``--set``) that names what config.yaml names, spelt another
    way, is no change: the same file or folder through a link, a relative path or a trailing slash, and an
    augmentation factor equal to the default config.yaml leaves unset. Another output is refused: the run
    continues where it is."""
    if not _same_path(resumed.output, written.output):
        raise UsageError(
            f"--resume continues the run in {written.output} and writes there; drop --output or --set output="
            f"{resumed.output} (a new run goes to another --output without --resume)"
        )
    resumed.output = written.output
    for key in ("data_dir", "teacher", "trim_vocab_corpus"):
        if _same_path(getattr(resumed, key), getattr(written, key)):
            setattr(resumed, key, getattr(written, key))
    if len(resumed.transfer or []) == len(written.transfer or []):
        resumed.transfer = [
            old if _same_path(new, old) else new for new, old in zip(resumed.transfer, written.transfer)
        ]
    if len(resumed.teachers) == len(written.teachers):
        for new, old in zip(resumed.teachers, written.teachers):
            if isinstance(new, dict) and isinstance(old, dict) and _same_path(new.get("teacher"), old.get("teacher")):
                new["teacher"] = old["teacher"]
    if resumed.augment and written.augment_factor is None and resumed.augment_factor is not None:
        from ..engine.transfer import augment_factor

        task = manager.registry.create("task", written.task, data_dir=written.data_dir, **written.task_options)
        if resumed.augment_factor == augment_factor(written, task):
            resumed.augment_factor = None


def _same_path(given: Any, written: Any) -> bool:
    """Whether ``given`` and ``written`` are the same text, or name the same existing file or folder."""
    if given == written:
        return True
    if not (isinstance(given, str) and isinstance(written, str)):
        return False
    try:
        return os.path.samefile(os.path.expanduser(given), os.path.expanduser(written))
    except OSError:  # either is no file or folder here: a name, which only the same text names
        return False


def teacher_weight(text: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        weight = math.nan
    if not (math.isfinite(weight) and weight > 0):
        raise UsageError(f"--teacher-weights takes positive numbers (e.g. 2 1), got {text!r}")
    return weight


def _file_teachers(config_file: Optional[str]) -> list:
    from ..config import load_yaml, member_entries

    given = load_yaml(config_file).get("teachers") if config_file else None
    return member_entries(given) if isinstance(given, (list, tuple, str)) else []


def _weighted(entries: list, weights: list[float]) -> list:
    if not weights:
        return entries
    return [
        {**entry, "weight": weight} if isinstance(entry, dict) else entry for entry, weight in zip(entries, weights)
    ]


def check_resume_settings(written: RunConfig, resumed: RunConfig) -> None:
    """``--resume --set`` may change how a run is written or watched (num_workers, report_to, ...),
    not what it trains: its checkpoints would continue another configuration's training."""
    from ..engine.checkpoint import settings_difference, training_settings

    differences = settings_difference(training_settings(written), training_settings(resumed))
    if differences:
        raise UsageError(
            f"--resume continues the run in {written.output} as its config.yaml says; the options given change "
            f"what it trains ({differences.replace(' there,', ' in config.yaml,')}). Resume without them, or start "
            f"a new run with them (another --output)"
        )


@contextlib.contextmanager
def explained_failure(config: RunConfig) -> Iterator[None]:
    """A run that fails on something other than a usage error or a signal ends with what failed, what
    the run directory kept and how to go on (``--resume`` when there are checkpoints), not a
    traceback (that is in the run's log.txt, and on the terminal with --debug)."""
    from ..interrupt import RunInterrupted

    try:
        yield
    except (UsageError, RunInterrupted):
        raise
    except Exception as exc:
        run_dir = getattr(exc, "kdplug_run_dir", None)
        if run_dir is None:  # before the run directory: kdplug's own errors say it all, a bug keeps its traceback
            raise
        raise RunFailedError(failure_message(exc, Path(run_dir))) from exc


class RunFailedError(KdplugError):
    """A run that failed after it started (exit 1); its message says what the directory kept."""


def failure_message(exc: BaseException, output: Path) -> str:
    from ..layout import CHECKPOINT_DIR, LOG_FILE
    from ..storage import write_failure_reason

    log_file = output / LOG_FILE
    if getattr(exc, "how_to_continue", None):  # the error says what was kept and how to go on (a checkpoint's write)
        return f"the run failed: {str(exc).strip()} The traceback is in {log_file}."
    reason = write_failure_reason(exc)
    what = f"a write failed: {reason}" if reason and not isinstance(exc, KdplugError) else str(exc).strip()
    what = what.splitlines()[0] if what else type(exc).__name__
    checkpoints = output / CHECKPOINT_DIR
    if checkpoints.is_dir() and any(checkpoints.rglob("*")):
        kept = (
            f"{output} keeps the checkpoints written before the failure: once the cause is fixed, continue with "
            f"'kdplug run --resume {output}'"
        )
    else:
        kept = f"nothing to resume in {output}: once the cause is fixed, run the same command with --overwrite"
    return f"the run failed ({what}). {kept}. The traceback is in {log_file}."

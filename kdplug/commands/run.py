"""``kdplug run``: one distillation run (no components given: the embedded offline demo)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from ..config import FIELDS, RunConfig, build_config, dump_yaml
from ..engine.rundir import CONFIG_FILE, METRICS_FILE, default_output
from ..storage import write_atomic
from ..errors import ConfigError, UsageError
from ..plugins import PluginManager
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

RUN_EXAMPLES = """
examples:
  kdplug run                                  # the offline demo: MiniLM -> BiLSTM on the demo task
  kdplug run --teacher bert-base --student bilstm --projector universal-ca --task sst2 --data-dir glue/SST-2
  kdplug run --teacher textattack/bert-base-uncased-SST-2 --student bilstm --projector rkd --task sst2 --data-dir glue/SST-2
  kdplug run --teacher ./my-finetuned-bert --student bert-4 --projector alp --task mrpc --data-dir glue/MRPC --set lr=2e-5
  kdplug run --teacher ./my-bert --task local --set task_options.train_file=train.csv --set task_options.dev_file=dev.csv
  kdplug run --config my-setup.yaml --set seed=2 --dry-run   # print what would run, train nothing
  kdplug run --projector rkd --seeds 5 --output runs/rkd     # seeds 42..46 in runs/rkd/seed-*, one teacher
  kdplug run --teacher minilm --student bilstm --projector rkd --augment tang    # + 20 augmented copies per example

every configuration key (use with --set KEY=VALUE or in the YAML file):
  """ + ", ".join(sorted(FIELDS)) + "\n  component options: --set student_options.hidden_size=256 (likewise teacher_options, projector_options, task_options, recipe_options)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run", help="distil a student from a teacher on a task (no arguments: the offline demo)",
        description="Load or fine-tune the teacher on the task, distil the student, evaluate it on the dev "
                    "split and write a run directory (config.yaml, metrics.json, student weights, log.txt). "
                    "With no component given, runs the embedded demo: the real MiniLM-L6 teacher, a BiLSTM "
                    "student without and with KD, on the generated demo task, offline.",
        epilog=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="a teacher name (see 'kdplug plugins'), a local checkpoint directory or a "
                                          "Hugging Face hub id (default: minilm)")
    parser.add_argument("--student", help="a student name (bilstm, gated-cnn, bert-4, distilroberta ...), a local "
                                          "checkpoint directory or a hub id (default: bilstm)")
    parser.add_argument("--projector", help="distillation method, e.g. nkd, rkd, pkd-skip, alp, universal-ca")
    parser.add_argument("--task", help="task name, e.g. sst2, mrpc, mnli, local, demo")
    parser.add_argument("--recipe", help="training schedule, e.g. standard, two-stage (default: the projector's own, "
                                         "two-stage for universal-*, else standard)")
    parser.add_argument("--data-dir", dest="data_dir", help="local directory with the task's files (GLUE layout)")
    parser.add_argument("--config", help="YAML file of configuration keys (overridden by flags and --set)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="set any configuration key, e.g. --set lr=2e-5 --set projector_options.layer_map=[1,5,9]")
    parser.add_argument("--output", help="run directory (default: runs/<time>-<task>-<student>-<projector>)")
    parser.add_argument("--seed", type=int, help="random seed (default: 42)")
    parser.add_argument("--seeds", metavar="N|S1,S2,...",
                        help="run the same setup once per seed into OUTPUT/seed-<s>: N seeds from --seed on "
                             "(42, 43, ... by default), or the listed ones; the teacher is fine-tuned once, with "
                             "--seed, and shared; mean ± std go to OUTPUT/seeds.json")
    parser.add_argument("--epochs", type=int, help="student training epochs (default: the student family's, 3 for "
                        "most, raised to reach 300 optimizer steps on small data, with early stopping: see --set "
                        "patience=N)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto (default): teacher inference in bf16 autocast (on CUDA fp16 where bf16 is not "
                             "supported), training in fp32 on CPU and bf16/fp16 mixed precision on CUDA")
    parser.add_argument("--baseline", help="also train the student with this projector (e.g. nkd) for the table")
    parser.add_argument("--transfer", nargs="+", action="extend", metavar="PATH",
                        help="unlabelled text the student also learns the teacher's outputs on: TSV/CSV/JSONL files "
                             "with the task's text columns, plain .txt lines, or datasets directories "
                             "(docs/transfer-sets.md)")
    parser.add_argument("--augment", metavar="NAME",
                        help="build a transfer set by augmenting the training set: tang (Tang et al. 2019) or "
                             "teacher-words (TinyBERT-style); options with --set augment_options.KEY=VALUE")
    parser.add_argument("--augment-factor", dest="augment_factor", type=int, metavar="N",
                        help="augmented copies per training example (default: 20)")
    parser.add_argument("--report-to", dest="report_to", metavar="TRACKERS",
                        help="experiment tracking: tensorboard, wandb, mlflow (comma list), all or none (default): "
                             "every loss term per step, dev metrics per epoch, attention heatmaps (docs/tracking.md)")
    parser.add_argument("--cache-dir", dest="cache_dir", help="fine-tuned teachers and teacher caches "
                        "(default: $KDPLUG_CACHE or ~/.cache/kdplug)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run in --output")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint "
                        "(its config.yaml is used; other options are ignored except --set)")
    parser.add_argument("--dry-run", dest="dry_run", action="store_true",
                        help="resolve and check everything the run would use (teacher, student, tokenizer, task and "
                             "its sizes, recipe, every stage's epochs, lr, weights and temperature, transfer set, "
                             "output, what is cached), print the plan and exit, training nothing")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    if args.resume:
        from ..config import apply, parse_overrides
        from ..engine.pipeline import resume_config

        config = apply(resume_config(Path(args.resume)), parse_overrides(args.overrides), source="--set").validate()
        report_failures(manager)
        if args.dry_run:
            from ..engine.plan import dry_run

            dry_run(config, manager.registry, resume=True)
            return 0
        from ..engine.pipeline import run

        run(config, manager.registry, resume=True)
        return 0
    flags = {key: getattr(args, key) for key in
             ("teacher", "student", "projector", "task", "recipe", "data_dir", "output", "seed", "epochs",
              "precision", "baseline", "cache_dir", "report_to", "transfer", "augment", "augment_factor")}
    components_given = any(flags[k] for k in ("teacher", "student", "projector", "task")) or args.config
    if not components_given:
        print("No components given: running the embedded demo (MiniLM-L6 teacher, BiLSTM student, demo task). "
              "See 'kdplug run --help' for your own setups.")
    config = build_config(file=args.config, flags=flags, overrides=args.overrides,
                          base=None if components_given else DEMO_PRESET)
    report_failures(manager)
    if args.dry_run:
        from ..engine.plan import dry_run

        seeds = parse_seeds(args.seeds, config.seed) if args.seeds is not None else None
        if seeds:
            config = seed_configs(config, seeds)[0]
            print(f"--seeds: {len(seeds)} runs ({', '.join(map(str, seeds))}) into {Path(config.output).parent}/seed-*; "
                  f"the plan of the first:")
        dry_run(config, manager.registry, overwrite=args.overwrite)
        return 0
    from ..engine.pipeline import run  # the engine (transformers, accelerate) only once the options are sound

    if args.seeds is not None:
        run_seeds(config, parse_seeds(args.seeds, config.seed), manager, overwrite=args.overwrite)
        return 0
    run(config, manager.registry, overwrite=args.overwrite)
    return 0


# -- several seeds ------------------------------------------------------------------------------

SEEDS_FILE = "seeds.json"


def parse_seeds(text: str, first: int) -> list[int]:
    """``"5"`` -> five seeds from ``first`` on; ``"1,2,3"`` (or ``[1,2,3]``) -> those seeds."""
    parts = [p.strip() for p in text.strip().strip("[]").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values:
        raise ConfigError(f"--seeds expects a count (--seeds 5) or a list of integers (--seeds 1,2,3), got {text!r}")
    if len(parts) == 1 and "," not in text:
        if values[0] < 1:
            raise ConfigError(f"--seeds {text}: the number of seeds must be at least 1")
        return list(range(first, first + values[0]))
    if len(set(values)) != len(values):
        raise ConfigError(f"--seeds {text}: a seed is listed twice")
    return values


def seed_configs(config: RunConfig, seeds: list[int]) -> list[RunConfig]:
    """One configuration per seed, identical but for ``seed`` and the output directory. The teacher's
    fine-tuning seed stays the base seed, so every student learns from the same fine-tuned teacher."""
    output = Path(config.output or default_output(config))
    teacher_seed = config.seed if config.teacher_seed is None else config.teacher_seed
    return [dataclasses.replace(config, seed=seed, teacher_seed=teacher_seed, output=str(output / f"seed-{seed}"))
            for seed in seeds]


def run_seeds(config: RunConfig, seeds: list[int], manager: PluginManager, *, overwrite: bool = False,
              echo=print) -> dict[str, Any]:
    """Run ``config`` once per seed (a finished seed with the same configuration is not run again,
    an interrupted one resumes), then write and print mean ± std over the seeds."""
    from ..engine.pipeline import CHECKPOINT_DIR, run
    from ..engine.preflight import resolve_components
    from ..engine.rundir import is_completed

    resolve_components(config, manager.registry)
    configs = seed_configs(config, seeds)
    root = Path(configs[0].output).parent
    foreign = sorted(e.name for e in root.iterdir() if not e.name.startswith("seed-") and e.name != SEEDS_FILE) \
        if root.is_dir() else []
    if foreign:
        raise UsageError(f"output directory {root} holds files kdplug did not write (e.g. {foreign[0]}); --seeds "
                         f"writes seed-<s>/ run directories and {SEEDS_FILE} into a new or empty directory, or one "
                         f"it wrote before: choose another --output")
    for number, seed_config in enumerate(configs, 1):
        run_dir = Path(seed_config.output)
        same = _same_config(run_dir, seed_config)
        if same and is_completed(run_dir) and not overwrite:
            echo(f"[seed {seed_config.seed}, {number}/{len(configs)}] done already in {run_dir}, skipped")
            continue
        resume = same and (run_dir / CHECKPOINT_DIR).is_dir() and not overwrite
        echo(f"[seed {seed_config.seed}, {number}/{len(configs)}]" + (" resuming" if resume else ""))
        # an unfinished run of this very configuration without checkpoints is ours to start again
        run(seed_config, manager.registry, overwrite=overwrite or same, resume=resume)
    summary = summarize_seeds(configs)
    write_atomic(root / SEEDS_FILE, json.dumps(summary, indent=2))
    echo(format_seeds(summary))
    echo(f"seeds summary: {root / SEEDS_FILE}; compare methods with 'kdplug report {root} OTHER_RUN_DIR'")
    return summary


def _same_config(run_dir: Path, config: RunConfig) -> bool:
    path = run_dir / CONFIG_FILE
    return path.is_file() and yaml.safe_load(path.read_text(encoding="utf-8")) == yaml.safe_load(dump_yaml(config))


def summarize_seeds(configs: list[RunConfig]) -> dict[str, Any]:
    """Per model (student, and the baseline when there is one): each dev metric's values, mean and
    sample standard deviation over the seeds."""
    runs = {c.seed: json.loads((Path(c.output) / METRICS_FILE).read_text(encoding="utf-8")) for c in configs}
    first = next(iter(runs.values()))
    models = {"student": f"{configs[0].student} + {configs[0].projector}"}
    if "baseline" in first:
        models["baseline"] = f"{configs[0].student} + {first['baseline']['projector']}"
    summary: dict[str, Any] = {"seeds": list(runs), "teacher_seed": configs[0].teacher_seed,
                               "main_metric": first["main_metric"], "best_checkpoint": configs[0].best_checkpoint,
                               "runs": {str(seed): c.output for seed, c in zip(runs, configs)}, "models": {}}
    for key, label in models.items():
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for split, metrics in first[key]["dev"].items():
            for metric in metrics:
                values = [runs[seed][key]["dev"][split][metric] for seed in runs]
                table.setdefault(split, {})[metric] = {
                    "values": values, "mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else None}
        summary["models"][label] = table
    return summary


def format_seeds(summary: dict[str, Any]) -> str:
    """The summary as a table: one line per model, mean ± std (×100) of every dev metric."""
    models = summary["models"]
    columns = [(split, metric) for split, metrics in next(iter(models.values())).items() for metric in metrics]
    header = ["model"] + [f"{split} {metric}" for split, metric in columns]
    body = []
    for label, table in models.items():
        cells = []
        for split, metric in columns:
            cell = table[split][metric]
            spread = f" ± {cell['std'] * 100:.2f}" if cell["std"] is not None else ""
            cells.append(f"{cell['mean'] * 100:.2f}{spread}")
        body.append([label] + cells)
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    seeds = ", ".join(str(s) for s in summary["seeds"])
    return "\n".join([f"{len(summary['seeds'])} seeds ({seeds}); mean ± sample std; teacher fine-tuned with seed "
                      f"{summary['teacher_seed']}; {summary['best_checkpoint']} checkpoint",
                      line(header), line(["-" * w for w in widths])] + [line(r) for r in body])

"""``kdplug run``: one distillation run (no components given: the embedded offline demo)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import FIELDS, build_config
from ..plugins import PluginManager
from . import report_failures

#: what ``kdplug run`` with no components does: the embedded, offline demo (see docs/cli.md)
DEMO_PRESET: dict[str, Any] = {
    "teacher": "minilm",
    "student": "bilstm",
    "projector": "rkd",
    "task": "demo",
    "baseline": "nkd",
    "epochs": 15,
    # MiniLM-L6 (a sentence-embedding model) sometimes stalls at chance with BERT's lr 5e-5 and
    # batch 32 on 800 examples; 1e-4 with batch 16 fine-tunes it reliably
    "teacher_epochs": 4,
    "teacher_lr": 1e-4,
    "teacher_batch_size": 16,
    "student_options": {"embedding_dim": 128, "hidden_size": 256},
}

RUN_EXAMPLES = """
examples:
  kdplug run                                  # the offline demo: MiniLM -> BiLSTM on the demo task
  kdplug run --teacher bert-base --student bilstm --projector universal-ca --task sst2 --data-dir glue/SST-2
  kdplug run --teacher ./my-finetuned-bert --student bert-4 --projector alp --task mrpc --set lr=2e-5
  kdplug run --config zoo/alp-kd/table1-sst2-alp.yaml --set seed=2

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
    parser.add_argument("--teacher", help="teacher name (see 'kdplug plugins'), hub id or local checkpoint directory")
    parser.add_argument("--student", help="student name, e.g. bilstm, gated-cnn, bert-4, distilroberta")
    parser.add_argument("--projector", help="distillation method, e.g. nkd, rkd, pkd-skip, alp, universal-ca")
    parser.add_argument("--task", help="task name, e.g. sst2, mrpc, mnli, local, demo")
    parser.add_argument("--recipe", help="training schedule, e.g. standard, two-stage (default: standard)")
    parser.add_argument("--data-dir", dest="data_dir", help="local directory with the task's files (GLUE layout)")
    parser.add_argument("--config", help="YAML file of configuration keys (overridden by flags and --set)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="set any configuration key, e.g. --set lr=2e-5 --set projector_options.layer_map=[1,5,9]")
    parser.add_argument("--output", help="run directory (default: runs/<time>-<task>-<student>-<projector>)")
    parser.add_argument("--seed", type=int, help="random seed (default: 42)")
    parser.add_argument("--epochs", type=int, help="student training epochs (default: 3)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                        help="auto (default): bf16 teacher inference where supported, fp32 training on CPU")
    parser.add_argument("--baseline", help="also train the student with this projector (e.g. nkd) for the table")
    parser.add_argument("--cache-dir", dest="cache_dir", help="fine-tuned teachers and teacher caches "
                        "(default: $KDPLUG_CACHE or ~/.cache/kdplug)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run in --output")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint "
                        "(its config.yaml is used; other options are ignored except --set)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..engine.pipeline import run

    if args.resume:
        from ..config import apply, parse_overrides
        from ..engine.pipeline import resume_config

        config = apply(resume_config(Path(args.resume)), parse_overrides(args.overrides), source="--set").validate()
        report_failures(manager)
        run(config, manager.registry, resume=True)
        return 0
    flags = {key: getattr(args, key) for key in
             ("teacher", "student", "projector", "task", "recipe", "data_dir", "output", "seed", "epochs",
              "precision", "baseline", "cache_dir")}
    components_given = any(flags[k] for k in ("teacher", "student", "projector", "task")) or args.config
    if not components_given:
        print("No components given: running the embedded demo (MiniLM-L6 teacher, BiLSTM student, demo task). "
              "See 'kdplug run --help' for your own setups.")
    config = build_config(file=args.config, flags=flags, overrides=args.overrides,
                          base=None if components_given else DEMO_PRESET)
    report_failures(manager)
    run(config, manager.registry, overwrite=args.overwrite)
    return 0

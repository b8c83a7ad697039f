"""The ``kdplug`` command line.

Exit codes: 0 success, 1 a failure during the run, 2 a usage error (unknown name, malformed
file or option), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from . import __version__
from .config import FIELDS, build_config
from .errors import KdplugError, UsageError
from .plugins import DISABLE_ENV, PluginManager, set_plugin_manager
from .registry import KINDS

#: what ``kdplug run`` with no components does: the embedded, offline demo (see docs/cli.md)
DEMO_PRESET: dict[str, Any] = {
    "teacher": "minilm",
    "student": "bilstm",
    "projector": "rkd",
    "task": "demo",
    "baseline": "nkd",
    "epochs": 4,
    "teacher_epochs": 3,
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


def _add_run(sub: argparse._SubParsersAction) -> None:
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
    parser.set_defaults(handler=cmd_run)


def _add_plugins(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugins", help="list every registered component and the plugin providing it",
                            description="List teachers, students, layer extractors, projectors, losses, tasks and "
                                        "recipes with the plugin, distribution and version that provide each, and "
                                        "any plugin that failed to load.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--kind", choices=list(KINDS), help="only this kind")
    parser.set_defaults(handler=cmd_plugins)


def _add_cache(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cache", help="show or free the teacher cache, fine-tuned teachers and heads",
                            description="The cache holds fine-tuned teachers, teacher outputs and warmed-up heads, "
                                        "each keyed by a fingerprint of what produced it.")
    parser.add_argument("action", choices=["list", "clear"], help="list: show entries and sizes; clear: delete them")
    parser.add_argument("--cache-dir", dest="cache_dir", help="default: $KDPLUG_CACHE or ~/.cache/kdplug")
    parser.set_defaults(handler=cmd_cache)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdplug", description="Knowledge distillation for NLP models, built from plugins.",
        epilog="Docs: docs/ in the repository (cli.md, hooks.md, methods.md, models.md, tasks.md). "
               f"Disable plugins with --disable-plugin NAME or {DISABLE_ENV}=NAME,NAME.")
    parser.add_argument("--version", action="version", version=f"kdplug {__version__}")
    parser.add_argument("--disable-plugin", dest="disabled", action="append", default=[], metavar="NAME",
                        help="do not load this plugin (its entry-point name; repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    _add_plugins(sub)
    _add_cache(sub)
    return parser


# -- commands ---------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace, manager: PluginManager) -> int:
    from .engine.pipeline import run

    flags = {key: getattr(args, key) for key in
             ("teacher", "student", "projector", "task", "recipe", "data_dir", "output", "seed", "epochs",
              "precision", "baseline", "cache_dir")}
    components_given = any(flags[k] for k in ("teacher", "student", "projector", "task")) or args.config
    if not components_given:
        print("No components given: running the embedded demo (MiniLM-L6 teacher, BiLSTM student, demo task). "
              "See 'kdplug run --help' for your own setups.")
    config = build_config(file=args.config, flags=flags, overrides=args.overrides,
                          base=None if components_given else DEMO_PRESET)
    _report_failures(manager)
    run(config, manager.registry, overwrite=args.overwrite)
    return 0


def cmd_plugins(args: argparse.Namespace, manager: PluginManager) -> int:
    registry = manager.registry
    entries = [e for e in registry if args.kind in (None, e.kind)]
    if args.json:
        print(json.dumps({
            "components": [{"kind": e.kind, "name": e.name, "description": e.description, "plugin": e.plugin,
                            "distribution": e.distribution, "version": e.version} for e in entries],
            "failures": [f.__dict__ for f in manager.failures],
            "disabled": sorted(manager.disabled),
        }, indent=2))
        return 0
    for kind in KINDS:
        group = [e for e in entries if e.kind == kind]
        if not group:
            continue
        print(f"{kind}s:")
        width = max(len(e.name) for e in group)
        for e in sorted(group, key=lambda e: e.name):
            origin = f"[{e.plugin}: {e.distribution} {e.version}]".replace(" ]", "]")
            print(f"  {e.name.ljust(width)}  {e.description}  {origin}")
    _report_failures(manager, stream=sys.stdout)
    if manager.disabled:
        print(f"disabled plugins: {', '.join(sorted(manager.disabled))}")
    return 0


def cmd_cache(args: argparse.Namespace, manager: PluginManager) -> int:
    from .engine.cache import default_cache_root, list_caches

    root = Path(args.cache_dir) if args.cache_dir else default_cache_root()
    sections = {"teacher-cache": "teacher outputs", "teachers": "fine-tuned teachers", "heads": "teacher heads"}
    if args.action == "clear":
        freed = 0
        for name in sections:
            directory = root / name
            if directory.exists():
                freed += sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
                shutil.rmtree(directory)
        print(f"cleared {root} ({freed / 2**20:.1f} MiB freed)")
        return 0
    print(f"cache: {root}")
    total = 0
    for name, title in sections.items():
        directory = root / name
        items = list_caches(directory) if name != "heads" else []
        files = sorted(directory.glob("*.safetensors")) if name == "heads" and directory.exists() else []
        if not items and not files:
            continue
        print(f"{title}:")
        for path, meta, size in items:
            total += size
            info = meta.description if meta is not None else "incomplete"
            extra = f" {meta.num_examples} examples" if meta is not None else ""
            print(f"  {path.name}  {size / 2**20:8.1f} MiB{extra}  {info}")
        for path in files:
            total += path.stat().st_size
            print(f"  {path.stem}  {path.stat().st_size / 2**20:8.1f} MiB")
    print(f"total {total / 2**20:.1f} MiB")
    return 0


def _report_failures(manager: PluginManager, stream=None) -> None:
    for failure in manager.failures:
        print(f"warning: {failure.message()}", file=stream or sys.stderr)


def _quiet_libraries(verbose: bool) -> None:
    """Transformers' load reports and progress bars drown kdplug's own; keep their errors only."""
    if verbose:
        return
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kdplug").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    _quiet_libraries(args.verbose)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        manager = PluginManager(disabled=args.disabled)
        set_plugin_manager(manager)
        return args.handler(args, manager)
    except UsageError as exc:
        print(f"kdplug: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KdplugError as exc:
        print(f"kdplug: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kdplug: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

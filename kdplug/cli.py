"""The ``kdplug`` command line.

Exit codes: 0 success, 1 a failure during the run, 2 a usage error (unknown name, malformed
file or option), 130 interrupted (SIGINT), 143 stopped by SIGTERM (see interrupt.py).
Each subcommand lives in :mod:`kdplug.commands`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Optional

from . import startup
from .commands import cache, check_plugin, export, new_plugin, plugins, predict, report, run, sweep, zoo
from .errors import DEBUG_ENV, KdplugError, debugging
from .logs import not_file_only
from .plugins import DISABLE_ENV, PluginManager, set_plugin_manager
from .version import __version__

#: the subcommands, in the order ``kdplug --help`` lists them
COMMANDS = [run, predict, export, plugins, cache, zoo, sweep, report, check_plugin, new_plugin]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdplug",
        description="Knowledge distillation for NLP models, built from plugins.",
        epilog="Docs: docs/ in the repository (cli.md, python-api.md, deploy.md, tracking.md, hooks.md, methods.md, "
        "models.md, llm-teachers.md, tasks.md, recipes.md, comparisons.md, zoo.md, sweep-and-report.md, "
        "writing-a-plugin.md, architecture.md, "
        "performance.md, scale.md, robustness.md, transfer-sets.md). "
        f"Disable plugins with --disable-plugin NAME or {DISABLE_ENV}=NAME,NAME.",
    )
    parser.add_argument("--version", action="version", version=f"kdplug {__version__}")
    parser.add_argument(
        "--disable-plugin",
        dest="disabled",
        action="append",
        default=[],
        metavar="NAME",
        help="do not load this plugin (its entry-point name; repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"print the traceback of an error, not only its message (or set {DEBUG_ENV}=1); a run's log.txt "
        "has it either way",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _quiet_libraries(verbose: bool) -> None:
    """Transformers' load reports and progress bars drown kdplug's own; keep their errors only.

    Set through the environment, which both libraries read when first imported: importing
    transformers here would cost a second on every command, bad arguments included.
    """
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported (an API user calling main): tell it directly
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        disable_progress_bars()


def main(argv: Optional[Sequence[str]] = None) -> int:
    startup.started()  # from here a Ctrl-C is a KeyboardInterrupt, reported below
    if hasattr(signal, "SIGXFSZ"):  # a file-size limit makes writes fail (EFBIG, reported) instead of killing us
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    logging.raiseExceptions = False  # a log line that cannot be written (full disk) must not bury the real error
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(not_file_only)  # what the run printed already goes to its log.txt alone
    logging.getLogger("kdplug").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    _quiet_libraries(args.verbose)
    if args.debug:
        os.environ[DEBUG_ENV] = "1"  # for the engine, which writes a failed run's traceback
    if args.command is None:
        parser.print_help()
        return 2
    try:
        manager = PluginManager(disabled=args.disabled, lazy=True)  # loaded when a command needs it
        set_plugin_manager(manager)
        return args.handler(args, manager)
    except KdplugError as exc:  # usage errors (2) and faults kdplug explains (1)
        if debugging():
            traceback.print_exc()
        print(f"kdplug: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kdplug: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (kdplug zoo list | head): stop quietly, as a command killed by SIGPIPE
        # does, and keep Python from complaining again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

"""The subcommands of ``kdplug``: one module each, with ``add_parser(subparsers)``.

A command's handler is ``handler(args, manager) -> exit code``; usage errors are raised as
:class:`kdplug.errors.UsageError` and turned into exit code 2 by :func:`kdplug.cli.main`.
"""

from __future__ import annotations

import sys

from ..plugins import PluginManager


def report_failures(manager: PluginManager, stream=None) -> None:
    """Warn about every plugin that was skipped, and why."""
    for failure in manager.failures:
        print(f"warning: {failure.message()}", file=stream or sys.stderr)

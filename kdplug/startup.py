"""Ctrl-C while the ``kdplug`` command starts.

Importing kdplug (torch, then transformers) takes seconds. Python turns a Ctrl-C in that time into
a ``KeyboardInterrupt`` raised inside whichever library module is being imported: a page of
traceback, or worse, another error from the half-imported module. Nothing has been read or
written yet, so while the command line starts SIGINT ends the process at once, with one line and
exit code 130; :func:`kdplug.cli.main` hands SIGINT back to Python (``KeyboardInterrupt``, which
it reports the same way) before it does anything. Importing kdplug from Python is left alone.

Importing this module acts (``kdplug/__init__.py`` imports it first); it imports only the
standard library.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

INTERRUPTED = 128 + signal.SIGINT


def command_line_starting() -> bool:
    """Whether this process is the ``kdplug`` command line importing kdplug: the console script, or
    ``python -m kdplug.cli``, for which ``sys.argv[0]`` is ``-m`` while runpy imports its package."""
    first = sys.argv[0] if sys.argv else ""
    return first == "-m" or os.path.basename(first) in ("kdplug", "kdplug.exe")


def exit_on_ctrl_c_while_starting() -> None:
    """Until :func:`started`: SIGINT exits with 130 and one line instead of raising mid-import."""
    if not command_line_starting() or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (nohup) or taken by a host
        signal.signal(signal.SIGINT, _interrupted_while_starting)


def started() -> None:
    """The command takes over: SIGINT raises ``KeyboardInterrupt`` again (graceful stops install their own)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted_while_starting(signum: int, frame: object) -> None:  # noqa: ARG001
    os.write(2, b"kdplug: interrupted while starting; nothing was read or written\n")
    os._exit(INTERRUPTED)


exit_on_ctrl_c_while_starting()

"""SIGINT/SIGTERM during training: finish the current step, checkpoint, exit cleanly.

The handler only sets a flag; the training loop checks it between steps, where the state is
consistent, writes a checkpoint and raises :class:`RunInterrupted`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from .errors import KdplugError


class RunInterrupted(KdplugError):
    """Stopped by a signal after writing a checkpoint; ``kdplug run --resume`` continues."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


_requested: list[int] = []


def requested() -> int | None:
    """The signal number that asked the run to stop, if any."""
    return _requested[0] if _requested else None


@contextlib.contextmanager
def graceful_stop() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into a stop request for the duration of the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):  # noqa: ARG001
        if _requested:  # a second signal: stop now
            raise KeyboardInterrupt
        _requested.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        _requested.clear()
        for signum, old in previous.items():
            signal.signal(signum, old)

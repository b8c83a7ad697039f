"""Fault injection for the robustness tests: deliver a signal to this process at a given step.

``KDPLUG_SIGNAL_AT=STAGE:EPOCH:STEP[:SIGNAL]`` (signal name or number, default SIGKILL) makes
the training loop send that signal to its own process right after that step, which is how the
tests kill a run at an exact point and check that ``--resume`` ends where an uninterrupted run
ends. Unset, it costs one dictionary lookup per stage.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

ENV = "KDPLUG_SIGNAL_AT"


def planned(stage: str) -> Optional[tuple[int, int, int]]:
    """``(epoch, step, signal)`` planned for ``stage``, if any."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    parts = spec.split(":")
    if parts[0] != stage or len(parts) not in (3, 4):
        return None
    signum = signal.SIGKILL
    if len(parts) == 4:
        signum = int(parts[3]) if parts[3].isdigit() else getattr(signal, parts[3])
    return int(parts[1]), int(parts[2]), int(signum)


def fire(plan: Optional[tuple[int, int, int]], epoch: int, step: int) -> None:
    if plan is not None and plan[:2] == (epoch, step):
        os.kill(os.getpid(), plan[2])

"""Fault injection for the robustness tests: a real signal delivered to this process at a chosen point.

``KDPLUG_SIGNAL_AT=STAGE:EPOCH:STEP[:SIGNAL]`` (signal name or number, default SIGKILL) makes
the training loop send that signal to its own process right after that step, which is how the
tests kill a run at an exact point and check that ``--resume`` ends where an uninterrupted run
ends; ``KDPLUG_SIGNAL_RANK=N`` sends it in rank N of a launch alone (each carries it otherwise, and
which dies first is a race). ``KDPLUG_FAULT_AT=POINT[:COUNT[:ACTION]]`` acts the COUNT-th time (default 1) the code
passes a named point: ACTION is a signal (default SIGKILL), or ``fsize=BYTES``, which sets this
process's real file-size limit (``RLIMIT_FSIZE``) so that the writes that follow fail the way a
full disk or a quota makes them fail. Points: ``checkpoint-write``, ``checkpoint-swap`` (between
the two renames that put a new checkpoint in place), ``cache-write``, ``teacher-store``,
``run-results``, and per rank N of a launch ``teacher-share-rankN`` (a batch of its share of the
teacher pass), ``augment-share-rankN`` (an augmented copy of its share) and ``exchange-rankN`` (before
it joins an exchange of the shared work, where the others wait for it in a collective). Unset, each
costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

ENV = "KDPLUG_SIGNAL_AT"
POINT_ENV = "KDPLUG_FAULT_AT"
#: the rank of a launch (its RANK) the planned signal is for; unset, every process carries it
RANK_ENV = "KDPLUG_SIGNAL_RANK"
_passes: dict[str, int] = {}


def _signal(text: Optional[str]) -> int:
    if not text:
        return int(signal.SIGKILL)
    return int(text) if text.isdigit() else int(getattr(signal, text))


def planned(stage: str) -> Optional[tuple[int, int, int]]:
    """``(epoch, step, signal)`` planned for ``stage``, if any."""
    spec = os.environ.get(ENV)
    if not spec or os.environ.get(RANK_ENV, os.environ.get("RANK", "0")) != os.environ.get("RANK", "0"):
        return None
    parts = spec.split(":")
    if parts[0] != stage or len(parts) not in (3, 4):
        return None
    return int(parts[1]), int(parts[2]), _signal(parts[3] if len(parts) == 4 else None)


def fire(plan: Optional[tuple[int, int, int]], epoch: int, step: int) -> None:
    if plan is not None and plan[:2] == (epoch, step):
        os.kill(os.getpid(), plan[2])


def fire_at(point: str) -> None:
    """Deliver the signal planned for the COUNT-th pass through ``point``."""
    spec = os.environ.get(POINT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    if parts[0] != point:
        return
    _passes[point] = _passes.get(point, 0) + 1
    if _passes[point] != int(parts[1] if len(parts) > 1 and parts[1] else 1):
        return
    action = parts[2] if len(parts) > 2 else None
    if action and action.startswith("fsize="):
        import resource

        limit = int(action.split("=", 1)[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return
    os.kill(os.getpid(), _signal(action))

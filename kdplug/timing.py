"""Timing a model honestly: warm-up, repeats, the spread, and whether the machine let it be measured.

One routine for every speed kdplug prints (the run's closing table, ``kdplug export``): a median
over repeats after warm-up calls, with the fastest and slowest repeat beside it. A figure is
flagged, not printed as a fact, where other processes kept the cores busy while it was measured or
where its repeats disagree by more than :data:`DISAGREEMENT` of their median: on a busy 2-core
machine the same student measured 142 and 11 examples/s a minute apart.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Optional

WARMUP, REPEATS = 2, 7
#: repeats whose slowest and fastest differ by more than this share of their median were disturbed
DISAGREEMENT = 0.5
#: other processes' load (in cores) above which a machine is too busy to time on
BUSY_LOAD = 0.5


@dataclass(frozen=True)
class Timing:
    """Seconds of one call: the median of ``repeats`` after warm-up, and the extremes."""

    median: float
    fastest: float
    slowest: float
    repeats: int

    @property
    def spread(self) -> float:
        """How far the repeats are apart, as a share of the median: (slowest - fastest) / median."""
        return (self.slowest - self.fastest) / self.median if self.median > 0 else 0.0


def time_call(
    call: Callable[[], object],
    *,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    synchronize: Optional[Callable[[], None]] = None,
) -> Timing:
    """Time ``call`` ``repeats`` times after ``warmup`` untimed calls (``synchronize`` waits for an
    accelerator before each clock reading)."""
    sync = synchronize or (lambda: None)
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        call()
        sync()
        samples.append(time.perf_counter() - started)
    return Timing(statistics.median(samples), min(samples), max(samples), repeats)


def unreliable(timings: Iterable[Timing], load: Optional[float]) -> Optional[str]:
    """Why these timings are not to be trusted, in words; None when they are."""
    if load is not None and load > BUSY_LOAD:
        return f"other processes kept {load:.1f} cores busy while it was measured"
    worst = max((timing.spread for timing in timings), default=0.0)
    if worst > DISAGREEMENT:
        return f"its repeats disagreed by {worst:.0%} of their median"
    return None


def plus_minus(spread: float) -> str:
    """A timing's spread as ``±4%``: half the distance between its slowest and fastest repeat."""
    return f"±{spread / 2:.0%}"


#: where an unreliable timing is taken again
RETIME = "on an idle machine (python benchmarks/inference.py --run RUN_DIR) before quoting them"


def megabytes(size: int) -> float:
    """Bytes in MB (10^6 bytes), the unit every size kdplug prints is in."""
    return size / 1e6

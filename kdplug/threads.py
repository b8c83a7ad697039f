"""How many intra-op threads a kdplug process gives PyTorch.

PyTorch starts one intra-op thread per physical core and each of them spins until all are done
with an operation. Where other processes keep the cores busy, every operation waits for its
slowest thread: on a 2-core machine running other jobs (load 2-6) a BiLSTM trained 5-35x slower
with two threads than with one. So kdplug counts the cores it may use (its CPU affinity and its
cgroup's CPU quota), subtracts the load other processes put on them, and gives PyTorch what is
left (at least one). ``--threads N`` (``threads`` in a configuration) sets the count, and so do
PyTorch's own variables (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``), which kdplug then leaves alone.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import UsageError

#: PyTorch's own settings of its thread count: where one is set, kdplug does not choose
TORCH_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count of this process and why (what metrics.json records)."""

    threads: int
    reason: str
    usable_cores: int
    load: Optional[float]

    def to_dict(self) -> dict:
        return {"threads": self.threads, "reason": self.reason, "usable_cores": self.usable_cores, "load": self.load}


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, math.floor(quota))) if quota is not None else cores


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> Optional[float]:
    """The CPU quota of this process's cgroup in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``);
    None when there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def other_load(interval: float = 0.3) -> Optional[float]:
    """The cores other processes keep busy now: the busy share of the usable cores' time over
    ``interval`` seconds (from /proc/stat; this process sleeps meanwhile), else the 1-minute load
    average. Not the load average first: it still counts a run that ended a minute ago."""
    try:
        cpus = {f"cpu{index}" for index in os.sched_getaffinity(0)}
        before = _cpu_times(cpus)
        time.sleep(interval)
        after = _cpu_times(cpus)
        total = after[0] - before[0]
        return None if total <= 0 else len(cpus) * (after[1] - before[1]) / total
    except (AttributeError, OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return None


def _cpu_times(cpus: set[str]) -> tuple[int, int]:
    """(all, busy) jiffies of ``cpus`` since boot; idle and iowait are not busy."""
    total = busy = 0
    for line in Path("/proc/stat").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in cpus:
            ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return total, busy


def choose(
    requested: Optional[int] = None, *, cores: Optional[int] = None, load: Optional[float] = None
) -> ThreadChoice:
    """The thread count for this process: ``requested`` (``--threads``) if given, else PyTorch's own
    variable if set, else the usable cores less the cores other processes keep busy (at least 1)."""
    cores = usable_cores() if cores is None else cores
    if requested is not None:
        if requested > cores:  # each operation would wait for threads that share a core: 25-40x slower epochs
            raise UsageError(
                f"threads={requested} (--threads): this process may use {cores} core{'s' * (cores > 1)} (its CPU "
                f"affinity and cgroup quota), and more threads than cores make every operation wait for the ones "
                f"sharing a core (an epoch ran 25 to 40 times slower). Use --threads {cores} or less, or leave it unset"
            )
        return ThreadChoice(requested, "--threads", cores, load)
    for variable in TORCH_VARIABLES:
        if os.environ.get(variable, "").strip().isdigit() and int(os.environ[variable]) > 0:
            return ThreadChoice(int(os.environ[variable]), variable, cores, load)
    load = other_load() if load is None else load
    if load is None:
        return ThreadChoice(cores, f"{cores} usable cores", cores, None)
    # a load below half a core is noise (the shell, an editor): the machine is idle
    free = cores if load < 0.5 else max(1, math.floor(cores - load + 0.5))
    reason = f"{cores} usable cores" + (f", {load:.1f} of them busy with other processes" if free < cores else "")
    return ThreadChoice(min(free, cores), reason, cores, round(load, 2))


def apply(choice: ThreadChoice) -> ThreadChoice:
    """Give PyTorch ``choice.threads`` intra-op threads (unless one of its own variables decided)."""
    if choice.reason not in TORCH_VARIABLES:
        import torch

        torch.set_num_threads(choice.threads)
    return choice

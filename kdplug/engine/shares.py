"""Work split across the processes of a launch (accelerate, torchrun, SLURM): one build, led by rank 0.

What a run needs once (a split's teacher outputs, a transfer set, its tokenisation) is built through
:func:`lead_or_follow`, the one lead/follow protocol: rank 0 takes the file lock, checks the store,
and broadcasts its order (what is missing, and a staging folder on the filesystem every process
sees); each process writes its share into that folder (files carry the data); every rank's status,
its share's record or its error, is then gathered by every rank (``all_gather_object``), so a
failing share's error reaches them all at once; rank 0 joins the shares, and a last gather tells the
others the result is in place. A process that dies breaks the collective the others wait in, and
the launcher (torch-elastic's agent under ``torchrun`` and ``accelerate launch``) ends the launch.
No heartbeat, no polling, and no monitored barrier: a share takes as long as its data (a teacher
pass over a large split), so a barrier's timeout would name a slow process as lost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

from ..errors import KdplugError
from ..storage import file_lock, staging_directory
from . import faults

POLL_SECONDS = 0.2
#: how long a process waits in a step of a shared build for the others, alive: rank 0 may check a
#: large stored entry, read large --transfer files or join a large split meanwhile (a dead process
#: breaks the step at once; the default groups' 10 to 30 minutes would fail a live one)
STEP_TIMEOUT = timedelta(hours=24)
#: the gloo group the shared builds' steps run in, made by :func:`meet` (None: the default group)
_steps_group: Any = None
#: the default group :data:`_steps_group` was made in (destroying it destroys ours too)
_steps_world: Any = None


def _all_gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value, group=_steps_group)
    return gathered


def broadcast(value: Any) -> Any:
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, group=_steps_group)
    return box[0]


@dataclass(frozen=True)
class Processes:
    """The processes that share a piece of work: this one's ``rank`` among ``count``, a collective
    ``broadcast`` that gives every rank rank 0's value, and ``gather``, every rank's value to every
    rank (torch.distributed's, in the group :func:`meet` made, unless given)."""

    rank: int = 0
    count: int = 1
    broadcast: Callable[[Any], Any] = lambda value: value
    gather: Callable[[Any], list[Any]] = _all_gather

    @property
    def leads(self) -> bool:
        return self.rank == 0


ONE_PROCESS = Processes(gather=lambda value: [value])


def share(num_items: int, rank: int, count: int, align: int = 1) -> range:
    """Rank ``rank``'s contiguous share of ``num_items``, cut at multiples of ``align`` (a batch
    size, so each share's batches are exactly the ones a single process forms)."""
    blocks = (num_items + align - 1) // align
    first, last = blocks * rank // count, blocks * (rank + 1) // count
    return range(min(first * align, num_items), min(last * align, num_items))


class ShareFailed(KdplugError, RuntimeError):
    """Another process of the launch died or failed before finishing its share: its message says
    which (None: it could not be told) and what to do, on the command line without a traceback (exit 1)."""

    def __init__(self, rank: Optional[int], reason: str, what: str) -> None:
        who = f"process rank {rank}" if rank is not None else "another process of the launch"
        super().__init__(f"{who} {reason} during {what}; nothing of it was stored. {AFTER}")
        self.rank = rank


AFTER = "Run again to compute it from the start (the folder it left is listed by 'kdplug cache clear --stale')."
#: what the others say of rank 0 when it failed outside a share (its own error is printed above)
LEAD_STOPPED = "stopped (its error is above)"

#: (host, pid) of each rank of this launch, learnt when the run starts (:func:`meet`), to name a
#: process lost in a collective, of which gloo says only "Connection closed by peer"
_roster: list[tuple[str, int]] = []


def meet(count: int) -> None:
    """Every process of a launch of ``count``: wait for the others, learn each one's host and pid, and
    make the gloo group of :data:`STEP_TIMEOUT` that the shared builds' steps run in (on CPU, not
    through the GPUs' NCCL and its watchdog). The group is made once per process group: a sweep runs
    its points in one process, and a group a launch makes keeps its sockets and threads until destroyed."""
    import torch.distributed as dist

    global _steps_group, _steps_world
    if _steps_group is None or _steps_world is not dist.group.WORLD:  # none yet, or the default group is new
        _steps_group = dist.new_group(backend="gloo", timeout=STEP_TIMEOUT)
        _steps_world = dist.group.WORLD
    _roster[:] = [tuple(item) for item in _all_gather((socket.gethostname(), os.getpid()))]


def exchange(processes: Processes, value: Any, what: str) -> Any:
    """``processes.broadcast(value)``; a process lost during it (killed, crashed) is named as a share's
    death is, not in the collective library's words."""
    faults.fire_at(f"exchange-rank{processes.rank}")
    try:
        return processes.broadcast(value)
    except ShareFailed:
        raise
    except RuntimeError as exc:  # gloo/NCCL: "Connection closed by peer", "connection reset"
        raise lost_process(processes.rank, what, exc) from exc


def lost_process(
    rank: int, what: str, error: BaseException, roster: Optional[list] = None, wait: float = 5.0
) -> ShareFailed:
    """The error naming the process of the launch that is gone, found among the ranks on this host
    (a killed process's connections close before it has exited: it is looked for ``wait`` seconds).

    Kept beside the launcher and the collectives for what they do not say: gloo reports a dead peer
    as "Connection closed by peer" with no rank, and torch-elastic's agent names the dead worker only
    under ``torchrun``/``accelerate launch``, in its own block, and may end this process before it
    speaks; processes started otherwise (``srun`` tasks, an ``env://`` rendezvous of one's own) have
    no agent at all. The pid check (a zombie counts as dead) turns the roster into the rank's name."""
    host = socket.gethostname()
    deadline = time.monotonic() + wait
    roster = roster or _roster
    while roster:
        for other, (where, pid) in enumerate(roster):
            if other != rank and where == host and not pid_alive(pid):
                return ShareFailed(other, f"(pid {pid} on {host}) died: it was killed or crashed", what)
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_SECONDS)
    words = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ShareFailed(None, f"stopped (the exchange with it failed: {words})", what)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host; a zombie (dead, not yet reaped) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): the signal check is all there is
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@dataclass
class Build:
    """One shared build as this process takes part in it: rank 0's ``order``, the staging ``folder``
    (None: nothing is built, or by one process alone), and the steps every rank takes together."""

    processes: Processes
    what: str
    order: dict[str, Any]
    folder: Optional[Path]
    #: (host, pid) of each rank, to name one lost in a step
    roster: list = field(default_factory=list)
    #: a step said a process failed or died: every rank has stopped there, and no step follows
    stopped: bool = False

    @property
    def shared(self) -> bool:
        return self.folder is not None

    def share_dir(self, rank: int, phase: str = "") -> Path:
        assert self.folder is not None
        return self.folder / phase / f"rank-{rank}"

    def share(
        self, work: Callable[[Path], dict[str, Any]], examples: int, *, phase: str = "", what: str = ""
    ) -> list[dict[str, Any]]:
        """This process's share, written by ``work`` into its own directory, then every rank's record
        (rank, examples, seconds and ``work``'s), on every rank. If a share failed, every other
        rank raises :class:`ShareFailed` naming it, and the failing one its own error."""
        rank, started = self.processes.rank, time.perf_counter()
        directory = self.share_dir(rank, phase)
        try:
            directory.mkdir(parents=True)
            result = work(directory)
        except BaseException as exc:
            shutil.rmtree(directory, ignore_errors=True)
            self.stop(f"failed ({type(exc).__name__}: {exc})", what)
            raise
        record = {"rank": rank, "examples": examples, "seconds": round(time.perf_counter() - started, 3), **result}
        return self.step(record, what)

    def step(self, status: Any, what: str = "") -> list[Any]:
        """Every rank's ``status``, gathered by every rank; :class:`ShareFailed` naming a rank that
        failed or died instead."""
        what = what or self.what
        statuses = self._gather({"ok": status}, what)
        failed = [(rank, item["failed"]) for rank, item in enumerate(statuses) if "failed" in item]
        if failed:
            self.stopped = True
            raise ShareFailed(*failed[0], what)
        return [item["ok"] for item in statuses]

    def stop(self, reason: str, what: str = "") -> None:
        """This process failed: the others, at whatever step they wait in, are told ``reason``."""
        if not self.stopped:
            self.stopped = True
            with contextlib.suppress(ShareFailed):
                self._gather({"failed": reason}, what or self.what)

    def _gather(self, value: Any, what: str) -> list[Any]:
        try:
            return self.processes.gather(value)
        except ShareFailed:
            self.stopped = True
            raise
        except RuntimeError as exc:  # gloo/NCCL: "Connection closed by peer"
            self.stopped = True
            raise lost_process(self.processes.rank, what, exc, self.roster) from exc


@contextlib.contextmanager
def lead_or_follow(
    processes: Processes, what: str, *, locks: Sequence[Path], check: Callable[[], dict[str, Any]], staging: Path
) -> Iterator[Build]:
    """The block of one build that every process of a launch enters. Rank 0 holds ``locks`` (in
    order) throughout and runs ``check()``: its order, whose ``build`` says whether anything is to
    build; under several processes a staging folder ``staging`` (a name beside the store) is made for
    the shares, and removed at the end (all in it is this launch's). The order is broadcast; the
    block builds (rank 0) or takes its share; once rank 0's block is done a last step tells the
    others the result is in place. A rank whose block raises tells the others at their next step.

    The file lock stays for what no launcher or collective covers: two separate ``kdplug run``s
    sharing a cache directory have no process group between them; the second waits on the lock
    and finds the entry built. It is an OS lock (``flock``), released when its holder dies, so a
    killed holder leaves no stale lock to check the liveness of. The other ranks of a launch never
    wait on it (rank 0 may take it again for the next build while they wait in a step)."""
    with contextlib.ExitStack() as held:
        if processes.leads:
            try:
                order, folder = _lead(held, processes, locks, check, staging)
            except BaseException as exc:  # the others wait for the order: they are told why none comes
                if processes.count > 1:
                    with contextlib.suppress(ShareFailed):
                        exchange(processes, {"failed": f"failed ({type(exc).__name__}: {exc})"}, what)
                raise
            exchange(processes, order, what)
        else:
            order = exchange(processes, None, what)
            if "failed" in order:
                raise ShareFailed(0, order["failed"], what)
            folder = Path(order["folder"]) if order["folder"] else None
        build = Build(processes, what, order, folder)
        if build.shared:
            build.roster = [tuple(item) for item in build.step((socket.gethostname(), os.getpid()))]
        try:
            yield build
        except BaseException as exc:
            if build.shared:
                build.stop(LEAD_STOPPED if processes.leads else f"failed ({type(exc).__name__}: {exc})")
            raise
        if build.shared:
            build.step(None)


def _lead(
    held: contextlib.ExitStack,
    processes: Processes,
    locks: Sequence[Path],
    check: Callable[[], dict[str, Any]],
    staging: Path,
) -> tuple[dict[str, Any], Optional[Path]]:
    """Rank 0's part before the order goes out: the locks (held by ``held``), the check, the staging folder."""
    for lock in locks:
        held.enter_context(file_lock(lock))
    order = check()
    folder = None
    if order.get("build") and processes.count > 1:
        folder = staging_directory(staging.parent, staging.name)
        held.callback(shutil.rmtree, folder, ignore_errors=True)
    order["folder"] = str(folder) if folder else None
    return order, folder

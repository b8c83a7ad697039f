"""Work split across the processes of a launch (accelerate, torchrun, SLURM), coordinated through files.

A teacher pass under ``accelerate launch --num_processes N`` is split into N contiguous shares,
one per process. Each process writes its share into a folder that rank 0 created (on the
filesystem every process sees), then leaves a marker saying it is done; rank 0 joins the shares.
Files, not collectives, carry this part: a process that dies mid-pass would leave the others
waiting in a collective until its timeout (30 minutes), with no word of which one died, while a
folder shows at once who is alive: every process keeps a heartbeat file there, which names its
host and pid. A process on the same host that is gone (or a zombie) is dead at once; one on another
host is taken for dead when its heartbeat is older than :data:`SILENT_SECONDS` (a thread keeps it fresh
while the process lives, whatever step it is in).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import KdplugError
from ..storage import write_atomic
from . import faults

#: a process on another host whose heartbeat is older than this is taken for dead (its pid cannot
#: be checked); a live process beats every 30 s
SILENT_SECONDS = 600.0
#: how long a process may take to announce itself in the folder before it is taken for dead
START_SECONDS = 600.0
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Processes:
    """The processes that share a piece of work: this one's ``rank`` among ``count``, and a
    collective ``broadcast`` that gives every rank rank 0's value (used only while all are alive)."""

    rank: int = 0
    count: int = 1
    broadcast: Callable[[Any], Any] = lambda value: value

    @property
    def leads(self) -> bool:
        return self.rank == 0


ONE_PROCESS = Processes()


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

#: (host, pid) of each rank of this launch, learnt when the run starts (:func:`meet`), to name a
#: process lost in a collective, of which gloo says only "Connection closed by peer"
_roster: list[tuple[str, int]] = []


def meet(count: int) -> None:
    """Every process of a launch of ``count``: wait for the others, and learn each one's host and pid."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * count
    dist.all_gather_object(gathered, (socket.gethostname(), os.getpid()))
    _roster[:] = [tuple(item) for item in gathered]


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


def lost_process(rank: int, what: str, error: BaseException, wait: float = 5.0) -> ShareFailed:
    """The error naming the process of the launch that is gone, found among the ranks on this host
    (a killed process's connections close before it has exited: it is looked for ``wait`` seconds)."""
    host = socket.gethostname()
    deadline = time.monotonic() + wait
    while _roster:
        for other, (where, pid) in enumerate(_roster):
            if other != rank and where == host and not pid_alive(pid):
                return ShareFailed(other, f"(pid {pid} on {host}) died: it was killed or crashed", what)
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_SECONDS)
    words = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ShareFailed(None, f"stopped (the exchange with it failed: {words})", what)


class Folder:
    """The folder one shared piece of work is written in, as every process of the launch sees it."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = Path(path), what
        self._created = time.time()

    def _heartbeat(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.alive"

    def _done(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.done"

    def _failed(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.failed"

    def share_dir(self, rank: int) -> Path:
        return self.path / f"rank-{rank}"

    def announce(self, rank: int) -> None:
        write_atomic(self._heartbeat(rank), json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))

    @contextlib.contextmanager
    def beating(self, rank: int, every: float = 30.0) -> Iterator[None]:
        """Keep ``rank``'s heartbeat fresh from a thread while the block runs: the long steps (a
        checksum or the join of a large split) write nothing for minutes."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                self.beat(rank)

        thread = threading.Thread(target=beat, name=f"kdplug-heartbeat-{rank}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def beat(self, rank: int) -> None:
        try:
            os.utime(self._heartbeat(rank))
        except OSError:  # the folder is gone: the lead gave up, which waiting will say
            pass

    def run_share(self, rank: int, work: Callable[[Path], dict[str, Any]], examples: int) -> None:
        """This process's share: announced, written by ``work`` into its share directory, then
        marked done with ``work``'s record and the share's examples and seconds; or, if ``work``
        raised, removed and marked failed (the others name this rank) before the error goes on."""
        self.require_lead()
        self.announce(rank)
        started = time.perf_counter()
        try:
            self.share_dir(rank).mkdir()
            with self.beating(rank):
                result = work(self.share_dir(rank))
        except BaseException as exc:
            shutil.rmtree(self.share_dir(rank), ignore_errors=True)
            self.fail(rank, f"{type(exc).__name__}: {exc}")
            raise
        self.finish(
            rank, {"rank": rank, "examples": examples, "seconds": round(time.perf_counter() - started, 3), **result}
        )

    def await_lead(self, done: Callable[[], bool]) -> None:
        """Another rank, its share given: wait until ``done()`` says rank 0's result is in place.
        :class:`ShareFailed` if rank 0 failed, died, fell silent, or removed the folder without a
        result. (Waiting on rank 0's file lock instead would deadlock: rank 0 may take the same lock
        again, for the next piece of work, before this rank gets it, and wait for this rank there.)"""
        while not done():
            if not self.path.is_dir():
                if done():
                    return
                raise ShareFailed(0, "stopped (its error is above)", self.what)
            self.check_alive(0)
            time.sleep(POLL_SECONDS)

    def require_lead(self) -> None:
        """:class:`ShareFailed` naming rank 0 if the folder is gone: rank 0 stopped and removed it."""
        if not self.path.is_dir():
            raise ShareFailed(0, "stopped (its error is above)", self.what)

    def finish(self, rank: int, record: dict[str, Any]) -> None:
        write_atomic(self._done(rank), json.dumps(record))

    def fail(self, rank: int, reason: str) -> None:
        try:
            write_atomic(self._failed(rank), reason)
        except OSError:
            pass

    def wait_for_shares(self, ranks: range, beat: Callable[[], None]) -> list[dict[str, Any]]:
        """Each rank's done record, once all are done; :class:`ShareFailed` naming the first rank
        that failed or died."""
        records: dict[int, dict[str, Any]] = {}
        while len(records) < len(ranks):
            for rank in ranks:
                if rank in records:
                    continue
                if self._done(rank).is_file():
                    records[rank] = json.loads(self._done(rank).read_text())
                else:
                    self.check_alive(rank)
            beat()
            if len(records) < len(ranks):
                time.sleep(POLL_SECONDS)
        return [records[rank] for rank in ranks]

    def check_alive(self, rank: int) -> None:
        """:class:`ShareFailed` if ``rank`` reported a failure, died or fell silent."""
        if self._failed(rank).is_file():
            raise ShareFailed(rank, f"failed ({self._failed(rank).read_text().strip()})", self.what)
        reason = self._death(rank)
        if reason is not None and not self._done(rank).is_file():  # done in the meantime: not dead
            raise ShareFailed(rank, reason, self.what)

    def _death(self, rank: int) -> Optional[str]:
        heartbeat = self._heartbeat(rank)
        try:
            seen = json.loads(heartbeat.read_text())
            silent = time.time() - heartbeat.stat().st_mtime
        except (OSError, ValueError):
            if time.time() - self._created > START_SECONDS:
                return f"never started its share in {START_SECONDS:.0f} s"
            return None
        if seen["host"] == socket.gethostname():
            if not pid_alive(int(seen["pid"])):
                return f"(pid {seen['pid']} on {seen['host']}) died: it was killed or crashed"
            return None
        if silent > SILENT_SECONDS:
            return f"(pid {seen['pid']} on {seen['host']}) fell silent for {silent:.0f} s"
        return None


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

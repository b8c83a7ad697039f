"""The teacher pass shared by the processes of a launch: shares joined into the one-process entry, and a
process that dies mid-pass named by the others, with nothing cached."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from kdplug.engine import cache as cache_module
from kdplug.engine.shares import Processes, ShareFailed, share

from .test_cache import SPECS, C, N, fake_teacher


def test_shares_cover_the_rows_once_at_batch_boundaries():
    for items, count, align in [(10, 2, 4), (1001, 3, 16), (5, 4, 8), (0, 2, 4), (64, 8, 8)]:
        ranges = [share(items, rank, count, align) for rank in range(count)]
        assert [row for part in ranges for row in part] == list(range(items))
        assert all(part.start % align == 0 for part in ranges if len(part))


class ThreadBroadcast:
    """Rank 0's value handed to every thread, as accelerate's broadcast hands it to every process;
    :meth:`gather`, every thread's value to every thread, as ``all_gather_object`` does."""

    def __init__(self, count: int) -> None:
        # a rank left waiting fails in 20 s (BrokenBarrierError) rather than hanging the test
        self.barrier, self.value, self.values = threading.Barrier(count, timeout=20), None, [None] * count

    def __call__(self, rank: int, value):
        if rank == 0:
            self.value = value
        self.barrier.wait()
        got = self.value
        self.barrier.wait()
        return got

    def gather(self, rank: int, value):
        self.values[rank] = value
        self.barrier.wait()
        got = list(self.values)
        self.barrier.wait()
        return got

    def processes(self, rank: int, count: int) -> Processes:
        return Processes(rank, count, lambda value: self(rank, value), lambda value: self.gather(rank, value))


def build_together(root, count: int, layers: bool = True, compute=None, expect_errors=False):
    broadcast, results, errors = ThreadBroadcast(count), {}, {}

    def rank_main(rank: int) -> None:
        try:
            results[rank] = cache_module.open_or_build(
                root,
                "k",
                layers_key="k-layers" if layers else None,
                num_examples=N,
                num_outputs=C,
                specs=SPECS,
                compute=compute or fake_teacher(batch=4),
                description={"split": "train"},
                processes=broadcast.processes(rank, count),
                align=4,
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if expect_errors:
        return errors
    assert not errors, errors
    return results


def test_shared_build_equals_the_one_process_build(tmp_path):
    alone = cache_module.open_or_build(
        tmp_path / "one",
        "k",
        layers_key="k-layers",
        num_examples=N,
        num_outputs=C,
        specs=SPECS,
        compute=fake_teacher(batch=4),
        description={"split": "train"},
    )
    together = build_together(tmp_path / "two", 2)
    four = build_together(tmp_path / "four", 4)  # 3 batches for 4 processes: rank 0's share is empty
    for kind in ("k", "k-layers"):
        data = "layers.f16" if kind.endswith("layers") else "logits.f32"
        one, two, many = (tmp_path / where / kind / data for where in ("one", "two", "four"))
        assert one.read_bytes() == two.read_bytes() == many.read_bytes()
    assert [r["examples"] for r in four[0].computed_by] == [0, 4, 4, 2]
    for rank, cache in together.items():
        assert np.array_equal(np.asarray(cache.layers), np.asarray(alone.layers)), rank
    # 10 examples in batches of 4: rank 0 computes the first batch, rank 1 the other two
    assert [(r["rank"], r["examples"]) for r in together[0].computed_by] == [(0, 4), (1, 6)]
    assert together[0].record()["computed_by"] == together[0].computed_by
    assert alone.computed_by[0]["examples"] == N
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if p.is_dir()) == ["k", "k-layers"]  # no shares


def test_shared_open_reuses_stored_entries_and_adds_layers(tmp_path):
    build_together(tmp_path, 2, layers=False)
    logits = (tmp_path / "k" / "logits.f32").stat().st_mtime_ns
    again = build_together(tmp_path, 2)  # now with layers: the logits entry is reused, not rewritten
    assert (tmp_path / "k" / "logits.f32").stat().st_mtime_ns == logits
    assert all(cache.has_layers for cache in again.values())
    assert again[0].logits_entry.built is False and again[0].layers_entry.built is True


RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch.distributed as dist

    from kdplug.engine import cache as cache_module
    from kdplug.engine.shares import Processes
    from tests.core.test_cache import C, N, SPECS, fake_teacher

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def broadcast(value):
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    try:
        cache_module.open_or_build(
            Path(sys.argv[1]), "k", layers_key="k-layers", num_examples=N, num_outputs=C, specs=SPECS,
            compute=fake_teacher(batch=2), description={"split": "train"},
            processes=Processes(rank, 2, broadcast), align=2,
        )
    except RuntimeError as exc:
        print(f"rank {rank}: {exc}", flush=True)
        sys.exit(1)
    """
)


def test_a_process_killed_mid_pass_is_named_and_nothing_is_cached(tmp_path, free_port):
    root = tmp_path / "cache"
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "KDPLUG_FAULT_AT": "teacher-share-rank1:2",  # rank 1 is SIGKILLed at its second batch
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(root)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    # reap rank 1 at once, as a launcher does; rank 0 must notice on its own
    assert ranks[1].wait(timeout=120) == -9
    out, _ = ranks[0].communicate(timeout=120)
    assert ranks[0].returncode == 1, out
    assert "rank 0: process rank 1 (pid" in out and "died: it was killed or crashed" in out, out
    assert "nothing of it was stored" in out and "kdplug cache clear --stale" in out, out
    assert {p.name for p in root.iterdir()} == {"k.lock", "k-layers.lock"}  # no entry, no share left behind

    rerun = build_together(root, 2)  # the next run builds it
    assert len(rerun[0]) == N and rerun[0].has_layers


@pytest.fixture
def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_failing_share_is_named_on_every_rank_and_a_failing_join_stops_the_others(tmp_path):
    """Each rank's status is gathered by every rank: rank 1's error reaches rank 0 (and rank 1 keeps
    its own); rank 0 failing as it joins the shares stops rank 1, which waited for the entry."""
    failing = fake_teacher(batch=4)

    def compute(with_layers, rows):
        if rows.start > 0:
            raise RuntimeError("the teacher broke")
        return failing(with_layers, rows)

    errors = build_together(tmp_path / "share", 2, compute=compute, expect_errors=True)
    assert isinstance(errors[0], ShareFailed) and errors[0].rank == 1, errors
    assert "process rank 1 failed (RuntimeError: the teacher broke) during the teacher pass over train" in str(
        errors[0]
    )
    assert str(errors[1]) == "the teacher broke"

    def broken_join(*args, **kwargs):
        raise OSError("join failed")

    original = cache_module._Plan._joined
    cache_module._Plan._joined = broken_join
    try:
        errors = build_together(tmp_path / "join", 2, expect_errors=True)
    finally:
        cache_module._Plan._joined = original
    assert isinstance(errors[1], ShareFailed) and errors[1].rank == 0, errors
    assert "process rank 0 stopped (its error is above) during the teacher pass over train" in str(errors[1])
    assert {p.name for p in (tmp_path / "join").iterdir()} == {"k.lock", "k-layers.lock"}  # no share folder left


def test_rank_0_failing_before_its_order_names_its_error_on_the_other_ranks(tmp_path):
    """Rank 0 refuses a symlinked lock (as it refuses any file it did not write) before it broadcasts
    its order: it keeps its own error, and the others are told it, not that it died."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / "k.lock").symlink_to(tmp_path / "elsewhere")
    errors = build_together(root, 2, expect_errors=True)
    assert type(errors[0]).__name__ == "UsageError" and "lock file" in str(errors[0]), errors
    assert isinstance(errors[1], ShareFailed) and errors[1].rank == 0, errors
    assert str(errors[1]).startswith("process rank 0 failed (UsageError: "), errors[1]
    assert "died" not in str(errors[1])


def test_meet_makes_the_steps_group_once_per_process_group(tmp_path):
    """A sweep meets once per point in one process: the gloo group (its sockets, its threads) is made
    once, and again only for a new default group (destroying the old one destroyed it)."""
    import torch.distributed as dist

    from kdplug.engine import shares

    def start(name: str) -> None:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / name}", rank=0, world_size=1)

    start("first")
    try:
        shares.meet(1)
        group = shares._steps_group
        shares.meet(1)
        assert shares._steps_group is group
        dist.destroy_process_group()
        start("second")
        shares.meet(1)
        assert shares._steps_group is not group
        assert shares._all_gather("x") == ["x"]
    finally:
        dist.destroy_process_group()
        shares._steps_group = shares._steps_world = None


LOCK_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kdplug.storage import file_lock

    with file_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_a_separate_run_holding_the_entrys_lock_and_killed_does_not_stop_the_next(tmp_path):
    """Two separate runs sharing a cache directory have no process group, no launcher between them:
    the file lock is what makes the second wait for the first. A holder SIGKILLed mid-build leaves no
    stale lock: the OS releases it, and the waiting run builds the entry."""
    import signal

    tmp_path.mkdir(exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "k.lock")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])},
    )
    assert holder.stdout.readline().strip() == "held"
    built = {}
    waiter = threading.Thread(
        target=lambda: built.update(
            cache=cache_module.open_or_build(
                tmp_path, "k", num_examples=N, num_outputs=C, specs=SPECS, compute=fake_teacher(batch=4),
                description={"split": "train"},
            )
        )
    )  # fmt: skip
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive() and not (tmp_path / "k").exists()  # waits for the other run
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and len(built["cache"]) == N and built["cache"].built


def test_a_process_lost_in_an_exchange_is_named_not_in_the_collective_librarys_words(monkeypatch):
    """gloo says only "Connection closed by peer" when a process of the launch dies while the others
    wait for it in a broadcast; the run names it from the ranks' pids learnt at its start."""
    import signal
    import socket

    from kdplug.engine import shares

    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(shares, "_roster", [(socket.gethostname(), os.getpid()), (socket.gethostname(), peer.pid)])

    def broadcast(value):
        if peer.poll() is None:
            os.kill(peer.pid, signal.SIGKILL)  # dies during the exchange
            peer.wait()
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")

    with pytest.raises(ShareFailed) as failed:
        shares.exchange(Processes(0, 2, broadcast), {"key": "k"}, "building the transfer set")
    message = str(failed.value)
    assert failed.value.rank == 1 and f"process rank 1 (pid {peer.pid} on" in message, message
    assert "died: it was killed or crashed during building the transfer set; nothing of it was stored" in message
    assert "Connection closed" not in message

    monkeypatch.setattr(shares, "_roster", [])  # not learnt (a launch that never met): said as it is
    with pytest.raises(ShareFailed, match="another process of the launch stopped .*Connection closed by peer"):
        shares.exchange(Processes(0, 2, broadcast), None, "building the transfer set")

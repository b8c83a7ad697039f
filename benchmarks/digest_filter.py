"""The transfer set's duplicate filter: the DigestSet kdplug had (a hash table in one flat array, fed one
digest at a time) against ``numpy.unique(..., return_index=True)`` over the digests the shares write,
which kdplug uses since issue 44 (measured: about 6x faster on 1M digests, the same peak memory).

N 64-bit digests (a fifth of them repeats, as augmented copies repeat) are filtered both ways to the
first occurrence of each; both must keep the same positions. Prints each one's seconds and peak
memory (tracemalloc; the kept positions included) and their ratios.

    python benchmarks/digest_filter.py [--digests 1000000]
    python benchmarks/digest_filter.py --quick      # a smoke run: 20,000 digests
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from array import array

import numpy as np

# -- the table kdplug used until issue 44 (kdplug/engine/digests.py), kept here as what is measured --

_EMPTY = 0  # a free slot; the digest 0 is stored as 1 (two of 2^64 values share a slot: harmless)


class DigestSet:
    """Digests (ints below 2**64, already uniformly spread: a hash's bytes) with open addressing
    and linear probing, kept at most half full; growing re-inserts every digest vectorised."""

    def __init__(self, capacity: int = 1024) -> None:
        size = 1 << max(4, (2 * capacity - 1).bit_length())
        self._slots, self._mask, self._count = array("Q", [_EMPTY]) * size, size - 1, 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, digest: int) -> bool:
        return self._slots[self._slot(digest or 1)] != _EMPTY

    def add(self, digest: int) -> bool:
        """Add ``digest``; whether it was new."""
        digest = digest or 1
        slot = self._slot(digest)
        if self._slots[slot] != _EMPTY:
            return False
        self._slots[slot] = digest
        self._count += 1
        if 2 * self._count > len(self._slots):
            self._grow()
        return True

    def _slot(self, digest: int) -> int:
        """Where ``digest`` is, else the free slot where it would go."""
        slots, mask = self._slots, self._mask
        slot = digest & mask
        while (held := slots[slot]) != _EMPTY and held != digest:
            slot = (slot + 1) & mask
        return slot

    def _grow(self) -> None:
        held = np.frombuffer(self._slots, dtype=np.uint64)
        digests, size = held[held != _EMPTY], 2 * len(self._slots)
        del held
        self._slots = array("Q")  # the old table is freed before the new one is made
        self._slots, self._mask = array("Q", [_EMPTY]) * size, size - 1
        table = np.frombuffer(self._slots, dtype=np.uint64)
        for start in range(0, len(digests), _BLOCK):
            _insert_new(table, digests[start : start + _BLOCK], self._mask)


_BLOCK = 1 << 16  # digests re-inserted at a time: the probing's own arrays stay small


def _insert_new(table: np.ndarray, digests: np.ndarray, mask: int) -> None:
    """Insert distinct ``digests`` none of which ``table`` holds, probing as :meth:`DigestSet.add`
    does, all at once: each round, every digest whose slot is free and first among those wanting
    it takes it; the others move to their next slot."""
    slots = (digests & np.uint64(mask)).astype(np.int64)
    pending = np.arange(len(digests))
    while pending.size:
        wanted = slots[pending]
        free = table[wanted] == _EMPTY
        _, first = np.unique(wanted[free], return_index=True)
        placed = pending[free][first]
        table[slots[placed]] = digests[placed]
        left = np.ones(len(digests), dtype=bool)
        left[placed] = False
        pending = pending[left[pending]]
        taken = table[slots[pending]] != _EMPTY
        slots[pending[taken]] = (slots[pending[taken]] + 1) & mask


# -- the measurement ---------------------------------------------------------------------------------


def digests(count: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    distinct = rng.integers(0, 2**63, size=count - count // 5, dtype=np.uint64)
    repeats = rng.choice(distinct, size=count // 5)
    mixed = np.concatenate([distinct, repeats])
    rng.shuffle(mixed)
    return mixed


CHUNK = 1 << 16  # as the join reads a share's digests: a chunk of Python ints at a time


def with_table(values: np.ndarray) -> np.ndarray:
    seen, kept = DigestSet(), array("q")
    for start in range(0, len(values), CHUNK):
        kept.extend(start + i for i, d in enumerate(values[start : start + CHUNK].tolist()) if seen.add(d))
    return np.frombuffer(kept, dtype=np.int64)


def with_numpy(values: np.ndarray) -> np.ndarray:
    return np.sort(np.unique(values, return_index=True)[1])


def measure(filter_, values: np.ndarray) -> tuple[np.ndarray, float, float]:
    """What ``filter_`` keeps, its seconds (best of 3), and its peak MiB (a run of its own: tracemalloc
    slows Python code more than numpy's)."""
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        kept = filter_(values)
        seconds.append(time.perf_counter() - started)
    tracemalloc.start()
    filter_(values)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return kept, min(seconds), peak


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--digests", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20,000 digests")
    args = parser.parse_args(argv)
    values = digests(20_000 if args.quick else args.digests)
    table, table_s, table_mib = measure(with_table, values)
    unique, numpy_s, numpy_mib = measure(with_numpy, values)
    print(f"{len(values):,} digests, {len(unique):,} distinct")
    print(f"DigestSet, one at a time:   {table_s:8.3f} s  peak {table_mib:7.1f} MiB")
    print(f"numpy.unique(return_index): {numpy_s:8.3f} s  peak {numpy_mib:7.1f} MiB")
    print(f"ratio DigestSet / numpy: {table_s / numpy_s:.1f}x the time, {table_mib / numpy_mib:.2f}x the memory")
    print(f"the same first occurrences: {np.array_equal(table, unique)}")
    return 0 if np.array_equal(table, unique) else 1


if __name__ == "__main__":
    sys.exit(main())

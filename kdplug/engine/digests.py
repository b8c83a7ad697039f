"""A set of 64-bit digests in one flat array: 16 to 32 bytes an entry, where a Python set of
them takes about 70. A transfer set of millions of texts drops its duplicates through it."""

from __future__ import annotations

from array import array

import numpy as np

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

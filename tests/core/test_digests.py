"""The transfer set's duplicate filter: a set of 64-bit digests in one flat array."""

from __future__ import annotations

import random
import tracemalloc

from kdplug.engine.digests import DigestSet


def test_it_answers_as_a_python_set_does_through_every_growth_and_probing_chain():
    """Random digests, digests that share their low bits (one long probing chain, contended when
    the table grows and re-inserts them at once), and 0: every add says whether the digest was
    new and every lookup agrees with Python's own set."""
    rng = random.Random(0)
    digests = [rng.getrandbits(64) for _ in range(30_000)]
    digests += [(i << 40) | 0x5A5A for i in range(1, 3_000)]  # equal low 40 bits: the same start slot
    digests += [0, 1 << 63, (1 << 64) - 1]
    digests += rng.sample(digests, 5_000)  # repeats
    rng.shuffle(digests)
    ours, reference = DigestSet(capacity=4), set()
    for digest in digests:
        assert ours.add(digest) == (digest not in reference)
        reference.add(digest)
    assert len(ours) == len(reference)
    assert all(digest in ours for digest in reference)
    others = [rng.getrandbits(64) for _ in range(20_000)] + [(i << 40) | 0x5A5A for i in range(3_000, 3_100)]
    assert [digest in ours for digest in others] == [digest in reference for digest in others]


def test_300k_digests_take_under_half_a_python_sets_memory():
    """16 to 32 bytes an entry (a table at most half full), where a Python set of the same 8-byte
    digests holds about 70."""
    rng = random.Random(1)
    digests = [rng.getrandbits(64) for _ in range(300_000)]
    tracemalloc.start()
    try:
        ours = DigestSet()
        for digest in digests:
            ours.add(digest)
        held, _ = tracemalloc.get_traced_memory()
        del ours
        reference = {digest.to_bytes(8, "big") for digest in digests}
        python_set, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del reference
    assert held <= 32 * len(digests) + 65_536
    assert held < python_set / 2, (held, python_set)

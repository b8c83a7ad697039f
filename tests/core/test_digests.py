"""The transfer set's duplicate filter: each text's first occurrence kept, found by ``numpy.unique``
over the digests of every part offered (the files' texts, the copies, each process's share)."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest

from kdplug.engine.augmenting import Checks, Writer, line


def test_the_first_occurrence_of_each_digest_is_kept_in_order_across_parts(tmp_path):
    """Random digests with repeats within and across parts, and 0 and 2**64 - 1: the writer keeps
    what a Python set fed one text at a time keeps, in the same order, with the same counts."""
    rng = random.Random(0)
    pool = [rng.getrandbits(64) for _ in range(3_000)] + [0, (1 << 64) - 1]
    parts = [[rng.choice(pool) for _ in range(size)] for size in (2_000, 0, 3_500)]
    handle = io.StringIO()
    writer = Writer(handle, tmp_path)
    for number, digests in enumerate(parts):
        path = tmp_path / f"share-{number}.jsonl"
        path.write_text("".join(line((f"text {d}", None)) for d in digests), encoding="utf-8")
        writer.offer_part(path, np.array(digests, dtype=np.uint64), "augmented", RuntimeError("incomplete"))
    writer.finish()
    seen, expected = set(), []
    for digest in (d for digests in parts for d in digests):
        if digest not in seen:
            seen.add(digest)
            expected.append(digest)
    assert [json.loads(text)[0] for text in handle.getvalue().splitlines()] == [f"text {d}" for d in expected]
    total = sum(map(len, parts))
    assert writer.counts["examples"] == writer.counts["augmented"] == len(expected)
    assert writer.counts["dropped_repeats"] == total - len(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["share-0.jsonl", "share-1.jsonl", "share-2.jsonl"]


def test_a_share_whose_lines_and_digests_disagree_raises_its_error(tmp_path):
    path = tmp_path / "share.jsonl"
    path.write_text(line(("a", None)) + line(("b", None)), encoding="utf-8")
    writer = Writer(io.StringIO(), tmp_path)
    writer.offer_part(path, np.array([1, 2, 3], dtype=np.uint64), "augmented", RuntimeError("rank 1 incomplete"))
    with pytest.raises(RuntimeError, match="rank 1 incomplete"):
        writer.finish()


def test_the_checks_drop_training_sentences_and_the_writer_its_own_candidates_file(tmp_path):
    from kdplug.types import Example

    checks = Checks([Example("The film", 1), Example("a plot", 0)], {"dev sentence"}, [])
    writer = Writer(io.StringIO(), tmp_path)
    texts = [("the  FILM", None), ("dev sentence", None), ("new one", None), ("New one", None), ("a plot", None)]
    writer.check_and_offer(checks, texts, "from_files")
    writer.finish()
    assert writer.handle.getvalue() == line(("new one", None))
    assert writer.counts["dropped_train_duplicates"] == 2 and writer.counts["dropped_dev_duplicates"] == 1
    assert writer.counts["dropped_repeats"] == 1 and writer.counts["from_files"] == 1
    assert list(tmp_path.iterdir()) == []  # its candidates file removed

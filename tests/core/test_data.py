"""Batching: padding to each batch's own length, length grouping, reproducible order."""

from __future__ import annotations

import random

import pytest
import torch

from kdplug.engine.data import Collator, LengthGroupedBatchSampler, padding_ratio


def sst2_like_lengths(n=4000, seed=0):
    """Short sentences with a long tail, like SST-2 (median ~10 tokens, max 64)."""
    rng = random.Random(seed)
    return [min(64, max(3, int(rng.lognormvariate(2.3, 0.6)))) for _ in range(n)]


def test_length_grouping_keeps_padding_low_on_sst2_like_lengths():
    lengths = sst2_like_lengths()
    grouped = LengthGroupedBatchSampler(lengths, 32, seed=1).batches()
    random_order = LengthGroupedBatchSampler(lengths, 32, seed=1, window_batches=1).batches()
    assert padding_ratio(lengths, grouped) <= 1.15
    assert padding_ratio(lengths, grouped) < padding_ratio(lengths, random_order)


def test_every_example_once_per_epoch_and_order_depends_on_seed_and_epoch():
    lengths = sst2_like_lengths(500)
    sampler = LengthGroupedBatchSampler(lengths, 16, seed=3)
    first = sampler.batches()
    assert sorted(i for batch in first for i in batch) == list(range(500))
    assert sampler.batches() == first
    sampler.set_epoch(1)
    assert sampler.batches() != first
    assert LengthGroupedBatchSampler(lengths, 16, seed=3, shuffle=False).batches()[0] == list(range(16))


def test_collator_pads_to_the_longest_in_the_batch():
    items = [{"index": 4, "input_ids": [5, 6, 7], "label": 1}, {"index": 9, "input_ids": [8], "label": 0}]
    batch = Collator(pad_id=0, is_regression=False)(items)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["index"].tolist() == [4, 9] and batch["labels"].dtype == torch.long


def test_a_split_is_tokenised_in_chunks_into_flat_int32_tables(monkeypatch, tiny_bert_dir):
    """The token ids of every example, exactly as the tokenizer gives them, whatever the chunking,
    held as flat arrays (4 bytes a token) rather than a list of Python ints per example."""
    import numpy as np
    from transformers import AutoTokenizer

    from kdplug.engine import data
    from kdplug.types import Example

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    rng = random.Random(0)
    words = ["good", "bad", "film", "plot", "the", "a", "dull", "moving"]
    examples = [
        Example(" ".join(rng.choices(words, k=rng.randint(1, 12))), i % 2, " ".join(rng.choices(words, k=3)))
        for i in range(23)
    ]
    expected = tokenizer([e.text_a for e in examples], [e.text_b for e in examples], truncation=True, max_length=9)
    monkeypatch.setattr(data, "ENCODE_CHUNK", 5)  # 23 examples: five chunks, the last one short
    split = data.encode(examples, tokenizer, 9, is_regression=False)
    assert split.input_ids.ids.dtype == np.int32 and split.token_type_ids.ids.dtype == np.int8
    assert [split[i]["input_ids"] for i in range(len(split))] == expected["input_ids"]
    assert [split[i]["token_type_ids"] for i in range(len(split))] == expected["token_type_ids"]
    assert list(split.lengths) == [len(ids) for ids in expected["input_ids"]]
    assert split.labels == [e.label for e in examples]
    with pytest.raises(IndexError):
        split.input_ids[23]


def test_a_split_whose_later_texts_are_longer_grows_its_table_and_holds_its_ids_once(monkeypatch, tiny_bert_dir):
    """The first chunk's short texts make the table's first estimate too small, so it grows; the
    ids come out exact, and at no point does encoding hold the split's ids twice: the traced peak
    stays under 1.8 times the finished arrays (a quarter of growth room, one chunk's lists), where
    joining one array per chunk at the end peaked at 2.4 times."""
    import tracemalloc

    from transformers import AutoTokenizer

    from kdplug.engine import data
    from kdplug.types import Example

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    rng = random.Random(1)
    words = ["good", "bad", "film", "plot", "the", "a", "dull", "moving"]
    examples = [Example("good", 1)] * 200 + [
        Example(" ".join(rng.choices(words, k=rng.randint(40, 60))), i % 2) for i in range(6000)
    ]
    monkeypatch.setattr(data, "ENCODE_CHUNK", 200)
    tracemalloc.start()
    try:
        split = data.encode(examples, tokenizer, 64, is_regression=False)
        finished = split.input_ids.ids.nbytes + split.token_type_ids.ids.nbytes + split.input_ids.offsets.nbytes
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = tokenizer([e.text_a for e in examples], truncation=True, max_length=64)["input_ids"]
    assert [split[i]["input_ids"] for i in (0, 199, 200, 3000, 6199)] == [
        expected[i] for i in (0, 199, 200, 3000, 6199)
    ]
    assert list(split.lengths) == [len(ids) for ids in expected]
    assert split.token_type_ids.ids.tolist() == [0] * len(split.input_ids.ids)
    assert finished > 1_000_000 and peak < 1.8 * finished, (peak, finished)

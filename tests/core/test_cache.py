"""The teacher cache: built once, reused, rebuilt when damaged, safe under concurrent builders."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import torch

from kdplug.engine import cache as cache_module
from kdplug.types import LayerSpec

SPECS = [LayerSpec(1, 4, "transformer"), LayerSpec(2, 3, "transformer")]
N, C = 10, 2


def fake_teacher(calls: list | None = None, batch: int = 4):
    """Deterministic 'teacher outputs' for N examples: row i holds the value i everywhere."""

    def compute():
        if calls is not None:
            calls.append(1)
        for start in range(0, N, batch):
            index = torch.arange(start, min(start + batch, N))
            rows = index.float()[:, None]
            yield index, rows.repeat(1, C), [rows.repeat(1, spec.width) * (spec.index + 1) for spec in SPECS]

    return compute


def build(root, calls=None, key="k"):
    return cache_module.open_or_build(
        root, key, num_examples=N, num_outputs=C, specs=SPECS, compute=fake_teacher(calls), description={"test": True}
    )


def test_build_then_fetch_by_index(tmp_path):
    cache = build(tmp_path)
    logits, layers = cache.fetch(torch.tensor([7, 2]))
    assert torch.equal(logits, torch.tensor([[7.0, 7.0], [2.0, 2.0]]))
    assert [layer.shape for layer in layers] == [(2, 4), (2, 3)]
    assert torch.equal(layers[1][0], torch.full((3,), 21.0))  # 7 * (index 2 + 1), stored in fp16
    assert cache.layers.dtype == np.float16
    assert [s.width for s in cache.specs] == [4, 3]


def test_second_open_reuses_without_computing(tmp_path):
    calls = []
    build(tmp_path, calls)
    build(tmp_path, calls)
    assert len(calls) == 1


def test_truncated_cache_is_detected_and_rebuilt(tmp_path):
    calls = []
    cache = build(tmp_path, calls)
    path = cache.directory / cache_module.LAYERS_FILE
    os.truncate(path, path.stat().st_size // 2)
    rebuilt = build(tmp_path, calls)
    assert len(calls) == 2
    assert torch.equal(rebuilt.fetch(torch.tensor([9]))[0], torch.tensor([[9.0, 9.0]]))


def test_corrupted_cache_fails_its_checksum_and_is_rebuilt(tmp_path):
    calls = []
    cache = build(tmp_path, calls)
    path = cache.directory / cache_module.LOGITS_FILE
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    path.write_bytes(bytes(data))
    rebuilt = build(tmp_path, calls)
    assert len(calls) == 2
    assert torch.equal(rebuilt.fetch(torch.tensor([0]))[0], torch.zeros(1, C))


def test_incomplete_build_leaves_no_cache(tmp_path):
    def failing():
        yield torch.arange(2), torch.zeros(2, C), [torch.zeros(2, s.width) for s in SPECS]
        raise RuntimeError("killed mid-build")

    try:
        cache_module.open_or_build(
            tmp_path, "k", num_examples=N, num_outputs=C, specs=SPECS, compute=failing, description={}
        )
    except RuntimeError:
        pass
    assert not (tmp_path / "k").exists()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # no staging directory left behind


def _build_in_process(root, queue):
    calls = []
    cache = build(root, calls)
    queue.put((len(calls), cache.fetch(torch.tensor([3]))[0].tolist()))


def test_concurrent_builders_compute_once(tmp_path):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=_build_in_process, args=(tmp_path, queue)) for _ in range(2)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(calls for calls, _ in results) == [0, 1]  # one built it, the other waited and read it
    assert all(values == [[3.0, 3.0]] for _, values in results)


def test_cache_key_changes_with_teacher_tokenizer_data_layers_and_precision():
    from kdplug.engine.data import EncodedSplit
    from kdplug.engine.teacher import cache_key

    def split(ids):
        return EncodedSplit(input_ids=ids, token_type_ids=None, labels=[0] * len(ids), is_regression=False, pad_id=0)

    base = dict(
        teacher_fingerprint="t", tokenizer_fingerprint="k", split=split([[1, 2], [3]]), specs=SPECS, precision="auto"
    )
    key = cache_key(**base)
    assert cache_key(**base) == key
    for change in (
        {"teacher_fingerprint": "t2"},
        {"tokenizer_fingerprint": "k2"},
        {"split": split([[1, 2], [4]])},
        {"specs": SPECS[:1]},
        {"precision": "fp32"},
    ):
        assert cache_key(**{**base, **change}) != key, change

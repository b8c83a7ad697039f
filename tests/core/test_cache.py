"""The teacher cache: built once, reused, rebuilt when damaged, safe under concurrent builders."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import numpy as np
import torch

from kdplug.engine import cache as cache_module
from kdplug.testing import tiny_run_args
from kdplug.types import LayerSpec

SPECS = [LayerSpec(1, 4, "transformer"), LayerSpec(2, 3, "transformer")]
N, C = 10, 2


def fake_teacher(calls: list | None = None, batch: int = 4):
    """Deterministic 'teacher outputs' for N examples: row i holds the value i everywhere. ``calls``
    records each pass, and whether it computed the layers."""

    def compute(with_layers: bool, rows: range):
        if calls is not None:
            calls.append(with_layers)
        for start in range(rows.start, rows.stop, batch):
            index = torch.arange(start, min(start + batch, rows.stop))
            value = index.float()[:, None]
            layers = [value.repeat(1, spec.width) * (spec.index + 1) for spec in SPECS] if with_layers else []
            yield index, value.repeat(1, C), layers

    return compute


def build(root, calls=None, key="k", layers=True):
    return cache_module.open_or_build(
        root,
        key,
        layers_key=f"{key}-layers" if layers else None,
        num_examples=N,
        num_outputs=C,
        specs=SPECS,
        compute=fake_teacher(calls),
        description={"test": True},
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
    assert calls == [True]


def test_logits_only_stores_no_layers_and_layers_come_later_beside_them(tmp_path):
    calls = []
    cache = build(tmp_path, calls, layers=False)
    assert calls == [False] and cache.layers is None and cache.fetch(torch.tensor([3]))[1] == []
    assert not list(tmp_path.rglob(cache_module.LAYERS_FILE))
    logits_file = tmp_path / "k" / cache_module.LOGITS_FILE
    before = logits_file.stat()
    both = build(tmp_path, calls)
    assert calls == [False, True]  # one more pass, for the layers
    after = logits_file.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # the logits were not written again
    assert both.logits_entry.built is False and both.layers_entry.built is True
    assert both.layers_entry.meta.logits == "k" and both.fingerprint == "k-layers"
    assert not list((tmp_path / "k-layers").glob(cache_module.LOGITS_FILE))  # no second copy of the logits
    assert torch.equal(both.fetch(torch.tensor([7]))[1][1], torch.full((1, 3), 21.0))


def test_truncated_cache_is_detected_and_rebuilt(tmp_path):
    calls = []
    cache = build(tmp_path, calls)
    path = cache.layers_entry.directory / cache_module.LAYERS_FILE
    os.truncate(path, path.stat().st_size // 2)
    rebuilt = build(tmp_path, calls)
    assert calls == [True, True]
    assert rebuilt.logits_entry.built is False and rebuilt.layers_entry.built is True  # only what was damaged
    assert torch.equal(rebuilt.fetch(torch.tensor([9]))[0], torch.tensor([[9.0, 9.0]]))


def test_corrupted_cache_fails_its_checksum_and_is_rebuilt(tmp_path):
    calls = []
    cache = build(tmp_path, calls)
    path = cache.logits_entry.directory / cache_module.LOGITS_FILE
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    path.write_bytes(bytes(data))
    rebuilt = build(tmp_path, calls)
    assert calls == [True, False]  # the logits again; the layers were intact
    assert torch.equal(rebuilt.fetch(torch.tensor([0]))[0], torch.zeros(1, C))


def test_an_entry_of_the_old_format_is_not_read(tmp_path):
    calls = []
    build(tmp_path, calls, layers=False)
    meta_path = tmp_path / "k" / cache_module.META_FILE
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "version": 1}))
    assert not cache_module.is_cached(tmp_path, "k")
    from kdplug.commands.cache import _cache_info

    assert "format 1, no longer read ('kdplug cache clear --key k' frees it)" in _cache_info(tmp_path / "k")
    build(tmp_path, calls, layers=False)
    assert calls == [False, False]


def test_incomplete_build_leaves_no_cache(tmp_path):
    def failing(with_layers, rows):
        yield torch.arange(2), torch.zeros(2, C), [torch.zeros(2, s.width) for s in SPECS]
        raise RuntimeError("killed mid-build")

    try:
        cache_module.open_or_build(
            tmp_path,
            "k",
            layers_key="k-layers",
            num_examples=N,
            num_outputs=C,
            specs=SPECS,
            compute=failing,
            description={},
        )
    except RuntimeError:
        pass
    assert not (tmp_path / "k").exists() and not (tmp_path / "k-layers").exists()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []  # no staging directory left behind


def _build_in_process(root, queue):
    calls = []
    cache = build(root, calls)
    queue.put((calls, cache.fetch(torch.tensor([3]))[0].tolist()))


def test_concurrent_builders_compute_once(tmp_path):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [context.Process(target=_build_in_process, args=(tmp_path, queue)) for _ in range(2)]
    for worker in workers:
        worker.start()
    results = [queue.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(len(calls) for calls, _ in results) == [0, 1]  # one built it, the other waited and read it
    assert all(values == [[3.0, 3.0]] for _, values in results)


def test_logits_key_changes_with_teacher_tokenizer_data_and_precision_and_not_with_layers():
    from kdplug.engine.data import EncodedSplit
    from kdplug.engine.teacher import layers_key, logits_key

    def split(ids):
        return EncodedSplit(input_ids=ids, token_type_ids=None, labels=[0] * len(ids), is_regression=False, pad_id=0)

    base = dict(teacher_fingerprint="t", tokenizer_fingerprint="k", split=split([[1, 2], [3]]), precision="auto")
    key = logits_key(**base)
    assert logits_key(**base) == key
    for change in (
        {"teacher_fingerprint": "t2"},
        {"tokenizer_fingerprint": "k2"},
        {"split": split([[1, 2], [4]])},
        {"precision": "fp32"},
    ):
        assert logits_key(**{**base, **change}) != key, change
    layers = layers_key(key, SPECS)
    assert layers not in (
        key,
        layers_key(key, SPECS[:1]),
        layers_key(logits_key(**{**base, "precision": "fp32"}), SPECS),
    )


# -- real runs on a tiny teacher: what each method's cache holds -----------------------------------


def tiny_argv(teacher, data, output, projector, *extra):
    tiny = tiny_run_args(teacher=teacher, task="sst2", data_dir=data, projector=projector, measure_speed=False)
    return ["run", *tiny, *extra, "--output", output]


def kdplug(capsys, *argv):
    from kdplug.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def teacher_cache() -> Path:
    return Path(os.environ["KDPLUG_CACHE"]) / "teacher-cache"


def entries(kind: str) -> dict[str, dict]:
    """The complete entries of one kind (``logits`` or ``layers``): key -> meta.json."""
    metas = {p.parent.name: json.loads(p.read_text()) for p in teacher_cache().glob("*/meta.json")}
    return {key: meta for key, meta in metas.items() if meta["kind"] == kind}


def data_bytes() -> int:
    """The bytes of the cache's data files (its meta.json files aside)."""
    return sum(p.stat().st_size for name in ("logits.f32", "layers.f16") for p in teacher_cache().glob(f"*/{name}"))


def test_an_rkd_run_caches_no_layer_vectors_and_an_alp_run_adds_them_beside_its_logits(
    capsys, tmp_path, tiny_bert_dir, sst2_dir
):
    code, out, err = kdplug(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "rkd", "rkd"))
    assert code == 0, err
    assert not list(teacher_cache().rglob("layers.f16"))  # no layer vector anywhere in the cache
    logits = {key: (teacher_cache() / key / "logits.f32").stat() for key in entries("logits")}
    assert len(logits) == 2 and not entries("layers")  # train and dev, logits only
    recorded = json.loads((tmp_path / "rkd" / "metrics.json").read_text())["teacher"]["cache"]
    assert set(recorded) == {"train", "dev"} and all(split["layers"] is None for split in recorded.values())
    assert " 0 bytes of layer vectors (train: built; dev: built)" in out

    code, out, err = kdplug(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "alp", "alp"))
    assert code == 0, err
    for key, before in logits.items():  # the stored logits were reused, not written again
        after = (teacher_cache() / key / "logits.f32").stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert set(entries("logits")) == set(logits)  # and no second copy of them
    layers = entries("layers")
    assert len(layers) == 2 and {meta["logits"] for meta in layers.values()} == set(logits)
    assert not any((teacher_cache() / key / "logits.f32").exists() for key in layers)
    recorded = json.loads((tmp_path / "alp" / "metrics.json").read_text())["teacher"]["cache"]
    assert all(split["logits"]["reused"] and not split["layers"]["reused"] for split in recorded.values())
    assert "(train: logits reused, layers built; dev: logits reused, layers built)" in out
    assert "(logits, reused)" in (tmp_path / "alp" / "log.txt").read_text()


def test_a_killed_build_leaves_no_entry_and_the_next_run_builds_it(tmp_path, tiny_bert_dir, sst2_dir):
    import subprocess
    import sys

    def run(output, **env):
        argv = [sys.executable, "-m", "kdplug.cli", *map(str, tiny_argv(tiny_bert_dir, sst2_dir, output, "alp"))]
        return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)

    killed = run(tmp_path / "killed", KDPLUG_FAULT_AT="cache-write:1:SIGKILL")  # its first pass: dev
    assert killed.returncode == -9, killed.stderr
    assert not entries("logits") and not entries("layers")
    assert not [p for p in teacher_cache().iterdir() if p.is_dir() and not p.name.startswith(".staging-")]
    again = run(tmp_path / "again")
    assert again.returncode == 0, again.stderr
    assert len(entries("logits")) == 2 and len(entries("layers")) == 2
    assert "(train: built; dev: built)" in again.stdout


def test_the_dry_run_says_the_bytes_a_build_writes(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    import re

    def estimate(projector):
        code, out, err = kdplug(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "plan", projector), "--dry-run")
        assert code == 0, err
        return int(re.search(r"cache size: ([\d,]+) bytes", out).group(1).replace(",", ""))

    for projector in ("rkd", "alp"):  # logits only, then logits and every matchable layer
        estimated = estimate(projector)
        code, _, err = kdplug(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / projector, projector))
        assert code == 0, err
        assert estimated == data_bytes(), projector
    assert estimate("alp") == data_bytes()  # reused or not: the size of what the run reads


def test_the_checksums_written_as_the_pass_goes_are_the_stored_files_hashes(tmp_path):
    """In order (every pass), the checksum is hashed while the rows are written; out of order, the
    complete file is hashed. Either way it is the hash of the bytes on disk, which reading checks."""
    from kdplug import fingerprint

    def shuffled(with_layers: bool, rows: range):
        batches = list(fake_teacher()(with_layers, rows))
        yield from batches[::-1]

    in_order = build(tmp_path / "in-order")
    out_of_order = cache_module.open_or_build(
        tmp_path / "out-of-order",
        "k",
        layers_key="k-layers",
        num_examples=N,
        num_outputs=C,
        specs=SPECS,
        compute=shuffled,
        description={"test": True},
    )
    for cache in (in_order, out_of_order):
        for entry in (cache.logits_entry, cache.layers_entry):
            ((name, checksum),) = entry.meta.checksums.items()
            assert checksum == fingerprint.of_file(str(entry.directory / name))
    assert np.array_equal(np.asarray(in_order.layers), np.asarray(out_of_order.layers))
    assert np.array_equal(np.asarray(in_order.logits), np.asarray(out_of_order.logits))

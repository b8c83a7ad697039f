"""Two processes (torchrun, gloo on CPU) give the one-process result, whatever the training set's size;
the teacher cache is built once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from safetensors.torch import load_file

from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

# Dropout off everywhere: with it, each rank draws its own masks and the runs differ by chance.
OPTIONS = tiny_run_args(
    task="sst2",
    projector="pkd-skip",
    epochs=2,
    student_options={"embedding_dim": 16, "hidden_size": 16, "dropout": 0.0},
    batch_size=8,
    teacher_batch_size=8,
    teacher_options={"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
)
#: float sums are reduced in another order across two processes (each share's loss and gradient are
#: summed apart, then averaged), nothing else may differ: measured 5.5e-7 on the weights after 2 epochs
#: of 3 steps; a dropped or repeated partial batch of 5 examples moved them by 3.7e-4
TOLERANCE = 1e-5


def run(launcher, tiny_bert_dir, data, output, cache, fault=None):
    env = {**os.environ, "KDPLUG_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    if fault:
        env["KDPLUG_FAULT_AT"] = fault
    argv = [
        *launcher,
        "-m",
        "kdplug.cli",
        "run",
        "--teacher",
        tiny_bert_dir,
        "--data-dir",
        str(data),
        *OPTIONS,
        "--output",
        str(output),
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if fault:
        assert done.returncode != 0, done.stdout + done.stderr
        return None, done.stdout + done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((output / "metrics.json").read_text()), done.stdout + done.stderr


def cache_entries(cache):
    """Each teacher-cache entry's data, by split and kind (the keys differ: each run fine-tuned its
    own teacher, the two within float rounding of each other)."""
    entries = {}
    for meta_file in (cache / "teacher-cache").glob("*/meta.json"):
        meta = json.loads(meta_file.read_text())
        dtype = np.float16 if meta["kind"] == "layers" else np.float32
        data = meta_file.parent / ("layers.f16" if meta["kind"] == "layers" else "logits.f32")
        entries[meta["description"]["split"], meta["kind"]] = np.fromfile(data, dtype=dtype)
    return entries


def test_two_processes_match_one(tmp_path, tiny_bert_dir):
    # 45 examples, batches of 8: the one partial batch (5 examples) is trained on once an epoch, as in
    # one process, though 5 do not split evenly (3 + 2, each share's loss weighted by its part)
    data = write_sst2(tmp_path / "SST-2", train=(SST2_TRAIN * 4)[:45], dev=SST2_DEV * 2)
    single, _ = run([sys.executable], tiny_bert_dir, data, tmp_path / "one", tmp_path / "cache-one")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    # rank 1 killed in its share of the teacher pass: the run fails and caches nothing of the pass
    _, killed = run(torchrun, tiny_bert_dir, data, tmp_path / "killed", tmp_path / "cache-two", "teacher-share-rank1")
    assert cache_entries(tmp_path / "cache-two") == {}, killed
    double, log = run(torchrun, tiny_bert_dir, data, tmp_path / "two", tmp_path / "cache-two")

    assert (single["processes"], double["processes"]) == (1, 2)
    assert log.count("building the teacher cache") == 2  # train and dev, once each, shared by both ranks
    assert log.count("distill epoch 2/2") == 1  # the main process tells the run, not every rank
    # each process computed its share of the train split (45 examples: batches of 16, 16 and 13) ...
    shares = [(r["rank"], r["examples"]) for r in double["teacher"]["cache"]["train"]["computed_by"]]
    assert shares == [(0, 16), (1, 29)], shares
    assert "teacher pass over train: 2 processes computed 16 + 29 examples" in log
    # ... and the joined cache is the one-process cache
    one, two = cache_entries(tmp_path / "cache-one"), cache_entries(tmp_path / "cache-two")
    assert sorted(one) == sorted(two) and len(one) == 4  # logits and layers of train and dev
    for key, values in one.items():
        np.testing.assert_allclose(two[key], values, atol=1e-4 if values.dtype == np.float32 else 2e-3)
    assert double["teacher"]["dev"] == single["teacher"]["dev"]
    assert double["student"]["dev"] == single["student"]["dev"]
    for one, two in zip(single["stages"]["distill"]["history"], double["stages"]["distill"]["history"]):
        assert abs(one["train"]["loss"] - two["train"]["loss"]) < TOLERANCE
    weights_one = load_file(str(tmp_path / "one" / "student" / "model.safetensors"))
    weights_two = load_file(str(tmp_path / "two" / "student" / "model.safetensors"))
    largest = max(float((weights_two[name] - tensor).abs().max()) for name, tensor in weights_one.items())
    print(f"largest difference of the student's weights, 2 processes vs 1: {largest:.2e}")
    assert largest <= TOLERANCE

"""Two processes (torchrun, gloo on CPU) give the one-process result; the teacher cache is built once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
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
#: float sums are reduced in another order across two processes; nothing else may differ
TOLERANCE = 1e-5


def run(launcher, tiny_bert_dir, data, output, cache):
    env = {**os.environ, "KDPLUG_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
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
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((output / "metrics.json").read_text()), done.stdout + done.stderr


def test_two_processes_match_one(tmp_path, tiny_bert_dir):
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN * 4, dev=SST2_DEV * 2)
    single, _ = run([sys.executable], tiny_bert_dir, data, tmp_path / "one", tmp_path / "cache-one")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    double, log = run(torchrun, tiny_bert_dir, data, tmp_path / "two", tmp_path / "cache-two")

    assert (single["processes"], double["processes"]) == (1, 2)
    assert log.count("building the teacher cache") == 2  # train and dev, once each, shared by both ranks
    assert double["teacher"]["dev"] == single["teacher"]["dev"]
    assert double["student"]["dev"] == single["student"]["dev"]
    for one, two in zip(single["stages"]["distill"]["history"], double["stages"]["distill"]["history"]):
        assert abs(one["train"]["loss"] - two["train"]["loss"]) < TOLERANCE
    weights_one = load_file(str(tmp_path / "one" / "student" / "model.safetensors"))
    weights_two = load_file(str(tmp_path / "two" / "student" / "model.safetensors"))
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, atol=TOLERANCE, rtol=0)

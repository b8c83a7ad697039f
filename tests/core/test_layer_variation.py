"""A layer method warns when the teacher layers it matches barely vary across examples.

The shares are checked against a direct float64 computation on a real cache; the warning end to end
with two real teachers: the tiny random BERT, whose [CLS] vector is its own embedding's at every
layer (BERT's initializer range 0.02 leaves attention too weak to move it: shares 4e-6 to 2e-5, as
pre-trained MiniLM's layers 1-5), and the same BERT fine-tuned until it learns the task (shares
2e-2 and up).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from kdplug.cli import main
from kdplug.engine import variation
from kdplug.engine.cache import open_or_build
from kdplug.testing import tiny_run_args
from kdplug.types import LayerSpec

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2


def direct_share(vectors: np.ndarray) -> float:
    vectors = vectors.astype(np.float64)
    return float(((vectors - vectors.mean(axis=0)) ** 2).sum() / (vectors**2).sum())


def test_shares_match_a_direct_computation_on_a_real_cache(tmp_path):
    rng = np.random.default_rng(0)
    examples = 5000
    # layer 1: one vector plus a little noise (a [CLS] that ignores the input); layer 2: vectors that vary
    flat = 3.0 + 1e-2 * rng.standard_normal((examples, 8))
    varied = rng.standard_normal((examples, 6)) + 0.5
    specs = [LayerSpec(index=1, width=8), LayerSpec(index=2, width=6)]

    def batches(with_layers, rows):
        for start in range(0, examples, 1000):
            rows = torch.arange(start, min(start + 1000, examples))
            yield rows, torch.zeros(len(rows), 2), [torch.from_numpy(flat[rows]), torch.from_numpy(varied[rows])]

    cache = open_or_build(
        tmp_path,
        "k",
        layers_key="k-layers",
        num_examples=examples,
        num_outputs=2,
        specs=specs,
        compute=batches,
        description={},
    )
    stored = np.asarray(cache.layers, dtype=np.float64)  # the fp16 values the shares are computed from
    expected = {1: direct_share(stored[:, :8]), 2: direct_share(stored[:, 8:])}
    chunked = variation.input_dependent_shares(cache, chunk_rows=300)  # many chunks, merged
    assert chunked == pytest.approx(expected, rel=1e-9)
    assert expected[1] < variation.NEAR_CONSTANT < expected[2]
    # past MAX_ROWS, evenly spaced rows stand for the split
    sampled = {1: direct_share(stored[::5, :8]), 2: direct_share(stored[::5, 8:])}
    assert variation.input_dependent_shares(cache, max_rows=1000, chunk_rows=300) == pytest.approx(sampled, rel=1e-9)


def layer_run(tmp_path, teacher, data, *extra):
    argv = [
        "run",
        *tiny_run_args(teacher=teacher, task="sst2", data_dir=str(data), projector="pkd-skip", teacher_epochs=None),
        *extra,
        "--output",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 0
    return json.loads((tmp_path / "run" / "metrics.json").read_text())


def flat_layer_warnings(metrics: dict, stage: str) -> list[str]:
    return [w for w in metrics["stages"][stage].get("warnings", []) if "barely vary" in w]


def test_a_teacher_whose_layers_barely_vary_is_reported(caplog, tmp_path, tiny_bert_dir, sst2_dir):
    with caplog.at_level(logging.WARNING, logger="kdplug"):
        metrics = layer_run(
            tmp_path, tiny_bert_dir, sst2_dir, "--set", "teacher_epochs=1", "--baseline", "universal-il"
        )
    shares = metrics["teacher"]["layer_variation"]
    assert set(shares) == {"1", "2", "3", "4"} and max(shares.values()) < variation.NEAR_CONSTANT
    (warning,) = flat_layer_warnings(metrics, "distill")  # pkd-skip, 4 -> 2 layers: teacher layers 2 and 3
    assert f"layers 2 ({shares['2']:.1e}), 3 ({shares['3']:.1e})" in warning and "--projector rkd" in warning
    # Universal-KD's pseudo classifiers read every teacher layer
    (universal,) = flat_layer_warnings(metrics, "baseline-universal-il-stage1")
    assert "layers 1 (" in universal and ", 4 (" in universal
    assert warning in caplog.messages  # said when the stage starts, not only in metrics.json


def test_a_teacher_whose_layers_vary_is_not_reported(caplog, tmp_path, tiny_bert_dir):
    # fine-tuned until it learns (75% on dev): its [CLS] vectors now depend on the input
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN * 4, dev=SST2_DEV * 2)
    learns = ["--set", "teacher_epochs=15", "--set", "teacher_lr=0.003", "--set", "batch_size=4"]
    with caplog.at_level(logging.WARNING, logger="kdplug"):
        metrics = layer_run(tmp_path, tiny_bert_dir, data, *learns)
    assert metrics["teacher"]["dev"]["dev"]["accuracy"] > 0.5
    shares = metrics["teacher"]["layer_variation"]
    assert min(shares.values()) > variation.NEAR_CONSTANT
    assert not flat_layer_warnings(metrics, "distill")
    assert not [m for m in caplog.messages if "barely vary" in m]

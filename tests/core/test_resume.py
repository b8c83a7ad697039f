"""Nothing lost: a run killed at any point and resumed ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN, interrupted_run, write_sst2


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert_dir):
    data = write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 4, dev=SST2_DEV * 2)
    argv = [
        "run",
        *tiny_run_args(
            teacher=tiny_bert_dir,
            task="sst2",
            data_dir=str(data),
            projector="pkd-skip",
            epochs=3,
            teacher_epochs=2,
            batch_size=4,
            checkpoint_every=5,
            teacher_batch_size=8,
        ),
    ]
    return argv


def finished(run_dir):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    weights = load_file(str(run_dir / "student" / "model.safetensors"))
    return metrics, weights


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    with pytest.MonkeyPatch.context() as patch:  # restores the test's own cache setting afterwards
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("reference-cache")))
        assert main(setup + ["--output", str(run_dir)]) == 0
    return finished(run_dir)


@pytest.mark.parametrize(
    "stage, epoch, step, signame",
    [
        ("distill", 2, 8, "SIGKILL"),  # mid-epoch, 3 steps after the last checkpoint
        ("teacher", 2, 3, "SIGKILL"),  # during teacher fine-tuning, before the teacher is stored
        ("distill", 1, 6, "SIGTERM"),  # a polite stop: checkpoint, then a clean exit
    ],
)
def test_killed_run_resumes_to_the_same_result(setup, reference, tmp_path, monkeypatch, stage, epoch, step, signame):
    run_dir = tmp_path / "run"
    killed = interrupted_run(setup, run_dir, KDPLUG_SIGNAL_AT=f"{stage}:{epoch}:{step}:{signame}")
    signum = getattr(signal, signame)
    if signum == signal.SIGKILL:
        assert killed.returncode == -signum, killed.stderr
    else:
        assert killed.returncode == 128 + signum, killed.stderr
        assert "checkpoint written" in killed.stderr and f"kdplug run --resume {run_dir}" in killed.stderr
    assert not (run_dir / "metrics.json").exists()
    assert (run_dir / "checkpoints" / stage / "state.json").is_file()

    assert main(["run", "--resume", str(run_dir)]) == 0
    metrics, weights = finished(run_dir)
    expected_metrics, expected_weights = reference
    assert metrics["student"]["dev"] == expected_metrics["student"]["dev"]
    assert metrics["teacher"]["dev"] == expected_metrics["teacher"]["dev"]
    history = [h["train"]["loss"] for h in metrics["stages"]["distill"]["history"]]
    expected_history = [h["train"]["loss"] for h in expected_metrics["stages"]["distill"]["history"]]
    assert history == pytest.approx(expected_history, abs=1e-6)
    assert weights.keys() == expected_weights.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-6, rtol=0)
    assert not (run_dir / "checkpoints").exists()  # removed once the run completed


def test_a_kill_between_the_checkpoint_renames_resumes_from_the_previous_checkpoint(setup, reference, tmp_path):
    # checkpoint swaps: three in the teacher's stage, the 4th replaces distill's step-5 checkpoint
    run_dir = tmp_path / "run"
    killed = interrupted_run(setup, run_dir, KDPLUG_FAULT_AT="checkpoint-swap:4:SIGKILL")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    checkpoints = run_dir / "checkpoints"
    assert not (checkpoints / "distill").exists() and (checkpoints / "distill.previous" / "state.json").is_file()

    assert main(["run", "--resume", str(run_dir)]) == 0
    metrics, weights = finished(run_dir)
    expected_metrics, expected_weights = reference
    assert metrics["student"]["dev"] == expected_metrics["student"]["dev"]
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-6, rtol=0)
    # the resumed run reused the stored teacher and still records how it was fine-tuned
    finetuned = metrics["teacher"]["finetuned"]
    assert "reused" in finetuned and len(finetuned["history"]) == 2 and finetuned["best_epoch"] in (1, 2)


def test_resume_of_a_completed_run_is_a_usage_error(setup, tmp_path, capsys):
    run_dir = tmp_path / "done"
    (run_dir).mkdir()
    (run_dir / "config.yaml").write_text("task: sst2\n")
    (run_dir / "metrics.json").write_text("{}")
    assert main(["run", "--resume", str(run_dir)]) == 2
    assert "already completed" in capsys.readouterr().err


def test_resume_of_a_directory_without_a_run_is_a_usage_error(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "no run to resume" in capsys.readouterr().err


#: a student that learns (lr 3e-3) and then stops improving: patience 2 ends its 10-epoch budget early
EARLY_STOPPING = ["--epochs", "10", "--set", "patience=2", "--set", "lr=0.003"]


@pytest.fixture(scope="module")
def stopped_early(setup, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stopped-early") / "run"
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: before the tests' own isolation applies
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("stopped-early-cache")))
        assert main([*setup, *EARLY_STOPPING, "--output", str(run_dir)]) == 0
    metrics, weights = finished(run_dir)
    stage = metrics["stages"]["distill"]
    stopped = stage["stopped_early"]
    assert stopped < 10 and len(stage["history"]) == stopped and stopped - stage["best_epoch"] == 2
    return metrics, weights


def test_early_stopping_waits_for_min_epochs(setup, stopped_early, tmp_path):
    stopped = stopped_early[0]["stages"]["distill"]["stopped_early"]
    wait = min(stopped + 2, 10)
    argv = [*setup, *EARLY_STOPPING, "--set", f"min_epochs={wait}", "--output", str(tmp_path / "run")]
    assert main(argv) == 0
    stage = json.loads((tmp_path / "run" / "metrics.json").read_text())["stages"]["distill"]
    assert len(stage["history"]) >= wait and stage["min_epochs"] == wait
    assert stage["stopped_early"] is None or stage["stopped_early"] >= wait
    # the same seed, so the epochs both ran are the same epochs
    earlier = stopped_early[0]["stages"]["distill"]["history"]
    assert [h["dev"] for h in stage["history"][:stopped]] == [h["dev"] for h in earlier]


def test_early_stopping_resumes_exactly_after_a_kill(setup, stopped_early, tmp_path):
    argv = [*setup, *EARLY_STOPPING]
    expected_metrics, expected_weights = stopped_early
    stage = expected_metrics["stages"]["distill"]
    stopped = stage["stopped_early"]

    run_dir = tmp_path / "run"
    # in the epoch before the stop
    killed = interrupted_run(argv, run_dir, KDPLUG_SIGNAL_AT=f"distill:{stopped - 1}:8:SIGKILL")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert main(["run", "--resume", str(run_dir)]) == 0
    metrics, weights = finished(run_dir)
    assert metrics["stages"]["distill"]["stopped_early"] == stopped
    resumed = metrics["stages"]["distill"]["history"]
    assert [h["dev"] for h in resumed] == [h["dev"] for h in stage["history"]]
    assert [h["train"]["loss"] for h in resumed] == pytest.approx(
        [h["train"]["loss"] for h in stage["history"]], abs=1e-6
    )
    assert metrics["student"]["dev"] == expected_metrics["student"]["dev"]
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-6, rtol=0)


def test_a_vocabulary_corpus_edited_between_a_kill_and_resume_is_a_difference_of_the_training_settings(tmp_path):
    from kdplug.config import build_config
    from kdplug.engine.checkpoint import settings_difference, training_settings

    corpus = tmp_path / "served.txt"
    corpus.write_text("a film i would watch again\n")
    config = build_config(overrides=["trim_vocab=true", f"trim_vocab_corpus={corpus}"])
    written = training_settings(config)
    assert settings_difference(written, training_settings(config)) == ""
    corpus.write_text("a film i would watch again\nand a new line\n")  # edited while the run was stopped
    difference = settings_difference(written, training_settings(config))
    assert difference.startswith("content of trim_vocab_corpus sha256 "), difference

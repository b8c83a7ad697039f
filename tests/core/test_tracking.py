"""Experiment tracking (``--report-to``): what a run logs is read back from each tracker's own
files, with the tracker's own reader, after a real (tiny) run."""

from __future__ import annotations

import json
import os

import pytest

from kdplug.cli import main
from kdplug.engine.tracking import parse_report_to
from kdplug.errors import ConfigError
from kdplug.testing import tiny_run_args


def tiny_run(capsys, tmp_path, teacher, data, report_to, *extra):
    run = tmp_path / "run"
    code = main(
        [
            "run",
            *tiny_run_args(teacher=teacher, task="sst2", data_dir=str(data), projector="alp", epochs=2),
            "--report-to",
            report_to,
            "--output",
            str(run),
            *extra,
        ]
    )
    assert code == 0, capsys.readouterr().out
    return run, json.loads((run / "metrics.json").read_text())


def test_tensorboard_gets_every_loss_term_each_step_the_dev_metrics_each_epoch_and_the_attention(
    capsys, tmp_path, tiny_bert_dir, sst2_dir, monkeypatch
):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    run, metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "tensorboard")
    event_dirs = {path.parent for path in (run / "tracking").rglob("events.out.tfevents.*")}
    # the run's events, and beneath them the hyper-parameters' own (TensorBoard's HParams layout)
    run_events = min(event_dirs, key=lambda path: len(path.parts))
    assert run_events == run / "tracking" / "kdplug"
    events = EventAccumulator(str(run_events), size_guidance={"scalars": 0, "images": 0}).Reload()
    tags = events.Tags()

    history = metrics["stages"]["distill"]["history"]
    train_terms = set(history[0]["train"])
    assert {"ce", "kd", "ild", "loss"} <= train_terms
    steps = len(events.Scalars("distill/train/loss"))
    assert steps % len(history) == 0
    for term in train_terms:
        # one point per optimisation step, numbered 1..steps within the stage
        assert [point.step for point in events.Scalars(f"distill/train/{term}")] == list(range(1, steps + 1))
    # the per-epoch mean the run records is the mean of the steps TensorBoard got
    per_epoch = steps // len(history)
    first_epoch = [point.value for point in events.Scalars("distill/train/loss")[:per_epoch]]
    assert sum(first_epoch) / per_epoch == pytest.approx(history[0]["train"]["loss"], rel=1e-4)

    dev = events.Scalars("distill/dev/dev/accuracy")
    assert [point.value for point in dev] == pytest.approx([epoch["dev"]["dev"]["accuracy"] for epoch in history])
    assert [point.step for point in dev] == [per_epoch * epoch for epoch in range(1, len(history) + 1)]
    assert len(events.Scalars("teacher/train/loss")) > 0 and "distill/lr" in tags["scalars"]
    assert "distill/attention" in tags["images"]  # ALP's attention heatmap
    assert not list(tmp_path.glob("mlflow.db")) and not (tmp_path / "runs").exists()  # nothing in the cwd


def test_mlflow_keeps_its_store_in_the_run_and_gets_params_and_metrics(
    capsys, tmp_path, tiny_bert_dir, sst2_dir, monkeypatch
):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run, metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "mlflow")
    assert (run / "tracking" / "mlflow.db").is_file()
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()

    client = mlflow.tracking.MlflowClient(f"sqlite:///{run / 'tracking' / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "kdplug"]
    [logged] = client.search_runs([experiment.experiment_id])
    assert logged.data.params["projector"] == "alp" and logged.data.params["student"] == "bilstm"
    history = client.get_metric_history(logged.info.run_id, "distill/dev/dev/accuracy")
    assert [point.value for point in history] == pytest.approx(
        [epoch["dev"]["dev"]["accuracy"] for epoch in metrics["stages"]["distill"]["history"]]
    )


def test_wandb_offline_writes_the_run_inside_the_run_directory(capsys, tmp_path, tiny_bert_dir, sst2_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    run, _ = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "wandb")
    [offline] = list((run / "tracking" / "wandb").glob("offline-run-*"))
    assert list(offline.glob("*.wandb")) and not (tmp_path / "wandb").exists()


def test_report_to_is_checked_before_any_work(capsys, tmp_path, monkeypatch):
    assert parse_report_to("none") == [] and parse_report_to(None) == []
    with pytest.raises(ConfigError, match="report_to must be none, all, or a comma list"):
        parse_report_to("tensorbored")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    if os.environ.get("WANDB_API_KEY") is None and pytest.importorskip("wandb"):
        with pytest.raises(ConfigError, match="wandb login"):
            parse_report_to("tensorboard,wandb")
    # on the command line: exit 2 with the message, and no run directory
    code = main(
        [
            "run",
            "--teacher",
            "minilm",
            "--student",
            "bilstm",
            "--report-to",
            "tensorbored",
            "--output",
            str(tmp_path / "run"),
        ]
    )
    assert code == 2 and "report_to must be" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()

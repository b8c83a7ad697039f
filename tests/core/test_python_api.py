"""The Python API: docs/python-api.md's complete example runs as written, and kdplug.distill
takes names and objects and runs what kdplug run runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import kdplug
from kdplug.testing import tiny_run_args, tiny_run_settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def code_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_complete_example_of_the_docs_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    example = code_blocks(DOC.read_text())[1]  # "A complete example"
    exec(compile(example, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "{'dev': {'accuracy'" in out and "x faster than the teacher" in out
    run = tmp_path / "runs" / "python-api-example"
    config = json.loads((run / "metrics.json").read_text())["config"]
    assert config["teacher"] == "python:teacher" and config["task"] == "python:task"
    assert (run / "student" / "model.safetensors").is_file()


def test_distill_with_names_is_what_kdplug_run_runs(tmp_path, tiny_bert_dir, sst2_dir):
    from kdplug.cli import main

    common = dict(teacher=tiny_bert_dir, student="bilstm", projector="rkd", task="sst2", data_dir=str(sst2_dir))
    settings = {
        "epochs": 1,
        "teacher_epochs": 1,
        "allow_weak_teacher": True,
        "student_options": {"hidden_size": 16, "embedding_dim": 16},
    }
    result = kdplug.distill(**common, **settings, output=str(tmp_path / "api"), echo=None)
    assert (
        main(
            [
                "run",
                *tiny_run_args(
                    teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=str(tmp_path / "cli")
                ),
            ]
        )
        == 0
    )
    cli = json.loads((tmp_path / "cli" / "metrics.json").read_text())
    assert result.dev == cli["student"]["dev"]
    untimed = lambda history: [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in history]  # noqa: E731
    assert untimed(result.metrics["stages"]["distill"]["history"]) == untimed(cli["stages"]["distill"]["history"])


def test_distill_reports_bad_settings_like_the_command_line(tmp_path):
    with pytest.raises(kdplug.UsageError, match="lr must be a positive finite number"):
        kdplug.distill(
            teacher="minilm", student="bilstm", projector="rkd", task="demo", lr=-1, output=str(tmp_path / "run")
        )
    with pytest.raises(kdplug.UsageError, match="unknown configuration key 'epoch'"):
        kdplug.distill(task="demo", epoch=3)
    assert not (tmp_path / "run").exists()


def test_an_in_memory_teacher_needs_a_head_of_the_tasks_size(tmp_path, tiny_bert_dir, sst2_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dir, num_labels=3)
    with pytest.raises(kdplug.UsageError, match="3 outputs but the task has 2.*num_labels=2"):
        kdplug.distill(
            teacher=(model, AutoTokenizer.from_pretrained(tiny_bert_dir)),
            task="sst2",
            data_dir=str(sst2_dir),
            student="bilstm",
            allow_weak_teacher=True,  # the tiny data is not what this test is about
            output=str(tmp_path / "run"),
            echo=None,
        )


def test_one_process_distils_twice_with_different_precisions(tmp_path, tiny_bert_dir, sst2_dir):
    """Accelerate keeps one precision per process: a second distill in another precision was refused
    with "AcceleratorState has already been initialized and cannot be changed"."""
    settings = tiny_run_settings(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), measure_speed=False)
    for precision in ("bf16", "fp32"):
        result = kdplug.distill(**settings, precision=precision, output=str(tmp_path / precision), echo=None)
        assert result.metrics["config"]["precision"] == precision

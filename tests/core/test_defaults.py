"""Defaults that help a user: the recipe a method needs, warnings when training goes nowhere,
and the two-stage schedule of Universal-KD (issue 13's end-to-end checks, tiny models)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from kdplug.cli import main
from kdplug.engine import health
from kdplug.testing import tiny_run_args
from kdplug.testing.tiny import make_tiny_classifier

from ..conftest import write_sst2


def cache_files(pattern):
    return sorted(Path(os.environ["KDPLUG_CACHE"]).glob(pattern))


def tiny_run(capsys, tmp_path, teacher, data, *extra, output="run"):
    code = main(
        [
            "run",
            *tiny_run_args(teacher=teacher, task="sst2", data_dir=str(data), projector=None, epochs=2, head_epochs=2),
            *extra,
            "--output",
            str(tmp_path / output),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    return out, json.loads((tmp_path / output / "metrics.json").read_text())


def test_universal_kd_runs_two_stages_by_default_and_says_so(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    out, metrics = tiny_run(
        capsys, tmp_path, tiny_bert_dir, sst2_dir, "--projector", "universal-ca", "--set", "keep_checkpoints=true"
    )
    assert out.splitlines()[0].startswith("recipe two-stage: the default of projector 'universal-ca'")
    assert list(metrics["stages"]) == ["teacher_heads", "stage1", "stage2"]
    assert metrics["config"]["recipe"] == "two-stage" and metrics["student"]["recipe"] == "two-stage"
    stage1, stage2 = metrics["stages"]["stage1"], metrics["stages"]["stage2"]
    assert stage1["weights"]["ce"] == 0 and "ce" not in stage1["history"][0]["train"]
    assert stage2["weights"] == {"ce": 1.0, "eta": 0.0, "lam": 0.0, "temperature": 1.0}
    assert set(stage2["history"][0]["train"]) == {"ce", "loss"}  # stage 2 is CE only

    # the teacher's pseudo classifiers stay frozen through stage 1: the trained module's copy of
    # them equals the warmed-up heads stored in the cache
    checkpoint = load_file(str(tmp_path / "run" / "checkpoints" / "stage1" / "model.safetensors"))
    stored = load_file(str(cache_files("heads/*.safetensors")[0]))
    for name, tensor in stored.items():
        assert torch.equal(checkpoint[f"teacher_heads.{name}"], tensor), name

    # stage 2 starts from stage 1's best epoch: its kept weights are stage 1's best ones
    best = load_file(str(tmp_path / "run" / "checkpoints" / "stage1" / "best.safetensors"))
    final = load_file(str(tmp_path / "run" / "checkpoints" / "stage1" / "model.safetensors"))
    assert all(torch.equal(best[name], final[name]) for name in best)


def test_an_explicit_recipe_wins_and_a_zero_ce_weight_is_a_warning(capsys, caplog, tmp_path, tiny_bert_dir, sst2_dir):
    with caplog.at_level(logging.WARNING, logger="kdplug"):
        out, metrics = tiny_run(
            capsys, tmp_path, tiny_bert_dir, sst2_dir, "--projector", "universal-ca", "--recipe", "standard"
        )
    assert "recipe two-stage" not in out and list(metrics["stages"]) == ["teacher_heads", "distill"]
    warning = next(r.message for r in caplog.records if "CE weight is 0" in r.message)
    assert "eta 0.5, lam 0.5" in warning and "--recipe two-stage" in warning


def test_a_student_that_learns_nothing_is_reported(capsys, caplog, tmp_path, tiny_bert_dir, sst2_dir):
    with caplog.at_level(logging.WARNING, logger="kdplug"):
        _, metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "--projector", "nkd", "--set", "lr=1e-9")
    warnings = metrics["stages"]["distill"]["warnings"]
    assert any("predicts" in w and "every dev example" in w and "--set lr=" in w for w in warnings)
    assert any("has not moved" in w for w in warnings)
    assert any("has not learned the task" in r.message for r in caplog.records)


def test_a_student_as_large_as_its_teacher_is_reported(capsys, caplog, tmp_path, tiny_bert_dir, sst2_dir):
    with caplog.at_level(logging.WARNING, logger="kdplug"):
        tiny_run(
            capsys,
            tmp_path,
            tiny_bert_dir,
            sst2_dir,
            "--projector",
            "nkd",
            "--set",
            "student_options.hidden_size=64",
            "--set",
            "student_options.embedding_dim=64",
        )
    assert any("as many as the teacher" in r.message for r in caplog.records)


def history(*epochs, classes=2):
    return [{"epoch": i, "train": terms, "predicted_classes": classes} for i, terms in enumerate(epochs, 1)]


LABELS = ("negative", "positive")


def test_health_single_class_waits_for_a_third_of_the_stage():
    one_class = [1, 1, 1]
    losses = [{"loss": 0.6}, {"loss": 0.5}, {"loss": 0.4}, {"loss": 0.3}]
    check = (
        lambda n, epochs, **kw: health.check_epoch(  # noqa: E731
            "distill", history(*losses[:n], **kw), epochs=epochs, lr=1e-3, labels=LABELS, predictions=one_class
        )
    )
    assert check(1, 6, classes=1) == []  # one epoch of six proves little
    findings = check(2, 6, classes=1)
    assert [f.code for f in findings] == ["single-class"] and "'positive'" in findings[0].message
    assert check(2, 12, classes=1) == []  # a slow start: reported after 4 of 12 epochs
    assert [f.code for f in check(4, 12, classes=1)] == ["single-class"]
    assert [f.code for f in check(1, 1, classes=1)] == ["single-class"]  # the last epoch always counts
    # an epoch that predicted both classes earlier: it learnt something, so not stuck
    mixed = history(*losses[:3], classes=1)
    mixed[0]["predicted_classes"] = 2
    assert health.check_epoch("distill", mixed, epochs=6, lr=1e-3, labels=LABELS, predictions=one_class) == []


def test_health_a_loss_pushed_off_by_a_learning_rate_too_large_is_told_to_lower_it():
    one_class = [0, 0, 0]
    # the training losses of `--set lr=1e6` (a BiLSTM under a tiny teacher): up by 12 orders of magnitude
    exploded = history({"ce": 7.768e9, "loss": 1.59e11}, {"ce": 2.062e21, "loss": 1.31e22}, classes=1)
    (finding,) = health.check_epoch("distill", exploded, epochs=2, lr=1e6, labels=LABELS, predictions=one_class)
    assert finding.code == "single-class" and "the learning rate 1e+06 is too large. Lower it" in finding.message
    assert "larger learning rate" not in finding.message and "ce went from 7.768e+09 to 2.062e+21" in finding.message
    # one epoch: a CE far above chance (ln 2) says the same
    (finding,) = health.check_epoch(
        "teacher", history({"ce": 40.0, "loss": 40.0}, classes=1), epochs=1, lr=1.0, labels=LABELS, predictions=[1]
    )
    assert "too large. Lower it (--set teacher_lr=...)" in finding.message
    # a slow start near chance still gets the advice to train longer or faster
    slow = history({"ce": 0.70, "loss": 0.70}, {"ce": 0.71, "loss": 0.71}, classes=1)
    (finding,) = health.check_epoch("distill", slow, epochs=2, lr=1e-5, labels=LABELS, predictions=one_class)
    assert "larger learning rate" in finding.message


def test_a_run_at_lr_1e6_is_advised_a_lower_learning_rate(tmp_path, caplog):
    teacher = make_tiny_classifier(tmp_path / "teacher")
    data = write_sst2(tmp_path / "SST-2")
    tiny = tiny_run_args(teacher=teacher, task="sst2", data_dir=str(data), epochs=2, teacher_epochs=None, batch_size=4)
    with caplog.at_level(logging.WARNING, logger="kdplug"):
        code = main(["run", *tiny, "--set", "lr=1e6", "--output", str(tmp_path / "run")])
    advice = [r.message for r in caplog.records if "stage 'distill'" in r.message]
    assert code == 0 and advice and all("larger learning rate" not in message for message in advice)
    assert any("the learning rate 1e+06 is too large. Lower it (--set lr=...)" in message for message in advice)


def test_health_flat_loss_only_at_chance_level():
    chance = torch.log(torch.tensor(2.0)).item()
    flat = history({"ce": chance, "loss": chance}, {"ce": chance * 0.999, "loss": chance * 0.999})
    assert [
        f.code for f in health.check_epoch("teacher", flat, epochs=3, lr=5e-5, labels=LABELS, predictions=None)
    ] == ["flat-loss"]
    learned = history({"ce": 0.05, "loss": 0.05}, {"ce": 0.0499, "loss": 0.0499})  # flat, but far below chance
    assert health.check_epoch("teacher", learned, epochs=3, lr=5e-5, labels=LABELS, predictions=None) == []


def test_health_ild_collapse_while_ce_stays_at_chance():
    collapsed = history({"ce": 0.70, "ild": 2.75, "loss": 1.0}, {"ce": 0.69, "ild": 0.04, "loss": 0.1})
    findings = health.check_epoch("distill", collapsed, epochs=3, lr=1e-3, labels=LABELS, predictions=[0, 1])
    assert [f.code for f in findings] == ["ild-collapse"] and "--set lam=" in findings[0].message
    learning = history({"ce": 0.70, "ild": 2.75, "loss": 1.0}, {"ce": 0.30, "ild": 0.04, "loss": 0.1})
    assert health.check_epoch("distill", learning, epochs=3, lr=1e-3, labels=LABELS, predictions=[0, 1]) == []


@pytest.mark.parametrize("examples, expected", [(67349, 3), (800, 12), (240, 30), (40, 30)])
def test_default_epochs_reach_enough_optimizer_steps(examples, expected):
    from kdplug.engine.schedule import default_epochs

    assert default_epochs(torch.nn.Linear(1, 1), examples, 32) == expected

"""``kdplug run --seeds``: one run per seed, one shared teacher, mean ± std, and paired comparisons."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml

from kdplug.cli import main
from kdplug.errors import ConfigError
from kdplug.seeds import parse_seeds
from kdplug.sweep import Sweep
from kdplug.testing import tiny_run_args


def test_parse_seeds_takes_a_count_or_a_list():
    assert parse_seeds("3", 42) == [42, 43, 44]
    assert parse_seeds("5,1,9", 42) == [5, 1, 9] and parse_seeds("[2,3]", 42) == [2, 3]
    for bad, message in (("0", "at least 1"), ("three", "a count"), ("1,1", "listed twice"), ("", "a count")):
        with pytest.raises(ConfigError, match=message):
            parse_seeds(bad, 42)


def test_a_sweeps_seed_axis_keeps_one_teacher(tmp_path):
    sweep = Sweep(tmp_path, {"seed": 5}, {"seed": [1, 2], "lr": [1e-3]})
    assert [sweep.config(p).teacher_seed for p in sweep.points] == [5, 5]
    assert [sweep.config(p).seed for p in sweep.points] == [1, 2]
    assert Sweep(tmp_path, {}, {"lr": [1e-3, 2e-3]}).config({"lr": 1e-3}).teacher_seed is None


def test_seeds_share_the_teacher_and_summarise(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    argv = [
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=str(tmp_path / "rkd")),
        "--baseline",
        "nkd",
        "--seed",
        "7",
        "--seeds",
        "2",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    runs = {seed: tmp_path / "rkd" / f"seed-{seed}" for seed in (7, 8)}
    configs = {seed: yaml.safe_load((path / "config.yaml").read_text()) for seed, path in runs.items()}
    metrics = {seed: json.loads((path / "metrics.json").read_text()) for seed, path in runs.items()}
    assert [configs[s]["seed"] for s in (7, 8)] == [7, 8] and {configs[s]["teacher_seed"] for s in (7, 8)} == {7}
    # the second seed reuses the teacher the first one fine-tuned
    assert "stored" in metrics[7]["teacher"]["finetuned"] and "reused" in metrics[8]["teacher"]["finetuned"]
    assert metrics[7]["teacher"]["dev"] == metrics[8]["teacher"]["dev"]

    summary = json.loads((tmp_path / "rkd" / "seeds.json").read_text())
    assert summary["seeds"] == [7, 8] and summary["teacher_seed"] == 7 and summary["best_checkpoint"] == "best"
    for model, key in (("bilstm + rkd", "student"), ("bilstm + nkd", "baseline")):
        values = [metrics[s][key]["dev"]["dev"]["accuracy"] for s in (7, 8)]
        cell = summary["models"][model]["dev"]["accuracy"]
        assert cell["values"] == values and cell["mean"] == pytest.approx(statistics.fmean(values))
        assert cell["std"] == pytest.approx(statistics.stdev(values))
    assert "2 seeds (7, 8)" in out and "bilstm + rkd" in out and "bilstm + nkd" in out

    # the same command again: both seeds are done, nothing runs
    stamps = {s: (runs[s] / "metrics.json").stat().st_mtime_ns for s in runs}
    assert main(argv) == 0
    assert "done already" in capsys.readouterr().out
    assert stamps == {s: (runs[s] / "metrics.json").stat().st_mtime_ns for s in runs}

    # the report pairs the student with its baseline on both seeds, with its predictions: a bootstrap too
    assert main(["report", str(tmp_path / "rkd"), "--output", str(tmp_path / "report")]) == 0
    records = json.loads((tmp_path / "report" / "comparisons.json").read_text())
    record = next(r for r in records if r["metric"] == "accuracy")
    assert (record["a"], record["b"], record["seeds"]) == ("rkd", "nkd", [7, 8]) and record["bootstrap"] is not None
    assert record["differences"] == pytest.approx(
        [
            metrics[s]["student"]["dev"]["dev"]["accuracy"] - metrics[s]["baseline"]["dev"]["dev"]["accuracy"]
            for s in (7, 8)
        ]
    )

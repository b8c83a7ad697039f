"""Paired comparisons (kdplug.compare) and the report's comparison section, on synthetic per-seed
results whose answer is known: a clear gap is "better", identical distributions are not resolved."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from kdplug import compare
from kdplug.cli import main
from kdplug.report import write_report
from kdplug.testing import tiny_run_args
from kdplug_tasks.base import METRICS

T_3_975 = 3.182446  # Student's t, 3 degrees of freedom, 97.5th percentile (any statistics table)


def runs_of(accuracy: float, seeds: list[int], labels: np.ndarray, rng: np.random.Generator):
    """Per seed, predictions right with probability ``accuracy``, and their scores."""
    results = {}
    for seed in seeds:
        right = rng.random(len(labels)) < accuracy
        predictions = np.where(right, labels, 1 - labels)
        results[seed] = compare.SeedResult(seed, {"accuracy": float(right.mean())}, predictions, labels)
    return results


def test_t_interval_matches_the_hand_computation():
    low, high = compare.t_interval([0.01, 0.02, 0.03, 0.04])
    half = T_3_975 * np.std([1, 2, 3, 4], ddof=1) / 2 / 100  # t · sd / √4
    assert low == pytest.approx(0.025 - half, abs=1e-6) and high == pytest.approx(0.025 + half, abs=1e-6)
    assert compare.t_interval([0.05]) == (-math.inf, math.inf)  # one seed: no spread, no interval


def test_t_interval_covers_the_true_difference_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    covered = [
        low <= 0.3 <= high for low, high in (compare.t_interval(rng.normal(0.3, 1.0, size=4)) for _ in range(2000))
    ]
    assert 0.935 <= np.mean(covered) <= 0.965


def test_a_clear_gap_is_better_and_reversed_worse():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    strong, weak = runs_of(0.90, [1, 2, 3, 4, 5], labels, rng), runs_of(0.75, [1, 2, 3, 4, 5], labels, rng)
    result = compare.compare(strong, weak, "accuracy", name_a="strong", name_b="weak")
    assert result.verdict == "better" and result.seeds == [1, 2, 3, 4, 5]
    assert result.t_interval[0] > 0 and result.bootstrap[0] > 0
    assert 0.10 < result.mean < 0.20 and result.t_interval[0] < result.mean < result.t_interval[1]
    assert result.differences == pytest.approx(
        [strong[s].scores["accuracy"] - weak[s].scores["accuracy"] for s in range(1, 6)]
    )
    assert compare.compare(weak, strong, "accuracy").verdict == "worse"


def test_identical_distributions_are_not_resolved():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    resolved = 0
    for _ in range(20):
        a, b = runs_of(0.8, [1, 2, 3], labels, rng), runs_of(0.8, [1, 2, 3], labels, rng)
        result = compare.compare(a, b, "accuracy", resamples=300)
        resolved += result.verdict != "not resolved at 3 seeds"
    assert resolved <= 2  # a 95% interval says "different" about 5% of the time, at most


def test_one_seed_never_resolves_even_a_large_gap():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    result = compare.compare(runs_of(0.95, [7], labels, rng), runs_of(0.6, [7], labels, rng), "accuracy")
    assert result.verdict == "not resolved at 1 seed" and result.seeds_needed is None
    assert result.bootstrap[0] > 0  # the dev-set noise alone would call it, the missing seed spread does not


def test_only_common_seeds_are_paired():
    a = {s: compare.SeedResult(s, {"accuracy": 0.8 + s / 100}) for s in (1, 2, 3)}
    b = {s: compare.SeedResult(s, {"accuracy": 0.8}) for s in (2, 3, 4)}
    result = compare.compare(a, b, "accuracy")
    assert result.seeds == [2, 3] and result.differences == pytest.approx([0.02, 0.03])
    assert result.bootstrap is None  # no predictions: the t-interval alone
    with pytest.raises(ValueError, match="share no seed"):
        compare.compare(a, {9: b[2]}, "accuracy")


def test_bootstrap_is_deterministic_for_a_seed():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 200)
    a, b = rng.integers(0, 3, (3, 200)), rng.integers(0, 3, (3, 200))
    first = compare.paired_bootstrap(a, b, labels, compare.matthews, resamples=500, seed=5)
    assert compare.paired_bootstrap(a, b, labels, compare.matthews, resamples=500, seed=5) == first
    assert compare.paired_bootstrap(a, b, labels, compare.matthews, resamples=500, seed=6) != first


def test_bootstrap_width_matches_the_binomial_standard_error():
    # One seed, B always wrong, A right with probability p: A − B is A's accuracy, whose standard
    # error over n examples is sqrt(p(1 − p)/n); the 95% percentile interval spans about 2·1.96 of it.
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 1000)
    a = np.where(rng.random(1000) < 0.7, labels, 1 - labels)[None]
    result = compare.paired_bootstrap(a, 1 - labels[None], labels, compare.accuracy, resamples=3000)
    accuracy = (a[0] == labels).mean()
    expected = 2 * 1.96 * math.sqrt(accuracy * (1 - accuracy) / 1000)
    assert result.interval[1] - result.interval[0] == pytest.approx(expected, rel=0.1)
    assert result.example_variance == pytest.approx(accuracy * (1 - accuracy) / 1000, rel=0.15)


@pytest.mark.parametrize("name", sorted(compare.WEIGHTED_METRICS))
def test_weighted_metrics_equal_the_task_metrics_on_every_resample(name):
    rng = np.random.default_rng(len(name))
    n = 40
    if name in ("pearson", "spearman"):
        pred, ref = rng.normal(size=n).round(1), rng.integers(0, 5, n).astype(float)  # ties on both sides
    else:
        classes = 2 if name == "f1" else 3
        pred, ref = rng.integers(0, classes, n), rng.integers(0, classes, n)
    draws = rng.integers(0, n, (30, n))
    draws[0] = 4  # a resample of one example, drawn n times: constant, degenerate metrics
    weights = np.stack([np.bincount(row, minlength=n) for row in draws]).astype(float)
    expected = [METRICS[name](pred[np.sort(row)], ref[np.sort(row)]) for row in draws]
    assert compare.WEIGHTED_METRICS[name](pred, ref, weights) == pytest.approx(expected, abs=1e-9)
    assert compare.weighted_metric(METRICS[name])(pred, ref, weights) == pytest.approx(expected, abs=1e-9)


def test_seeds_needed_is_the_smallest_n_with_enough_power():
    from scipy import stats

    def enough(n, d, s, v=0.0):
        t = stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)
        return t * t * (s * s / n + v) <= d * d

    for d, s, v in ((0.01, 0.02, 0.0), (0.04, 0.01, 0.0), (0.02, 0.03, 1e-5)):
        n = compare.seeds_needed(d, s, v)
        assert enough(n, d, s, v) and (n == 2 or not enough(n - 1, d, s, v))
    z = 1.959964 + 0.841621  # z_0.975 + z_0.8: many seeds, the normal formula n = (z·s/d)²
    assert compare.seeds_needed(0.01, 0.1) == pytest.approx((z * 0.1 / 0.01) ** 2, rel=0.01)
    assert compare.seeds_needed(0.01, 0.02, example_variance=(0.01 / z) ** 2) is None  # dev-set noise too large
    assert compare.seeds_needed(0.0, 0.02) is None
    assert compare.seeds_needed(0.05, 0.0) == 2


def test_verdict_and_the_papers_ordering():
    assert compare.verdict([(0.01, 0.03), (0.002, 0.04)], 3) == "better"
    assert compare.verdict([(0.01, 0.03), (-0.002, 0.04)], 3) == "not resolved at 3 seeds"
    assert compare.verdict([(-0.03, -0.01)], 2) == "worse"
    assert compare.verdict([(0.01, 0.03)], 1) == "not resolved at 1 seed"
    result = compare.compare(
        {s: compare.SeedResult(s, {"m": 0.9 + s / 1000}) for s in (1, 2, 3)},
        {s: compare.SeedResult(s, {"m": 0.8}) for s in (1, 2, 3)},
        "m",
    )
    assert result.verdict == "better"
    assert compare.ordering(90.4, 90.1, result) == "reproduced"
    assert compare.ordering(88.0, 90.1, result) == "contradicted"
    result.verdict = "not resolved at 3 seeds"
    assert compare.ordering(90.4, 90.1, result) == "not resolved"


# -- the report ---------------------------------------------------------------------------------


def write_run(
    directory,
    *,
    projector: str,
    seed: int,
    accuracy: float,
    labels: np.ndarray,
    rng,
    zoo=None,
    best_checkpoint="best",
    lr=None,
    trained_lr=1e-3,
    student_options=None,
):
    """A finished run directory as the engine writes it, with predictions right at ``accuracy``;
    ``lr`` as configured (None: the family's default), ``trained_lr`` as its stage recorded it."""
    directory.mkdir(parents=True)
    right = rng.random(len(labels)) < accuracy
    predictions = np.where(right, labels, 1 - labels).tolist()
    config = {
        "teacher": "bert-base",
        "student": "bert-4",
        "projector": projector,
        "task": "sst2",
        "recipe": "standard",
        "seed": seed,
        "best_checkpoint": best_checkpoint,
        "zoo": zoo,
        "epochs": 3,
        "lr": lr,
        "student_options": student_options or {},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    dev = {"dev": {"accuracy": float(right.mean())}}
    stage = {
        "lr": lr or trained_lr,
        "epochs": 3,
        "history": [],
        "weights": {"ce": 0.3, "eta": 0.7, "lam": 0.0, "temperature": 10.0},
    }
    (directory / "metrics.json").write_text(
        json.dumps(
            {
                "task": "sst2",
                "main_metric": "accuracy",
                "config": config,
                "teacher": {"dev": {"dev": {"accuracy": 0.9}}},
                "stages": {"distill": stage},
                "student": {"dev": dev, "parameters": 1000},
                "wall_seconds": 1.0,
            }
        )
    )
    (directory / "predictions.json").write_text(
        json.dumps({"dev": {"predictions": predictions, "labels": labels.tolist()}})
    )
    return directory


def test_report_compares_methods_on_common_seeds(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    runs = [
        write_run(tmp_path / name / f"seed-{seed}", projector=name, seed=seed, accuracy=acc, labels=labels, rng=rng)
        for name, acc in (("nkd", 0.70), ("alp", 0.88), ("rkd", 0.70))
        for seed in (1, 2, 3)
    ]
    (tmp_path / "nkd" / "seeds.json").write_text("{}")  # a 'kdplug run --seeds' output stands for its runs
    files = write_report([tmp_path / "nkd", *runs[3:]], tmp_path / "report", resamples=500)
    markdown = files["markdown"].read_text()
    assert "best dev epoch (best_checkpoint: best)" in markdown
    records = {(r["a"], r["b"]): r for r in json.loads(files["comparisons"].read_text())}
    assert set(records) == {("alp", "nkd"), ("rkd", "nkd"), ("rkd", "alp")}  # nkd is the reference
    assert records[("alp", "nkd")]["verdict"] == "better" and records[("rkd", "alp")]["verdict"] == "worse"
    assert records[("rkd", "nkd")]["verdict"] == "not resolved at 3 seeds"
    assert records[("alp", "nkd")]["seeds"] == [1, 2, 3] and records[("alp", "nkd")]["bootstrap"] is not None
    assert "| alp − nkd | dev accuracy | 3 |" in markdown and "**better**" in markdown


def test_report_keeps_setups_apart(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 100)
    runs = [
        write_run(
            tmp_path / f"{name}-{policy}",
            projector=name,
            seed=1,
            accuracy=0.8,
            labels=labels,
            rng=rng,
            best_checkpoint=policy,
        )
        for name in ("nkd", "rkd")
        for policy in ("best", "last")
    ]
    records = json.loads(write_report(runs, tmp_path / "report", resamples=0)["comparisons"].read_text())
    assert sorted(r["best_checkpoint"] for r in records) == ["best", "last"]  # never best against last
    assert all(r["verdict"] == "not resolved at 1 seed" and r["bootstrap"] is None for r in records)


@pytest.mark.parametrize(
    "alp, pkd, expected", [(0.92, 0.80, "reproduced"), (0.80, 0.92, "contradicted"), (0.85, 0.85, "not resolved")]
)
def test_report_checks_the_papers_ordering_of_zoo_rows(tmp_path, alp, pkd, expected, capsys):
    # ALP-KD Table 1, SST-2: S_ALP 90.37 above S_PKD 90.14
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    runs = [
        write_run(
            tmp_path / row / str(seed),
            projector=row,
            seed=seed,
            accuracy=acc,
            labels=labels,
            rng=rng,
            zoo=f"alp-kd/table1-sst2-{row}",
        )
        for row, acc in (("alp", alp), ("pkd", pkd))
        for seed in (1, 2, 3, 4)
    ]
    assert main(["report", *map(str, runs), "--output", str(tmp_path / "report"), "--resamples", "300"]) == 0
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "The paper's ordering (alp-kd Table 1, sst2)" in markdown
    assert f"| **{expected}** |" in markdown and "90.37 > 90.14" in markdown
    assert "(n=4) / 90.37 (accuracy)" in markdown  # ours, mean ± std over 4 seeds, beside the paper's


def test_methods_are_told_apart_and_labelled_by_the_values_that_ran(tmp_path):
    """lr left to kdplug (None) and the same lr set by hand are one method; another lr is another,
    labelled with its value, never 'lr=None'."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    runs = [
        write_run(tmp_path / f"default-{seed}", projector="rkd", seed=seed, accuracy=0.8, labels=labels, rng=rng)
        for seed in (1, 2)
    ]
    runs += [
        write_run(tmp_path / f"set-{seed}", projector="rkd", seed=seed, accuracy=0.8, labels=labels, rng=rng, lr=1e-3)
        for seed in (3, 4)
    ]
    runs += [
        write_run(tmp_path / f"other-{seed}", projector="rkd", seed=seed, accuracy=0.8, labels=labels, rng=rng, lr=2e-3)
        for seed in (1, 2, 3, 4)
    ]
    files = write_report(runs, tmp_path / "report", resamples=0)
    [record] = json.loads(files["comparisons"].read_text())
    assert {record["a"], record["b"]} == {"rkd (lr=0.001)", "rkd (lr=0.002)"}
    assert record["seeds"] == [1, 2, 3, 4]  # the default-lr and the hand-set runs form one method
    assert "None" not in files["markdown"].read_text().split("## Comparisons")[1].split("## Training")[0]


def test_an_ablation_of_a_student_option_is_compared_and_labelled_by_it(tmp_path):
    """Two rkd runs that differ only in a student option are one comparison (same dev set, same
    seeds), each labelled by the option's value; another dev set is never paired with them."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    runs = [
        write_run(
            tmp_path / f"{name}-{seed}",
            projector="rkd",
            seed=seed,
            accuracy=accuracy,
            labels=labels,
            rng=rng,
            student_options=options,
        )
        for name, accuracy, options in (
            ("random", 0.70, None),
            ("teacher", 0.90, {"init_embeddings_from_teacher": True}),
        )
        for seed in (1, 2, 3)
    ]
    files = write_report(runs, tmp_path / "report", resamples=300)
    [record] = json.loads(files["comparisons"].read_text())
    assert {record["a"], record["b"]} == {
        'rkd (student_options={"init_embeddings_from_teacher": true})',
        "rkd (student_options={})",
    }
    assert record["verdict"] == "better" and record["seeds"] == [1, 2, 3]
    assert "sst2: bert-base → bert-4" in files["markdown"].read_text()


def test_a_note_shared_by_every_comparison_is_said_once(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    runs = [
        write_run(tmp_path / name, projector=name, seed=1, accuracy=0.8, labels=labels, rng=rng)
        for name in ("nkd", "rkd", "alp", "pkd-skip")
    ]
    markdown = write_report(runs, tmp_path / "report", resamples=0)["markdown"].read_text()
    assert markdown.count("one seed: the seed-to-seed spread is unknown") == 1
    assert "nothing can be resolved (every comparison above)" in markdown


def test_a_baseline_student_keeps_its_predictions_for_the_bootstrap(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    argv = ["run", *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=tmp_path / "runs")]
    argv += ["--baseline", "nkd", "--seeds", "1,2"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "seed-1"
    baseline = json.loads((run / "baseline_predictions.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    labels = baseline["dev"]["labels"]
    accuracy = sum(p == y for p, y in zip(baseline["dev"]["predictions"], labels)) / len(labels)
    assert accuracy == pytest.approx(metrics["baseline"]["dev"]["dev"]["accuracy"])  # the baseline's own
    files = write_report([tmp_path / "runs"], tmp_path / "report", resamples=200)
    [record] = json.loads(files["comparisons"].read_text())
    assert {record["a"], record["b"]} == {"rkd", "nkd"} and record["bootstrap"] is not None


def test_the_same_configuration_run_twice_is_two_methods_labelled_by_directory(tmp_path):
    """Before and after a change of kdplug itself: the same configuration and seeds in two
    directories (both named ``exp``) are compared, not merged with the second's seeds dropped, and
    labelled by where they came from; each directory's runs stay together whatever order their seeds
    are read in; a key one version does not write yet makes no difference; and each directory's
    ``--baseline`` students are its own reference."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 400)
    runs = {"before": (0.70, (2, 3, 10)), "after": (0.90, (1, 2, 3, 10))}  # seed-10 sorts before seed-2
    for name, (accuracy, seeds) in runs.items():
        for seed in seeds:
            run = write_run(
                tmp_path / name / "exp" / f"seed-{seed}",
                projector="rkd",
                seed=seed,
                accuracy=accuracy,
                labels=labels,
                rng=rng,
            )
            metrics = json.loads((run / "metrics.json").read_text())
            baseline = 0.5 if name == "before" else 0.6
            metrics["baseline"] = {"projector": "nkd", "dev": {"dev": {"accuracy": baseline + seed / 1000}}}
            (run / "metrics.json").write_text(json.dumps(metrics))
        (tmp_path / name / "exp" / "seeds.json").write_text("{}")  # a 'kdplug run --seeds' output
    config = tmp_path / "after" / "exp" / "seed-1" / "config.yaml"
    config.write_text(config.read_text() + "min_epochs: null\n")  # a key the earlier version did not have
    files = write_report([tmp_path / "before" / "exp", tmp_path / "after" / "exp"], tmp_path / "report", resamples=300)
    records = {(r["a"], r["b"]): r for r in json.loads(files["comparisons"].read_text())}
    after_before = (
        records.get(("rkd [after/exp]", "rkd [before/exp]")) or records[("rkd [before/exp]", "rkd [after/exp]")]
    )
    assert after_before["seeds"] == [2, 3, 10]
    assert after_before["verdict"] == ("better" if after_before["a"] == "rkd [after/exp]" else "worse")
    nkd = {label for pair in records for label in pair if label.startswith("nkd")}
    assert nkd == {"nkd [before/exp]", "nkd [after/exp]"}  # each directory's baseline, none dropped
    after_nkd = next(r for (a, b), r in records.items() if {a, b} == {"rkd [after/exp]", "nkd [after/exp]"})
    assert after_nkd["seeds"] == [1, 2, 3, 10]

"""Your own data, as the README's "Your own data" block runs it: the example that ships in
``examples/reviews`` resolves as written, and data too small to fine-tune or judge a teacher is
refused before anything trains."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from kdplug.cli import main
from kdplug.testing import tiny_run_args

ROOT = Path(__file__).resolve().parents[2]
REVIEWS = ROOT / "examples" / "reviews"
COLUMNS = ["--set", "task_options.text_column=review", "--set", "task_options.label_column=sentiment"]


def write_reviews(directory: Path, train: list[tuple[str, str]], dev: list[tuple[str, str]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        with open(directory / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows([("review", "sentiment"), *rows])
    return directory


def test_the_shipped_example_has_both_classes_in_train_and_dev():
    for name, least in (("train", 100), ("dev", 60)):
        with open(REVIEWS / f"{name}.csv", newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) >= least and {row["sentiment"] for row in rows} == {"pos", "neg"}
        assert min(sum(row["sentiment"] == label for row in rows) for label in ("pos", "neg")) >= len(rows) // 3
        assert all(row["review"].strip() for row in rows)


def test_the_shipped_example_runs_its_readme_dry_run(capsys, tiny_bert_dir, tmp_path):
    code = main(
        ["run", "--teacher", tiny_bert_dir, "--task", "local", "--data-dir", str(REVIEWS), *COLUMNS, "--dry-run"]
        + ["--output", str(tmp_path / "run")]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "2 labels (neg, pos)" in out and "train 232, dev 80" in out


TWO_ROWS = (
    [('"a warm, funny film"', "pos"), ("flat and far too long", "neg")],
    [("I loved it", "pos"), ("a mess", "neg")],
)


@pytest.mark.parametrize(
    "train, dev, says",
    [
        (*TWO_ROWS, "the dev split has 2 examples (at least 10)"),
        (
            [("good", "pos"), ("fine", "pos"), ("great", "pos"), ("bad", "neg")],
            [(f"review {i}", "pos" if i % 2 else "neg") for i in range(12)],
            "training examples per class: 'neg' 1 (at least 2 of each)",
        ),
    ],
    ids=["two dev rows", "one neg training row"],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry run"])
def test_data_too_small_to_judge_a_teacher_is_refused_before_any_training(
    capsys, tiny_bert_dir, tmp_path, train, dev, says, dry_run
):
    data = write_reviews(tmp_path / "my_data", train, dev)
    output = tmp_path / "run"
    judged = tiny_run_args(teacher=tiny_bert_dir, task="local", data_dir=str(data), allow_weak_teacher=None)
    code = main(["run", *judged, *COLUMNS, "--output", str(output), *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err
    assert code == 2
    assert "too few examples to fine-tune a teacher and tell whether it beats the majority class" in err
    assert says in err and "--set allow_weak_teacher=true to distil without judging the teacher" in err
    cache = Path(os.environ["KDPLUG_CACHE"])
    assert not (cache / "teachers").exists() or not any((cache / "teachers").iterdir())  # nothing fine-tuned
    assert not output.exists()  # refused before the run directory is made


def test_allow_weak_teacher_distils_from_two_rows_without_judging(capsys, tiny_bert_dir, tmp_path):
    """kdplug's own tests distil on a handful of examples: with allow_weak_teacher the teacher is
    not judged, so the size check does not apply."""
    data = write_reviews(tmp_path / "my_data", *TWO_ROWS)
    argv = ["run", *tiny_run_args(teacher=tiny_bert_dir, task="local", data_dir=str(data)), *COLUMNS]
    code = main([*argv, "--output", str(tmp_path / "run"), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "check before distilling: off" in out

"""Data values kept as they are: labels that look like paths stay labels in the package,
``kdplug predict`` writes tables a CSV reader reads back to the input texts, text files that are
not UTF-8 (UTF-16 without a byte-order mark) are refused with the fix, a local task's labels
that are a repeated header line, empty, or differ only in case or in how a number is written are
refused before the teacher loads, and a fine-tuned teacher is stored under its task's label names."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN

NEWS = ("/m/news", "/r/news")  # Freebase-style topic ids: labels, not paths


def write_table(path: Path, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([header, *rows])
    return path


@pytest.fixture(scope="module")
def news_cache(tmp_path_factory) -> Path:
    """The cache of :func:`news_run`: its fine-tuned teacher is stored there."""
    return tmp_path_factory.mktemp("news-cache")


@pytest.fixture(scope="module")
def news_run(tmp_path_factory, tiny_bert_dir, news_cache):
    """A finished tiny run on a local task whose labels are ``/m/news`` and ``/r/news``."""
    root = tmp_path_factory.mktemp("news")
    for split, rows in (("train", SST2_TRAIN), ("dev", SST2_DEV)):
        write_table(root / "data" / f"{split}.csv", ("text", "label"), [(t, NEWS[int(y)]) for t, y in rows])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(news_cache))
        argv = tiny_run_args(teacher=tiny_bert_dir, task="local", data_dir=root / "data", output=root / "run")
        assert main(["run", *argv, "--set", "task_options.labels=[/m/news, /r/news]"]) == 0
    return root / "run"


def predict_cli(capsys, *argv):
    code = main(["predict", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- 9a: labels are data, never redacted as paths --------------------------------------------------


def test_labels_that_look_like_paths_stay_labels_in_the_package_and_predictions(capsys, tmp_path, news_run):
    student = news_run / "student"
    info = json.loads((student / "kdplug_student.json").read_text())
    assert info["labels"] == list(NEWS)
    assert json.loads((student / "config.json").read_text())["id2label"] == {"0": "/m/news", "1": "/r/news"}
    assert "task_options.labels='[/m/news, /r/news]'" in (student / "README.md").read_text()  # the command, as run
    for path in student.iterdir():  # the run's own paths are still reduced to their last component
        if path.suffix in (".md", ".json") and path.name != "tokenizer.json":
            assert str(news_run.parent) not in path.read_text(), path.name
    source = tmp_path / "in.txt"
    source.write_text("a gripping film\nthe plot was dull\n")
    code, out, err = predict_cli(capsys, news_run, "--input", source)
    assert code == 0, err
    rows = list(csv.reader(out.splitlines(), delimiter="\t"))
    assert rows[0] == ["text", "label", "probability_/m/news", "probability_/r/news"]
    for row in rows[1:]:
        assert row[1] in NEWS and float(row[2]) + float(row[3]) == pytest.approx(1.0, abs=2e-6)
        assert row[2] != row[3]


# -- 9b: tables that read back to the input texts -------------------------------------------------

TRICKY = [
    "a tab\there and\tthere",
    "a line\nbreak",
    "windows\r\nline end and a lone \r return",
    "\r cr",  # a carriage return, no line feed: written bare, a reader split the row there
    "ends with a return\r",
    'she said "superb" and ""twice""',
    '"starts with a quote',
    "back\\slash, \\t is no tab, ends with one\\",
    "commas, everywhere, ,",
    "ünïcödé — 日本語 🎬 ‘quotes’",
    "  leading and trailing spaces  ",
]


@pytest.mark.parametrize("suffix, delimiter", [(".tsv", "\t"), (".csv", ",")])
def test_predict_writes_a_table_that_reads_back_to_the_input_texts(capsys, tmp_path, news_run, suffix, delimiter):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(TRICKY)), "utf-8")
    output = tmp_path / f"out{suffix}"
    code, _, err = predict_cli(capsys, news_run, "--input", source, "--output", output)
    assert code == 0, err
    with open(output, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter=delimiter))
    assert rows[0] == ["id", "text", "label", "probability_/m/news", "probability_/r/news"]
    assert [row[1] for row in rows[1:]] == TRICKY and [row[0] for row in rows[1:]] == [
        str(i) for i in range(len(TRICKY))
    ]
    assert all(row[2] in NEWS and len(row) == 5 for row in rows[1:])


# -- 9c: text that is not UTF-8 is refused, never read as garbage ----------------------------------


@pytest.mark.parametrize("encoding, iconv", [("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE")])
def test_predict_refuses_utf16_without_a_byte_order_mark_and_reads_it_with_its_encoding(
    capsys, tmp_path, news_run, encoding, iconv
):
    source = tmp_path / "in.txt"
    source.write_bytes("a gripping film\nthe plot was dull\n".encode(encoding))
    code, out, err = predict_cli(capsys, news_run, "--input", source, "--output", tmp_path / "out.tsv")
    assert code == 2 and out == "" and "Traceback" not in err
    assert str(source) in err and f"UTF-16 ({encoding}) without a byte-order mark" in err, err
    assert f"iconv -f {iconv} -t UTF-8" in err and f"--encoding={encoding}" in err
    assert not (tmp_path / "out.tsv").exists()
    code, _, err = predict_cli(
        capsys, news_run, "--input", source, "--encoding", encoding, "--output", tmp_path / "out.tsv"
    )
    assert code == 0 and "2 predictions written" in err, err


def test_a_nul_byte_after_the_first_block_is_refused_with_its_line(capsys, tmp_path, news_run):
    source = tmp_path / "in.txt"
    source.write_bytes(b"a gripping film\n" * 10_000 + "the plot was dull\n".encode("utf-16-le"))
    code, _, err = predict_cli(capsys, news_run, "--input", source, "--output", tmp_path / "out.tsv")
    assert code == 2 and "line 10001" in err and "NUL" in err and "Traceback" not in err, err
    assert not (tmp_path / "out.tsv").exists()


def kdplug_run(tiny_bert_dir, data: Path, output: Path, *extra: str) -> int:
    return main(["run", *tiny_run_args(teacher=tiny_bert_dir, task="local", data_dir=data, output=output), *extra])


def assert_refused_before_the_teacher(output: Path) -> None:
    cache = Path(os.environ["KDPLUG_CACHE"])
    assert not (cache / "teachers").exists() or not any((cache / "teachers").iterdir())  # nothing fine-tuned
    assert not output.exists()


def test_local_training_data_in_utf16_is_refused_before_the_teacher(capsys, tmp_path, tiny_bert_dir):
    data = tmp_path / "data"
    write_table(data / "dev.csv", ("text", "label"), [(t, y) for t, y in SST2_DEV])
    text = "text,label\n" + "".join(f"{t},{y}\n" for t, y in SST2_TRAIN)
    (data / "train.csv").write_bytes(text.encode("utf-16-le"))
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "train.csv" in err and "UTF-16 (utf-16-le)" in err and "task_options.encoding=utf-16-le" in err, err
    assert_refused_before_the_teacher(tmp_path / "run")


def test_a_transfer_file_in_utf16_is_refused_before_the_teacher(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    transfer = tmp_path / "unlabelled.txt"
    transfer.write_bytes("a film\nanother film\n".encode("utf-16-le"))
    argv = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=sst2_dir, output=tmp_path / "run")
    code = main(["run", *argv, "--transfer", str(transfer)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert str(transfer) in err and "UTF-16 (utf-16-le)" in err and "iconv -f UTF-16LE -t UTF-8" in err, err
    assert_refused_before_the_teacher(tmp_path / "run")


# -- 10: a header line repeated inside the data, labels that differ only in case ------------------


def test_a_header_line_repeated_in_the_data_is_refused_with_its_line(capsys, tmp_path, tiny_bert_dir):
    """Two files joined with ``cat``: the second one's header is not a class named 'sentiment'."""
    data = tmp_path / "data"
    half = len(SST2_TRAIN) // 2
    header = ("text", "sentiment")
    write_table(data / "train.csv", header, [*SST2_TRAIN[:half], header, *SST2_TRAIN[half:]])
    write_table(data / "dev.csv", header, SST2_DEV)
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run", "--set", "task_options.label_column=sentiment")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "train.csv" in err and f"line {half + 2}" in err and "repeats the header line" in err, err
    assert "tail -n +2" in err  # how to join files without their headers
    assert_refused_before_the_teacher(tmp_path / "run")


def test_a_header_line_of_another_layout_is_refused_by_its_label(capsys, tmp_path, tiny_bert_dir):
    """The second file's columns in another order: its header is no repeat, but its label is the column's name."""
    data = tmp_path / "data"
    write_table(data / "train.csv", ("text", "label"), [*SST2_TRAIN[:6], ("label", "text"), *SST2_TRAIN[6:]])
    write_table(data / "dev.csv", ("text", "label"), SST2_DEV)
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and "train.csv, line 8" in err and "probably the header line of another file" in err, err
    assert "the label 'text' is the name of a column" in err
    assert_refused_before_the_teacher(tmp_path / "run")


def test_labels_that_differ_only_in_case_are_refused_with_their_counts_and_lines(capsys, tmp_path, tiny_bert_dir):
    data = tmp_path / "data"
    labels = ("neg", "pos")
    train = [(t, labels[int(y)]) for t, y in SST2_TRAIN]
    train[5] = (train[5][0], "Pos")
    train[9] = (train[9][0], "Pos")
    write_table(data / "train.csv", ("text", "label"), train)
    write_table(data / "dev.csv", ("text", "label"), [(t, labels[int(y)]) for t, y in SST2_DEV])
    count = sum(label == "pos" for _, label in train)
    first = next(i for i, (_, label) in enumerate(train) if label == "pos") + 2
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "train.csv" in err and "differ only in case" in err, err
    assert "'Pos' (2 examples, first on line 7)" in err and f"'pos' ({count} examples, first on line {first})" in err
    assert "task_options.labels=" in err  # the switch that keeps them apart, if they are different classes
    assert_refused_before_the_teacher(tmp_path / "run")
    # declared, the labels are the user's choice: three classes, as written
    code = kdplug_run(
        tiny_bert_dir, data, tmp_path / "run", "--set", "task_options.labels=[neg, Pos, pos]", "--dry-run"
    )
    out, err = capsys.readouterr()
    assert code == 0 and "3 labels (neg, Pos, pos)" in out, err
    # a dev label in another case than the training file's is named as such
    write_table(data / "train.csv", ("text", "label"), [(t, labels[int(y)]) for t, y in SST2_TRAIN])
    write_table(data / "dev.csv", ("text", "label"), [(SST2_DEV[0][0], "Neg"), *[(t, "pos") for t, _ in SST2_DEV]])
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and "dev.csv, line 2" in err and "It differs from 'neg' only in case" in err, err


def test_labels_that_are_one_number_written_two_ways_are_refused_with_their_counts_and_lines(
    capsys, tmp_path, tiny_bert_dir
):
    """``1`` and ``1.0`` (a column saved once as integers, once as floats) were two classes, silently."""
    data = tmp_path / "data"
    train = [(t, str(y)) for t, y in SST2_TRAIN]
    ones = [i for i, (_, y) in enumerate(train) if y == "1"]
    for i in ones[-2:]:
        train[i] = (train[i][0], "1.0")
    write_table(data / "train.csv", ("text", "label"), train)
    write_table(data / "dev.csv", ("text", "label"), SST2_DEV)
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "train.csv" in err and "are one number written two ways" in err, err
    assert f"'1' ({len(ones) - 2} examples, first on line {ones[0] + 2})" in err, err
    assert f"'1.0' (2 examples, first on line {ones[-2] + 2})" in err, err
    assert "e.g. every '1.0' as '1'" in err and """task_options.labels=["0", "1", "1.0"]""" in err, err
    assert_refused_before_the_teacher(tmp_path / "run")
    # a dev label that is a training label's number written another way is named as such
    write_table(data / "train.csv", ("text", "label"), SST2_TRAIN)
    write_table(data / "dev.csv", ("text", "label"), [*SST2_DEV, (SST2_DEV[0][0], "1.0")])
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and f"dev.csv, line {len(SST2_DEV) + 2}" in err, err
    assert "It is the number '1' written another way: write it as '1'." in err, err


def test_an_empty_label_is_refused_with_its_line(capsys, tmp_path, tiny_bert_dir):
    """An empty label cell was a class '' of its own (labels ['', 'neg', 'pos']), silently."""
    data = tmp_path / "data"
    labels = ("neg", "pos")
    train = [(t, labels[int(y)]) for t, y in SST2_TRAIN]
    train[3] = (train[3][0], "")
    train[7] = (train[7][0], "")
    write_table(data / "train.csv", ("text", "label"), train)
    write_table(data / "dev.csv", ("text", "label"), [(t, labels[int(y)]) for t, y in SST2_DEV])
    code = kdplug_run(tiny_bert_dir, data, tmp_path / "run")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "train.csv, line 5" in err and "the label in column 'label' is empty (2 examples without one" in err, err
    assert "Write each example's label, or delete the examples that have none" in err
    assert_refused_before_the_teacher(tmp_path / "run")


def test_a_stored_teacher_with_the_task_s_own_labels_matches_them_by_name():
    """Two labels differing in case, declared on purpose: the checkpoint saved with exactly the task's
    labels is the same list, not "labels kdplug cannot tell apart"."""
    from kdplug_models.labels import match_labels

    labels = ["neg", "Pos", "pos"]
    match = match_labels(dict(enumerate(labels)), labels, source="teacher-dir", what="teacher")
    assert match.order == (0, 1, 2) and not match.reordered
    match = match_labels(dict(enumerate(["pos", "neg", "Pos"])), labels, source="teacher-dir", what="teacher")
    assert match.order == (1, 2, 0)


# -- a fine-tuned teacher is stored under its task's label names -----------------------------------


@pytest.mark.parametrize("labels, reused", [(NEWS, True), (("neg", "pos"), False)])
def test_a_data_set_with_other_label_names_does_not_reuse_the_stored_teacher(
    capsys, monkeypatch, tmp_path, tiny_bert_dir, news_run, news_cache, labels, reused
):
    """The same texts and label indices as the news run's, under other names: another task, whose
    teacher would otherwise be the news run's (then refused, its labels being /m/news and /r/news)."""
    for split, rows in (("train", SST2_TRAIN), ("dev", SST2_DEV)):
        write_table(tmp_path / "data" / f"{split}.csv", ("text", "label"), [(t, labels[int(y)]) for t, y in rows])
    monkeypatch.setenv("KDPLUG_CACHE", str(news_cache))
    declared = "task_options.labels=[" + ", ".join(labels) + "]"
    code = kdplug_run(tiny_bert_dir, tmp_path / "data", tmp_path / "run", "--set", declared, "--dry-run")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ("fine-tuning: 1 epochs" in out) and (f"stored already: {news_cache}" in out) == reused, out

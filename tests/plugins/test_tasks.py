"""The first-party tasks: GLUE readers on files in GLUE's real layouts, metrics against scikit-learn
and scipy, every data problem as a DataError naming file and line, local files, the demo task."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

import kdplug
from kdplug.cli import main
from kdplug.errors import ConfigError, DataError, OfflineError, UnknownComponentError, UsageError
from kdplug_tasks import demo, glue

# --------------------------------------------------------------------------------------------
# GLUE files, written in each task's layout of the original GLUE download
# --------------------------------------------------------------------------------------------

MNLI_TRAIN_HEADER = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
    "label1",
    "gold_label",
]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]
STSB_HEADER = [
    "index",
    "genre",
    "filename",
    "year",
    "old_index",
    "source1",
    "source2",
    "sentence1",
    "sentence2",
    "score",
]

# task -> (folder, header per file (None: no header line), row(index, text_a, text_b, label) -> fields,
#          the label values as the files spell them, in GLUE's label order)
LAYOUTS = {
    "cola": ("CoLA", None, lambda i, a, b, y: ["gj04", y, "" if y == "1" else "*", a], ["0", "1"]),
    "sst2": ("SST-2", ["sentence", "label"], lambda i, a, b, y: [a, y], ["0", "1"]),
    "mrpc": (
        "MRPC",
        ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        lambda i, a, b, y: [y, str(1000 + i), str(2000 + i), a, b],
        ["0", "1"],
    ),
    "qqp": (
        "QQP",
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        lambda i, a, b, y: [str(i), str(2 * i), str(2 * i + 1), a, b, y],
        ["0", "1"],
    ),
    "stsb": (
        "STS-B",
        STSB_HEADER,
        lambda i, a, b, y: [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b, y],
        ["0.000", "1.250", "3.800", "5.000"],
    ),
    "mnli": (
        "MNLI",
        MNLI_TRAIN_HEADER,
        lambda i, a, b, y: [
            str(i),
            "31193",
            f"{i}n",
            "government",
            f"( {a} )",
            f"( {b} )",
            f"(ROOT {a})",
            f"(ROOT {b})",
            a,
            b,
            y,
            y,
        ],
        ["entailment", "neutral", "contradiction"],
    ),
    "qnli": (
        "QNLI",
        ["index", "question", "sentence", "label"],
        lambda i, a, b, y: [str(i), a, b, y],
        ["entailment", "not_entailment"],
    ),
    "rte": (
        "RTE",
        ["index", "sentence1", "sentence2", "label"],
        lambda i, a, b, y: [str(i), a, b, y],
        ["entailment", "not_entailment"],
    ),
}

GLUE_LABELS = {  # GLUE's label order, from the GLUE benchmark's own definitions
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "stsb": (),
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
}


def glue_rows(task, split, n):
    """``n`` rows for a split: texts with GLUE's stray quotes, labels cycling through the label set."""
    _, _, _, values = LAYOUTS[task]
    return [
        (
            f'{split} sentence {i} , said " the {task} witness',
            f"{split} other sentence {i} ' s",
            values[i % len(values)],
        )
        for i in range(n)
    ]


def write_glue_file(path, task, rows, header=None):
    _, default_header, make_row, _ = LAYOUTS[task]
    header = default_header if header is None else header
    lines = ["\t".join(header)] if header else []
    for i, (a, b, y) in enumerate(rows):
        fields = make_row(i, a, b, y)
        if task == "mnli":  # dev files have five annotator labels before gold_label, train one
            fields = fields[:10] + [y] * (len(header) - 10)
        lines.append("\t".join(fields))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_glue_task(root, task, sizes=None):
    """The task's folder under ``root``; returns ``{split: rows}``."""
    folder = root / LAYOUTS[task][0]
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, n in (sizes or {"train": 7, **dict.fromkeys(glue.SPECS[task].dev_splits, 5)}).items():
        header = MNLI_DEV_HEADER if task == "mnli" and split != "train" else None
        written[split] = glue_rows(task, split, n)
        write_glue_file(folder / f"{split}.tsv", task, written[split], header)
    return written


def expected_label(task, value):
    return float(value) if task == "stsb" else LAYOUTS[task][3].index(value)


@pytest.mark.parametrize("task_name", list(LAYOUTS))
def test_glue_reader_reads_the_original_layout(tmp_path, task_name):
    written = write_glue_task(tmp_path, task_name)
    task = kdplug.create_task(task_name, data_dir=str(tmp_path))
    assert isinstance(task, kdplug.Task)
    assert task.labels == GLUE_LABELS[task_name]
    assert task.is_regression == (task_name == "stsb")
    assert task.is_pair == (task_name not in ("cola", "sst2"))
    assert kdplug.num_outputs(task) == (1 if task_name == "stsb" else len(GLUE_LABELS[task_name]))
    for split in ("train", *task.dev_splits):
        examples = task.load_split(split)
        assert [e.text_a for e in examples] == [a for a, _, _ in written[split]]  # stray quotes kept verbatim
        assert [e.text_b for e in examples] == [b if task.is_pair else None for _, b, _ in written[split]]
        assert [e.label for e in examples] == [expected_label(task_name, y) for _, _, y in written[split]]


def test_mnli_has_both_dev_files_and_the_glue_label_order(tmp_path):
    root = tmp_path / "glue_data"
    write_glue_task(root, "mnli", {"train": 6, "dev_matched": 4, "dev_mismatched": 3})
    task = kdplug.create_task("mnli", data_dir=str(root))
    assert task.dev_splits == ("dev_matched", "dev_mismatched")
    assert task.labels == ("entailment", "neutral", "contradiction")
    matched, mismatched = task.load_split("dev_matched"), task.load_split("dev_mismatched")
    assert len(matched) == 4 and len(mismatched) == 3
    assert matched[0].text_a.startswith("dev_matched") and mismatched[0].text_a.startswith("dev_mismatched")
    with pytest.raises(UsageError, match="dev_matched, dev_mismatched"):
        task.load_split("dev")


def test_cola_is_headerless_and_data_dir_may_be_the_task_folder(tmp_path):
    (tmp_path / "train.tsv").write_text(
        "gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThey drank the pub.\n", encoding="utf-8"
    )
    (tmp_path / "dev.tsv").write_text("bc01\t1\t\tThe sailors rode the breeze clear of the rocks.\n", encoding="utf-8")
    task = kdplug.create_task("cola", data_dir=str(tmp_path))
    train = task.load_split("train")
    assert [(e.text_a, e.label) for e in train] == [
        ("Our friends won't buy this analysis.", 1),
        ("They drank the pub.", 0),
    ]
    assert task.main_metric == "matthews"


def test_max_examples_keep_the_first_n(tmp_path):
    write_glue_task(tmp_path, "rte", {"train": 9, "dev": 6})
    full = kdplug.create_task("rte", data_dir=str(tmp_path))
    short = kdplug.create_task("rte", data_dir=str(tmp_path), max_train_examples=4, max_dev_examples=2)
    assert short.load_split("train") == full.load_split("train")[:4]
    assert short.load_split("dev") == full.load_split("dev")[:2]
    with pytest.raises(ConfigError, match="positive integer"):
        kdplug.create_task("rte", data_dir=str(tmp_path), max_train_examples=0)


# --------------------------------------------------------------------------------------------
# Metrics against scikit-learn and scipy
# --------------------------------------------------------------------------------------------

REFERENCE_METRICS = {
    "accuracy": lambda p, r: skm.accuracy_score(r, p),
    "f1": lambda p, r: skm.f1_score(r, p),
    "matthews": lambda p, r: skm.matthews_corrcoef(r, p),
    "pearson": lambda p, r: stats.pearsonr(p, r)[0],
    "spearman": lambda p, r: stats.spearmanr(p, r)[0],
}
MAIN_METRICS = {
    "cola": ("matthews", {"matthews", "accuracy"}),
    "sst2": ("accuracy", {"accuracy"}),
    "mrpc": ("accuracy", {"accuracy", "f1"}),
    "qqp": ("accuracy", {"accuracy", "f1"}),
    "stsb": ("pearson", {"pearson", "spearman"}),
    "mnli": ("accuracy", {"accuracy"}),
    "qnli": ("accuracy", {"accuracy"}),
    "rte": ("accuracy", {"accuracy"}),
}


@pytest.mark.parametrize("task_name", list(LAYOUTS))
def test_glue_metrics_agree_with_sklearn_and_scipy(tmp_path, task_name):
    write_glue_task(tmp_path, task_name, {"train": 2, **dict.fromkeys(glue.SPECS[task_name].dev_splits, 2)})
    task = kdplug.create_task(task_name, data_dir=str(tmp_path))
    rng = np.random.default_rng(len(task_name))
    if task.is_regression:
        references, predictions = rng.uniform(0, 5, 200), rng.uniform(0, 5, 200)
    else:
        references = rng.integers(0, len(task.labels), 200)
        # better than chance, so that the metrics are not all near zero
        predictions = np.where(rng.random(200) < 0.6, references, rng.integers(0, len(task.labels), 200))
    main, names = MAIN_METRICS[task_name]
    scores = task.compute_metrics(predictions.tolist(), references.tolist())
    assert task.main_metric == main and set(scores) == names
    for name, value in scores.items():
        assert value == pytest.approx(REFERENCE_METRICS[name](predictions, references), abs=1e-12)


def test_a_constant_prediction_has_zero_correlation(tmp_path):
    write_glue_task(tmp_path, "stsb", {"train": 2, "dev": 2})
    scores = kdplug.create_task("stsb", data_dir=str(tmp_path)).compute_metrics([2.5] * 4, [0.0, 1.0, 4.0, 5.0])
    assert scores == {"pearson": 0.0, "spearman": 0.0}


def test_compute_metrics_rejects_logits(tmp_path):
    write_glue_task(tmp_path, "sst2", {"train": 2, "dev": 2})
    task = kdplug.create_task("sst2", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="argmax"):
        task.compute_metrics([[0.1, 0.9], [0.8, 0.2]], [1, 0])


# --------------------------------------------------------------------------------------------
# Bad GLUE data: a DataError naming the file and the line or column
# --------------------------------------------------------------------------------------------


def sst2_dir(tmp_path, train_lines, dev_lines=("sentence\tlabel", "a fine film\t1")):
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_text("\n".join(train_lines) + "\n", encoding="utf-8")
    if dev_lines is not None:
        (folder / "dev.tsv").write_text("\n".join(dev_lines) + "\n", encoding="utf-8")
    return kdplug.create_task("sst2", data_dir=str(tmp_path))


def test_missing_file(tmp_path):
    task = sst2_dir(tmp_path, ["sentence\tlabel", "good\t1"], dev_lines=None)
    with pytest.raises(DataError, match=r"dev\.tsv: file not found.*--data-dir") as error:
        task.load_split("dev")
    assert error.value.path.endswith("dev.tsv")


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        kdplug.create_task("sst2", data_dir=str(tmp_path / "nowhere"))


def test_misnamed_column_is_named_with_a_suggestion(tmp_path):
    task = sst2_dir(tmp_path, ["sentence\tlabels", "good\t1"])
    with pytest.raises(DataError, match=r"train\.tsv, line 1: no column 'label'.*Did you mean 'labels'"):
        task.load_split("train")


def test_line_with_the_wrong_number_of_fields(tmp_path):
    task = sst2_dir(tmp_path, ["sentence\tlabel", "good\t1", "a tab\tinside\t0"])
    with pytest.raises(DataError, match=r"train\.tsv, line 3: expected 2 fields.*found 3") as error:
        task.load_split("train")
    assert error.value.line == 3


def test_headerless_cola_line_with_three_fields(tmp_path):
    (tmp_path / "train.tsv").write_text("gj04\t1\t\tfine.\ngj04\t0\tbroken line\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.tsv, line 2: expected 4 fields"):
        kdplug.create_task("cola", data_dir=str(tmp_path)).load_split("train")


def test_label_outside_the_label_set(tmp_path):
    write_glue_task(tmp_path, "rte", {"train": 2, "dev": 2})
    write_glue_file(tmp_path / "RTE" / "dev.tsv", "rte", [("a", "b", "entailment"), ("c", "d", "entailed")])
    task = kdplug.create_task("rte", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"dev\.tsv, line 3: label 'entailed' in column 'label'.*'not_entailment'"):
        task.load_split("dev")


def test_empty_split(tmp_path):
    task = sst2_dir(tmp_path, ["sentence\tlabel", "good\t1"], dev_lines=["sentence\tlabel"])
    with pytest.raises(DataError, match=r"dev\.tsv: no examples"):
        task.load_split("dev")


def test_pair_task_given_single_sentences(tmp_path):
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence1\tlabel\n0\tone sentence only\tentailment\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.tsv, line 1: no column 'sentence2'.*sentence-pair task"):
        kdplug.create_task("rte", data_dir=str(tmp_path)).load_split("train")


def test_stsb_score_that_is_not_a_number(tmp_path):
    write_glue_task(tmp_path, "stsb", {"train": 2, "dev": 2})
    write_glue_file(tmp_path / "STS-B" / "train.tsv", "stsb", [("a", "b", "4.2"), ("c", "d", "n/a")])
    with pytest.raises(DataError, match=r"train\.tsv, line 3: expected a number in column 'score'"):
        kdplug.create_task("stsb", data_dir=str(tmp_path)).load_split("train")


def test_qqp_skips_a_few_malformed_lines_and_counts_them(tmp_path, caplog):
    rows = glue_rows("qqp", "train", 300)
    write_glue_task(tmp_path, "qqp", {"train": 1, "dev": 2})
    path = tmp_path / "QQP" / "train.tsv"
    write_glue_file(path, "qqp", rows)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines.insert(11, "12345\t67\t89\ta question broken by a newline")  # becomes line 12
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="kdplug_tasks.glue"):
        examples = kdplug.create_task("qqp", data_dir=str(tmp_path)).load_split("train")
    assert [e.text_a for e in examples] == [a for a, _, _ in rows]
    assert "skipped 1 malformed line(s) (12)" in caplog.text


def test_qqp_with_many_malformed_lines_is_the_wrong_file(tmp_path):
    write_glue_task(tmp_path, "qqp", {"train": 1, "dev": 2})
    path = tmp_path / "QQP" / "train.tsv"
    path.write_text("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n" + "1\t2\tonly three\n" * 5, encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.tsv: 5 of 5 lines \(first: line 2\)"):
        kdplug.create_task("qqp", data_dir=str(tmp_path)).load_split("train")


# --------------------------------------------------------------------------------------------
# The hub copy: converted like the files, OfflineError fast when the hub is unreachable
# --------------------------------------------------------------------------------------------


def test_hub_copy_is_converted_in_glue_label_order(monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = {"premise": ["p0", "p1", "p2"], "hypothesis": ["h0", "h1", "h2"], "label": [2, 0, 1], "idx": [0, 1, 2]}
    fake = datasets.DatasetDict(
        {split: datasets.Dataset.from_dict(rows) for split in ("train", "validation_matched", "validation_mismatched")}
    )
    monkeypatch.setattr(glue, "load_hub_copy", lambda spec: fake)
    task = kdplug.create_task("mnli", max_dev_examples=2)
    assert [(e.text_a, e.text_b, e.label) for e in task.load_split("train")] == [
        ("p0", "h0", 2),
        ("p1", "h1", 0),
        ("p2", "h2", 1),
    ]
    assert len(task.load_split("dev_mismatched")) == 2


def test_unreachable_hub_raises_offline_error_fast(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    start = time.monotonic()
    with pytest.raises(OfflineError, match="pass --data-dir with the GLUE files"):
        kdplug.create_task("sst2")
    assert time.monotonic() - start < 5


def test_hub_offline_mode_without_a_cached_copy_raises_offline_error(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(OfflineError, match="--data-dir"):
        kdplug.create_task("rte")
    assert time.monotonic() - start < 10


# --------------------------------------------------------------------------------------------
# Registry: names, suggestions, options
# --------------------------------------------------------------------------------------------


def test_every_task_is_registered():
    assert set(kdplug.list_tasks()) >= {*LAYOUTS, "local", "demo"}


def test_unknown_task_suggests_the_close_name():
    with pytest.raises(UnknownComponentError, match="Did you mean 'sst2'") as error:
        kdplug.create_task("sst-2")
    assert error.value.suggestions[0] == "sst2"


def test_unknown_option_suggests_the_close_name(tmp_path):
    with pytest.raises(ConfigError, match="no option 'label_nosie'.*Did you mean 'label_noise'"):
        kdplug.create_task("demo", label_nosie=0.1)


# --------------------------------------------------------------------------------------------
# The local task
# --------------------------------------------------------------------------------------------

TRAIN = [
    ("a lovely day", "pos"),
    ("a dreadful day", "neg"),
    ("fine weather", "pos"),
    ("cold rain", "neg"),
    ("warm sun", "pos"),
]
DEV = [("a fine day", "pos"), ("grey fog", "neg")]


def write_local(path, rows, fmt, columns=("text", "label")):
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(dict(zip(columns, row))) + "\n" for row in rows), encoding="utf-8")
    else:
        import csv

        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(
                handle,
                delimiter="\t" if fmt == "tsv" else ",",
                lineterminator="\n",
                quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
            )
            writer.writerow(columns)
            writer.writerows(rows)


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_local_classification_in_every_format(tmp_path, fmt):
    write_local(tmp_path / f"train.{fmt}", TRAIN, fmt)
    write_local(tmp_path / f"dev.{fmt}", DEV, fmt)
    task = kdplug.create_task("local", data_dir=str(tmp_path))
    assert task.labels == ("neg", "pos")  # sorted, from the training file
    assert not task.is_pair and not task.is_regression and task.main_metric == "accuracy"
    assert [(e.text_a, task.labels[e.label]) for e in task.load_split("train")] == TRAIN
    assert [(e.text_a, task.labels[e.label]) for e in task.load_split("dev")] == DEV


def test_local_csv_with_quoted_commas_and_declared_labels(tmp_path):
    write_local(tmp_path / "a.csv", [("well, that was great", "pos"), ('she said "no", twice', "neg")], "csv")
    write_local(tmp_path / "b.csv", [("meh, fine", "pos")], "csv")
    task = kdplug.create_task(
        "local", train_file=str(tmp_path / "a.csv"), dev_file=str(tmp_path / "b.csv"), labels=["pos", "neg"]
    )
    assert task.labels == ("pos", "neg")
    assert [(e.text_a, e.label) for e in task.load_split("train")] == [
        ("well, that was great", 0),
        ('she said "no", twice', 1),
    ]


@pytest.mark.parametrize("declared", [None, '[pos, neg, "no"]'])
def test_a_dev_label_missing_from_train_advises_a_command_that_works(tmp_path, capsys, tiny_bert_dir, declared):
    """The advice is the --set that declares every label, and running it gets past the data."""
    write_local(tmp_path / "train.csv", [("good film", "pos"), ("bad film", "neg"), ("so-so", "no")], "csv")
    write_local(tmp_path / "dev.csv", [("fine, I guess", "maybe, yes"), ("great", "pos")], "csv")
    argv = ["run", "--dry-run", "--teacher", tiny_bert_dir, "--task", "local", "--data-dir", str(tmp_path)]
    argv += ["--set", "allow_weak_teacher=true"]  # two dev examples: too few to judge a teacher
    argv += ["--set", f"task_options.labels={declared}"] if declared else []
    assert main([*argv, "--output", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    found = re.search(r"--set '(task_options\.labels=[^']*)'", err)
    assert "label 'maybe, yes' in column 'label' is not in the label set" in err and found, err
    expected = '[pos, neg, "no", "maybe, yes"]' if declared else '["maybe, yes", neg, "no", pos]'
    assert found.group(1) == f"task_options.labels={expected}"  # quoted where YAML would read a boolean, or 2 labels
    assert main([*argv, "--set", found.group(1), "--output", str(tmp_path / "run")]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
def test_local_regression_pairs(tmp_path, fmt):
    columns = ("first", "second", "similarity")
    rows = [("a cat", "a kitten", 4.5), ("a car", "the sea", 0.25), ("rain", "drizzle", 3.0)]
    write_local(tmp_path / f"train.{fmt}", rows, fmt, columns)
    write_local(tmp_path / f"dev.{fmt}", rows[:2], fmt, columns)
    task = kdplug.create_task(
        "local",
        data_dir=str(tmp_path),
        text_column="first",
        text_pair_column="second",
        label_column="similarity",
        regression=True,
    )
    assert task.is_regression and task.is_pair and task.labels == () and kdplug.num_outputs(task) == 1
    assert [(e.text_a, e.text_b, e.label) for e in task.load_split("train")] == rows
    scores = task.compute_metrics([4.0, 1.0], [4.5, 0.25])
    assert set(scores) == {"pearson", "spearman"} and task.main_metric == "pearson"


def test_local_jsonl_integer_labels(tmp_path):
    write_local(tmp_path / "train.jsonl", [("x", 1), ("y", 0), ("z", 2)], "jsonl")
    write_local(tmp_path / "dev.jsonl", [("w", 2)], "jsonl")
    task = kdplug.create_task("local", data_dir=str(tmp_path))
    assert task.labels == ("0", "1", "2") and task.load_split("dev")[0].label == 2


def test_local_label_outside_the_set_names_file_and_line(tmp_path):
    write_local(tmp_path / "train.tsv", TRAIN, "tsv")
    write_local(tmp_path / "dev.tsv", DEV + [("so-so", "neutral")], "tsv")
    task = kdplug.create_task("local", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"dev\.tsv, line 4: label 'neutral'.*labels=\[") as error:
        task.load_split("dev")
    assert error.value.line == 4


def test_local_bad_inputs(tmp_path):
    write_local(tmp_path / "train.jsonl", TRAIN, "jsonl")
    write_local(tmp_path / "dev.jsonl", DEV, "jsonl")
    with pytest.raises(DataError, match=r"train\.jsonl, line 1: no value for 'review'"):
        kdplug.create_task("local", data_dir=str(tmp_path), text_column="review")
    with pytest.raises(DataError, match=r"line 1: no value for 'hypothesis'"):
        kdplug.create_task("local", data_dir=str(tmp_path), text_pair_column="hypothesis")
    (tmp_path / "dev.jsonl").write_text('{"text": "ok", "label": "pos"}\n{"text": "cut off', encoding="utf-8")
    with pytest.raises(DataError, match=r"dev\.jsonl, line 2: not valid JSON"):
        kdplug.create_task("local", data_dir=str(tmp_path))
    (tmp_path / "dev.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match=r"dev\.jsonl: no examples"):
        kdplug.create_task("local", data_dir=str(tmp_path))
    write_local(tmp_path / "dev.tsv", DEV, "tsv")
    with pytest.raises(DataError, match="several candidates: dev.tsv, dev.jsonl"):
        kdplug.create_task("local", data_dir=str(tmp_path))


def test_local_csv_line_with_the_wrong_number_of_fields(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\ngood,pos\nbad, really,neg\n", encoding="utf-8")
    write_local(tmp_path / "dev.csv", DEV, "csv")
    with pytest.raises(DataError, match=r"train\.csv, line 3: expected 2 fields.*quoted"):
        kdplug.create_task("local", data_dir=str(tmp_path))


def test_local_needs_files_and_consistent_options(tmp_path):
    with pytest.raises(ConfigError, match="train_file"):
        kdplug.create_task("local")
    with pytest.raises(DataError, match="train.tsv, train.csv, train.jsonl"):
        kdplug.create_task("local", data_dir=str(tmp_path))
    write_local(tmp_path / "train.tsv", [("a", "pos"), ("b", "pos")], "tsv")
    write_local(tmp_path / "dev.tsv", DEV, "tsv")
    with pytest.raises(DataError, match="at least two labels"):
        kdplug.create_task("local", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="regression"):
        kdplug.create_task("local", data_dir=str(tmp_path), regression=True, labels=["a", "b"])


# --------------------------------------------------------------------------------------------
# The demo task
# --------------------------------------------------------------------------------------------


def test_demo_is_deterministic_under_a_seed_and_differs_across_seeds():
    first, again = kdplug.create_task("demo", seed=3), kdplug.create_task("demo", seed=3)
    other = kdplug.create_task("demo", seed=4)
    for split in ("train", "dev"):
        assert first.load_split(split) == again.load_split(split)
        assert first.load_split(split) != other.load_split(split)
    assert first.labels == ("negative", "positive") and first.main_metric == "accuracy"


def test_demo_sizes_balance_and_disjoint_splits():
    task = kdplug.create_task("demo", num_train=300, num_dev=120)
    train, dev = task.load_split("train"), task.load_split("dev")
    assert len(train) == 300 and len(dev) == 120
    assert Counter(e.label for e in dev) == {0: 60, 1: 60}
    assert 0.4 < np.mean([e.label for e in train]) < 0.6
    assert not {e.text_a for e in train} & {e.text_a for e in dev}
    assert len({e.text_a for e in train}) == 300


def test_demo_label_noise_flips_exactly_that_fraction_of_train_labels_only():
    clean = demo.generate(num_train=200, num_dev=50, seed=1, label_noise=0.0)
    noisy = demo.generate(num_train=200, num_dev=50, seed=1, label_noise=0.2)
    assert [e.text_a for e in clean["train"]] == [e.text_a for e in noisy["train"]]
    assert sum(a.label != b.label for a, b in zip(clean["train"], noisy["train"])) == 40
    assert clean["dev"] == noisy["dev"]


def test_demo_dev_words_are_mostly_rare_in_train():
    data = demo.generate(seed=0)
    sentiment = set(demo.POSITIVE) | set(demo.NEGATIVE)

    def words(examples):
        return [w.strip(",.;") for e in examples for w in e.text_a.lower().split() if w.strip(",.;") in sentiment]

    seen = Counter(words(data["train"]))
    dev_words = words(data["dev"])
    rare = sum(seen[word] <= 2 for word in dev_words) / len(dev_words)
    assert rare > 0.25  # a student from scratch has not learned these words; a pretrained teacher knows them


def test_demo_contrast_decides_by_the_clause_after_but():
    data = demo.generate(num_train=800, num_dev=10, seed=0, label_noise=0.0)
    checked = 0
    for example in data["train"]:
        text = example.text_a.lower()
        parts = re.split(r", but |; however, |, yet ", text)
        if len(parts) != 2 or re.search(r"\bnot\b|never|n't|hardly|far from", text):
            continue
        after = " " + parts[1].replace(".", " .")
        polarities = {1 for w in demo.POSITIVE if f" {w} ." in after} | {0 for w in demo.NEGATIVE if f" {w} ." in after}
        if len(polarities) == 1:
            assert polarities == {example.label}, text
            checked += 1
    assert checked > 20


def test_demo_rejects_bad_options():
    with pytest.raises(ConfigError, match="label_noise"):
        kdplug.create_task("demo", label_noise=0.7)
    with pytest.raises(ConfigError, match="num_train"):
        kdplug.create_task("demo", num_train=-5)


# -- data from Hugging Face datasets ---------------------------------------------------------------


def review_dataset(class_label=True):
    import datasets

    label = datasets.ClassLabel(names=["negative", "positive"]) if class_label else datasets.Value("int64")
    features = datasets.Features({"review": datasets.Value("string"), "label": label})
    rows = {"train": (["good film", "bad plot", "fine music"], [1, 0, 1]), "validation": (["great", "awful"], [1, 0])}
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict({"review": texts, "label": labels}, features=features)
            for split, (texts, labels) in rows.items()
        }
    )


def test_local_reads_a_saved_dataset_dict_with_its_label_names(tmp_path):
    review_dataset().save_to_disk(str(tmp_path / "saved"))
    task = kdplug.create_task("local", str(tmp_path / "saved"), text_column="review")
    assert task.labels == ("negative", "positive")  # from the ClassLabel feature, in its order
    assert [(e.text_a, e.label) for e in task.load_split("train")] == [
        ("good film", 1),
        ("bad plot", 0),
        ("fine music", 1),
    ]
    assert [e.text_a for e in task.load_split("dev")] == ["great", "awful"]  # the validation split


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_local_reads_parquet_and_arrow_files(tmp_path, suffix):
    data = review_dataset(class_label=False)
    for split, name in (("train", "train"), ("validation", "dev")):
        if suffix == ".parquet":
            data[split].to_parquet(str(tmp_path / f"{name}.parquet"))
        else:
            data[split].save_to_disk(str(tmp_path / f"saved-{name}"))
            arrow = next((tmp_path / f"saved-{name}").glob("*.arrow"))
            arrow.rename(tmp_path / f"{name}.arrow")
    task = kdplug.create_task("local", str(tmp_path), text_column="review")
    assert task.labels == ("0", "1") and len(task.load_split("train")) == 3 and len(task.load_split("dev")) == 2


def test_dataset_columns_that_do_not_match_are_clear_errors(tmp_path):
    review_dataset().save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"no column 'text'.*'review', 'label'.*task_options.text_column"):
        kdplug.create_task("local", str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"no 'train' split.*'training'.*task_options.train_split"):
        kdplug.create_task("local", str(tmp_path / "saved"), text_column="review", train_split="training")


def test_glue_reads_a_saved_copy_of_the_hub_dataset(tmp_path):
    import datasets

    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["negative", "positive"]),
            "idx": datasets.Value("int32"),
        }
    )
    glue = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {"sentence": ["a fine film", "a dull film"], "label": [1, 0], "idx": [0, 1]}, features=features
            )
            for split in ("train", "validation", "test")
        }
    )
    glue.save_to_disk(str(tmp_path / "sst2"))
    task = kdplug.create_task("sst2", str(tmp_path / "sst2"))
    assert [(e.text_a, e.label) for e in task.load_split("dev")] == [("a fine film", 1), ("a dull film", 0)]

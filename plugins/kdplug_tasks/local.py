"""The ``local`` task: the user's own data, classification or regression.

    kdplug run --task local --data-dir my_data/ --set task_options.text_column=review

reads ``my_data/train.{tsv,csv,jsonl,parquet,arrow}`` and ``my_data/dev.*``; ``train_file`` /
``dev_file`` name the files directly (relative to ``data_dir`` when both are given). The format
comes from the extension: TSV is split on tabs with quoting disabled (like GLUE), CSV uses
standard quoting, JSONL holds one object per line (TSV and CSV need a header line); Parquet and
Arrow files are read with ``datasets``. ``data_dir`` may also be a directory written by
``DatasetDict.save_to_disk`` (its ``train`` split and ``validation``, ``dev`` or ``test``), and
the Python API passes a ``DatasetDict`` in memory (option ``dataset``). A ``ClassLabel`` column
brings its label names.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from typing import Any, Optional

import kdplug
from kdplug.errors import ConfigError, DataError
from kdplug.textio import yaml_word
from kdplug.types import Example

from . import hfdatasets
from .base import DataTask, check_count, label_index, parse_score, reject_unknown_options, require_examples
from .tables import FORMATS, read_records

OPTIONS = (
    "train_file",
    "dev_file",
    "text_column",
    "text_pair_column",
    "label_column",
    "labels",
    "regression",
    "max_train_examples",
    "max_dev_examples",
    "encoding",
    "dataset",
    "train_split",
    "dev_split",
)
#: every extension a split file may have
EXTENSIONS = (*FORMATS, *hfdatasets.DATASET_FORMATS)
#: the option that names each role's column, for error messages
COLUMN_OPTIONS = {"text_a": "text_column", "text_b": "text_pair_column", "label": "label_column"}


def label_text(value: Any) -> str:
    """A label as a string, whatever the file stored: ``"pos"``, ``1`` and ``true`` alike."""
    return value.strip() if isinstance(value, str) else json.dumps(value)


def find_split_file(data_dir: str, split: str) -> str:
    """``data_dir/<split>.{tsv,csv,jsonl,parquet,arrow}``: exactly one of them must exist."""
    if not os.path.isdir(data_dir):
        raise DataError(
            "the data directory does not exist; pass --data-dir with your train and dev "
            "files, or name them with train_file and dev_file.",
            path=data_dir,
        )
    found = [
        os.path.join(data_dir, split + ext) for ext in EXTENSIONS if os.path.isfile(os.path.join(data_dir, split + ext))
    ]
    if len(found) != 1:
        problem = "several candidates: " + ", ".join(map(os.path.basename, found)) if found else "none found"
        raise DataError(
            f"expected exactly one {split} file named {', '.join(split + ext for ext in EXTENSIONS)} "
            f"({problem}), or a directory written by DatasetDict.save_to_disk; or name the file with "
            f"the option {split}_file.",
            path=data_dir,
        )
    return found[0]


def resolve_file(data_dir: Optional[str], given: Optional[str], split: str) -> str:
    if given is not None:
        given = os.fspath(given)
        return os.path.join(data_dir, given) if data_dir is not None and not os.path.isabs(given) else given
    if data_dir is None:
        raise ConfigError(
            f"the local task needs its files: pass --data-dir with train and dev files, or set "
            f"task_options.train_file and task_options.dev_file (missing: {split}_file)."
        )
    return find_split_file(os.fspath(data_dir), split)


def local_task(
    data_dir: Optional[str] = None,
    *,
    train_file: Optional[str] = None,
    dev_file: Optional[str] = None,
    text_column: str = "text",
    text_pair_column: Optional[str] = None,
    label_column: str = "label",
    labels: Optional[Sequence[Any]] = None,
    regression: bool = False,
    max_train_examples: Optional[int] = None,
    max_dev_examples: Optional[int] = None,
    encoding: Optional[str] = None,
    dataset: Any = None,
    train_split: Optional[str] = None,
    dev_split: Optional[str] = None,
    **unknown: Any,
) -> DataTask:
    """The user's files as a task.

    ``labels`` fixes the label set and its order (class i = ``labels[i]``); without it the
    label set is every value of the training file's label column, sorted. ``regression=True``
    reads the label column as a float target. ``text_pair_column`` makes it a sentence-pair task.
    ``encoding`` reads files that are not UTF-8 (``latin-1``, ``cp1252``; a byte-order mark is
    recognised by itself). ``dataset`` is a ``datasets.DatasetDict`` in memory (the Python API);
    ``train_split`` / ``dev_split`` name its splits, or those of a saved one in ``data_dir``.
    """
    reject_unknown_options("local", unknown, OPTIONS)
    limits = dict(
        max_train_examples=check_count("max_train_examples", max_train_examples),
        max_dev_examples=check_count("max_dev_examples", max_dev_examples),
    )
    if regression and labels is not None:
        raise ConfigError("the local task got both regression=true and labels; a regression task has no label set.")
    if labels is not None and (
        isinstance(labels, (str, bytes)) or len(set(map(label_text, labels))) != len(labels) or len(labels) < 2
    ):
        raise ConfigError(f"option labels must be a list of at least two distinct labels, got {labels!r}.")
    columns = {"text_a": text_column, "text_b": text_pair_column, "label": label_column}
    if dataset is not None or (data_dir is not None and train_file is None and hfdatasets.is_dataset_dir(data_dir)):
        where = "the dataset given in memory" if dataset is not None else os.fspath(data_dir)
        loaded = dataset if dataset is not None else hfdatasets.load_dataset_dict(where)
        splits = {
            "train": hfdatasets.pick_split(loaded, "train", where, train_split),
            "dev": hfdatasets.pick_split(loaded, "dev", where, dev_split),
        }
        files = {split: f"{where} ({split})" for split in splits}
        records = {
            split: require_examples(
                list(hfdatasets.dataset_records(data, columns, files[split], COLUMN_OPTIONS)), path=files[split]
            )
            for split, data in splits.items()
        }
        class_names = hfdatasets.label_names(splits["train"], label_column)
    else:
        files = {"train": resolve_file(data_dir, train_file, "train"), "dev": resolve_file(data_dir, dev_file, "dev")}
        records, class_names = {}, None
        for split, path in files.items():
            if os.path.splitext(path)[1].lower() in hfdatasets.DATASET_FORMATS:
                data = hfdatasets.load_file(path)
                class_names = class_names or hfdatasets.label_names(data, label_column)
                rows = hfdatasets.dataset_records(data, columns, path, COLUMN_OPTIONS)
            else:
                rows = read_records(path, columns, encoding=encoding, options=COLUMN_OPTIONS)
            records[split] = require_examples(list(rows), path=path)

    if regression:
        label_set: tuple[str, ...] = ()
    elif labels is not None:
        label_set = tuple(label_text(label) for label in labels)
    elif class_names:  # a ClassLabel column: its own names, in its own order; rows hold indices
        label_set = class_names
    else:
        label_set = tuple(sorted({label_text(record["label"]) for _, record in records["train"]}))
        if len(label_set) == 1:
            raise DataError(
                f"every example has the label {label_set[0]!r} in column {label_column!r}; a "
                f"classification task needs at least two labels (or set regression=true).",
                path=files["train"],
            )
    declared = "declared by the option labels" if labels is not None else f"found in {files['train']}"

    def declare_all(unknown: str) -> str:
        """The option that makes ``unknown`` a label too (declared labels keep their order; found ones are sorted)."""
        every = [*label_set, unknown] if labels is not None else sorted({*label_set, unknown})
        value = "task_options.labels=[" + ", ".join(yaml_word(label) for label in every) + "]"
        return f"declare every label, in class order: --set {shlex.quote(value)} (labels=[...] in Python)."

    def example(path: str, line: int, record: dict[str, Any]) -> Example:
        value = record["label"]
        if regression:
            label: float | int = parse_score(value, column=label_column, path=path, line=line)
        elif class_names and labels is None and isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < len(class_names):
                raise DataError(
                    f"label index {value} in column {label_column!r} is outside the dataset's "
                    f"{len(class_names)} classes",
                    path=path,
                    line=line,
                )
            label = value
        else:
            label = label_index(
                label_text(record["label"]),
                label_set,
                column=label_column,
                path=path,
                line=line,
                hint=f"The label set was {declared}; fix the label, or {declare_all(label_text(record['label']))}",
            )
        text_b = str(record["text_b"]) if text_pair_column is not None else None
        return Example(text_a=str(record["text_a"]), text_b=text_b, label=label)

    def reader(split: str, limit: Optional[int]) -> list[Example]:
        rows = records[split][:limit] if limit is not None else records[split]
        return [example(files[split], line, record) for line, record in rows]

    return DataTask(
        name="local",
        labels=label_set,
        is_pair=text_pair_column is not None,
        metrics=("pearson", "spearman") if regression else ("accuracy", "macro_f1"),
        main_metric="pearson" if regression else "accuracy",
        reader=reader,
        is_regression=regression,
        source=f"{files['train']} + {files['dev']}",
        text_columns=(text_column,) if text_pair_column is None else (text_column, text_pair_column),
        **limits,
    )


@kdplug.hookimpl
def kdplug_register_tasks(register):
    register(
        "local",
        local_task,
        description="your own TSV/CSV/JSONL/Parquet/Arrow files or a saved DatasetDict "
        "(options: train_file, dev_file, text_column, text_pair_column, "
        "label_column, labels, regression, encoding)",
    )

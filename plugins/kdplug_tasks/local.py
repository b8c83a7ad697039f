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
import math
import os
import shlex
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import kdplug
from kdplug.errors import ConfigError, DataError
from kdplug.textio import yaml_word

from . import hfdatasets
from .base import DataTask, check_count, label_index, parse_score, reject_unknown_options, require_examples
from .columns import ExampleTable, RecordTable
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
    _check_label_options(labels, regression)
    columns = {"text_a": text_column, "text_b": text_pair_column, "label": label_column}
    if dataset is not None or (data_dir is not None and train_file is None and hfdatasets.is_dataset_dir(data_dir)):
        files, records, class_names = _dataset_records(dataset, data_dir, train_split, dev_split, columns)
    else:
        files, records, class_names = _file_records(data_dir, train_file, dev_file, columns, encoding)
    label_set = _label_set(labels, regression, class_names, records, columns, files["train"])
    examples = _ExampleReader(
        label_set=label_set,
        declared_labels=labels is not None,
        class_names=class_names,
        regression=regression,
        label_column=label_column,
        pairs=text_pair_column is not None,
        declared="declared by the option labels" if labels is not None else f"found in {files['train']}",
    )

    def reader(split: str, limit: Optional[int]) -> ExampleTable:
        table = records[split]
        count = len(table) if limit is None else min(limit, len(table))
        texts_b = table.texts["text_b"] if text_pair_column is not None else None
        return ExampleTable(table.texts["text_a"], texts_b, examples.labels(files[split], table, count), count)

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


#: (split -> where it came from, split -> its records, the ClassLabel names or None)
_Records = tuple[dict[str, str], dict[str, RecordTable], Optional[tuple[str, ...]]]
#: the roles whose values are texts (stored as strings), beside the label
TEXT_ROLES = ("text_a", "text_b")


def _check_label_options(labels: Optional[Sequence[Any]], regression: bool) -> None:
    if regression and labels is not None:
        raise ConfigError("the local task got both regression=true and labels; a regression task has no label set.")
    if labels is not None and (
        isinstance(labels, (str, bytes)) or len(set(map(label_text, labels))) != len(labels) or len(labels) < 2
    ):
        raise ConfigError(f"option labels must be a list of at least two distinct labels, got {labels!r}.")


def _dataset_records(
    dataset: Any, data_dir: Optional[str], train_split: Optional[str], dev_split: Optional[str], columns: dict
) -> _Records:
    """The records of a ``DatasetDict``: the one given in memory, else the one saved in ``data_dir``."""
    where = "the dataset given in memory" if dataset is not None else os.fspath(data_dir)
    loaded = dataset if dataset is not None else hfdatasets.load_dataset_dict(where)
    splits = {
        "train": hfdatasets.pick_split(loaded, "train", where, train_split),
        "dev": hfdatasets.pick_split(loaded, "dev", where, dev_split),
    }
    files = {split: f"{where} ({split})" for split in splits}
    records = {
        split: require_examples(
            RecordTable(hfdatasets.dataset_records(data, columns, files[split], COLUMN_OPTIONS), TEXT_ROLES),
            path=files[split],
        )
        for split, data in splits.items()
    }
    return files, records, hfdatasets.label_names(splits["train"], columns["label"])


def _file_records(
    data_dir: Optional[str], train_file: Optional[str], dev_file: Optional[str], columns: dict, encoding: Optional[str]
) -> _Records:
    """The records of the train and dev files: tables by their extension, Parquet and Arrow through ``datasets``."""
    files = {"train": resolve_file(data_dir, train_file, "train"), "dev": resolve_file(data_dir, dev_file, "dev")}
    records, class_names = {}, None
    for split, path in files.items():
        if os.path.splitext(path)[1].lower() in hfdatasets.DATASET_FORMATS:
            data = hfdatasets.load_file(path)
            class_names = class_names or hfdatasets.label_names(data, columns["label"])
            rows = hfdatasets.dataset_records(data, columns, path, COLUMN_OPTIONS)
        else:
            rows = read_records(path, columns, encoding=encoding, options=COLUMN_OPTIONS)
        records[split] = require_examples(RecordTable(rows, TEXT_ROLES), path=path)
    return files, records, class_names


def _label_set(
    labels: Optional[Sequence[Any]],
    regression: bool,
    class_names: Optional[tuple[str, ...]],
    records: dict[str, RecordTable],
    columns: dict[str, Optional[str]],
    train_file: str,
) -> tuple[str, ...]:
    """The class names in class order: none for regression, the declared ones, the ClassLabel
    column's, else every label the training file holds, sorted."""
    if regression:
        return ()
    if labels is not None:
        return tuple(label_text(label) for label in labels)
    if class_names:  # a ClassLabel column: its own names, in its own order; rows hold indices
        return class_names
    label_set = tuple(sorted({label_text(value) for value in records["train"].distinct("label")}))
    _check_found_labels(label_set, records["train"], columns, train_file)
    if len(label_set) == 1:
        raise DataError(
            f"every example has the label {label_set[0]!r} in column {columns['label']!r}; a "
            f"classification task needs at least two labels (or set regression=true).",
            path=train_file,
        )
    return label_set


def _check_found_labels(label_set: tuple[str, ...], table: RecordTable, columns: dict, train_file: str) -> None:
    """Labels read from the training file that are a mistake far more often than a class: a column's
    name (a header line of another file), an empty label, and labels spelt two ways (case, number)."""
    names = [label for label in label_set if label in columns.values()]
    if names:
        raise DataError(
            f"the label {names[0]!r} is the name of a column: this line is probably the header line of another "
            f"file joined to this one, and would be an example of a class {names[0]!r}. Delete it; to join files, "
            f"keep the first one's header only (tail -n +2 second.csv >> first.csv).",
            path=train_file,
            line=_label_lines(table)[names[0]][1],
        )
    if "" in label_set:
        count, line = _label_lines(table)[""]
        raise DataError(
            f"the label in column {columns['label']!r} is empty ({_examples(count)} without one, the first on this "
            f"line): an empty label would be a class of its own. Write each example's label, or delete the "
            f"examples that have none.",
            path=train_file,
            line=line,
        )
    for how, spelling_key, alike in (
        ("differ only in case", str.casefold, "e.g. all lower-case"),
        ("are one number written two ways", _number, "e.g. every {others} as {first}"),
    ):
        _refuse_spellings(how, spelling_key, alike, label_set, table, columns["label"], train_file)


def _number(label: str) -> Optional[float]:
    """The finite number ``label`` spells (``1``, ``1.0`` and ``1e0`` alike), if it spells one."""
    try:
        value = float(label)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _refuse_spellings(
    how: str, spelling_key, alike: str, label_set: tuple[str, ...], table: RecordTable, label_column: str, path: str
) -> None:
    """Refuse labels that ``spelling_key`` takes for one: a class written two ways, far more often than two
    classes. ``alike`` is the advice on writing them alike, given the first clash's ``first`` and ``others``."""
    by_key: dict[Any, list[str]] = {}
    for label in label_set:
        key = spelling_key(label)
        if key is not None:
            by_key.setdefault(key, []).append(label)
    clashes = [spellings for spellings in by_key.values() if len(spellings) > 1]
    if not clashes:
        return
    found = _label_lines(table)
    named = "; ".join(
        " and ".join(
            f"{label!r} ({_examples(found[label][0])}, first on line {found[label][1]})" for label in spellings
        )
        for spellings in clashes
    )
    declared = "task_options.labels=[" + ", ".join(yaml_word(label) for label in label_set) + "]"
    advice = alike.format(first=repr(clashes[0][0]), others=" and ".join(map(repr, clashes[0][1:])))
    raise DataError(
        f"labels in column {label_column!r} that {how}: {named}. Each spelling would be a class of its own. If they "
        f"are one class, write them alike in the file ({advice}); if they are different classes, declare every "
        f"label, in class order: --set {shlex.quote(declared)} (labels=[...] in Python).",
        path=path,
    )


def _examples(count: int) -> str:
    return f"{count} example{'s' if count != 1 else ''}"


def _label_lines(table: RecordTable) -> dict[str, tuple[int, int]]:
    """Each label of ``table`` (as :func:`label_text` spells it): how many records hold it, and the
    line of the first."""
    codes = np.frombuffer(table.codes["label"], dtype=np.dtype(table.codes["label"].typecode))
    seen, first, counts = np.unique(codes, return_index=True, return_counts=True)
    found: dict[str, tuple[int, int]] = {}
    for code, index, count in zip(seen.tolist(), first.tolist(), counts.tolist()):
        label, line = label_text(table.values["label"][code]), table.lines[index]
        earlier = found.get(label, (0, line))
        found[label] = (earlier[0] + count, min(earlier[1], line))
    return found


@dataclass(frozen=True)
class _ExampleReader:
    """A record as an :class:`Example`: its label a score, a ClassLabel index, or its text's class."""

    label_set: tuple[str, ...]
    declared_labels: bool  # the option labels fixed the label set and its order
    class_names: Optional[tuple[str, ...]]
    regression: bool
    label_column: str
    pairs: bool
    declared: str  # where the label set came from, for messages

    def declare_all(self, unknown: str) -> str:
        """The option that makes ``unknown`` a label too (declared labels keep their order; found ones are sorted)."""
        every = [*self.label_set, unknown] if self.declared_labels else sorted({*self.label_set, unknown})
        value = "task_options.labels=[" + ", ".join(yaml_word(label) for label in every) + "]"
        return f"declare every label, in class order: --set {shlex.quote(value)} (labels=[...] in Python)."

    def labels(self, path: str, table: RecordTable, count: int) -> array:
        """The labels of the first ``count`` records of ``table``: each distinct value is read once,
        at its first line (where an error about it points)."""
        read: dict[int, float | int] = {}
        codes, values, lines = table.codes["label"], table.values["label"], table.lines
        labels = array("d" if self.regression else "q")
        for index in range(count):
            code = codes[index]
            if code not in read:
                read[code] = self.label(path, lines[index], values[code])
            labels.append(read[code])
        return labels

    def label(self, path: str, line: int, value: Any) -> float | int:
        if self.regression:
            return parse_score(value, column=self.label_column, path=path, line=line)
        if self.class_names and not self.declared_labels and isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value < len(self.class_names):
                raise DataError(
                    f"label index {value} in column {self.label_column!r} is outside the dataset's "
                    f"{len(self.class_names)} classes",
                    path=path,
                    line=line,
                )
            return value
        text = label_text(value)
        return label_index(
            text, self.label_set, column=self.label_column, path=path, line=line, hint=self.unknown_hint(text)
        )

    def unknown_hint(self, text: str) -> str:
        """How to fix a label ``text`` outside the label set: a known label spelt another way is named."""
        number = _number(text)
        for label in self.label_set:
            if label.casefold() == text.casefold():
                return f"It differs from {label!r} only in case: write it as {label!r}."
            if number is not None and _number(label) == number:
                return f"It is the number {label!r} written another way: write it as {label!r}."
        return f"The label set was {self.declared}; fix the label, or {self.declare_all(text)}"


@kdplug.hookimpl
def kdplug_register_tasks(register):
    register(
        "local",
        local_task,
        description="your own TSV/CSV/JSONL/Parquet/Arrow files or a saved DatasetDict "
        "(options: train_file, dev_file, text_column, text_pair_column, "
        "label_column, labels, regression, encoding)",
    )

"""The GLUE tasks of the papers (CoLA, SST-2, MRPC, QQP, STS-B, MNLI, QNLI, RTE).

With ``data_dir``, each task reads the files of the original GLUE download
(``download_glue_data.py``): ``data_dir`` is the GLUE root holding ``CoLA/``, ``SST-2/`` ... or
one task's own directory. Without it, the task loads the ``datasets`` copy from the Hugging
Face hub (``nyu-mll/glue``) and raises :class:`~kdplug.errors.OfflineError` within seconds when
the hub cannot be reached. Both sources give the same examples in the same GLUE label order.

Metrics are those of the papers: Matthews correlation for CoLA, Pearson (and Spearman) for
STS-B, accuracy for the rest; MRPC and QQP also report F1, but their ``main_metric`` is
accuracy because that is what ALP-KD and Universal-KD report on dev and what PKD selects
checkpoints by (PKD's test-server tables show F1/accuracy).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

import kdplug
from kdplug import hub
from kdplug.errors import DataError, OfflineError, UsageError
from kdplug.types import Example

from . import hfdatasets
from .base import DataTask, check_count, label_index, parse_score, reject_unknown_options, require_examples
from .tables import read_records

logger = logging.getLogger(__name__)

HUB_ID = "nyu-mll/glue"
MAX_SKIPPED_FRACTION = 0.01  # QQP: more malformed lines than this means the wrong file


@dataclass(frozen=True)
class GlueSpec:
    """What differs between GLUE tasks; everything else is :class:`~kdplug_tasks.base.DataTask`."""

    name: str
    description: str
    folder: str  # the task's directory in the GLUE download
    text_columns: tuple[str, ...]  # one or two columns of the TSV files
    label_column: str
    labels: tuple[str, ...]  # GLUE's label order (what the hub copy's integers mean); () = regression
    label_values: tuple[str, ...]  # how the TSV files spell each label, in the same order
    metrics: tuple[str, ...]
    main_metric: str
    hub_columns: tuple[str, ...]  # text columns of the `datasets` copy
    dev_splits: tuple[str, ...] = ("dev",)
    fieldnames: Optional[tuple[str, ...]] = None  # the fields of a headerless file (CoLA)
    skip_malformed: bool = False

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


BINARY = ("0", "1")
NLI3 = ("entailment", "neutral", "contradiction")
NLI2 = ("entailment", "not_entailment")

SPECS: dict[str, GlueSpec] = {
    spec.name: spec
    for spec in [
        GlueSpec(
            "cola",
            "GLUE CoLA: linguistic acceptability; Matthews correlation",
            "CoLA",
            text_columns=("sentence",),
            label_column="label",
            labels=("unacceptable", "acceptable"),
            label_values=BINARY,
            metrics=("matthews", "accuracy"),
            main_metric="matthews",
            hub_columns=("sentence",),
            # no header line: source code, label, the author's original mark ("*" or empty), sentence
            fieldnames=("source", "label", "author_label", "sentence"),
        ),
        GlueSpec(
            "sst2",
            "GLUE SST-2: movie review sentiment; accuracy",
            "SST-2",
            text_columns=("sentence",),
            label_column="label",
            labels=("negative", "positive"),
            label_values=BINARY,
            metrics=("accuracy",),
            main_metric="accuracy",
            hub_columns=("sentence",),
        ),
        GlueSpec(
            "mrpc",
            "GLUE MRPC: paraphrase of news sentences; accuracy and F1",
            "MRPC",
            text_columns=("#1 String", "#2 String"),
            label_column="Quality",
            labels=("not_equivalent", "equivalent"),
            label_values=BINARY,
            metrics=("accuracy", "f1"),
            main_metric="accuracy",
            hub_columns=("sentence1", "sentence2"),
        ),
        GlueSpec(
            "qqp",
            "GLUE QQP: duplicate Quora questions; accuracy and F1",
            "QQP",
            text_columns=("question1", "question2"),
            label_column="is_duplicate",
            labels=("not_duplicate", "duplicate"),
            label_values=BINARY,
            metrics=("accuracy", "f1"),
            main_metric="accuracy",
            hub_columns=("question1", "question2"),
            # the real train.tsv has lines broken by newlines inside questions; the hub copy
            # drops them too
            skip_malformed=True,
        ),
        GlueSpec(
            "stsb",
            "GLUE STS-B: sentence similarity 0-5 (regression); Pearson and Spearman",
            "STS-B",
            text_columns=("sentence1", "sentence2"),
            label_column="score",
            labels=(),
            label_values=(),
            metrics=("pearson", "spearman"),
            main_metric="pearson",
            hub_columns=("sentence1", "sentence2"),
        ),
        GlueSpec(
            "mnli",
            "GLUE MNLI: 3-way inference, matched and mismatched dev; accuracy",
            "MNLI",
            text_columns=("sentence1", "sentence2"),
            label_column="gold_label",
            labels=NLI3,
            label_values=NLI3,
            metrics=("accuracy",),
            main_metric="accuracy",
            hub_columns=("premise", "hypothesis"),
            dev_splits=("dev_matched", "dev_mismatched"),
        ),
        GlueSpec(
            "qnli",
            "GLUE QNLI: does the sentence answer the question; accuracy",
            "QNLI",
            text_columns=("question", "sentence"),
            label_column="label",
            labels=NLI2,
            label_values=NLI2,
            metrics=("accuracy",),
            main_metric="accuracy",
            hub_columns=("question", "sentence"),
        ),
        GlueSpec(
            "rte",
            "GLUE RTE: textual entailment; accuracy",
            "RTE",
            text_columns=("sentence1", "sentence2"),
            label_column="label",
            labels=NLI2,
            label_values=NLI2,
            metrics=("accuracy",),
            main_metric="accuracy",
            hub_columns=("sentence1", "sentence2"),
        ),
    ]
}


# --------------------------------------------------------------------------------------------
# The original GLUE files
# --------------------------------------------------------------------------------------------


def task_directory(spec: GlueSpec, data_dir: str) -> str:
    """``data_dir/<Folder>`` when ``data_dir`` is the GLUE root, else ``data_dir`` itself."""
    if not os.path.isdir(data_dir):
        raise DataError(
            f"the data directory does not exist; pass --data-dir with the GLUE download "
            f"(a directory holding {spec.folder}/) or with {spec.folder}'s own files.",
            path=data_dir,
        )
    nested = os.path.join(data_dir, spec.folder)
    return nested if os.path.isdir(nested) else data_dir


def read_glue_file(spec: GlueSpec, path: str, limit: Optional[int], encoding: Optional[str] = None) -> list[Example]:
    if not os.path.isfile(path):
        raise DataError(
            f"file not found. GLUE {spec.folder} needs "
            f"{', '.join(f'{split}.tsv' for split in ('train', *spec.dev_splits))} as in the "
            f"original GLUE download; pass --data-dir with the GLUE directory.",
            path=path,
        )
    columns = {
        "text_a": spec.text_columns[0],
        "label": spec.label_column,
        "text_b": spec.text_columns[1] if spec.is_pair else None,
    }
    skipped: list[int] = []
    records = read_records(
        path,
        columns,
        fieldnames=spec.fieldnames,
        encoding=encoding,
        on_malformed=skipped.append if spec.skip_malformed else None,
    )
    examples = []
    total = 0
    for line, record in records:
        total += 1
        if spec.labels:
            label = label_index(
                record["label"].strip(), spec.label_values, column=spec.label_column, path=path, line=line
            )
        else:
            label = parse_score(record["label"], column=spec.label_column, path=path, line=line)
        examples.append(Example(text_a=record["text_a"], text_b=record.get("text_b"), label=label))
        if limit is not None and len(examples) == limit:
            break
    if skipped:
        if len(skipped) > MAX_SKIPPED_FRACTION * (total + len(skipped)):
            raise DataError(
                f"{len(skipped)} of {total + len(skipped)} lines (first: line {skipped[0]}) do not "
                f"have the {spec.folder} layout's fields; is this the right file?",
                path=path,
            )
        logger.warning(
            "%s: skipped %d malformed line(s) (%s), as the datasets copy of GLUE does",
            path,
            len(skipped),
            ", ".join(map(str, skipped[:5])) + (" ..." if len(skipped) > 5 else ""),
        )
    return require_examples(examples, path=path)


# --------------------------------------------------------------------------------------------
# The hub copy
# --------------------------------------------------------------------------------------------


def load_hub_copy(spec: GlueSpec) -> Any:
    """The ``datasets`` copy of one GLUE task (a DatasetDict), or OfflineError, fast."""
    fix = (
        f"pass --data-dir with the GLUE files (the original download, holding {spec.folder}/), "
        f"or set HF_HUB_OFFLINE=1 to use a copy already in the datasets cache"
    )
    try:
        import datasets
        from huggingface_hub import constants
    except ImportError as error:
        raise UsageError(
            f"GLUE task {spec.name!r} without --data-dir needs the datasets library "
            f"(pip install datasets: kdplug's glue extra); or {fix}."
        ) from error
    if not datasets.config.HF_HUB_OFFLINE and not hub.reachable(constants.ENDPOINT):
        raise OfflineError(
            f"GLUE task {spec.name!r}: the Hugging Face hub ({constants.ENDPOINT}) cannot be "
            f"reached to download {HUB_ID}; {fix}."
        )
    try:
        return datasets.load_dataset(HUB_ID, spec.name)
    except (ConnectionError, FileNotFoundError) as error:
        raise OfflineError(f"GLUE task {spec.name!r}: could not load {HUB_ID} ({error}); {fix}.") from error


def hub_examples(spec: GlueSpec, dataset: Any, split: str, limit: Optional[int]) -> list[Example]:
    name = split.replace("dev", "validation")  # dev_matched -> validation_matched
    if name not in dataset:
        raise DataError(
            f"the GLUE {spec.name} dataset has no split {name!r} (it has {', '.join(map(repr, dataset))}); "
            f"save the whole DatasetDict of load_dataset('nyu-mll/glue', '{spec.name}')",
            path=getattr(dataset, "cache_files", None) and spec.name,
        )
    rows = dataset[name]
    missing = [c for c in (*spec.hub_columns[: 2 if spec.is_pair else 1], "label") if c not in rows.column_names]
    if missing:
        raise DataError(
            f"the {name} split has no column {', '.join(map(repr, missing))} (it has "
            f"{', '.join(map(repr, rows.column_names))}); a GLUE {spec.name} DatasetDict has "
            f"{', '.join(map(repr, (*spec.hub_columns, 'label')))}",
            path=spec.name,
        )
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    texts_a = rows[spec.hub_columns[0]]
    texts_b = rows[spec.hub_columns[1]] if spec.is_pair else [None] * len(texts_a)
    cast = float if not spec.labels else int
    return [Example(text_a=a, text_b=b, label=cast(label)) for a, b, label in zip(texts_a, texts_b, rows["label"])]


# --------------------------------------------------------------------------------------------
# Factory and registration
# --------------------------------------------------------------------------------------------


def glue_task(
    spec: GlueSpec,
    data_dir: Optional[str] = None,
    *,
    max_train_examples: Optional[int] = None,
    max_dev_examples: Optional[int] = None,
    encoding: Optional[str] = None,
    **unknown: Any,
) -> DataTask:
    """A GLUE task from the original files in ``data_dir``, or from the hub copy.

    ``max_train_examples`` / ``max_dev_examples`` keep the first N examples (quick runs);
    ``encoding`` reads files that are not UTF-8 (e.g. ``latin-1``).
    """
    reject_unknown_options(spec.name, unknown, ["max_train_examples", "max_dev_examples", "encoding"])
    limits = dict(
        max_train_examples=check_count("max_train_examples", max_train_examples),
        max_dev_examples=check_count("max_dev_examples", max_dev_examples),
    )
    if data_dir is not None and hfdatasets.is_dataset_dir(os.fspath(data_dir)):
        saved = hfdatasets.load_dataset_dict(os.fspath(data_dir))  # load_dataset("nyu-mll/glue", ...).save_to_disk

        def reader(split: str, limit: Optional[int]) -> list[Example]:
            return hub_examples(spec, saved, split, limit)

        source = os.fspath(data_dir)
    elif data_dir is not None:
        directory = task_directory(spec, os.fspath(data_dir))

        def reader(split: str, limit: Optional[int]) -> list[Example]:
            return read_glue_file(spec, os.path.join(directory, f"{split}.tsv"), limit, encoding)

        source = directory
    else:
        dataset = load_hub_copy(spec)

        def reader(split: str, limit: Optional[int]) -> list[Example]:
            return hub_examples(spec, dataset, split, limit)

        source = f"{HUB_ID}/{spec.name}"
    return DataTask(
        name=spec.name,
        labels=spec.labels,
        is_pair=spec.is_pair,
        metrics=spec.metrics,
        main_metric=spec.main_metric,
        reader=reader,
        is_regression=not spec.labels,
        dev_splits=spec.dev_splits,
        source=source,
        text_columns=spec.text_columns,
        hub_dataset=HUB_ID,
        **limits,
    )


@kdplug.hookimpl
def kdplug_register_tasks(register):
    for spec in SPECS.values():
        register(spec.name, functools.partial(glue_task, spec), description=spec.description)

"""Data from Hugging Face ``datasets``: a directory written by ``DatasetDict.save_to_disk``,
Parquet and Arrow files, or a ``DatasetDict`` already in memory.

Rows come out as ``(row_number, {role: value})``, like :func:`kdplug_tasks.tables.read_records`,
so the tasks turn them into examples the same way (and their errors name the same things).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Optional

from kdplug.errors import DataError, UsageError, close_matches

#: file extensions read through ``datasets``
DATASET_FORMATS = {".parquet": "parquet", ".arrow": "arrow"}
#: names a DatasetDict may give its dev split, in order of preference
DEV_SPLITS = ("validation", "dev", "valid", "test")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise UsageError(
            "reading datasets directories, Parquet or Arrow files needs the datasets library: "
            "pip install datasets (kdplug's glue extra)"
        ) from None
    return datasets


def is_dataset_dir(path: Optional[str]) -> bool:
    """A directory ``DatasetDict.save_to_disk`` wrote."""
    return path is not None and os.path.isfile(os.path.join(path, "dataset_dict.json"))


def load_dataset_dict(path: str) -> Any:
    datasets = _datasets()
    try:
        return datasets.load_from_disk(path)
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"not a dataset saved with save_to_disk ({exc})", path=path) from None


def load_file(path: str) -> Any:
    """A Parquet or Arrow file as a ``datasets.Dataset``."""
    datasets = _datasets()
    if not os.path.isfile(path):
        raise DataError("file not found.", path=path)
    try:
        if path.lower().endswith(".parquet"):
            return datasets.Dataset.from_parquet(path)
        return datasets.Dataset.from_file(path)
    except Exception as exc:  # pyarrow raises its own error types
        raise DataError(
            f"could not read it as {DATASET_FORMATS[os.path.splitext(path)[1].lower()]} ({exc})", path=path
        ) from None


def pick_split(dataset_dict: Any, split: str, where: str, given: Optional[str] = None) -> Any:
    """The DatasetDict's split for kdplug's ``split`` (``train``; ``dev``: validation, dev ... )."""
    names = list(dataset_dict.keys())
    wanted = [given] if given else ([split] if split == "train" else [split, *DEV_SPLITS])
    for name in wanted:
        if name in names:
            return dataset_dict[name]
    option = "train_split" if split == "train" else "dev_split"
    raise DataError(
        f"the dataset has no {split!r} split (looked for {', '.join(map(repr, wanted))}); its splits "
        f"are {', '.join(map(repr, names))}: name one with --set task_options.{option}=NAME",
        path=where,
    )


def label_names(dataset: Any, column: str) -> Optional[tuple[str, ...]]:
    """The names of a ``ClassLabel`` column (GLUE's, or any dataset's with named classes)."""
    feature = getattr(dataset, "features", {}).get(column)
    names = getattr(feature, "names", None)
    return tuple(names) if names else None


def dataset_records(
    dataset: Any, columns: dict[str, Optional[str]], where: str, options: Optional[dict[str, str]] = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a ``datasets.Dataset`` as ``{role: value}``; row numbers count from 1."""
    options = options or {}
    available = list(dataset.column_names)
    wanted = {role: column for role, column in columns.items() if column is not None}
    for role, column in wanted.items():
        if column not in available:
            suggestions = close_matches(column, available)
            hint = f" Did you mean {suggestions[0]!r}?" if suggestions else ""
            if role in options:
                hint += (
                    f" Name the column with --set task_options.{options[role]}="
                    f"{suggestions[0] if suggestions else 'NAME'}."
                )
            raise DataError(
                f"no column {column!r}; the dataset has columns {', '.join(map(repr, available))}.{hint}", path=where
            )
    values = {role: dataset[column] for role, column in wanted.items()}
    for index in range(len(dataset)):
        yield index + 1, {role: column[index] for role, column in values.items()}

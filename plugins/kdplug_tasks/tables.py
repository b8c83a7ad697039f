"""Reading TSV, CSV and JSONL files into rows, with errors that name the file, line and column.

Every reader yields ``(line_number, record)`` pairs, so the code that turns records into
examples can point a :class:`~kdplug.errors.DataError` at the exact line. Line numbers count
from 1 and include the header line, as an editor shows them.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Optional

from kdplug import textio
from kdplug.errors import DataError, close_matches

#: file extension -> format name understood by :func:`read_records`
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl"}


def open_text(path: str, encoding: Optional[str] = None):
    """A data file as text: UTF-8 unless a byte-order mark or ``encoding`` says otherwise (a
    leading UTF-8 mark is dropped: MRPC has one); see :mod:`kdplug.textio`."""
    if not os.path.isfile(path):
        where = os.path.dirname(os.path.abspath(path))
        present = sorted(os.listdir(where)) if os.path.isdir(where) else []
        listing = f" The directory holds: {', '.join(present)}." if present else ""
        raise DataError(f"file not found.{listing}", path=path)
    return textio.open_text(path, encoding=encoding)


def read_tsv(path: str, encoding: Optional[str] = None) -> Iterator[tuple[int, list[str]]]:
    """Tab-separated lines with quoting disabled: one line is one record, split on every tab.

    GLUE's files contain unbalanced quotes inside sentences, which a quoting CSV reader would
    merge with the following lines; splitting on tabs keeps every sentence intact. Blank lines
    are skipped.
    """
    with open_text(path, encoding) as handle:
        for line_number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield line_number, line.split("\t")


def read_csv(path: str, encoding: Optional[str] = None) -> Iterator[tuple[int, list[str]]]:
    """Comma-separated records with standard (RFC 4180) quoting; a record may span lines."""
    with open_text(path, encoding) as handle:
        reader = csv.reader(handle)
        start = 1
        try:
            for fields in reader:
                if any(field.strip() for field in fields):
                    yield start, fields
                start = reader.line_num + 1
        except csv.Error as error:
            raise DataError(
                f"malformed CSV ({error}); check the quoting of this record.", path=path, line=start
            ) from error


def read_jsonl(path: str, encoding: Optional[str] = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """One JSON object per line; blank lines are skipped."""
    with open_text(path, encoding) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(
                    f"not valid JSON ({error.msg} at column {error.colno}); each line of a "
                    f".jsonl file must be one JSON object.",
                    path=path,
                    line=line_number,
                ) from error
            if not isinstance(record, dict):
                raise DataError(
                    f'expected a JSON object such as {{"text": ..., "label": ...}}, found {type(record).__name__}.',
                    path=path,
                    line=line_number,
                )
            yield line_number, record


#: how a DataError names each role of ``read_records``
ROLE_NAMES = {
    "text_a": "text",
    "text_b": "second text of each pair (this is a sentence-pair task: it needs two text columns)",
    "label": "label",
}


def column_index(header: Sequence[str], column: str, *, path: str, role: str, option: Optional[str] = None) -> int:
    """The position of ``column`` in a header line, or a DataError listing the columns there are
    and, where an option names the column, how to set it."""
    names = [name.strip() for name in header]
    if column in names:
        return names.index(column)
    suggestions = close_matches(column, names)
    hint = f" Did you mean {suggestions[0]!r}?" if suggestions else ""
    if option:
        hint += f" Name the column with --set task_options.{option}={suggestions[0] if suggestions else 'NAME'}."
    raise DataError(
        f"no column {column!r} (expected to hold the {role}); the header has columns "
        f"{', '.join(repr(name) for name in names)}.{hint}",
        path=path,
        line=1,
    )


def read_records(
    path: str,
    columns: dict[str, Optional[str]],
    *,
    fieldnames: Optional[Sequence[str]] = None,
    on_malformed: Optional[Callable[[int], None]] = None,
    encoding: Optional[str] = None,
    options: Optional[dict[str, str]] = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Records of a TSV/CSV/JSONL file (format from the extension) as ``{role: value}``.

    ``columns`` maps a role (``"text_a"``, ``"text_b"``, ``"label"``) to the column or JSON key
    holding it; roles mapped to None are left out. TSV and CSV files start with a header line,
    unless ``fieldnames`` names the fields of a headerless file (CoLA). A line with the wrong
    number of fields raises a DataError, or is passed to ``on_malformed(line)`` and skipped.
    ``options`` names the task option that sets each role's column (for error messages), and
    ``encoding`` the file's encoding when it is not UTF-8 (see :mod:`kdplug.textio`).
    """
    options = options or {}
    wanted = {role: column for role, column in columns.items() if column is not None}
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise DataError(f"unknown file format; use one of the extensions {', '.join(FORMATS)}.", path=path)
    if fmt == "jsonl":
        for line_number, record in read_jsonl(path, encoding):
            missing = [role for role, column in wanted.items() if record.get(column) is None]
            if missing:
                named = [f"task_options.{options[role]}" for role in missing if role in options]
                hint = f" Name the keys with --set {' / '.join(named)}=KEY." if named else ""
                raise DataError(
                    f"no value for {', '.join(repr(wanted[role]) for role in missing)}; this line has keys "
                    f"{', '.join(repr(key) for key in record) or '(none)'}. Every line needs "
                    f"{', '.join(repr(key) for key in wanted.values())}.{hint}",
                    path=path,
                    line=line_number,
                )
            yield line_number, {role: record[column] for role, column in wanted.items()}
        return
    rows = read_tsv(path, encoding) if fmt == "tsv" else read_csv(path, encoding)
    if fieldnames is None:
        header = next(rows, None)
        if header is None:
            raise DataError(
                "the file is empty; expected a header line naming the columns "
                f"{', '.join(repr(column) for column in wanted.values())}.",
                path=path,
            )
        fieldnames, layout = header[1], "the header (line 1)"
    else:
        layout = f"this file's layout ({', '.join(fieldnames)})"
    positions = {
        role: column_index(fieldnames, column, path=path, role=ROLE_NAMES.get(role, role), option=options.get(role))
        for role, column in wanted.items()
    }
    header = [_header_field(name) for name in fieldnames] if layout.startswith("the header") else None
    for line_number, fields in rows:
        if header is not None and [_header_field(field) for field in fields] == header:
            refuse_repeated_header(fields, path=path, line=line_number, label=positions.get("label"))
        if len(fields) != len(fieldnames) and on_malformed is not None:
            on_malformed(line_number)
            continue
        check_field_count(
            fields,
            len(fieldnames),
            path=path,
            line=line_number,
            layout=layout,
            hint=TSV_HINT if fmt == "tsv" else CSV_HINT,
        )
        yield line_number, {role: fields[position] for role, position in positions.items()}


def _header_field(name: str) -> str:
    return name.strip().lstrip("\ufeff")  # a file joined after another keeps its byte-order mark


def refuse_repeated_header(fields: Sequence[str], *, path: str, line: int, label: Optional[int]) -> None:
    """A data line that is the header line again: two files joined with ``cat``, whose second header
    would be read as an example (and its label column's name as a class of its own)."""
    became = f", and {fields[label].strip()!r} a class of its own" if label is not None else ""
    raise DataError(
        f"this line repeats the header line ({', '.join(repr(field.strip()) for field in fields)}), as when two "
        f"files are joined with cat: read as data it would be an example{became}. Delete the line; to join files, "
        f"keep the first one's header only: tail -n +2 second{os.path.splitext(path)[1]} >> first"
        f"{os.path.splitext(path)[1]}.",
        path=path,
        line=line,
    )


TSV_HINT = "A sentence probably contains a tab or a line break: remove it, or re-export the file."
CSV_HINT = 'A field that contains a comma or a line break must be quoted ("...").'


def check_field_count(
    fields: Sequence[str], expected: int, *, path: str, line: int, layout: str, hint: str = TSV_HINT
) -> None:
    if len(fields) != expected:
        raise DataError(f"expected {expected} fields as in {layout}, found {len(fields)}. {hint}", path=path, line=line)

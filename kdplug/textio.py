"""Reading the user's text files whatever their encoding, with an error that says how to fix it.

A byte-order mark decides (UTF-8, UTF-16 and UTF-32, as Windows tools write them); without one the
file must be UTF-8, or be given its encoding (``task_options.encoding=latin-1``, ``--encoding``).
A file that is neither fails with its name, the line and the bytes that are not UTF-8, and the
option to pass: a Windows-1252 file from Excel never becomes silently garbled text. NUL bytes are
refused too: UTF-16 or UTF-32 text saved without a byte-order mark is valid UTF-8 byte by byte,
and would be read as texts of NUL characters split in the wrong places.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import os
import shlex
from collections.abc import Iterable, Iterator
from typing import Any, Optional

from .errors import DataError, UsageError

#: byte-order marks, longest first (UTF-32's LE mark starts with UTF-16's)
BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def detect_encoding(data: bytes) -> Optional[str]:
    """The encoding a byte-order mark announces, if the data starts with one."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return encoding
    return None


def _require_codec(encoding: str, path: object) -> None:
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise DataError(
            f"unknown encoding {encoding!r}; use a Python codec name such as utf-8, latin-1, cp1252 or utf-16",
            path=path,
        ) from None


def decode(
    data: bytes, path: object, *, encoding: Optional[str] = None, option: Optional[str] = "task_options.encoding"
) -> str:
    """``data`` as text: in ``encoding`` if given, else by its byte-order mark, else UTF-8.
    ``option`` is how the user gives the encoding (None: they cannot; the file must be UTF-8)."""
    chosen = encoding or detect_encoding(data) or "utf-8"
    _require_codec(chosen, path)
    refuse_nul_bytes(data, path, chosen, option)
    try:
        return data.decode(chosen)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = data[exc.start : min(exc.end + 2, len(data))]
        if encoding is not None:
            hint = f"Check {option}={encoding}"
        elif option is None:
            hint = f"Save it as UTF-8, e.g. {_iconv('CP1252', path)} for a file saved by Excel on Windows"
        else:
            hint = (
                f"Pass its encoding, e.g. {option}=latin-1 (or cp1252 for a file saved by Excel on Windows), "
                f"or save it as UTF-8"
            )
        raise DataError(
            f"the file is not valid {chosen.upper()}: bytes {bad!r} at byte {exc.start}. {hint}.", path=path, line=line
        ) from None


#: bytes read from a file's start to tell its encoding: a byte-order mark, or the zero bytes of wide text
SNIFF_BYTES = 1 << 16
#: which of every four bytes is zero in ASCII text saved in each wide encoding without a byte-order mark
WIDE_ENCODINGS = {
    (False, True, False, True): "utf-16-le",
    (True, False, True, False): "utf-16-be",
    (False, True, True, True): "utf-32-le",
    (True, True, True, False): "utf-32-be",
}


def wide_encoding(sample: bytes) -> Optional[str]:
    """The UTF-16 or UTF-32 byte order that ``sample``'s zero bytes point to (ASCII text saved as
    UTF-16-LE has a zero at every odd byte), or None."""
    rows = len(sample) // 4
    if rows == 0:
        return None
    zeros = tuple(sample[k : rows * 4 : 4].count(0) * 2 > rows for k in range(4))
    return WIDE_ENCODINGS.get(zeros)


def refuse_nul_bytes(data: bytes, path: object, chosen: str, option: Optional[str]) -> None:
    """A DataError where ``data`` (a file, or its start) holds a NUL byte and ``chosen`` is a
    byte-wide encoding: text never holds one, UTF-16 and UTF-32 text without a byte-order mark does."""
    at = data.find(b"\0")
    if at < 0 or codecs.lookup(chosen).name.startswith(("utf-16", "utf-32")):
        return
    line = data[:at].count(b"\n") + 1
    start = at - at % 4
    wide = wide_encoding(data[start : start + 4096])
    if wide is None:
        raise DataError(
            f"the file holds a NUL byte (byte {at}), which text never holds: it is not a text file, or it is "
            f"text in an encoding with zero bytes (UTF-16, UTF-32). Save it as UTF-8 text"
            + (f", or pass its encoding ({option}=utf-16 ...)" if option else "")
            + ".",
            path=path,
            line=line,
        )
    family = wide[:6].upper()
    fix = f"Convert it to UTF-8: {_iconv(wide.upper().replace('-LE', 'LE').replace('-BE', 'BE'), path)}"
    raise DataError(
        f"the file holds NUL bytes (the first at byte {at}): it looks like {family} ({wide}) without a byte-order "
        f"mark, which read as {chosen.upper()} would become texts of NUL characters split in the wrong places. "
        + fix
        + (f", or pass its encoding: {option}={wide}" if option else "")
        + ".",
        path=path,
        line=line,
    )


def _iconv(source: str, path: object) -> str:
    """The command that converts ``path`` from ``source`` to UTF-8, into a file beside it."""
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) and os.path.isfile(path) else "FILE"
    stem, extension = os.path.splitext(name)
    return f"iconv -f {source} -t UTF-8 {shlex.quote(name)} > {shlex.quote(f'{stem}-utf8{extension}')}"


def read_text(
    path: str | os.PathLike, *, encoding: Optional[str] = None, option: Optional[str] = "task_options.encoding"
) -> str:
    with open(path, "rb") as handle:
        return decode(handle.read(), path, encoding=encoding, option=option)


def open_text(
    path: str | os.PathLike, *, encoding: Optional[str] = None, option: Optional[str] = "task_options.encoding"
) -> io.TextIOWrapper:
    """The file as a text stream, decoded as it is read (a file of a million lines is never held
    whole); ``newline`` is kept so a stray carriage return inside a field does not split its record.
    Bytes that do not decode, and NUL bytes (UTF-16 read as UTF-8), raise the :class:`DataError`
    that :func:`decode` gives, with their line: those of the file's first block before it opens."""
    with open(path, "rb") as handle:
        start = handle.read(SNIFF_BYTES)
    chosen = encoding or detect_encoding(start) or "utf-8"
    _require_codec(chosen, path)
    refuse_nul_bytes(start, path, chosen, option)
    return _DecodingText(open(path, "rb"), path, encoding, option, chosen)


class _DecodingText(io.TextIOWrapper):
    """A text stream whose decoding error is reported as :func:`decode` reports it; so is a NUL
    character past the first block (a UTF-16 file appended to a UTF-8 one)."""

    def __init__(self, raw, path, encoding: Optional[str], option: Optional[str], chosen: str) -> None:
        super().__init__(raw, encoding=chosen, newline="\n")
        self._path, self._given, self._option = path, encoding, option
        self._wide = codecs.lookup(chosen).name.startswith(("utf-16", "utf-32"))

    def __next__(self) -> str:
        try:
            return self._checked(super().__next__())
        except UnicodeDecodeError:
            self._report()
            raise

    def readline(self, size: int = -1) -> str:
        try:
            return self._checked(super().readline(size))
        except UnicodeDecodeError:
            self._report()
            raise

    def read(self, size: Optional[int] = -1) -> str:
        try:
            return self._checked(super().read(size))
        except UnicodeDecodeError:
            self._report()
            raise

    def _checked(self, text: str) -> str:
        if "\0" in text and not self._wide:
            self._report()
        return text

    def _report(self) -> None:
        """Read the file again whole, only now, to say where its undecodable bytes are."""
        with open(self._path, "rb") as handle:
            decode(handle.read(), self._path, encoding=self._given, option=self._option)


# -- files of texts (kdplug predict's inputs, transfer sets) -------------------------------------

#: file extension -> format read by :func:`read_inputs`
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".txt": "lines"}
GENERIC_COLUMNS = ("text", "text_pair")


def input_format(path: str, given: Optional[str]) -> str:
    """The format of a file of texts, from ``given`` or its extension (stdin: plain lines)."""
    if given:
        return given
    if path == "-":
        return "lines"
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise UsageError(f"cannot tell the format of {path}: use .tsv, .csv, .jsonl or .txt, or pass --format")
    return fmt


def pick_columns(
    header: list[str],
    task_columns: tuple[str, ...],
    is_pair: bool,
    given: Optional[tuple[Optional[str], Optional[str]]],
    name: str,
    consumer: str = "this student",
) -> list[str]:
    """The input's text columns: given ones, else the task's, else text/text_pair."""
    wanted = 2 if is_pair else 1
    candidates = [tuple(c for c in given if c)] if given else [task_columns[:wanted], GENERIC_COLUMNS[:wanted]]
    for columns in candidates:
        if len(columns) == wanted and all(column in header for column in columns):
            return list(columns)
    expected = " and ".join(repr(c) for c in candidates[0]) + (
        f" (or {' and '.join(repr(c) for c in candidates[1])})" if len(candidates) > 1 else ""
    )
    fix = (
        "rename them, or name yours with --text-column" + (" and --pair-column" if is_pair else "")
        if consumer == "this student"
        else "rename them"
    )
    raise DataError(
        f"the input has columns {', '.join(repr(h) for h in header) or '(none)'} but {consumer} reads "
        f"{expected}; {fix}",
        path=name,
        line=1,
    )


def read_inputs(
    text: str,
    fmt: str,
    name: str,
    task_columns: tuple[str, ...],
    is_pair: bool,
    given: Optional[tuple[Optional[str], Optional[str]]],
    consumer: str = "this student",
) -> tuple[list[dict], list[str], list]:
    """(rows as dicts, the row keys in order, the texts or pairs to predict) of a whole text."""
    keys, pairs = input_rows(io.StringIO(text), fmt, name, task_columns, is_pair, given, consumer)
    rows, texts = [], []
    for row, item in pairs:
        rows.append(row)
        texts.append(item)
    return rows, keys, texts


def input_rows(
    stream: Iterable[str],
    fmt: str,
    name: str,
    task_columns: tuple[str, ...],
    is_pair: bool,
    given: Optional[tuple[Optional[str], Optional[str]]],
    consumer: str = "this student",
    *,
    keys: Optional[list[str]] = None,
) -> tuple[list[str], Iterator[tuple[dict, Any]]]:
    """The row keys of a file of texts, and its ``(row, text or pair)`` items as they are read, so
    that a file of any length is never held whole. A JSONL file's keys are those of all its rows
    (:func:`jsonl_keys`): pass them as ``keys`` for a stream that cannot be read twice. An input
    without a single text raises UsageError once it is read to its end."""
    if fmt == "lines":
        keys = list(GENERIC_COLUMNS[: 2 if is_pair else 1])
        return keys, _nonempty(_line_items(stream, keys, is_pair, name), name, consumer)
    if fmt == "jsonl":
        if keys is None:
            lines = list(stream)  # read twice: once for the keys of every row, once for the rows
            keys, stream = jsonl_keys(lines, name), lines
        columns = pick_columns(keys, task_columns, is_pair, given, name, consumer)
        return keys, _nonempty(_jsonl_items(stream, columns, is_pair, name), name, consumer)
    reader = csv.reader(
        stream, delimiter="\t" if fmt == "tsv" else ",", quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
    )
    header = next((fields for fields in reader if any(field.strip() for field in fields)), None)
    if header is None:
        raise UsageError(f"{name} is empty: expected a header line and texts")
    keys = [field.strip() for field in header]
    columns = pick_columns(keys, task_columns, is_pair, given, name, consumer)
    return keys, _nonempty(_table_items(reader, keys, columns, is_pair, name), name, consumer)


def jsonl_keys(lines: Iterable[str], name: str) -> list[str]:
    """Every key of a JSONL file's rows, in order of first appearance."""
    return list(dict.fromkeys(key for row, _ in _jsonl_rows(lines, name) for key in row))


def _nonempty(items: Iterator[tuple[dict, Any]], name: str, consumer: str) -> Iterator[tuple[dict, Any]]:
    empty = True
    for item in items:
        empty = False
        yield item
    if empty:
        raise UsageError(f"{name} holds no texts; {consumer} needs at least one")


def _line_items(stream: Iterable[str], keys: list[str], is_pair: bool, name: str) -> Iterator[tuple[dict, Any]]:
    for number, line in enumerate(stream, start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        if is_pair and len(fields) != 2:
            raise DataError(
                f"a sentence-pair student needs two tab-separated texts on each line, found {len(fields)} field(s)",
                path=name,
                line=number,
            )
        yield dict(zip(keys, fields if is_pair else [line])), (tuple(fields) if is_pair else line)


def _jsonl_rows(lines: Iterable[str], name: str) -> Iterator[tuple[dict, int]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"not valid JSON ({exc.msg}); each line must be one object", path=name, line=number
            ) from None
        if not isinstance(record, dict):
            raise DataError("expected a JSON object per line", path=name, line=number)
        yield record, number


def _jsonl_items(lines: Iterable[str], columns: list[str], is_pair: bool, name: str) -> Iterator[tuple[dict, Any]]:
    for count, (row, _) in enumerate(_jsonl_rows(lines, name), start=1):
        if any(not isinstance(row.get(column), str) for column in columns):
            raise DataError(f"expected text in {', '.join(repr(c) for c in columns)}", path=name, line=count)
        yield row, (tuple(row[c] for c in columns) if is_pair else row[columns[0]])


def _table_items(reader, keys: list[str], columns: list[str], is_pair: bool, name: str) -> Iterator[tuple[dict, Any]]:
    start = reader.line_num + 1
    for fields in reader:
        number, start = start, reader.line_num + 1
        if not any(field.strip() for field in fields):
            continue
        if len(fields) != len(keys):
            raise DataError(
                f"expected {len(keys)} fields as in the header, found {len(fields)}", path=name, line=number
            )
        row = dict(zip(keys, fields))
        yield row, (tuple(row[c] for c in columns) if is_pair else row[columns[0]])


def yaml_word(text: str) -> str:
    """``text`` as a ``--set`` value (or an item of a list or mapping in one) must spell it to reach
    kdplug as that string: bare where YAML reads it so (``positive``), double-quoted where YAML
    would read something else (``"yes"`` is not the boolean true, ``"0"`` not a number, ``"a, b"``
    not two items)."""
    import yaml

    try:
        plain = yaml.safe_load(text) == text and text == text.strip() and not any(c in text for c in ",[]{}#'\"")
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(text)

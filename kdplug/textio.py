"""Reading the user's text files whatever their encoding, with an error that says how to fix it.

A byte-order mark decides (UTF-8, UTF-16 and UTF-32, as Windows tools write them); without one the
file must be UTF-8, or be given its encoding (``task_options.encoding=latin-1``, ``--encoding``).
A file that is neither fails with its name, the line and the bytes that are not UTF-8, and the
option to pass: a Windows-1252 file from Excel never becomes silently garbled text.
"""

from __future__ import annotations

import codecs
import io
import os
from typing import Optional

from .errors import DataError

#: byte-order marks, longest first (UTF-32's LE mark starts with UTF-16's)
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def detect_encoding(data: bytes) -> Optional[str]:
    """The encoding a byte-order mark announces, if the data starts with one."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return encoding
    return None


def decode(data: bytes, path: object, *, encoding: Optional[str] = None,
           option: str = "task_options.encoding") -> str:
    """``data`` as text: in ``encoding`` if given, else by its byte-order mark, else UTF-8."""
    chosen = encoding or detect_encoding(data) or "utf-8"
    try:
        codecs.lookup(chosen)
    except LookupError:
        raise DataError(f"unknown encoding {chosen!r}; use a Python codec name such as utf-8, latin-1, cp1252 or "
                        f"utf-16", path=path) from None
    try:
        return data.decode(chosen)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        bad = data[exc.start:min(exc.end + 2, len(data))]
        hint = (f"Pass its encoding, e.g. {option}=latin-1 (or cp1252 for a file saved by Excel on Windows), "
                f"or save it as UTF-8" if encoding is None else f"Check {option}={encoding}")
        raise DataError(f"the file is not valid {chosen.upper()}: bytes {bad!r} at byte {exc.start}. {hint}.",
                        path=path, line=line) from None


def read_text(path: str | os.PathLike, *, encoding: Optional[str] = None,
              option: str = "task_options.encoding") -> str:
    with open(path, "rb") as handle:
        return decode(handle.read(), path, encoding=encoding, option=option)


def open_text(path: str | os.PathLike, *, encoding: Optional[str] = None,
              option: str = "task_options.encoding") -> io.StringIO:
    """The file as a text stream; ``newline`` is kept so a stray carriage return inside a field
    does not split its record."""
    return io.StringIO(read_text(path, encoding=encoding, option=option), newline="\n")

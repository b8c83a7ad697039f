"""The GLUE SST-2 layout both builders write: ``sentence<TAB>label`` with a header, unquoted."""

from __future__ import annotations

from pathlib import Path


def write(path: Path, rows: list[tuple[str, int]], labelled: bool) -> None:
    """One text per line (the builders collapse spacing, so no text holds a tab or a line break);
    ``unlabelled`` files (for ``--transfer``) have the sentence column only."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("sentence\tlabel\n" if labelled else "sentence\n")
        for text, label in rows:
            handle.write(f"{text}\t{label}\n" if labelled else f"{text}\n")

"""The GLUE SST-2 layout both builders write: ``sentence<TAB>label`` with a header, unquoted."""

from __future__ import annotations

import argparse
import random
from pathlib import Path


def write(path: Path, rows: list[tuple[str, int]], labelled: bool) -> None:
    """One text per line (the builders collapse spacing, so no text holds a tab or a line break);
    ``unlabelled`` files (for ``--transfer``) have the sentence column only."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("sentence\tlabel\n" if labelled else "sentence\n")
        for text, label in rows:
            handle.write(f"{text}\t{label}\n" if labelled else f"{text}\n")


def write_splits(rows: list[tuple[str, int]], output: Path, sizes: dict[str, int | None], what: str) -> None:
    """Shuffle ``rows`` with seed 0 and write them in order as ``train.tsv`` and ``dev.tsv`` (labelled)
    and ``unlabelled.tsv`` (text only), each of its size in ``sizes`` (None: the rest)."""
    random.Random(0).shuffle(rows)
    output.mkdir(parents=True, exist_ok=True)
    start = 0
    for name, size in sizes.items():
        end = len(rows) if size is None else start + size
        write(output / f"{name}.tsv", rows[start:end], labelled=name != "unlabelled")
        start = end
    dev = rows[sizes["train"] : sizes["train"] + sizes["dev"]]
    print(f"{len(rows)} {what}; wrote {output} (dev: {sum(label for _, label in dev) / len(dev):.1%} positive)")


def checked_paths(parser: argparse.ArgumentParser, archive: Path, output: Path) -> None:
    """Exit 2 with argparse's usage line when the archive is not a file or the output is a file."""
    if not archive.is_file():
        parser.error(f"{archive} is not a file: download it first (see the command in this script's docstring)")
    if output.exists() and not output.is_dir():
        parser.error(f"{output} exists and is not a directory: name a new or existing folder")

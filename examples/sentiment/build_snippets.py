"""Build the movie-snippets sentiment set the docs measure transfer sets on: real sentences, no hub.

The corpus is the 10,605 Rotten Tomatoes snippets (Pang and Lee's sentence polarity data) that
Hutto and Gilbert (2014) rated for VADER, shipped in the source distribution of the PyPI package
``vaderSentiment`` 3.3.2 (``additional_resources/hutto_ICWSM_2014.tar.gz``, file
``movieReviewSnippets_GroundTruth.txt``: id, mean human rating from -4 to +4, text). Snippets rated
within 0.5 of neutral are dropped, the rest labelled by the rating's sign (1 positive, 0 negative),
de-duplicated (case and spacing aside), shuffled with seed 0 and written in the GLUE SST-2 layout:
2,000 for ``train.tsv``, 1,000 for ``dev.tsv`` and the rest without labels as ``unlabelled.tsv``
(for ``--transfer``); ``--train-size`` moves more of the labelled snippets into ``train.tsv``::

    pip download vaderSentiment==3.3.2 --no-deps --no-binary :all: -d sdists
    python examples/sentiment/build_snippets.py sdists/vaderSentiment-3.3.2.tar.gz snippets
    kdplug run --teacher minilm --task sst2 --data-dir snippets --student bilstm --projector rkd

The package itself is never installed or imported; the script reads the file from the archives.
"""

from __future__ import annotations

import argparse
import io
import tarfile
from pathlib import Path

from glue_tsv import checked_paths, write_splits

NESTED = "additional_resources/hutto_ICWSM_2014.tar.gz"
CORPUS = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
NEUTRAL = 0.5
SIZES = {"train": 2000, "dev": 1000, "unlabelled": None}  # None: the rest


def member(archive: tarfile.TarFile, suffix: str) -> bytes:
    """The bytes of the one member whose name ends with ``suffix``."""
    (info,) = [info for info in archive.getmembers() if info.name.endswith(suffix)]
    return archive.extractfile(info).read()


def snippets(sdist: Path) -> list[tuple[str, int]]:
    """(text, 1 for positive / 0 for negative) once per text, in the corpus's order."""
    with tarfile.open(sdist) as outer:
        nested = member(outer, NESTED)
    with tarfile.open(fileobj=io.BytesIO(nested)) as inner:
        lines = member(inner, CORPUS).decode("latin-1").splitlines()
    seen, kept = set(), []
    for line in lines:
        _, rating, raw = line.split("\t", 2)
        text = " ".join(raw.split())
        key = text.lower()
        if abs(float(rating)) < NEUTRAL or not text or key in seen:
            continue
        seen.add(key)
        kept.append((text, int(float(rating) > 0)))
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdist", type=Path, help="vaderSentiment-3.3.2.tar.gz (pip download, see above)")
    parser.add_argument("output", type=Path, help="directory to write train.tsv, dev.tsv and unlabelled.tsv into")
    parser.add_argument(
        "--train-size",
        type=int,
        default=SIZES["train"],
        help=f"labelled training snippets (default {SIZES['train']:,}; at most 8,000, the dev set and 1,000 "
        "unlabelled ones are kept)",
    )
    args = parser.parse_args()
    if not 1 <= args.train_size <= 8000:
        parser.error(f"--train-size must be between 1 and 8000, got {args.train_size}")
    checked_paths(parser, args.sdist, args.output)
    try:
        rows = snippets(args.sdist)
    except tarfile.ReadError:
        parser.error(f"{args.sdist} is not the archive named above (it cannot be opened)")
    write_splits(rows, args.output, {**SIZES, "train": args.train_size}, "snippets")


if __name__ == "__main__":
    main()

"""A transfer set's texts: its files' and the augmenter's copies, each kept once, written in order.

Every candidate text passes checks that need only the text (equal to a dev or training sentence,
or nothing but stop words and mask tokens: dropped) and one that needs every earlier text (a
repeat: dropped). Under a launch of several processes the slow part is shared: each process
prepares the augmenter on a share of the distinct training sentences (where the augmenter can,
through ``prepare_share``/``prepare_join``), then makes and checks the copies of its share of the
training examples; rank 0 reads the shares back in order and drops the repeats, so the set is the
one a single process writes, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..capabilities import AugmenterCapabilities, capabilities
from ..types import Example
from ..words import has_content
from . import faults, shares

Text = tuple[str, Optional[str]]

#: what building a set counts, in its record (transfer.json)
COUNTS = (
    "examples",
    "from_files",
    "augmented",
    "dropped_dev_duplicates",
    "dropped_train_duplicates",
    "dropped_repeats",
    "dropped_degenerate",
)
COPIES_FILE, DIGESTS_FILE, PREPARED_FILE = "copies.jsonl", "digests.u64", "prepared.json"
CHUNK = 1 << 16  # digests written, and read back, at a time


def normalised(text: Text) -> str:
    """The key under which two texts count as the same sentence: case and spacing ignored."""
    return "\t".join(" ".join(part.lower().split()) for part in text if part is not None)


def digest(key: str) -> int:
    """64 bits standing for a normalised text: millions of them in one array stay small."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def first_occurrences(digests: np.ndarray) -> np.ndarray:
    """The positions of each distinct digest's first occurrence, in order."""
    return np.sort(np.unique(digests, return_index=True)[1])


def line(text: Text) -> str:
    """A text as a line of the set's JSONL file."""
    return json.dumps([text[0]] if text[1] is None else list(text), ensure_ascii=False) + "\n"


class TrainingSentences(Sequence[str]):
    """Every sentence of the training examples (both of a pair), as an augmenter's ``prepare`` sees
    them: read from the examples as they are asked for, never copied into one list."""

    def __init__(self, examples: Sequence[Example]) -> None:
        self.examples = examples
        self.pairs = bool(examples) and examples[0].text_b is not None

    def __len__(self) -> int:
        return len(self.examples) * (2 if self.pairs else 1)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"sentence index {index} out of range for {len(self)} sentences")
        index %= len(self)
        if not self.pairs:
            return self.examples[index].text_a
        example = self.examples[index // 2]
        return example.text_b if index % 2 else example.text_a

    def __iter__(self) -> Iterator[str]:
        for example in self.examples:
            yield example.text_a
            if self.pairs:
                yield example.text_b


def augmented(
    augmenter: Any, examples: Sequence[Example], factor: int, seed: int, rows: Optional[range] = None
) -> Iterator[tuple[int, Text]]:
    """``(source index, text)`` for ``factor`` augmented copies of every example (of ``rows``, a
    share, when given; duplicates are the set's to drop). Each copy's randomness depends only on
    (seed, example, copy), so a share's copies are the ones one process makes; the sides of a
    pair are augmented each on its own."""
    schedule = capabilities(AugmenterCapabilities, augmenter).pair_schedule
    for index in range(len(examples)) if rows is None else rows:
        example = examples[index]
        for copy in range(factor):
            rng = random.Random(f"{seed}:{index}:{copy}")
            a, b = example.text_a, example.text_b
            side = copy % 3 if schedule == "cycle" else 2  # pairs: the first only, the second only, both
            if b is None or side in (0, 2):
                a = augmenter(a, rng)
            if b is not None and side in (1, 2):
                b = augmenter(b, rng)
            if a.strip() and (b is None or b.strip()):
                yield index, (a, b)


class Checks:
    """The checks a candidate text needs nothing else for: not a dev sentence, not a training
    sentence, not only stop words, punctuation and special tokens."""

    def __init__(self, train: Sequence[Example], dev_keys: set[str], special: list[str]) -> None:
        self.dev_keys, self.special = dev_keys, special
        hashed = (digest(normalised((example.text_a, example.text_b))) for example in train)
        self.training = np.unique(np.fromiter(hashed, np.uint64, len(train)))  # sorted: searched

    def __call__(self, text: Text) -> tuple[Optional[str], int]:
        """``(the count that drops it, or None to keep it; its digest)``."""
        key = normalised(text)
        hashed = digest(key)
        if key in self.dev_keys:
            return "dropped_dev_duplicates", hashed
        where = int(np.searchsorted(self.training, np.uint64(hashed)))
        if where < len(self.training) and int(self.training[where]) == hashed:
            return "dropped_train_duplicates", hashed
        if not has_content(key.split(), self.special):
            return "dropped_degenerate", hashed
        return None, hashed


class Writer:
    """The set's texts file, each text kept once, in the order offered, with the counts. The texts
    that pass the checks are offered in parts (a file of lines and their digests: the transfer files',
    the augmented copies', or a process's share of them); :meth:`finish` keeps each digest's first
    occurrence (``numpy.unique`` over every part's digests) and writes those lines, in order."""

    def __init__(self, handle, scratch: Path) -> None:
        self.handle, self.scratch = handle, scratch
        self.counts = dict.fromkeys(COUNTS, 0)
        #: (lines file, its digests, origin, the error if the two disagree, whether this writer wrote it)
        self.parts: list[tuple[Path, np.ndarray, str, Optional[Exception], bool]] = []

    def check_and_offer(self, checks: Checks, texts: Iterable[Text], origin: str) -> None:
        path, digests = self.scratch / f".candidates-{len(self.parts)}.jsonl", array("Q")
        self.parts.append((path, np.zeros(0, np.uint64), origin, None, True))  # removed by finish, whatever happens
        with open(path, "w", encoding="utf-8") as candidates:
            for text in texts:
                dropped, hashed = checks(text)
                if dropped:
                    self.counts[dropped] += 1
                else:
                    candidates.write(line(text))
                    digests.append(hashed)
        self.parts[-1] = (path, np.frombuffer(digests, np.uint64), origin, None, True)

    def offer_part(self, lines: Path, digests: np.ndarray, origin: str, incomplete: Exception) -> None:
        """Lines another process wrote with their digests; ``incomplete`` raised if they disagree."""
        self.parts.append((lines, digests, origin, incomplete, False))

    def finish(self) -> None:
        try:
            everything = np.concatenate([part[1] for part in self.parts] or [np.zeros(0, np.uint64)])
            keep = np.zeros(len(everything), dtype=bool)
            keep[np.unique(everything, return_index=True)[1]] = True
            del everything
            start = 0
            for path, digests, origin, incomplete, _ in self.parts:
                self._copy(path, keep[start : start + len(digests)], origin, incomplete)
                start += len(digests)
        finally:
            for path, *_, own in self.parts:
                if own:
                    path.unlink(missing_ok=True)

    def _copy(self, path: Path, keep: np.ndarray, origin: str, incomplete: Optional[Exception]) -> None:
        offered = 0
        with open(path, encoding="utf-8") as lines:
            for start in range(0, len(keep), CHUNK):  # a chunk of Python bools at a time
                for kept, text_line in zip(keep[start : start + CHUNK].tolist(), lines):
                    offered += 1
                    if kept:
                        self.handle.write(text_line)
                        self.counts["examples"] += 1
                        self.counts[origin] += 1
                    else:
                        self.counts["dropped_repeats"] += 1
            if (offered != len(keep) or lines.readline()) and incomplete is not None:
                raise incomplete


def prepare_alone(augmenter: Any, train: Sequence[Example]) -> None:
    if hasattr(augmenter, "prepare"):
        augmenter.prepare(TrainingSentences(train))


class SharedAugmentation:
    """The processes of a launch augmenting the training set together, in ``build``'s folder (on the
    filesystem they all see): one share each of the augmenter's preparation, then of the copies."""

    PREPARING, COPYING = "the augmenter's preparation", "the augmentation of the training set"

    def __init__(self, build: shares.Build, augmenter: Any, train: Sequence[Example], checks: Checks) -> None:
        self.build, self.augmenter, self.train, self.checks = build, augmenter, train, checks
        self.processes = build.processes
        self._copies: list[dict[str, Any]] = []

    def prepare(self) -> None:
        """The augmenter prepared as ``prepare`` would, each process preparing one share of the
        distinct training sentences where the augmenter can join shares; else on its own."""
        rank, count = self.processes.rank, self.processes.count
        if not (hasattr(self.augmenter, "prepare_share") and hasattr(self.augmenter, "prepare_join")):
            prepare_alone(self.augmenter, self.train)
            return
        sentences = TrainingSentences(self.train)
        distinct = first_occurrences(np.fromiter((digest(s) for s in sentences), np.uint64, len(sentences)))
        mine = shares.share(len(distinct), rank, count)

        def prepare_share(directory: Path) -> dict[str, Any]:
            prepared = self.augmenter.prepare_share(sentences[int(distinct[i])] for i in mine)
            (directory / PREPARED_FILE).write_text(json.dumps(prepared), encoding="utf-8")
            return {}

        self.build.share(prepare_share, len(mine), phase="prepare", what=self.PREPARING)
        self.augmenter.prepare_join(
            [
                json.loads((self.build.share_dir(other, "prepare") / PREPARED_FILE).read_text(encoding="utf-8"))
                for other in range(count)
            ]
        )

    def copy_share(self, factor: int, seed: int) -> None:
        """This process's copies, checked and written into its share of the folder; every rank's record."""
        rank = self.processes.rank
        rows = shares.share(len(self.train), rank, self.processes.count)

        def write(directory: Path) -> dict[str, Any]:
            dropped = dict.fromkeys(COUNTS, 0)
            digests = array("Q")
            with (
                open(directory / COPIES_FILE, "w", encoding="utf-8") as copies,
                open(directory / DIGESTS_FILE, "wb") as digest_file,
            ):
                for _, text in augmented(self.augmenter, self.train, factor, seed, rows):
                    faults.fire_at(f"augment-share-rank{rank}")
                    reason, hashed = self.checks(text)
                    if reason:
                        dropped[reason] += 1
                        continue
                    copies.write(line(text))
                    digests.append(hashed)
                    if len(digests) == CHUNK:
                        digests.tofile(digest_file)
                        del digests[:]
                digests.tofile(digest_file)
            return {"dropped": dropped}

        self._copies = self.build.share(write, len(rows), phase="copies", what=self.COPYING)

    def join_copies(self, writer: Writer) -> list[dict[str, Any]]:
        """Rank 0: every process's copies, offered to ``writer`` in order; each share's record."""
        for rank, record in enumerate(self._copies):
            directory = self.build.share_dir(rank, "copies")
            path = directory / DIGESTS_FILE
            digests = np.memmap(path, dtype=np.uint64, mode="r") if path.stat().st_size else np.zeros(0, np.uint64)
            incomplete = shares.ShareFailed(rank, "left a share that is incomplete", self.COPYING)
            writer.offer_part(directory / COPIES_FILE, digests, "augmented", incomplete)
            for name, value in record["dropped"].items():
                writer.counts[name] += value
        return [{key: record[key] for key in ("rank", "examples", "seconds")} for record in self._copies]

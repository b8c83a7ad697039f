"""Tokenised data sets, length-grouped batching and padding to each batch's own length.

Every encoded example keeps its position in the split (``index``), so teacher outputs can be
looked up from the teacher cache by index whatever the batch order or the student's tokenizer.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from ..token_budget import budget_batches
from ..types import Example, Task


class TokenTable(Sequence[list[int]]):
    """Token id lists stored flat (one array of ids, one of offsets); ``table[i]`` is one example's
    ids. In memory for a task's splits (4 bytes a token, where a list of Python ints takes about
    36), memory-mapped from disk for a stored transfer set."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids, self.offsets = ids, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"token table index {index} out of range for {len(self)} sequences")
        index %= len(self)
        return self.ids[self.offsets[index] : self.offsets[index + 1]].tolist()

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def packed(sequences: Sequence[Sequence[int]], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """``(every id of sequences in one flat array, each sequence's length)``: a tokenizer's Python
    lists of one chunk of texts, as arrays."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    return np.fromiter(itertools.chain.from_iterable(sequences), dtype=dtype, count=int(lengths.sum())), lengths


class GrowingArray:
    """A flat array filled chunk by chunk. It grows in place (``ndarray.resize`` reallocates, and a
    large block is remapped, not copied), so a split's token ids are never held twice, as joining
    per-chunk arrays would hold them. The first reservation's unfilled capacity is never touched, so
    never resident; growing zero-fills the new part (at most a quarter more), given back at the end."""

    def __init__(self, dtype: type) -> None:
        self.array, self.size = np.empty(0, dtype=dtype), 0

    def reserve(self, capacity: int) -> None:
        if capacity <= len(self.array):
            return
        if self.size == 0:
            self.array = np.empty(capacity, dtype=self.array.dtype)  # untouched pages cost nothing
        else:  # resize zero-fills the new part; no views of the array exist until it is finished
            self.array.resize(capacity, refcheck=False)

    def extend(self, values: np.ndarray) -> None:
        end = self.size + len(values)
        if end > len(self.array):
            self.reserve(max(end, len(self.array) + len(self.array) // 4))
        self.array[self.size : end] = values
        self.size = end

    def finished(self) -> np.ndarray:
        """The filled part; the capacity beyond it is given back."""
        self.array.resize(self.size, refcheck=False)
        return self.array


@dataclass
class EncodedSplit:
    """A split tokenised once: token ids (a :class:`TokenTable`), labels and each example's index."""

    input_ids: Sequence[list[int]]  # a TokenTable (in memory, or memory-mapped for transfer sets), or lists
    token_type_ids: Sequence[list[int]] | None
    labels: list[float]
    is_regression: bool
    pad_id: int
    #: a fingerprint of the token ids computed when they were stored (hashing them again is slow)
    token_fingerprint: Optional[str] = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = {"index": index, "input_ids": self.input_ids[index], "label": self.labels[index]}
        if self.token_type_ids is not None:
            item["token_type_ids"] = self.token_type_ids[index]
        return item

    @property
    def lengths(self) -> Sequence[int]:
        if hasattr(self.input_ids, "lengths"):
            return self.input_ids.lengths()
        return [len(ids) for ids in self.input_ids]


class WithTransfer:
    """The labelled training split followed by a transfer set, as one data set for distillation.

    Index ``i < len(labelled)`` is a labelled example, the rest the transfer set's (its index into
    the teacher cache is ``i - len(labelled)``); items carry ``labelled``, so the objective counts
    CE on the labelled rows only. An epoch visits every labelled example and ``per_epoch``
    transfer examples: the transfer set in one fixed shuffled order (per seed), continued from
    epoch to epoch, so every transfer example is seen once before any is seen twice.
    """

    def __init__(self, labelled: EncodedSplit, transfer: EncodedSplit, *, per_epoch: Optional[int] = None) -> None:
        self.labelled, self.transfer = labelled, transfer
        self.per_epoch = len(transfer) if per_epoch is None else max(0, min(per_epoch, len(transfer)))
        self.is_regression, self.pad_id = labelled.is_regression, labelled.pad_id

    def __len__(self) -> int:
        return len(self.labelled) + len(self.transfer)

    @property
    def epoch_size(self) -> int:
        return len(self.labelled) + self.per_epoch

    @property
    def lengths(self) -> np.ndarray:
        return np.concatenate(
            [np.asarray(self.labelled.lengths, dtype=np.int64), np.asarray(self.transfer.lengths, dtype=np.int64)]
        )

    def __getitem__(self, index: int) -> dict[str, Any]:
        first = len(self.labelled)
        if index < first:
            return {**self.labelled[index], "labelled": True}
        return {**self.transfer[index - first], "index": index, "labelled": False}

    def epoch_pool(self, epoch: int, seed: int) -> list[int]:
        """The indices one epoch visits (before the sampler's shuffle)."""
        first, total = len(self.labelled), len(self.transfer)
        if self.per_epoch >= total:
            return list(range(first + total))
        order = np.random.default_rng(seed).permutation(total)
        start = ((epoch - 1) * self.per_epoch) % total
        chosen = np.take(order, np.arange(start, start + self.per_epoch), mode="wrap")
        return list(range(first)) + (chosen + first).tolist()


def default_max_length(task: Task) -> int:
    """The papers' maximum sequence lengths: 64 for single sentences, 128 for pairs."""
    return 128 if task.is_pair else 64


#: texts tokenised at once: the tokenizer's Python lists of one chunk are packed before the next
ENCODE_CHUNK = 8192


def encode(examples: Sequence[Example], tokenizer: Any, max_length: int, *, is_regression: bool) -> EncodedSplit:
    """``examples`` tokenised in chunks, each packed into one flat array of the split's ids before the
    next is tokenised: memory grows with the token count (4 bytes a token), not with Python objects,
    and the ids are never held twice."""
    pairs = bool(examples) and examples[0].text_b is not None
    offsets = np.zeros(len(examples) + 1, dtype=np.int64)
    ids, types = GrowingArray(np.int32), GrowingArray(np.int8)
    with_types = False
    for start in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[start : start + ENCODE_CHUNK]
        encoded = tokenizer(
            [example.text_a for example in chunk],
            [example.text_b for example in chunk] if pairs else None,
            truncation=True,
            max_length=max_length,
        )
        chunk_ids, lengths = packed(encoded["input_ids"], np.int32)
        if start == 0:  # the first chunk's mean length, times the split, with a margin: one allocation
            ids.reserve(int(len(chunk_ids) / len(chunk) * len(examples) * 1.05) + 1)
        ids.extend(chunk_ids)
        np.cumsum(lengths, out=offsets[start + 1 : start + 1 + len(chunk)])
        offsets[start + 1 : start + 1 + len(chunk)] += offsets[start]
        with_types = "token_type_ids" in encoded
        if with_types:
            types.reserve(len(ids.array))
            types.extend(packed(encoded["token_type_ids"], np.int8)[0])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    labels = [float(example.label) if is_regression else int(example.label) for example in examples]
    return EncodedSplit(
        input_ids=TokenTable(ids.finished(), offsets),
        token_type_ids=TokenTable(types.finished(), offsets) if with_types else None,
        labels=labels,
        is_regression=is_regression,
        pad_id=pad_id,
    )


class Collator:
    """Pads a batch to its own longest sequence (never to a fixed maximum)."""

    def __init__(self, pad_id: int, is_regression: bool) -> None:
        self.pad_id = pad_id
        self.is_regression = is_regression

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(item["input_ids"]) for item in items)
        batch_size = len(items)
        input_ids = torch.full((batch_size, width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.long)
        has_types = "token_type_ids" in items[0]
        token_type_ids = torch.zeros((batch_size, width), dtype=torch.long) if has_types else None
        for row, item in enumerate(items):
            length = len(item["input_ids"])
            input_ids[row, :length] = torch.tensor(item["input_ids"])
            attention_mask[row, :length] = 1
            if has_types:
                token_type_ids[row, :length] = torch.tensor(item["token_type_ids"])
        batch = {
            "index": torch.tensor([item["index"] for item in items], dtype=torch.long),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": torch.tensor(
                [item["label"] for item in items], dtype=torch.float if self.is_regression else torch.long
            ),
        }
        if has_types:
            batch["token_type_ids"] = token_type_ids
        if "labelled" in items[0]:
            batch["labelled"] = torch.tensor([item["labelled"] for item in items], dtype=torch.bool)
        return batch


class LengthGroupedBatchSampler(Sampler[list[int]]):
    """Batches of similar length, in a random order that depends only on (seed, epoch).

    Shuffles the examples, sorts each window of ``batch_size * window_batches`` by length and
    cuts it into batches, then shuffles the batches: padding stays low while every epoch still
    sees a different, reproducible order. With ``shuffle=False`` the order is the data's.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        window_batches: int = 50,
        pool: Optional[Callable[[int, int], list[int]]] = None,
        epoch_size: Optional[int] = None,
    ) -> None:
        self.lengths = lengths if isinstance(lengths, np.ndarray) else list(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.window = batch_size * window_batches
        self.epoch = 0
        #: ``pool(epoch, seed)``: the indices an epoch visits (a transfer set's share), else all
        self.pool, self.epoch_size = pool, epoch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        order = self.pool(self.epoch, self.seed) if self.pool is not None else list(range(len(self.lengths)))
        if not self.shuffle:
            return [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        rng = random.Random(self.seed * 100_003 + self.epoch)
        rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.window):
            window = sorted(order[start : start + self.window], key=lambda i: int(self.lengths[i]))
            batches.extend(window[i : i + self.batch_size] for i in range(0, len(window), self.batch_size))
        rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        size = self.epoch_size if self.epoch_size is not None else len(self.lengths)
        return (size + self.batch_size - 1) // self.batch_size


def budget_loader(split: EncodedSplit, tokens_per_batch: int) -> DataLoader:
    """``split`` in batches of at most ``tokens_per_batch`` padded tokens, longest first (see
    :mod:`kdplug.token_budget`); each batch carries its examples' ``index``, by which whoever reads
    it puts the results back in order."""
    batches = budget_batches(split.lengths, range(len(split)), tokens_per_batch)
    return DataLoader(split, batch_sampler=batches, collate_fn=Collator(split.pad_id, split.is_regression))


def padding_ratio(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Tokens in the padded batches divided by real tokens (1.0 = no padding)."""
    real = sum(lengths)
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return padded / real if real else 1.0

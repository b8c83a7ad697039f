"""Training batches cut into the shares of the processes of a launch, so that N processes train as one.

Every process draws the same global batches (the length-grouped order depends on the seed and the
epoch only) and takes its contiguous share of each. Accelerate's ``split_batches`` does not serve:
it yields full batches only, plus the last one topped up from the first, so the one partial batch
of an epoch (placed at random by the length-grouped shuffle) was dropped in most epochs and repeated
in others. Here every example of an epoch is trained on exactly once, whatever the data's size.

A share carries its weight: ``N * |share| / |global batch|``. The loss of a process is a mean over
its share; DDP averages the gradients of the N processes; so each loss scaled by its weight makes
that average the gradient of the mean over the global batch, the one-process step. A partial batch
with fewer examples than processes leaves some processes without an example: each runs one of the
batch's examples at weight 0 (DDP's gradient all-reduce needs every process at every step).
CE over the labelled rows of a mixed batch (labelled and transfer examples) gets its own weight
(``labelled_weight``), as its mean runs over the labelled rows, not the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, Sampler

from .data import Collator, EncodedSplit, LengthGroupedBatchSampler, WithTransfer


@dataclass(frozen=True)
class Share:
    """One process's share of one global batch."""

    indices: list[int]
    #: examples in the global batch, and how many of them are labelled (None: a split without a transfer set)
    batch_size: int
    labelled: Optional[int]
    processes: int
    #: this process has no example of the batch: ``indices`` repeat one, trained at weight 0
    filler: bool = False

    @property
    def weight(self) -> float:
        """What this process's loss (a mean over its share) is scaled by: DDP's average of the scaled
        gradients is then the gradient of the global batch's mean."""
        return 0.0 if self.filler else self.processes * len(self.indices) / self.batch_size


class ProcessShards(Sampler[Share]):
    """This process's share (:class:`Share`) of each global batch of ``batches``; the same number of
    steps on every process, each example of an epoch in exactly one share."""

    def __init__(self, batches: LengthGroupedBatchSampler, rank: int, processes: int, labelled: Optional[int]) -> None:
        self.batches, self.rank, self.processes, self.labelled = batches, rank, processes, labelled
        #: global batches of the current epoch to pass over (a resumed epoch's steps already taken)
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.batches.set_epoch(epoch)
        self.skip = skip

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Share]:
        for batch in self.batches.batches()[self.skip :]:
            first, last = len(batch) * self.rank // self.processes, len(batch) * (self.rank + 1) // self.processes
            labelled = None if self.labelled is None else sum(index < self.labelled for index in batch)
            part = batch[first:last]
            yield Share(part or batch[:1], len(batch), labelled, self.processes, filler=not part)


class ShareView:
    """A split read share by share: each share's items, with the share (for :class:`ShareCollator`)."""

    def __init__(self, split: EncodedSplit | WithTransfer) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.split[index]

    def __getitems__(self, share: Share) -> tuple[Share, list[dict[str, Any]]]:
        return share, [self.split[index] for index in share.indices]


class ShareCollator:
    """A share's batch, padded as :class:`Collator` pads, with its weights: ``weight`` (the loss's)
    and, where the global batch has labelled rows among unlabelled ones, ``labelled_weight`` (CE's
    over this share's labelled rows, so that the weighted CE is this share's part of the global
    batch's labelled mean)."""

    def __init__(self, collator: Collator) -> None:
        self.collator = collator

    def __call__(self, data: tuple[Share, list[dict[str, Any]]]) -> dict[str, Any]:
        share, items = data
        batch = self.collator(items)
        batch["weight"] = share.weight  # a float: exact in any dtype the loss is computed in
        if share.labelled:  # CE_r * weight_r, averaged over the processes = sum of CE over labelled / |L|
            mine = 0 if share.filler else int(batch["labelled"].sum())  # integers: exactly 1.0 in one process
            batch["labelled_weight"] = mine * share.batch_size / (len(share.indices) * share.labelled)
        return batch


def training_loader(
    split: EncodedSplit | WithTransfer,
    sampler: LengthGroupedBatchSampler,
    *,
    rank: int,
    processes: int,
    num_workers: int,
) -> tuple[DataLoader, ProcessShards]:
    """This process's loader over ``split``'s batches as ``sampler`` draws them, and its shards
    (``set_epoch`` before each epoch)."""
    labelled = len(split.labelled) if isinstance(split, WithTransfer) else None
    shards = ProcessShards(sampler, rank, processes, labelled)
    loader = DataLoader(
        ShareView(split),  # type: ignore[arg-type]
        batch_sampler=shards,  # type: ignore[arg-type]
        collate_fn=ShareCollator(Collator(split.pad_id, split.is_regression)),
        num_workers=num_workers,
        # its own generator: creating an iterator must not draw from the global RNG, or a resumed
        # run would see different dropout masks than an uninterrupted one
        generator=torch.Generator().manual_seed(sampler.seed),
    )
    return loader, shards

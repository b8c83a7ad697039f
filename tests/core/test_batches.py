"""Global batches cut into process shares (engine/batches.py): every example once an epoch under N
processes, whatever the data's size, and the weighted shares' gradient is the global batch's."""

from __future__ import annotations

import collections
import random

import pytest
import torch

import kdplug
from kdplug.engine.batches import ProcessShards, ShareCollator, ShareView
from kdplug.engine.data import Collator, EncodedSplit, LengthGroupedBatchSampler, WithTransfer
from kdplug.engine.objective import WeightedObjective
from kdplug.types import StepState


def shards(lengths, batch_size, processes, labelled=None, seed=5):
    return [
        ProcessShards(LengthGroupedBatchSampler(lengths, batch_size, seed=seed), rank, processes, labelled)
        for rank in range(processes)
    ]


@pytest.mark.parametrize("size", [1, 2, 5, 7, 8, 9, 45, 48, 101])
@pytest.mark.parametrize("batch_size, processes", [(8, 2), (4, 3), (6, 4)])
def test_every_example_is_in_exactly_one_share_an_epoch_whatever_the_size(size, batch_size, processes):
    rng = random.Random(size)
    lengths = [rng.randint(1, 30) for _ in range(size)]
    ranks = shards(lengths, batch_size, processes)
    for epoch in (1, 2, 3):
        for rank in ranks:
            rank.set_epoch(epoch)
        steps = [list(rank) for rank in ranks]
        assert {len(s) for s in steps} == {len(ranks[0])}  # the same number of steps on every process
        seen = collections.Counter()
        for step, (batch, *_) in enumerate(zip(ranks[0].batches.batches(), *steps)):
            shares = [s[step] for s in steps]
            real = [i for share in shares if not share.filler for i in share.indices]
            assert real == batch  # the global batch, in order, cut into contiguous shares
            assert sum(share.weight for share in shares) == pytest.approx(processes)
            seen.update(real)
        assert seen == collections.Counter(range(size)), (epoch, seen)  # none dropped, none repeated


def test_a_resumed_epoch_passes_over_the_steps_already_taken():
    ranks = shards(list(range(1, 46)), 8, 2)
    ranks[1].set_epoch(2)
    whole = list(ranks[1])
    ranks[1].set_epoch(2, skip=4)
    assert list(ranks[1]) == whole[4:]


def split(lengths, seed):
    rng = random.Random(seed)
    ids = [[rng.randint(1, 9) for _ in range(n)] for n in lengths]
    return EncodedSplit(ids, None, [rng.randint(0, 1) for _ in lengths], False, 0)


class Bag(torch.nn.Module):
    """A tiny student: a linear layer on the mean of its token embeddings (float64)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 4, dtype=torch.float64)
        self.out = torch.nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, batch):
        mask = batch["attention_mask"].unsqueeze(-1).double()
        return self.out((self.embed(batch["input_ids"]) * mask).sum(1) / mask.sum(1))


def loss_gradient(model, objective, batch, teacher):
    """The gradient of ``weight * loss`` of one share's batch, and its loss terms."""
    model.zero_grad()
    logits = model(batch)
    terms = objective(
        StepState(
            student_logits=logits,
            student_layers=[],
            labels=batch["labels"],
            teacher_logits=teacher[batch["index"]],
            teacher_layers=None,
            teacher_head_logits=None,
            pairs=None,
            labelled=batch.get("labelled"),
            labelled_weight=batch.get("labelled_weight"),
        )
    )
    (terms["loss"] * batch["weight"]).backward()
    return [p.grad.clone() for p in model.parameters()], {k: v.detach() * batch["weight"] for k, v in terms.items()}


@pytest.mark.parametrize("processes", [1, 2, 3])
@pytest.mark.parametrize("labelled_count", [3, 12])  # a transfer set's batches mix labelled and unlabelled rows
@pytest.mark.parametrize("size", [17, 21])  # the last batch of 1 (processes without an example) or of 5
def test_weighted_shares_give_the_gradient_and_the_terms_of_the_global_batch(processes, labelled_count, size):
    """DDP averages the processes' gradients: with each share's loss weighted, that average is the
    gradient of the whole batch's loss (CE's mean over its labelled rows, KD's over all rows), for full
    and partial batches, shares without a labelled row, and processes without an example (filler)."""
    lengths = [(i * 7) % 11 + 1 for i in range(size)]
    data = WithTransfer(split(lengths[:labelled_count], 1), split(lengths[labelled_count:], 2))
    teacher = torch.randn(len(data), 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    objective = WeightedObjective(
        eta=0.6,
        lam=0.0,
        task_loss=kdplug.create_loss("ce"),
        kd_loss=kdplug.create_loss("kd", temperature=2.0),
        ild_loss=None,
    )
    model, view, collate = Bag(), ShareView(data), ShareCollator(Collator(0, False))
    cut = shards(data.lengths, 8, processes, labelled=labelled_count)
    whole = shards(data.lengths, 8, 1, labelled=labelled_count)[0]
    checked = 0
    for shares in zip(whole, *cut):
        reference, expected = loss_gradient(model, objective, collate(view.__getitems__(shares[0])), teacher)
        parts = [loss_gradient(model, objective, collate(view.__getitems__(share)), teacher) for share in shares[1:]]
        assert [set(terms) for _, terms in parts] == [set(expected)] * processes  # the same terms on every process
        for position, gradient in enumerate(reference):
            averaged = sum(grads[position] for grads, _ in parts) / processes
            torch.testing.assert_close(averaged, gradient, rtol=0, atol=1e-12)
        for key, value in expected.items():
            assert sum(terms[key] for _, terms in parts).item() / processes == pytest.approx(value.item(), abs=1e-12)
        checked += 1
    assert checked == 3  # 8 + 8 + 1 or 5: the last batch partial

"""Warm-up of the teacher's pseudo classifiers (Universal-KD's f_i^t, DIH's heads).

Each head is a Linear on one frozen teacher layer, trained with CE (MSE for regression) on the
cached layer vectors, so the warm-up never runs the teacher. Each head keeps the weights of
its own best dev-loss epoch. Trained heads are stored by a fingerprint of the teacher cache and
the settings, so later runs with the same teacher and data reuse them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from . import fingerprint
from .cache import TeacherCache, file_lock
from .objective import TeacherHeads

log = logging.getLogger(__name__)


def _head_loss(logits: torch.Tensor, labels: torch.Tensor, is_regression: bool) -> torch.Tensor:
    """Per-head losses of ``(B, n, C)`` logits: a vector of n values."""
    if is_regression:
        return ((logits.squeeze(-1) - labels[:, None]) ** 2).mean(dim=0)
    n = logits.shape[1]
    flat = F.cross_entropy(logits.flatten(0, 1), labels.repeat_interleave(n), reduction="none")  # (B*n,)
    return flat.view(-1, n).mean(dim=0)


@torch.no_grad()
def _dev_logits(heads: TeacherHeads, cache: TeacherCache, batch_size: int) -> torch.Tensor:
    chunks = []
    for start in range(0, len(cache), batch_size):
        _, layers = cache.fetch(torch.arange(start, min(start + batch_size, len(cache))))
        chunks.append(heads(layers))
    return torch.cat(chunks)  # (N, n, C)


def train_heads(train: TeacherCache, train_labels: list[float], dev: TeacherCache, dev_labels: list[float], *,
                num_outputs: int, is_regression: bool, epochs: int, lr: float, batch_size: int, seed: int) -> tuple[TeacherHeads, dict]:
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    heads = TeacherHeads([spec.width for spec in train.specs], num_outputs)
    label_dtype = torch.float if is_regression else torch.long
    y_train, y_dev = torch.tensor(train_labels, dtype=label_dtype), torch.tensor(dev_labels, dtype=label_dtype)
    optimizer = torch.optim.Adam(heads.parameters(), lr=lr)
    n = len(heads.heads)
    best_loss = torch.full((n,), float("inf"))
    best = [None] * n
    history = []
    for epoch in range(1, epochs + 1):
        heads.train()
        order = torch.randperm(len(y_train), generator=generator)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            _, layers = train.fetch(rows)  # memory stays flat: only this batch is paged in
            loss = _head_loss(heads(layers), y_train[rows], is_regression).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        heads.eval()
        dev_loss = _head_loss(_dev_logits(heads, dev, 4 * batch_size), y_dev, is_regression)
        history.append({"epoch": epoch, "dev_loss": dev_loss.tolist()})
        for i in range(n):
            if dev_loss[i] < best_loss[i]:
                best_loss[i] = dev_loss[i]
                best[i] = {k: v.clone() for k, v in heads.heads[i].state_dict().items()}
    for i, state in enumerate(best):
        if state is not None:
            heads.heads[i].load_state_dict(state)
    dev_logits = _dev_logits(heads, dev, 4 * batch_size)
    accuracy = None if is_regression else (dev_logits.argmax(-1) == y_dev[:, None]).float().mean(0).tolist()
    return heads, {"best_dev_loss": best_loss.tolist(), "dev_accuracy": accuracy, "history": history}


def warmed_up_heads(root: Path, train: TeacherCache, train_labels: list[float], dev: TeacherCache,
                    dev_labels: list[float], *, num_outputs: int, is_regression: bool, epochs: int, lr: float,
                    batch_size: int, seed: int) -> tuple[TeacherHeads, dict]:
    """Heads for this teacher cache: loaded when stored, else trained and stored."""
    key = fingerprint.of_values("teacher-heads", train.meta.fingerprint, dev.meta.fingerprint,
                                fingerprint.of_values(train_labels), epochs, lr, batch_size, seed)
    directory = root / "heads"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{key}.safetensors"
    with file_lock(directory / f"{key}.lock"):
        heads = TeacherHeads([spec.width for spec in train.specs], num_outputs)
        if path.is_file():
            try:
                heads.load_state_dict(load_file(str(path)))
                log.info("teacher heads reused from %s", path)
                return heads, {"reused": str(path)}
            except Exception as exc:  # a damaged file: train again
                log.warning("stored teacher heads %s are unreadable (%s); training them again", path, exc)
        heads, summary = train_heads(train, train_labels, dev, dev_labels, num_outputs=num_outputs,
                                     is_regression=is_regression, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
        staging = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in heads.state_dict().items()}, str(staging))
        staging.replace(path)
    return heads, summary

"""Warm-up of the teacher's pseudo classifiers (Universal-KD's f_i^t, DIH's heads).

Each head is a Linear on one frozen teacher layer, trained with CE (MSE for regression) on the
cached layer vectors, so the warm-up never runs the teacher. Each head keeps the weights of its
own best epoch, judged on a fixed held-out tenth of the *training* set (every tenth example),
never on the dev split that results are reported on. Trained heads are stored by a fingerprint
of the teacher cache and the settings, so later runs with the same teacher and data reuse them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from .. import fingerprint
from ..storage import file_lock, raise_as_storage_error, staging_file, write_atomic
from .cache import TeacherCache
from .objective import TeacherHeads

log = logging.getLogger(__name__)


def _head_loss(logits: torch.Tensor, labels: torch.Tensor, is_regression: bool) -> torch.Tensor:
    """Per-head losses of ``(B, n, C)`` logits: a vector of n values."""
    if is_regression:
        return ((logits.squeeze(-1) - labels[:, None]) ** 2).mean(dim=0)
    n = logits.shape[1]
    flat = F.cross_entropy(logits.flatten(0, 1), labels.repeat_interleave(n), reduction="none")  # (B*n,)
    return flat.view(-1, n).mean(dim=0)


#: how the held-out slice is chosen, as recorded in metrics.json
SELECTION_RULE = "every 10th training example (index 9, 19, ...) held out; heads are trained on the rest"


def held_out_split(num_examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, held-out rows): a fixed tenth of the training set, the same for every seed."""
    held_out = [i for i in range(num_examples) if i % 10 == 9] or [num_examples - 1]
    kept = set(held_out)
    train = [i for i in range(num_examples) if i not in kept] or held_out
    return torch.tensor(train), torch.tensor(held_out)


@torch.no_grad()
def _logits(heads: TeacherHeads, cache: TeacherCache, rows: torch.Tensor, batch_size: int) -> torch.Tensor:
    chunks = []
    for start in range(0, len(rows), batch_size):
        _, layers = cache.fetch(rows[start : start + batch_size])
        chunks.append(heads(layers))
    return torch.cat(chunks)  # (N, n, C)


def train_heads(
    cache: TeacherCache,
    labels: list[float],
    *,
    num_outputs: int,
    is_regression: bool,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> tuple[TeacherHeads, dict]:
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    heads = TeacherHeads([spec.width for spec in cache.specs], num_outputs)
    y = torch.tensor(labels, dtype=torch.float if is_regression else torch.long)
    train_rows, held_rows = held_out_split(len(y))
    optimizer = torch.optim.Adam(heads.parameters(), lr=lr)
    n = len(heads.heads)
    best_loss = torch.full((n,), float("inf"))
    best = [None] * n
    history = []
    for epoch in range(1, epochs + 1):
        heads.train()
        order = train_rows[torch.randperm(len(train_rows), generator=generator)]
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            _, layers = cache.fetch(rows)  # memory stays flat: only this batch is paged in
            loss = _head_loss(heads(layers), y[rows], is_regression).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        heads.eval()
        held_loss = _head_loss(_logits(heads, cache, held_rows, 4 * batch_size), y[held_rows], is_regression)
        history.append({"epoch": epoch, "held_out_loss": held_loss.tolist()})
        for i in range(n):
            if held_loss[i] < best_loss[i]:
                best_loss[i] = held_loss[i]
                best[i] = {k: v.clone() for k, v in heads.heads[i].state_dict().items()}
    for i, state in enumerate(best):
        if state is not None:
            heads.heads[i].load_state_dict(state)
    held_logits = _logits(heads, cache, held_rows, 4 * batch_size)
    accuracy = None if is_regression else (held_logits.argmax(-1) == y[held_rows][:, None]).float().mean(0).tolist()
    return heads, {
        "selection": SELECTION_RULE,
        "trained_on": len(train_rows),
        "held_out": len(held_rows),
        "best_held_out_loss": best_loss.tolist(),
        "held_out_accuracy": accuracy,
        "history": history,
    }


def warmed_up_heads(
    root: Path,
    cache: TeacherCache,
    labels: list[float],
    *,
    num_outputs: int,
    is_regression: bool,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> tuple[TeacherHeads, dict]:
    """Heads for this teacher cache: loaded when stored, else trained and stored."""
    key = fingerprint.of_values(
        "teacher-heads",
        "held-out-train",
        cache.fingerprint,  # its layers entry's key
        fingerprint.of_values(labels),
        epochs,
        lr,
        batch_size,
        seed,
    )
    directory = root / "heads"
    path = directory / f"{key}.safetensors"
    record = directory / f"{key}.json"
    with file_lock(directory / f"{key}.lock"):
        heads = TeacherHeads([spec.width for spec in cache.specs], num_outputs)
        if path.is_file():
            try:
                heads.load_state_dict(load_file(str(path)))
                log.info("teacher heads reused from %s", path)
                summary = json.loads(record.read_text()) if record.is_file() else {}
                return heads, {"reused": str(path), **summary}
            except Exception as exc:  # a damaged file: train again
                log.warning("stored teacher heads %s are unreadable (%s); training them again", path, exc)
        heads, summary = train_heads(
            cache,
            labels,
            num_outputs=num_outputs,
            is_regression=is_regression,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            seed=seed,
        )
        staging = None
        try:
            descriptor, staging = staging_file(path)
            os.close(descriptor)  # safetensors writes it by name: the name is this process's own
            save_file({k: v.contiguous() for k, v in heads.state_dict().items()}, str(staging))
            write_atomic(record, json.dumps(summary))
            os.replace(staging, path)
        except Exception as exc:
            if staging is not None:
                staging.unlink(missing_ok=True)
            raise_as_storage_error(
                exc,
                f"the teacher heads {path}",
                "the heads trained in this run are used, but not stored for later runs",
            )
    return heads, summary

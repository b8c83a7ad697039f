"""Batches sized by a budget of tokens instead of a count of examples, for passes without gradients
(the teacher pass, evaluation, ``kdplug predict``).

A batch costs what its padded tensor holds, ``examples x longest``: a count of examples gives a
batch of short sentences little work and a batch with one long text much padding. Here the
examples of a window are sorted by length, longest first (a batch too large for the device fails at
once, not at the end), and cut wherever the next example would take the padded batch past the
budget; an example longer than the budget goes alone. Results go back to the data's order window by
window, so memory for reordered results stays bounded and the teacher cache is still written in
order.

The floats differ from count batches in their last bits (about 1e-7 on an fp32 teacher's logits; one
bf16 step, up to 6.1e-5, on a teacher run in bf16 under precision auto; predictions the same): matrix products
pick their kernels by shape (a batch of a few rows takes another path than one of many) and
attention sums over the padded width. That is why these budgets are settings, off by default: a
run without them computes what it always did, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: examples sorted together: their reordered results are held until the window is done
WINDOW = 2048


def budget_batches(lengths: Sequence[int] | np.ndarray, rows: Sequence[int], tokens_per_batch: int) -> list[list[int]]:
    """``rows`` (indices into ``lengths``) sorted longest first and cut into batches whose padded
    size (examples x the batch's longest) is at most ``tokens_per_batch``; an example longer than
    that is a batch of its own. The sort is stable: equal lengths keep the data's order."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return []
    sizes = np.maximum(np.asarray(lengths)[rows], 1)
    order = np.argsort(-sizes, kind="stable")
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0  # the current batch's first example's length: longest first
    for position in order:
        if current and longest * (len(current) + 1) > tokens_per_batch:
            batches.append(current)
            current = []
        if not current:
            longest = int(sizes[position])
        current.append(int(rows[position]))
    batches.append(current)
    return batches


def windows(rows: Sequence[int], size: int = WINDOW) -> list[Sequence[int]]:
    """``rows`` in consecutive windows of ``size``."""
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def window_batches(
    lengths: Sequence[int] | np.ndarray, rows: Sequence[int], tokens_per_batch: int
) -> list[list[list[int]]]:
    """The budget batches of each window of ``rows``: one list of batches per window."""
    return [budget_batches(lengths, window, tokens_per_batch) for window in windows(rows)]

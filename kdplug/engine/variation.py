"""How much each teacher layer's vector depends on the input, and a warning when a layer method
matches layers that barely do.

A layer term compares the student's layer vectors with the teacher's. Where a teacher layer's
vector is nearly the same for every example (the [CLS] vectors of all-MiniLM-L6-v2's layers 1-5:
the input-dependent share of their energy is 4e-7 to 4e-4), the term is met by a constant: it falls
to about 0 while the student learns nothing of the input. The share of a layer over examples i is

    share = Σ_i ‖h_i − h̄‖² / Σ_i ‖h_i‖²

(0: the same vector for every input; 1: vectors centred on 0). It is read from the teacher cache
in chunks (never a full copy in memory), from evenly spaced rows when the cache is large.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import numpy as np

from ..capabilities import ProjectorCapabilities, capabilities

log = logging.getLogger(__name__)

#: below this share a matched teacher layer counts as near-constant. The cache stores layers in
#: fp16, whose rounding adds at most ~1e-7 to a share; MiniLM's flat layers sit at 4e-7 to 4e-4,
#: while a layer that carries the input (MiniLM's last, a tiny random BERT's) has 1e-2 or more
NEAR_CONSTANT = 1e-3
#: rows read at most: the shares of 20,000 evenly spaced examples are those of the split to within
#: sampling noise, and a pass over them takes well under a second
MAX_ROWS = 20_000
#: rows per chunk read from the memory-mapped cache
CHUNK_ROWS = 2048


def sampled_chunks(layers: np.ndarray, max_rows: int, chunk_rows: int) -> Iterator[np.ndarray]:
    """Chunks of ``layers`` (the cache's ``(examples, total width)`` memmap) as float64: every row,
    or evenly spaced ones when there are more than ``max_rows``."""
    step = max(1, -(-len(layers) // max_rows))
    for start in range(0, len(layers), chunk_rows * step):
        yield np.asarray(layers[start : start + chunk_rows * step : step], dtype=np.float64)


def input_dependent_shares(cache: Any, *, max_rows: int = MAX_ROWS, chunk_rows: int = CHUNK_ROWS) -> dict[int, float]:
    """Each cached teacher layer's input-dependent share of energy (module docstring), keyed by its
    number 1..n as layer maps name it. Chunks are merged by their centred sums of squares (Chan et
    al.'s update), so a share of 1e-7 is not lost to cancellation."""
    widths = [spec.width for spec in cache.specs]
    bounds = np.cumsum([0, *widths])
    count, mean, centred, energy = 0, np.zeros(bounds[-1]), np.zeros(len(widths)), np.zeros(len(widths))
    for chunk in sampled_chunks(cache.layers, max_rows, chunk_rows):
        rows, chunk_mean = len(chunk), chunk.mean(axis=0)
        chunk_centred = ((chunk - chunk_mean) ** 2).sum(axis=0)
        delta = (chunk_mean - mean) ** 2 * (count * rows / (count + rows))
        per_column = chunk_centred + delta
        centred += np.add.reduceat(per_column, bounds[:-1])
        energy += np.add.reduceat((chunk**2).sum(axis=0), bounds[:-1])
        mean += (chunk_mean - mean) * (rows / (count + rows))
        count += rows
    return {i + 1: float(c / e) if e > 0 else 0.0 for i, (c, e) in enumerate(zip(centred, energy))}


def matched_teacher_layers(projector: Any, num_teacher_layers: int) -> list[int]:
    """The teacher layers (1..n) whose cached vectors ``projector``'s term reads: those its
    ``matching`` pairs name, all of them for a projector on the teacher's pseudo classifiers (one per
    layer, Universal-KD); none for one that reads per-token signals from the live teacher (TinyBERT,
    MiniLMv2: its tokens vary where a [CLS] vector does not) or says nothing of its layers."""
    if projector is None or capabilities(ProjectorCapabilities, projector).needs_tokens:
        return []
    if capabilities(ProjectorCapabilities, projector).needs_teacher_heads:
        return list(range(1, num_teacher_layers + 1))
    matching = capabilities(ProjectorCapabilities, projector).matching
    pairs = matching.get("pairs", []) if isinstance(matching, dict) else []
    return sorted({int(t) for _, teachers in pairs for t in teachers} & set(range(1, num_teacher_layers + 1)))


def near_constant_warning(name: str, projector: Any, matched: Sequence[int], shares: dict[int, float]) -> Optional[str]:
    """The warning for the matched layers whose share is below :data:`NEAR_CONSTANT`, None if none is."""
    flat = [t for t in matched if shares[t] < NEAR_CONSTANT]
    if not flat:
        return None
    listed = ", ".join(f"{t} ({shares[t]:.1e})" for t in flat)
    varied = [t for t, share in shares.items() if share >= NEAR_CONSTANT]
    if not varied:
        top = max(shares, key=shares.get)
        remedy = (
            f"no teacher layer varies more than layer {top} ({shares[top]:.1e}): distil the logits (--projector rkd)"
        )
    elif hasattr(projector, "layer_map"):  # not through capabilities(): the option, set or not (PKD, CKD, ALP, CKA)
        remedy = (
            f"match teacher layers that vary (here {', '.join(map(str, varied))}: --set "
            f"projector_options.layer_map=[...]) or distil the logits (--projector rkd)"
        )
    else:
        remedy = f"distil the logits (--projector rkd); the layers that vary are {', '.join(map(str, varied))}"
    return (
        f"projector {name!r} matches teacher layers whose vectors barely vary across the training examples: "
        f"layer{'s' if len(flat) > 1 else ''} {listed}, input-dependent share of their energy below "
        f"{NEAR_CONSTANT:g}. Its layer term can fall to about 0 while the student learns nothing of the input; "
        f"{remedy}"
    )

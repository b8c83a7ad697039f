"""Layer maps shared by the layer-matching methods: which teacher layers each student layer learns from.

Teacher layers are numbered 1..n and student layers 1..m, as in the papers: the positions in
``request.teacher_layers`` / ``request.student_layers`` (the matchable layers, embeddings
excluded). The hidden-space methods (PKD, CKD, ALP-KD) match the student's intermediate layers
1..m−1 only: the output layer m is already supervised by the logit KD (PKD §3.2; ALP-KD: "there is
no teacher layer connected to the last student layer").

Buckets (CKD and ALP-KD, ALP-KD §Experimental Study), for k = m−1 matched student layers:

- no overlap (NO):  bucket j = {⌊(j−1)·n/k⌋+1, …, ⌊j·n/k⌋}, contiguous and near-equal
  (12→4: {1-4}, {5-8}, {9-12}; 12→2: {1-12});
- partial overlap (PO): NO bucket j plus the first layer of NO bucket j+1, i.e. each bucket shares
  its first layer with the previous one (12→4: {1-5}, {5-9}, {9-12}).

Layer maps (``projector_options.layer_map``, Yu, Wen and Mou 2025, "layer-selection strategy
doesn't matter (much)"), applied to what a method's own rule gives its k matched student layers
(a teacher layer each for PKD, a bucket each for CKD and ALP-KD):

- ``forward``: the method's own map (the default);
- ``reverse``: the same teacher layers in reverse order, student layer j gets what k+1−j had
  (their ``LAYER_MAP[m][::-1]``);
- ``random``: a permutation of them, drawn once per run from the run's seed (their
  ``np.random.permutation(LAYER_MAP[m])``, drawn once at the start) and recorded in metrics.json;
- ``all-to-one``: every matched student layer to teacher layer ⌈n/2⌉ (their "all-to-one", teacher
  layer 6 of 12);
- ``"s:t,s:t,..."``: student layer s to teacher layer t, for every matched student layer, as
  other toolkits spell a map (TextBrewer's matches, ``0:0,2:1``), here 1-based.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import Union

import torch
from torch import nn

from kdplug.errors import PluginError, UsageError
from kdplug.types import DistillInputs, LayerSpec, ProjectionRequest

Buckets = tuple[tuple[int, ...], ...]
BucketSpec = Union[str, Sequence[Sequence[int]]]


def intermediate_student_layers(request: ProjectionRequest, method: str) -> tuple[LayerSpec, ...]:
    """The student layers h^1..h^(m−1) a hidden-space method matches."""
    m = len(request.student_layers)
    if m < 2:
        raise UsageError(
            f"projector {method!r} matches the student's intermediate layers h^1..h^(m-1), but the student "
            f"has m={m} matchable layer(s); use a student with at least 2 layers, or a logit-level method "
            f"('rkd') or 'universal-cg', which distils into the output layer"
        )
    return request.student_layers[:-1]


def no_overlap_buckets(n: int, k: int) -> Buckets:
    return tuple(tuple(range((j - 1) * n // k + 1, j * n // k + 1)) for j in range(1, k + 1))


def partial_overlap_buckets(n: int, k: int) -> Buckets:
    buckets = no_overlap_buckets(n, k)
    return tuple(bucket + buckets[j + 1][:1] if j + 1 < k else bucket for j, bucket in enumerate(buckets))


def check_teacher_layer(index: object, n: int, method: str, option: str) -> int:
    """A 1-based teacher layer number from a user option, validated."""
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= n:
        raise UsageError(
            f"projector {method!r}: {option} holds {index!r}, but teacher layers are numbered 1..{n} "
            f"(the matchable layers, the embedding output excluded)"
        )
    return index


def resolve_buckets(buckets: BucketSpec, n: int, k: int, method: str) -> Buckets:
    """``"all"``, ``"no"``, ``"po"`` or k explicit lists of teacher layer numbers -> k buckets."""
    if isinstance(buckets, str):
        if buckets == "all":
            return tuple(tuple(range(1, n + 1)) for _ in range(k))
        if buckets not in ("no", "po"):
            raise UsageError(
                f"projector {method!r}: buckets must be 'all', 'no', 'po' or a list of {k} lists "
                f"of teacher layer numbers, got {buckets!r}"
            )
        if n < k:
            raise UsageError(
                f"projector {method!r}: {k} student layers cannot each get a bucket of the teacher's {n} "
                f"layers; set buckets by hand (projector_options: {{buckets: [[1], [1, 2], ...]}})"
            )
        return no_overlap_buckets(n, k) if buckets == "no" else partial_overlap_buckets(n, k)
    if not isinstance(buckets, (list, tuple)):
        raise UsageError(
            f"projector {method!r}: buckets must be 'all', 'no', 'po' or a list of {k} lists "
            f"of teacher layer numbers, got {buckets!r}"
        )
    resolved = tuple(tuple(bucket) if isinstance(bucket, (list, tuple)) else bucket for bucket in buckets)
    if len(resolved) != k or any(not isinstance(bucket, tuple) or not bucket for bucket in resolved):
        raise UsageError(
            f"projector {method!r}: buckets must hold one non-empty list of teacher layer numbers per matched "
            f"student layer ({k} lists for h^1..h^{k}), got {buckets!r}"
        )
    return tuple(tuple(check_teacher_layer(i, n, method, "buckets") for i in bucket) for bucket in resolved)


def bucket_mask(buckets: Buckets, n: int) -> torch.Tensor:
    """``(k, n)`` bool: which teacher layers each matched student layer may attend to."""
    mask = torch.zeros(len(buckets), n, dtype=torch.bool)
    for j, bucket in enumerate(buckets):
        mask[j, [i - 1 for i in bucket]] = True
    return mask


def common_width(specs: Sequence[LayerSpec], side: str, method: str) -> int:
    """The one width all ``specs`` share (pairs are stacked into one ``(batch, P, D)`` tensor)."""
    widths = sorted({spec.width for spec in specs})
    if len(widths) != 1:
        raise UsageError(
            f"projector {method!r} needs the {side}'s matched layers to share one width, got widths {widths}"
        )
    return widths[0]


def layer_adapter(student: LayerSpec, teacher: LayerSpec, out_width: int) -> nn.Module:
    """A learned Linear from a student layer to ``out_width`` where the widths differ or the two
    layers are of different architectures (a BiLSTM's attention-pooled vector, bounded by tanh,
    against a Transformer's [CLS] state: equal widths put them in no common space, and the layer
    loss would sit at a floor it cannot leave); else the identity, as the papers (BERT to BERT)."""
    if student.width == out_width and student.kind == teacher.kind:
        return nn.Identity()
    return nn.Linear(student.width, out_width)


def attention_divisor(temperature: object, width: int | None, method: str) -> float:
    """τ_att, the divisor of the attention scores: a positive number, or ``"sqrt-d"`` = √width."""
    if temperature == "sqrt-d" and width is not None:
        return math.sqrt(width)
    if not isinstance(temperature, bool) and isinstance(temperature, (int, float)) and temperature > 0:
        return float(temperature)
    allowed = "a positive number or 'sqrt-d'" if width is not None else "a positive number"
    raise UsageError(f"projector {method!r}: attention_temperature must be {allowed}, got {temperature!r}")


def check_inputs(inputs: DistillInputs, n: int, m: int, method: str) -> None:
    """The engine hands over every matchable layer of both models, as the request announced."""
    if len(inputs.teacher_layers) != n or len(inputs.student_layers) != m:
        raise PluginError(
            f"projector {method!r} was built for {n} teacher and {m} student layers but got "
            f"{len(inputs.teacher_layers)} and {len(inputs.student_layers)}; pass the layers of the "
            f"ProjectionRequest it was created with"
        )


LAYER_MAPS = ("forward", "reverse", "random", "all-to-one")
_PAIRS = re.compile(r"\s*\d+\s*:\s*\d+\s*(,\s*\d+\s*:\s*\d+\s*)*")


def arrange(groups: Buckets, layer_map: object, n: int, seed: int, method: str) -> Buckets:
    """The teacher layers of each of the k matched student layers under ``layer_map`` (see the
    module docstring); ``groups`` is the method's own (forward) map."""
    k = len(groups)
    if layer_map is None or layer_map == "forward":
        return groups
    if k == 1 and layer_map in ("reverse", "random"):
        raise UsageError(
            f"projector {method!r}: layer_map {layer_map!r} rearranges the matched student layers, but only one is "
            f"matched, so it would equal forward; set projector_options.match_output_layer=true (pkd, cka) or "
            f"use a student with more layers"
        )
    if layer_map == "reverse":
        return groups[::-1]
    if layer_map == "random":
        order = list(range(k))
        random.Random(seed).shuffle(order)
        return tuple(groups[i] for i in order)
    if layer_map == "all-to-one":
        return tuple(((n + 1) // 2,) for _ in range(k))
    if isinstance(layer_map, (list, tuple)) and len(layer_map) == k:
        return tuple((check_teacher_layer(t, n, method, "layer_map"),) for t in layer_map)
    if isinstance(layer_map, str) and _PAIRS.fullmatch(layer_map):
        pairs = [tuple(int(x) for x in item.split(":")) for item in layer_map.split(",")]
        students = sorted(s for s, _ in pairs)
        if students != list(range(1, k + 1)):
            raise UsageError(
                f"projector {method!r}: layer_map {layer_map!r} must name each matched student layer 1..{k} once "
                f"(student:teacher pairs, e.g. {','.join(f'{j}:{groups[j - 1][-1]}' for j in range(1, k + 1))})"
            )
        chosen = dict(pairs)
        return tuple((check_teacher_layer(chosen[j], n, method, "layer_map"),) for j in range(1, k + 1))
    raise UsageError(
        f"projector {method!r}: layer_map must be one of {', '.join(LAYER_MAPS)}, student:teacher pairs "
        f"such as {','.join(f'{j}:{groups[j - 1][-1]}' for j in range(1, k + 1))!r}, or a list of {k} teacher "
        f"layer number(s) (1..{n}); got {layer_map!r}"
    )


def matching_record(strategy: object, groups: Buckets) -> dict:
    """What the run records of a layer map: the strategy and each matched student layer's teacher layers."""
    return {
        "layer_map": "forward" if strategy is None else strategy if isinstance(strategy, str) else "given",
        "pairs": [[j + 1, list(group)] for j, group in enumerate(groups)],
    }


def check_layer_map_option(*_: object, layer_map: object = None, **__: object) -> None:
    """What can be said of ``layer_map`` before the models are loaded (the run's option checks)."""
    if layer_map is None or layer_map in LAYER_MAPS:
        return
    if isinstance(layer_map, str) and _PAIRS.fullmatch(layer_map):
        return
    if isinstance(layer_map, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in layer_map):
        return
    raise UsageError(
        f"projector_options.layer_map must be one of {', '.join(LAYER_MAPS)}, student:teacher pairs such as "
        f"'1:4,2:8', or a list of teacher layer numbers; got {layer_map!r}"
    )

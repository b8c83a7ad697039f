"""ALP-KD (Passban et al. 2021): each student layer imitates an attention-weighted sum of teacher layers.

For the student's intermediate layers j = 1..m−1 (the output layer is left to the logit KD, "there
is no teacher layer connected to the last student layer", ALP-KD §Experimental Study):

    α_jk = softmax_k(h_s^j · h_t^k / τ_att)  over k in A(j)        (eq. 5; τ_att = 1 in the paper)
    C^j  = Σ_k α_jk h_t^k,     L_ALP = Σ_j MSE(h_s^j, C^j)          (eq. 5-7)

A(j) is every teacher layer for ``alp`` (eq. 6) or the CKD bucket of j for ``alp-no`` /
``alp-po``, rearranged by ``layer_map`` (see :mod:`.layers`). α is computed per input from the
student's current state and is not detached: the gradient of the MSE reaches h_s^j both directly
and through α ("α ... are optimized during training"); the teacher vectors are detached. Where the
widths differ, or the student is a BiLSTM or Gated-CNN, a learned Linear maps h_s^j to the
teacher's width first, and both the scores and the MSE use the mapped vector.

``alp-kqv1`` / ``alp-kqv4`` are the key-query-value variant of the paper's appendix (Table 4),
read as Vaswani et al.'s multi-head attention with h_s^j as the query and the teacher layers as
keys; each key's value is its own learned projection:

    head_h = softmax_k(q_j W_h^Q · h_t^k W_h^K / τ_att) · [h_t^k W_h^V]_k,   C^j = concat_h(head_h) W^O

with d_head = D/heads and τ_att = √d_head by default (Vaswani's scaling), no biases (Vaswani's
equations). The value vectors carry the teacher's content through a learned map, as CKD's target
does; the alternative reading, a free vector per key, would leave C^j without any teacher content
beyond the weights. The recorded attention is the mean over heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import nn

import kdplug
from kdplug.errors import UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import (
    BucketSpec,
    arrange,
    attention_divisor,
    bucket_mask,
    check_inputs,
    check_layer_map_option,
    common_width,
    intermediate_student_layers,
    layer_adapter,
    matching_record,
    resolve_buckets,
)

AttentionTemperature = Union[float, str]


ALP = """@inproceedings{passban2021alpkd,
  title = {{ALP-KD}: Attention-Based Layer Projection for Knowledge Distillation},
  author = {Passban, Peyman and Wu, Yimeng and Rezagholizadeh, Mehdi and Liu, Qun},
  booktitle = {Proceedings of AAAI 2021},
  year = {2021}
}"""


class ALP(nn.Module):
    """ALP-KD with the attention over all n teacher layers (eq. 6): no buckets to choose."""

    name = "alp"
    default_buckets = "all"
    default_attention_temperature: AttentionTemperature = 1.0
    ild_loss = "mse"
    needs_teacher_heads = False
    # ALP-KD Table 10, its most frequent setting: η = 0.7, λ = 0.2 (MNLI, MRPC, QNLI, QQP), τ = 20
    # (4 of 8 tasks). Table 10 covers every ALP student, so the bucketed variants share it.
    default_weights = {"eta": 0.7, "lam": 0.2, "temperature": 20.0}
    citation = ALP
    check_options = staticmethod(check_layer_map_option)  # before the models load

    def __init__(
        self,
        request: ProjectionRequest,
        *,
        buckets: Optional[BucketSpec] = None,
        attention_temperature: Optional[AttentionTemperature] = None,
        layer_map: Union[str, Sequence[int], None] = None,
    ) -> None:
        super().__init__()
        students = intermediate_student_layers(request, self.name)
        self.n, self.m = len(request.teacher_layers), len(request.student_layers)
        self.width = common_width(request.teacher_layers, "teacher", self.name)
        own = resolve_buckets(self.default_buckets if buckets is None else buckets, self.n, len(students), self.name)
        if layer_map in ("reverse", "random") and len(own) > 1 and len(set(own)) == 1:
            raise UsageError(
                f"projector {self.name!r}: layer_map {layer_map!r} reorders the student layers' buckets, but every "
                f"student layer attends to the same teacher layers {list(own[0])}; use alp-no or alp-po (or set "
                f"buckets) for a map to change anything"
            )
        self.layer_map = layer_map
        self.buckets = arrange(own, layer_map, self.n, request.seed, self.name)
        self.register_buffer("mask", bucket_mask(self.buckets, self.n), persistent=False)  # (m-1, n)
        self.attention_temperature = (
            self.default_attention_temperature if attention_temperature is None else attention_temperature
        )
        attention_divisor(self.attention_temperature, self.width, self.name)  # validate now, not mid-training
        teacher = request.teacher_layers[-1]
        self.adapters = nn.ModuleList(layer_adapter(spec, teacher, self.width) for spec in students)

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        check_inputs(inputs, self.n, self.m, self.name)
        students = inputs.student_layers[:-1]
        queries = torch.stack([adapt(h) for adapt, h in zip(self.adapters, students)], dim=1)  # (B, m-1, D)
        keys = torch.stack([h.detach() for h in inputs.teacher_layers], dim=1)  # (B, n, D)
        combined, attention = self.combine(queries, keys)
        return ProjectedPairs(queries, combined, attention=attention)

    def attend(self, scores: torch.Tensor) -> torch.Tensor:
        """softmax over each student layer's bucket of ``scores`` ``(..., m-1, n)``; 0 outside it."""
        tau = attention_divisor(self.attention_temperature, self.score_width, self.name)
        return (scores / tau).masked_fill(~self.mask, float("-inf")).softmax(dim=-1)

    @property
    def score_width(self) -> int:
        """Width of the vectors whose dot products are the scores (d of ``sqrt-d``)."""
        return self.width

    def combine(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = self.attend(queries @ keys.transpose(1, 2))  # (B, m-1, n)
        return alpha @ keys, alpha  # (B, m-1, D), (B, m-1, n)

    @property
    def matching(self) -> dict:
        return matching_record(self.layer_map, self.buckets)

    def extra_repr(self) -> str:
        buckets = "all" if bool(self.mask.all()) else [list(bucket) for bucket in self.buckets]
        return f"buckets={buckets!r}, attention_temperature={self.attention_temperature!r}"


class ALPNoOverlap(ALP):
    """ALP-NO: attention inside CKD-NO buckets (eq. 5)."""

    name = "alp-no"
    default_buckets = "no"


class ALPPartialOverlap(ALP):
    """ALP-PO: attention inside CKD-PO buckets (eq. 5)."""

    name = "alp-po"
    default_buckets = "po"


class ALPKeyQueryValue(ALP):
    """ALP with single-head key-query-value attention (Table 4, ALP-1); ``buckets`` gives ALP-NO-1/PO-1."""

    name = "alp-kqv1"
    default_heads = 1
    default_attention_temperature: AttentionTemperature = "sqrt-d"

    def __init__(
        self,
        request: ProjectionRequest,
        *,
        heads: Optional[int] = None,
        buckets: Optional[BucketSpec] = None,
        attention_temperature: Optional[AttentionTemperature] = None,
        layer_map: Union[str, Sequence[int], None] = None,
    ) -> None:
        super().__init__(request, buckets=buckets, attention_temperature=attention_temperature, layer_map=layer_map)
        self.heads = self.default_heads if heads is None else heads
        if isinstance(self.heads, bool) or not isinstance(self.heads, int) or self.heads < 1 or self.width % self.heads:
            raise UsageError(
                f"projector {self.name!r}: heads must be a positive divisor of the teacher width "
                f"{self.width}, got {self.heads!r}"
            )
        self.query, self.key, self.value, self.output = (
            nn.Linear(self.width, self.width, bias=False) for _ in range(4)
        )

    @property
    def score_width(self) -> int:
        return self.width // self.heads

    def combine(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, pairs, n, heads, d = queries.shape[0], queries.shape[1], keys.shape[1], self.heads, self.score_width
        q = self.query(queries).view(batch, pairs, heads, d).transpose(1, 2)  # (B, H, m-1, d)
        k = self.key(keys).view(batch, n, heads, d).transpose(1, 2)  # (B, H, n, d)
        v = self.value(keys).view(batch, n, heads, d).transpose(1, 2)  # (B, H, n, d)
        alpha = self.attend(q @ k.transpose(2, 3))  # (B, H, m-1, n)
        heads_out = (alpha @ v).transpose(1, 2).reshape(batch, pairs, heads * d)  # (B, m-1, D)
        return self.output(heads_out), alpha.mean(dim=1)  # (B, m-1, D), (B, m-1, n)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, " + super().extra_repr()


class ALPKeyQueryValue4(ALPKeyQueryValue):
    """ALP with 4-head key-query-value attention (Table 4, ALP-4)."""

    name = "alp-kqv4"
    default_heads = 4


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("alp", ALP, description="ALP-KD, attention over all teacher layers (Passban et al. 2021)")
    register("alp-no", ALPNoOverlap, description="ALP-KD, attention inside buckets without overlap; option buckets")
    register("alp-po", ALPPartialOverlap, description="ALP-KD, attention inside partially overlapping buckets")
    register("alp-kqv1", ALPKeyQueryValue, description="ALP-KD with key-query-value attention, 1 head (Table 4)")
    register("alp-kqv4", ALPKeyQueryValue4, description="ALP-KD with key-query-value attention, 4 heads (Table 4)")

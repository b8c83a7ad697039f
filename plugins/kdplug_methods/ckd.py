"""Combinatorial KD (Wu et al. 2020, as ALP-KD eq. 4 uses it): each student layer imitates a bucket.

Ĉ^j = concat(h_t^k for k in bucket j), C^j = W_j Ĉ^j + b_j (a learned Linear per bucket, to the
student's width: buckets may differ in size, so each has its own), L_CKD = Σ_j MSE(h_s^j, C^j) for
the student's intermediate layers j = 1..m−1. W_j is CKD's learned map between the two spaces, for
a BiLSTM or Gated-CNN student too (a second Linear on the student's side would let both sides
shrink to zero: a loss of 0 that teaches nothing). ``ckd-no`` uses buckets without overlap, ``ckd-po``
buckets that share their first layer with the previous one (rules in :mod:`.layers`); ``buckets``
sets them by hand, one list of 1-based teacher layers per matched student layer; ``layer_map``
rearranges them (``reverse``, ``random``, ``all-to-one``, ``"1:4,2:8"``: see :mod:`.layers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import nn

import kdplug
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import (
    BucketSpec,
    arrange,
    check_inputs,
    check_layer_map_option,
    common_width,
    intermediate_student_layers,
    matching_record,
    resolve_buckets,
)

CKD = """@inproceedings{wu2020skip,
  title = {Why Skip If You Can Combine: A Simple Knowledge Distillation Technique for Intermediate Layers},
  author = {Wu, Yimeng and Passban, Peyman and Rezagholizadeh, Mehdi and Liu, Qun},
  booktitle = {Proceedings of EMNLP 2020},
  pages = {1016--1021},
  year = {2020}
}"""


class CKDNoOverlap(nn.Module):
    """CKD-NO: contiguous buckets sharing no layer (12→4: {1-4}, {5-8}, {9-12})."""

    name = "ckd-no"
    default_buckets = "no"
    ild_loss = "mse"
    needs_teacher_heads = False
    # ALP-KD Table 9, the most frequent values: η = 0.2 (4 of 8 tasks), λ = 0.2 (all), τ = 20 (4 of 8).
    default_weights = {"eta": 0.2, "lam": 0.2, "temperature": 20.0}
    citation = CKD
    check_options = staticmethod(check_layer_map_option)  # before the models load

    def __init__(
        self,
        request: ProjectionRequest,
        *,
        buckets: Optional[BucketSpec] = None,
        layer_map: Union[str, Sequence[int], None] = None,
    ) -> None:
        super().__init__()
        students = intermediate_student_layers(request, self.name)
        self.n, self.m = len(request.teacher_layers), len(request.student_layers)
        own = resolve_buckets(self.default_buckets if buckets is None else buckets, self.n, len(students), self.name)
        self.layer_map = layer_map
        self.buckets = arrange(own, layer_map, self.n, request.seed, self.name)
        width = common_width(students, "student", self.name)
        self.projections = nn.ModuleList(
            nn.Linear(sum(request.teacher_layers[k - 1].width for k in bucket), width) for bucket in self.buckets
        )

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        check_inputs(inputs, self.n, self.m, self.name)
        student = torch.stack(inputs.student_layers[:-1], dim=1)  # (B, m-1, D_s)
        combined = [  # concat (B, Σ bucket widths) -> Linear -> (B, D_s)
            project(torch.cat([inputs.teacher_layers[k - 1].detach() for k in bucket], dim=-1))
            for project, bucket in zip(self.projections, self.buckets)
        ]
        return ProjectedPairs(student, torch.stack(combined, dim=1))  # (B, m-1, D_s) each

    @property
    def matching(self) -> dict:
        return matching_record(self.layer_map, self.buckets)

    def extra_repr(self) -> str:
        return f"buckets={[list(bucket) for bucket in self.buckets]}"


class CKDPartialOverlap(CKDNoOverlap):
    """CKD-PO: each bucket shares its first layer with the previous one (12→4: {1-5}, {5-9}, {9-12})."""

    name = "ckd-po"
    default_buckets = "po"


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register(
        "ckd-no",
        CKDNoOverlap,
        description="CKD, concat+Linear over buckets without overlap (Wu et al. 2020); option buckets",
    )
    register(
        "ckd-po",
        CKDPartialOverlap,
        description="CKD, concat+Linear over partially overlapping buckets (Wu et al. 2020); option buckets",
    )

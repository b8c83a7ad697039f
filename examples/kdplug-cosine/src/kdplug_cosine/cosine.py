"""Cosine alignment of the top layers: DistilBERT's cosine embedding loss as a kdplug projector.

DistilBERT (Sanh et al. 2019, Sec. 3) adds to the distillation loss a cosine embedding loss
L_cos = 1 - cos(h_s, h_t) that aligns the *directions* of the student's and the teacher's hidden
states: unlike MSE it ignores their scale, which differs between a freshly initialised student
and a fine-tuned teacher. DistilBERT applies it to the last layer of a student as wide as its
teacher; here it is applied to the student's top ``layers`` layers (default: all m of them), the
top student layer facing the top teacher layer, the next one the next, and so on:

    L = sum_{k=0}^{K-1}  1 - cos(W_k h_s^{m-k}, h_t^{n-k})

where W_k is the identity when the widths agree and otherwise a learned linear map without bias
(TinyBERT's W_h, Jiao et al. 2020; a bias would be pointless under a scale-free comparison).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kdplug
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest


class CosineDistance(nn.Module):
    """1 - cos(student, target) per pair over D; mean over the batch, summed over the pairs.

    ``student`` and ``target`` are ``(batch, P, D)`` (logits ``(batch, C)`` count as one pair);
    ``weights`` ``(batch, P)`` scales each pair's term, as for kdplug's other pair losses.
    """

    def forward(self, student: Tensor, target: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        if student.dim() == 2:
            student, target = student.unsqueeze(1), target.unsqueeze(1)  # (B, C) -> (B, 1, C)
            weights = weights.unsqueeze(1) if weights is not None and weights.dim() == 1 else weights
        if student.shape != target.shape or student.dim() != 3:
            raise kdplug.PluginError(
                f"loss 'cosine-distance' compares (batch, P, D) tensors of one shape, got "
                f"{tuple(student.shape)} and {tuple(target.shape)}"
            )
        terms = 1.0 - F.cosine_similarity(student, target, dim=-1, eps=1e-8)  # (B, P)
        if weights is not None:
            terms = terms * weights
        return terms.mean(dim=0).sum()


class CosineTopLayers(nn.Module):
    """The student's top ``layers`` layers against the teacher's, compared by cosine distance."""

    ild_loss = "cosine-distance"
    needs_teacher_heads = False
    # DistilBERT weighs its three losses (KD, MLM, cosine) 5:2:1; as kdplug's eta·KD + lam·ILD
    # plus (1-eta-lam)·CE on the task labels, the same proportions give 5/8, 1/8 and 2/8.
    default_weights = {"eta": 0.625, "lam": 0.125, "temperature": 2.0}

    def __init__(self, request: ProjectionRequest, *, layers: Optional[int] = None) -> None:
        super().__init__()
        n, m = len(request.teacher_layers), len(request.student_layers)
        if layers is None:
            layers = min(n, m)
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= min(n, m):
            raise kdplug.UsageError(
                f"projector 'cosine': layers must be an integer from 1 to {min(n, m)} (the "
                f"student has {m} layers, the teacher {n}); got {layers!r}. Set it with "
                f"--set projector_options.layers=N"
            )
        # pair k: student layer m-k with teacher layer n-k (1-based), top layers first
        self.pairs = tuple((m - k, n - k) for k in range(layers))
        widths = {request.teacher_layers[t - 1].width for _, t in self.pairs}
        if len(widths) != 1:
            raise kdplug.UsageError(
                f"projector 'cosine': the matched teacher layers have different widths {sorted(widths)}; lower layers="
            )
        self.width = widths.pop()
        self.maps = nn.ModuleList(
            nn.Identity()
            if request.student_layers[s - 1].width == self.width
            else nn.Linear(request.student_layers[s - 1].width, self.width, bias=False)
            for s, _ in self.pairs
        )

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        student = torch.stack(
            [project(inputs.student_layers[s - 1]) for project, (s, _) in zip(self.maps, self.pairs)], dim=1
        )  # (B, K, D_t)
        teacher = torch.stack([inputs.teacher_layers[t - 1].detach() for _, t in self.pairs], dim=1)  # (B, K, D_t)
        return ProjectedPairs(student=student, teacher=teacher)


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register(
        "cosine",
        CosineTopLayers,
        description="cosine alignment of the top layers (DistilBERT, Sanh et al. 2019); option layers",
    )


@kdplug.hookimpl
def kdplug_register_losses(register):
    register("cosine-distance", CosineDistance, description="1 - cos per pair, summed over pairs (DistilBERT)")

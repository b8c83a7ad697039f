"""CKA distillation (after Zhou et al., "Rethinking Centered Kernel Alignment in Knowledge
Distillation", IJCAI 2024): each matched student layer's representations of the batch are made
similar to its teacher layer's, as linear centred kernel alignment measures it (Kornblith et al.
2019). CKA compares B×B Gram matrices, so a 384-wide teacher and a 256-wide BiLSTM compare
directly, with no projector to learn.

For a matched pair with the batch's vectors X (B×d_s, student) and Y (B×d_t, teacher),
centred over the batch (X̃ = HX, Ỹ = HY, H = I − 11ᵀ/B):

    K = X̃X̃ᵀ,  L = ỸỸᵀ,   CKA = ⟨K, L⟩_F / (‖K‖_F·‖L‖_F) ∈ [0, 1],   L_CKA = Σ_pairs (1 − CKA)

The pairs follow PKD-skip's map (student layer j ↔ teacher layer ⌈j·n/m⌉ for j = 1..m−1, or 1..m
with ``match_output_layer``), rearranged by ``layer_map`` like every layer-matching method. The
projector returns both sides' vectors as ``(B, P, D)`` pairs, the narrower side zero-padded to the
wider width (extra zero columns leave XXᵀ, and so CKA, unchanged); the ``cka`` loss computes CKA
of each pair over the batch, for these pairs or any others.

Where the paper is silent or kdplug differs: the paper distils vision models' logits and features
with an *uncentred* alignment in its code; kdplug uses Kornblith's centred CKA (the paper's
starting point) on the layer vectors the extractor gives (the [CLS] state, a pooled vector), with
ε = 1e-8 in the denominator. CKA is a statistic of the batch: its value and gradient depend on the
batch size (with B small and widths large it is biased upward), gradient accumulation is not the
same as a larger batch, and a batch of one or two examples has nothing to align (CKA is 1 for any
two centred points; the term is 0 there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import Tensor, nn

import kdplug
from kdplug.errors import PluginError, UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import arrange, check_inputs, check_layer_map_option, intermediate_student_layers, matching_record

RCKA = """@inproceedings{zhou2024rcka,
  title = {Rethinking Centered Kernel Alignment in Knowledge Distillation},
  author = {Zhou, Zikai and Shen, Yunhang and Shao, Shitong and Gong, Linrui and Lin, Shaohui},
  booktitle = {Proceedings of IJCAI 2024},
  year = {2024}
}"""

EPS = 1e-8
#: with two examples every centred Gram matrix is a multiple of [[1, -1], [-1, 1]]: CKA is 1 whatever
#: the vectors, so CKA needs 3 or more examples in a batch
MIN_BATCH = 3


def centred_gram(x: Tensor) -> Tensor:
    """K = X̃X̃ᵀ of the batch's vectors ``(..., B, d)`` centred over the batch: ``(..., B, B)``."""
    centred = x - x.mean(dim=-2, keepdim=True)
    return centred @ centred.transpose(-1, -2)


def pad_to(x: Tensor, width: int) -> Tensor:
    """``x`` ``(B, d)`` with zero columns up to ``width``."""
    return nn.functional.pad(x, (0, width - x.shape[-1]))


class CKAProjector(nn.Module):
    """Pairs of Gram matrices for CKA: student layer j and its teacher layer, any widths."""

    name = "cka"
    ild_loss = "cka"
    needs_teacher_heads = False
    pairs_per_example = False  # CKA is a statistic of the batch, not a term per example
    # kdplug's choice (the paper tunes its weights per vision benchmark): rkd's τ = 10, KD 0.5, the
    # CKA term 0.3 (each pair's term lies in [0, 1]) and CE 0.2, a convex combination like ALP-KD's
    default_weights = {"eta": 0.5, "lam": 0.3, "temperature": 10.0}
    check_options = staticmethod(check_layer_map_option)  # before the models load
    citation = RCKA

    def __init__(
        self,
        request: ProjectionRequest,
        *,
        layer_map: Union[str, Sequence[int], None] = None,
        match_output_layer: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(match_output_layer, bool):
            raise UsageError(f"projector 'cka': match_output_layer is true or false, got {match_output_layer!r}")
        self.n, self.m = len(request.teacher_layers), len(request.student_layers)
        students = request.student_layers if match_output_layer else intermediate_student_layers(request, self.name)
        self.matched = len(students)
        forward = tuple((-(-j * self.n // self.m),) for j in range(1, self.matched + 1))  # ⌈j·n/m⌉
        self.layer_map = layer_map
        self.pairs = arrange(forward, layer_map, self.n, request.seed, self.name)

    @property
    def matching(self) -> dict:
        return matching_record(self.layer_map, self.pairs)

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        check_inputs(inputs, self.n, self.m, self.name)
        students = inputs.student_layers[: self.matched]
        teachers = [inputs.teacher_layers[group[0] - 1].detach() for group in self.pairs]
        width = max(h.shape[-1] for h in [*students, *teachers])
        student = torch.stack([pad_to(h, width) for h in students], dim=1)  # (B, P, D)
        teacher = torch.stack([pad_to(h, width) for h in teachers], dim=1)  # (B, P, D)
        chosen = torch.tensor([group[0] - 1 for group in self.pairs], device=teacher.device)
        attention = nn.functional.one_hot(chosen, self.n).to(teacher.dtype)  # (P, n)
        return ProjectedPairs(student, teacher, attention=attention.expand(teacher.shape[0], -1, -1))

    def extra_repr(self) -> str:
        return f"pairs={[[j + 1, g[0]] for j, g in enumerate(self.pairs)]}, layer_map={self.layer_map!r}"


class CKALoss(nn.Module):
    """Σ_pairs w_p·(1 − CKA_p): linear centred CKA of each pair's ``(B, D)`` sides over the batch;
    w_p = the mean over the batch of ``weights[:, p]`` (1 without weights). Width D may hold
    zero-padding (it does not change CKA). A batch of fewer than 3 examples gives 0. Computed in
    fp32 outside autocast."""

    def forward(self, student: Tensor, target: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        if student.dim() == 2:
            student, target = student.unsqueeze(1), target.unsqueeze(1)  # (B, C) counts as one pair
        if student.dim() != 3 or student.shape != target.shape:
            raise PluginError(
                f"loss 'cka' compares (batch, P, D) pairs of one shape, got {tuple(student.shape)} and "
                f"{tuple(target.shape)}; pad the narrower side with zeros (it leaves CKA unchanged)"
            )
        if weights is not None and weights.shape != student.shape[:2]:
            raise PluginError(f"loss 'cka': weights must be (batch, P), got {tuple(weights.shape)}")
        if student.shape[0] < MIN_BATCH:
            return student.sum() * 0.0  # two centred points: every Gram matrix is a·[[1,-1],[-1,1]], CKA ≡ 1
        with torch.autocast(student.device.type, enabled=False):  # Gram matrices in fp32, not bf16
            k, lg = (centred_gram(side.transpose(0, 1).float()) for side in (student, target))  # (P, B, B) each
            cka = (k * lg).sum(dim=(1, 2)) / (k.norm(dim=(1, 2)) * lg.norm(dim=(1, 2)) + EPS)  # (P,)
        pair_weights = weights.float().mean(dim=0) if weights is not None else torch.ones_like(cka)
        return (pair_weights * (1.0 - cka)).sum()


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register(
        "cka",
        CKAProjector,
        description="CKA on matched layers, any widths and families (after Zhou et al. 2024); option layer_map",
    )


@kdplug.hookimpl
def kdplug_register_losses(register):
    register("cka", CKALoss, description="1 − linear centred CKA of each pair over the batch, summed over pairs")

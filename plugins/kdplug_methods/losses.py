"""The losses every method is scored with: CE, Hinton's KD, and the pair losses of the ILD methods.

Pair losses compare what a projector returns: ``student`` and ``target`` of shape
``(batch, P, D)``. Each computes one term per example and pair, ``(batch, P)``, optionally scaled
by ``weights`` (attention on the losses), then averages over the batch and sums over the pairs:
the papers sum over the matched layers (PKD eq. 7, ALP-KD eq. 7, Universal-KD eq. 7), and a batch
mean keeps the scale independent of the batch size.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kdplug
from kdplug.errors import PluginError, UsageError


def _as_pairs(student: Tensor, target: Tensor, weights: Optional[Tensor], loss: str):
    """``(B, P, D)`` views of both sides; logits ``(B, C)`` count as a single pair, and regression
    scores ``(B,)`` as a single pair of width 1."""
    if student.dim() == 1 and target.dim() == 1:
        student, target = student[:, None], target[:, None]  # (B,) -> (B, 1)
    if student.dim() == 2:
        student, target = student.unsqueeze(1), target.unsqueeze(1)  # (B, 1, C)
        if weights is not None and weights.dim() == 1:
            weights = weights.unsqueeze(1)  # (B, 1)
    if student.dim() != 3 or student.shape != target.shape:
        raise PluginError(
            f"loss {loss!r} compares (batch, P, D) tensors of one shape, got student "
            f"{tuple(student.shape)} and target {tuple(target.shape)}; the projector that made "
            f"these pairs must return ProjectedPairs with matching student and teacher shapes"
        )
    if weights is not None and weights.shape != student.shape[:2]:
        raise PluginError(
            f"loss {loss!r}: weights must be (batch, P) = {tuple(student.shape[:2])}, got {tuple(weights.shape)}"
        )
    return student, target, weights


def _reduce(terms: Tensor, weights: Optional[Tensor]) -> Tensor:
    """``(B, P)`` per-example terms -> scalar: weighted, mean over the batch, sum over the pairs."""
    if weights is not None:
        terms = terms * weights
    return terms.mean(dim=0).sum()


class CrossEntropy(nn.Module):
    """CE(y, z_s) on gold labels; ``weights`` ``(batch,)`` scales each example's term."""

    def forward(self, logits: Tensor, labels: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        terms = F.cross_entropy(logits, labels.long(), reduction="none")  # (B,)
        return (terms * weights).mean() if weights is not None else terms.mean()


class KDLoss(nn.Module):
    """Hinton's KD: τ²·KL(σ(z_t/τ) ‖ σ(z_s/τ)), summed over classes and averaged over the batch.

    ``batchmean`` (never ``mean`` over batch×classes, which would shrink the loss with the class
    count); τ² keeps the gradient scale independent of τ (Hinton et al. 2015).
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
            raise UsageError(
                f"loss 'kd': temperature must be a positive number, got {temperature!r}; "
                f"set e.g. temperature: 5 in the run config"
            )
        self.temperature = float(temperature)

    def forward(self, student_logits: Tensor, teacher_logits: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        tau = self.temperature
        log_student = F.log_softmax(student_logits / tau, dim=-1)  # (B, C)
        log_teacher = F.log_softmax(teacher_logits.detach() / tau, dim=-1)  # (B, C)
        terms = F.kl_div(log_student, log_teacher, reduction="none", log_target=True).sum(dim=-1)  # (B,)
        if weights is not None:
            terms = terms * weights
        return tau**2 * terms.mean()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}"


class MSELoss(nn.Module):
    """Mean squared error per pair (mean over D), as ``F.mse_loss`` (CKD, ALP-KD eq. 7)."""

    def forward(self, student: Tensor, target: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        student, target, weights = _as_pairs(student, target, weights, "mse")
        terms = (student - target).pow(2).mean(dim=-1)  # (B, P)
        return _reduce(terms, weights)


class NormalizedMSELoss(nn.Module):
    """PKD eq. 7: ‖a/‖a‖₂ − b/‖b‖₂‖²₂ between unit vectors.

    ``reduction="sum"`` (default) is the equation: summed over D and over the pairs, averaged
    over the batch. ``"mean"`` is PKD's reference code (``F.mse_loss`` of the normalised states):
    averaged over D, the pairs and the batch, D·P times smaller, which is why PKD's β is 10-1000.
    """

    REDUCTIONS = ("sum", "mean")

    def __init__(self, reduction: str = "sum") -> None:
        super().__init__()
        if reduction not in self.REDUCTIONS:
            raise UsageError(
                f"loss 'normalized-mse': reduction must be 'sum' (PKD eq. 7) or 'mean' (PKD's code), got {reduction!r}"
            )
        self.reduction = reduction

    def forward(self, student: Tensor, target: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        student, target, weights = _as_pairs(student, target, weights, "normalized-mse")
        squared = (F.normalize(student, dim=-1) - F.normalize(target, dim=-1)).pow(2)  # (B, P, D)
        if self.reduction == "mean":
            return _reduce(squared.mean(dim=-1), weights) / squared.shape[1]
        return _reduce(squared.sum(dim=-1), weights)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class KLLoss(nn.Module):
    """KL(target ‖ student) per pair over D, for pairs of probability distributions (Universal-KD eq. 6).

    0·log 0 counts as 0 and the student's probabilities are floored at the smallest normal float,
    so a class the student gives (numerically) zero mass yields a large finite loss, not inf/nan.
    """

    def forward(self, student: Tensor, target: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        student, target, weights = _as_pairs(student, target, weights, "kl")
        log_student = student.clamp_min(torch.finfo(student.dtype).tiny).log()  # (B, P, D)
        terms = (torch.xlogy(target, target) - target * log_student).sum(dim=-1)  # (B, P)
        return _reduce(terms, weights)


@kdplug.hookimpl
def kdplug_register_losses(register):
    register("ce", CrossEntropy, description="cross-entropy on gold labels")
    register("kd", KDLoss, description="Hinton's KD: τ²·KL(σ(t/τ) ‖ σ(s/τ)), batchmean")
    register("mse", MSELoss, description="MSE per pair, mean over the batch, summed over pairs (CKD, ALP-KD)")
    register(
        "normalized-mse",
        NormalizedMSELoss,
        description="squared distance of L2-normalised vectors per pair (PKD eq. 7)",
    )
    register("kl", KLLoss, description="KL(target ‖ student) of probability vectors per pair (Universal-KD)")

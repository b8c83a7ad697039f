"""The losses every method is scored with: CE, Hinton's KD, and the pair losses of the ILD methods.

Pair losses compare what a projector returns: ``student`` and ``target`` of shape
``(batch, P, D)``. Each computes one term per example and pair, ``(batch, P)``, optionally scaled
by ``weights`` (attention on the losses), then averages over the batch and sums over the pairs:
the papers sum over the matched layers (PKD eq. 7, ALP-KD eq. 7, Universal-KD eq. 7), and a batch
mean keeps the scale independent of the batch size.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kdplug
from kdplug.errors import PluginError, UsageError

log = logging.getLogger("kdplug.losses")


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


def standardize(logits: Tensor, eps: float = 1e-7) -> Tensor:
    """Sun et al. 2024's Z-score of each example's logits over the classes: (z − mean) / (σ + ε),
    σ the unbiased standard deviation and ε = 1e-7 outside the root, as their code; in fp32
    outside autocast (ε is below bf16's resolution)."""
    with torch.autocast(logits.device.type, enabled=False):
        logits = logits.float()
        return (logits - logits.mean(dim=-1, keepdim=True)) / (logits.std(dim=-1, keepdim=True) + eps)


def _check_temperature(temperature: object, loss: str) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
        raise UsageError(
            f"loss {loss!r}: temperature must be a positive number, got {temperature!r}; "
            f"set e.g. temperature: 5 in the run config"
        )
    return float(temperature)


class _WarnsOnTwoClasses:
    """A logit loss that has nothing to learn from with two classes says so, once."""

    two_class_note = ""
    _warned = False

    def _note_classes(self, logits: Tensor) -> None:
        if logits.shape[-1] == 2 and not self._warned:
            self._warned = True
            log.warning(self.two_class_note)


class KDLoss(_WarnsOnTwoClasses, nn.Module):
    """Hinton's KD: τ²·KL(σ(z_t/τ) ‖ σ(z_s/τ)), summed over classes and averaged over the batch.

    ``batchmean`` (never ``mean`` over batch×classes, which would shrink the loss with the class
    count); τ² keeps the gradient scale independent of τ (Hinton et al. 2015). ``standardize``:
    logit standardisation (Sun et al., CVPR 2024): both sides' logits Z-scored per example
    (:func:`standardize`) before the temperature, τ then their "base temperature".
    """

    two_class_note = (
        "logit standardisation with 2 classes: the Z-scored logits of an example are ±(1/√2, −1/√2), its sign "
        "alone, so the KD term has no gradient almost everywhere (Sun et al.'s method needs 3 or more classes); "
        "the run goes on with CE and any other term"
    )

    def __init__(self, temperature: float = 1.0, standardize: bool = False) -> None:
        super().__init__()
        self.temperature = _check_temperature(temperature, "kd")
        if not isinstance(standardize, bool):
            raise UsageError(f"loss 'kd': standardize is true or false, got {standardize!r}")
        self.standardize = standardize

    def forward(self, student_logits: Tensor, teacher_logits: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        tau = self.temperature
        teacher_logits = teacher_logits.detach()
        if self.standardize:
            self._note_classes(student_logits)
            student_logits, teacher_logits = standardize(student_logits), standardize(teacher_logits)
        log_student = F.log_softmax(student_logits / tau, dim=-1)  # (B, C)
        log_teacher = F.log_softmax(teacher_logits / tau, dim=-1)  # (B, C)
        terms = F.kl_div(log_student, log_teacher, reduction="none", log_target=True).sum(dim=-1)  # (B,)
        if weights is not None:
            terms = terms * weights
        return tau**2 * terms.mean()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, standardize={self.standardize}"


def pearson_distance(a: Tensor, b: Tensor, eps: float = 1e-8) -> Tensor:
    """1 − Pearson correlation along the last axis: the cosine of mean-centred vectors, the product
    of norms floored at ε (DIST's code adds ε; a floor keeps d(x, x) exactly 0 for the near-uniform
    probabilities a high temperature gives, and still avoids 0/0)."""
    a, b = a - a.mean(dim=-1, keepdim=True), b - b.mean(dim=-1, keepdim=True)
    return 1 - (a * b).sum(dim=-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(eps)


class DISTLoss(_WarnsOnTwoClasses, nn.Module):
    """DIST (Huang et al., NeurIPS 2022): relations, not values, of the probabilities.

    With Y = softmax(z/τ) of both models, ``(batch, C)``:
    L = τ²·(β·mean_i d(Y_s[i,:], Y_t[i,:]) + γ·mean_c d(Y_s[:,c], Y_t[:,c])), d = 1 − Pearson:
    inter-class (each example's class distribution) and intra-class (each class over the batch).
    Logits ``(batch, C)``, or pairs ``(batch, P, C)`` (summed over the pairs); ``weights``
    ``(batch, P)`` scale each example's inter-class term and, by their mean, a pair's intra-class term.
    β = γ = 1 here (``inter_weight``, ``intra_weight``); the paper's setting (CE 1, β = γ = 2, τ = 1)
    is ``inter_weight=2, intra_weight=2, eta=1, ce_weight=1, temperature=1``. The intra-class term
    is a batch statistic: it needs 3 or more examples (0 on smaller batches).
    """

    two_class_note = (
        "DIST with 2 classes: the correlation of two-element vectors is ±1, so its inter-class term has no "
        "gradient, and its two intra-class terms are one; DIST reduces to a single over-the-batch correlation"
    )

    def __init__(self, temperature: float = 1.0, inter_weight: float = 1.0, intra_weight: float = 1.0) -> None:
        super().__init__()
        self.temperature = _check_temperature(temperature, "dist")
        for name, value in (("inter_weight", inter_weight), ("intra_weight", intra_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UsageError(f"loss 'dist': {name} must be 0 or a positive number, got {value!r}")
        self.inter_weight, self.intra_weight = float(inter_weight), float(intra_weight)

    def forward(self, student_logits: Tensor, teacher_logits: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        student, teacher, weights = _as_pairs(student_logits, teacher_logits.detach(), weights, "dist")  # (B, P, C)
        self._note_classes(student)
        tau = self.temperature
        student, teacher = F.softmax(student / tau, dim=-1), F.softmax(teacher / tau, dim=-1)
        inter = pearson_distance(student, teacher)  # (B, P): each example, across classes
        inter = (inter * weights).mean(dim=0) if weights is not None else inter.mean(dim=0)  # (P,)
        if student.shape[0] >= 3:  # each class, across the batch (two examples correlate ±1 whatever they are)
            intra = pearson_distance(student.permute(1, 2, 0), teacher.permute(1, 2, 0)).mean(dim=-1)  # (P,)
            if weights is not None:
                intra = intra * weights.mean(dim=0)  # a batch statistic: the pair's mean weight
        else:
            intra = torch.zeros_like(inter)
        return tau**2 * (self.inter_weight * inter + self.intra_weight * intra).sum()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, inter_weight={self.inter_weight}, intra_weight={self.intra_weight}"


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
    register(
        "kd", KDLoss, description="Hinton's KD: τ²·KL(σ(t/τ) ‖ σ(s/τ)), batchmean; option standardize (Sun et al.)"
    )
    register("mse", MSELoss, description="MSE per pair, mean over the batch, summed over pairs (CKD, ALP-KD)")
    register(
        "normalized-mse",
        NormalizedMSELoss,
        description="squared distance of L2-normalised vectors per pair (PKD eq. 7)",
    )
    register("kl", KLLoss, description="KL(target ‖ student) of probability vectors per pair (Universal-KD)")
    register("dist", DISTLoss, description="DIST: Pearson relations of the probabilities, inter- and intra-class")

"""The training objective, and the one module that holds everything trainable.

``DistillationModule`` wraps the student, the projector and any loss parameters so that the
optimizer, checkpoints and DDP see a single module; only the student is exported at the end.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Optional

import torch
from torch import nn

from ..capabilities import LayerExtractorCapabilities, ObjectiveCapabilities, ProjectorCapabilities, capabilities
from ..errors import PluginError
from ..types import DistillInputs, LayerExtractor, ProjectedPairs, StepState, TokenSignals

Objective = Callable[[StepState], dict[str, torch.Tensor]]


class WeightedObjective(nn.Module):
    """L = β·task + η·KD + λ·ILD (ALP-KD eq. 7; PKD eq. 8 with β = 1 − α, η = α, λ = PKD's β).

    ``task`` is CE (MSE for regression) over the labelled rows only, ``KD`` the
    temperature-scaled KL on logits (MSE for regression), ``ILD`` the projector's own loss on the
    pairs it returns. The three weights are independent; ``ce`` defaults to 1 − η − λ, the
    convex combination of ALP-KD. Terms with weight 0 are not computed, so ``nkd`` needs no
    teacher at all.
    """

    def __init__(
        self,
        *,
        eta: float,
        lam: float,
        task_loss: Callable,
        kd_loss: Optional[Callable],
        ild_loss: Optional[Callable],
        regression: bool = False,
        ce: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.regression = regression
        self.eta, self.lam = eta, lam
        self.ce = round(1.0 - eta - lam, 9) if ce is None else ce
        self.task_loss, self.kd_loss, self.ild_loss = task_loss, kd_loss, ild_loss

    @property
    def needs_teacher(self) -> bool:
        return self.eta > 0 or self.lam > 0

    def forward(self, state: StepState) -> dict[str, torch.Tensor]:
        terms: dict[str, torch.Tensor] = {}
        total = state.student_logits.new_zeros(())
        if self.ce > 0:
            ce = state.labelled_loss(self.task_loss, self.regression)
            if ce is not None:
                terms["ce"] = ce
                total = total + self.ce * ce
        if self.eta > 0:
            terms["kd"] = self.kd_loss(state.student_logits, state.teacher_logits)
            total = total + self.eta * terms["kd"]
        if self.lam > 0 and state.pairs is not None:
            terms["ild"] = pair_loss(self.ild_loss, state.pairs)
            total = total + self.lam * terms["ild"]
        terms["loss"] = total
        return terms


def pair_loss(loss: Optional[Callable], pairs: ProjectedPairs) -> torch.Tensor:
    """The ILD term of a projector's pairs: its loss on the pairs, or the per-example terms it
    computed itself (``pairs.terms``), weighted, averaged over the batch and summed over the pairs
    as every pair loss reduces them."""
    if pairs.terms is not None:
        terms = pairs.terms if pairs.weights is None else pairs.terms * pairs.weights
        return terms.mean(dim=0).sum()
    if loss is None:
        raise PluginError(
            "the projector returned pairs of vectors but names no ild_loss to compare them; set its ild_loss "
            "(e.g. 'mse'), or return ProjectedPairs(terms=...) with each example's loss per pair"
        )
    return loss(pairs.student, pairs.teacher, pairs.weights)


class TeacherHeads(nn.Module):
    """Pseudo classifiers on the teacher's layers (Universal-KD, DIH): one Linear per layer."""

    def __init__(self, widths: list[int], num_outputs: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(width, num_outputs) for width in widths)

    def forward(self, layers: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([head(layer) for head, layer in zip(self.heads, layers)], dim=1)  # (B, n, C)


class DistillationModule(nn.Module):
    """Student + projector + objective; forward returns the loss terms of one batch."""

    def __init__(
        self,
        student: nn.Module,
        extractor: LayerExtractor,
        projector: Optional[nn.Module],
        objective: nn.Module | Objective,
        teacher_heads: Optional[TeacherHeads] = None,
    ) -> None:
        super().__init__()
        self.student = student
        self.projector = projector
        self.objective = objective
        self.extractor = extractor
        specs = extractor.layer_specs(student)
        self.matchable_positions = [i for i, spec in enumerate(specs) if spec.matchable]
        self.teacher_heads = teacher_heads
        if teacher_heads is not None:
            teacher_heads.requires_grad_(False)

    @property
    def needs_teacher(self) -> bool:
        return capabilities(ObjectiveCapabilities, self.objective).needs_teacher

    @property
    def needs_tokens(self) -> bool:
        """Whether the projector distils per-token signals (the teacher then runs on every batch)."""
        return bool(capabilities(ProjectorCapabilities, self.projector).needs_tokens)

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        teacher_logits: Optional[torch.Tensor] = None,
        teacher_layers: Optional[list[torch.Tensor]] = None,
        teacher_tokens: Optional[TokenSignals] = None,
    ) -> dict[str, torch.Tensor]:
        student_tokens = None
        if teacher_tokens is not None:
            outputs, student_tokens = self.extractor.forward_with_tokens(
                self.student, lambda: model_forward(self.student, batch), batch["attention_mask"]
            )
        else:
            outputs = model_forward(self.student, batch)
        logits = outputs.logits
        layers = layer_vectors(self.extractor, self.student, outputs, batch)
        student_layers = [layers[i] for i in self.matchable_positions]
        head_logits = None
        if self.teacher_heads is not None and teacher_layers is not None:
            with torch.no_grad():
                head_logits = self.teacher_heads(teacher_layers)
        pairs = None
        if self.projector is not None and teacher_layers is not None:
            pairs = self.projector(
                DistillInputs(
                    teacher_layers=teacher_layers,
                    student_layers=student_layers,
                    teacher_logits=teacher_logits,
                    student_logits=logits,
                    teacher_head_logits=head_logits,
                    teacher_tokens=teacher_tokens,
                    student_tokens=student_tokens,
                )
            )
        return self.objective(
            StepState(
                student_logits=logits,
                student_layers=student_layers,
                labels=batch["labels"],
                teacher_logits=teacher_logits,
                teacher_layers=teacher_layers,
                teacher_head_logits=head_logits,
                pairs=pairs,
                labelled=batch.get("labelled"),
                labelled_weight=batch.get("labelled_weight"),
            )
        )


@functools.cache
def takes_token_types(model_class: type) -> bool:
    """Whether a model class's forward accepts ``token_type_ids`` (asked once per class, not per batch)."""
    return "token_type_ids" in inspect.signature(model_class.forward).parameters


def layer_vectors(
    extractor: LayerExtractor, model: nn.Module, outputs: Any, batch: dict[str, torch.Tensor]
) -> list[torch.Tensor]:
    """``extractor``'s vectors of ``model``'s ``outputs`` on ``batch``: with the batch's inputs for an
    extractor that reads them (a decoder's last real token depends on each example's length)."""
    if capabilities(LayerExtractorCapabilities, extractor).reads_inputs:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        return extractor(model, outputs, inputs)  # type: ignore[call-arg]
    return extractor(model, outputs)


def model_forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    """Call a teacher or student on a collated batch, passing token types only to models that take them."""
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "token_type_ids" in batch and takes_token_types(type(model)):
        kwargs["token_type_ids"] = batch["token_type_ids"]
    return model(**kwargs)

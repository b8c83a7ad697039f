"""Universal-KD (Wu et al. 2021): layer matching in the output space, through pseudo classifiers.

Every layer gets a pseudo classifier f(h) = σ(W h + b) (eq. 3; the bias is left implicit in the
paper's notation, as for any classifier). The teacher's, f_i^t for i = 1..n, are trained first with
CE on the frozen teacher (the engine's warm-up) and arrive as ``inputs.teacher_head_logits``. The
student's, f_j^s for j = 1..m−1, live in this projector and are trained only through this loss (no
CE on them); the student's output layer is its own classifier, f_m^s = σ(z_s). Then

    λ_ij  = softmax_i(f_i^t · f_j^s / τ_att)  over all n teacher layers      (eq. 4; τ_att = 1)
    F^t(j) = Σ_i λ_ij f_i^t,          l(j) = KL(F^t(j) ‖ f_j^s)             (eq. 5-6)

- ``universal-il``: Σ_{j=1}^{m−1} l(j) (eq. 7);  ``universal-ca``: the same for a student of another
  architecture (eq. 9): the pairs live in the output space, so no width has to match;
- ``universal-cg``: l(m), the output layer against the attention-weighted pseudo TAs (eq. 8);
- ``universal-loss-att`` (Table 6, ▲): Σ_i λ_im KL(f_i^t ‖ f_m^s), attention on the losses.

λ is computed from the student's current outputs and is not detached ("it is the output layer of
the student [that] determines how much we should attend to each pseudo TA"), so the gradient also
flows through the attention; the teacher side is detached.

Regression tasks (one output; the paper is silent): f is the raw scalar prediction (no softmax) and
MSE replaces KL, as for the logit KD. A dot product of two scalars would always put the weight on
the largest teacher prediction, whatever the student says, so the attention is on closeness:
λ_ij = softmax_i(−(f_i^t − f_j^s)² / τ_att), the heads nearest the student's prediction get the
weight (kdplug's choice; docs/methods.md, Regression).

Training is two-stage (§4.2): stage 1 is β·KD + (1−β)·L_Univ with no CE, stage 2 CE only. That
is these projectors' ``default_recipe``: a run that names no recipe gets ``two-stage``, since a
single stage of their default weights would never see a gold label.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

import kdplug
from kdplug.errors import UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import attention_divisor, check_inputs, intermediate_student_layers
from .losses import standardize as standardize_logits

log = logging.getLogger("kdplug.methods.universal")

UNIVERSAL = """@inproceedings{wu2021universalkd,
  title = {Universal-{KD}: Attention-based Output-Grounded Intermediate Layer Knowledge Distillation},
  author = {Wu, Yimeng and Rezagholizadeh, Mehdi and Ghaddar, Abbas and Haidar, Md Akmal and Ghodsi, Ali},
  booktitle = {Proceedings of EMNLP 2021},
  year = {2021}
}"""


class UniversalIL(nn.Module):
    """Universal-KD^(IL): every intermediate student layer against the attention-weighted pseudo TAs."""

    name = "universal-il"
    ild_loss = "kl"
    needs_teacher_heads = True
    # Stage 1 of the paper: L = β·L_KD + (1−β)·L_Univ with no CE, β = 0.5 (Table 7: 5 of 8 tasks;
    # Table 8: all; Table 9: 5 of 8), τ = 1 for all runs; stage 2 is CE only.
    default_weights = {"eta": 0.5, "lam": 0.5, "temperature": 1.0}
    default_recipe = "two-stage"
    citation = UNIVERSAL

    def __init__(
        self, request: ProjectionRequest, *, attention_temperature: float = 1.0, standardize: bool = False
    ) -> None:
        super().__init__()
        self.n, self.m, self.outputs = len(request.teacher_layers), len(request.student_layers), request.num_outputs
        self.is_regression = request.is_regression
        if self.is_regression:
            self.ild_loss = "mse"
        if not isinstance(standardize, bool) or (standardize and self.is_regression):
            raise UsageError(
                f"projector {self.name!r}: standardize (logit standardisation of the output-space terms) is true "
                f"or false, and a regression has no class logits to standardise; got {standardize!r}"
            )
        self.standardize = standardize
        if standardize and self.outputs == 2:
            log.warning(
                "projector %r: logit standardisation with 2 classes leaves each output's sign alone (±1/√2): its "
                "output-space terms carry no gradient; it needs 3 or more classes",
                self.name,
            )
        self.tau = attention_divisor(attention_temperature, None, self.name)
        self.classifiers = nn.ModuleList(
            nn.Linear(spec.width, self.outputs) for spec in self.student_classified(request)
        )

    def student_classified(self, request: ProjectionRequest):
        """The student layers that get a pseudo classifier of their own."""
        return intermediate_student_layers(request, self.name)

    def outputs_of(self, logits: torch.Tensor) -> torch.Tensor:
        """f = σ(logits), or the raw prediction for a regression; with ``standardize``, σ of the
        Z-scored logits (Sun et al. 2024, at Universal-KD's τ = 1)."""
        if self.is_regression:
            return logits
        return (standardize_logits(logits) if self.standardize else logits).softmax(dim=-1)

    def teacher_outputs(self, inputs: DistillInputs) -> torch.Tensor:
        check_inputs(inputs, self.n, self.m, self.name)
        heads = inputs.teacher_head_logits
        expected = (inputs.student_logits.shape[0], self.n, self.outputs)
        if heads is None or tuple(heads.shape) != expected:
            got = "None" if heads is None else tuple(heads.shape)
            raise UsageError(
                f"projector {self.name!r} needs inputs.teacher_head_logits of shape (batch, n, C) = {expected}, "
                f"got {got}: the logits of the teacher's warmed-up pseudo classifiers, which the engine "
                f"supplies because needs_teacher_heads is True"
            )
        return self.outputs_of(heads.detach())  # (B, n, C)

    def student_outputs(self, inputs: DistillInputs) -> torch.Tensor:
        logits = [classify(h) for classify, h in zip(self.classifiers, inputs.student_layers[:-1])]
        return self.outputs_of(torch.stack(logits, dim=1))  # (B, m-1, C)

    def attention(self, teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
        """λ as ``(B, P, n)``: row j holds λ_1j..λ_nj (eq. 4; closeness for regression)."""
        if self.is_regression:  # (B, P, 1) - (B, 1, n) -> (B, P, n) squared distances
            scores = -(student - teacher.transpose(1, 2)).pow(2)
        else:
            scores = student @ teacher.transpose(1, 2)  # (B, P, C) @ (B, C, n) -> (B, P, n)
        return (scores / self.tau).softmax(dim=-1)

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        teacher = self.teacher_outputs(inputs)  # (B, n, C)
        student = self.student_outputs(inputs)  # (B, P, C)
        lam = self.attention(teacher, student)  # (B, P, n)
        return ProjectedPairs(student, lam @ teacher, attention=lam)  # F^t(j) = Σ_i λ_ij f_i^t: (B, P, C)

    def extra_repr(self) -> str:
        return f"attention_temperature={self.tau}, regression={self.is_regression}, standardize={self.standardize}"


class UniversalCA(UniversalIL):
    """Universal-KD^(CA): eq. 9 is eq. 7 for a student of another architecture (BiLSTM, Gated-CNN)."""

    name = "universal-ca"


class UniversalCG(UniversalIL):
    """Universal-KD^(CG): the student's output layer against the pseudo TAs (capacity gap, eq. 8)."""

    name = "universal-cg"

    def student_classified(self, request: ProjectionRequest):
        return ()  # the output layer's classifier is the student's own

    def student_outputs(self, inputs: DistillInputs) -> torch.Tensor:
        return self.outputs_of(inputs.student_logits).unsqueeze(1)  # (B, 1, C)


class UniversalLossAttention(UniversalCG):
    """Universal-KD▲ (Table 6): Σ_i λ_im KL(f_i^t ‖ f_m^s), the attention weighs the losses."""

    name = "universal-loss-att"

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        teacher = self.teacher_outputs(inputs)  # (B, n, C)
        student = self.student_outputs(inputs)  # (B, 1, C)
        lam = self.attention(teacher, student).squeeze(1)  # (B, n): λ_im
        # pair i is (f_m^s, f_i^t) with weight λ_im; its attention row puts λ_im on teacher layer i
        return ProjectedPairs(
            student.expand_as(teacher), teacher, weights=lam, attention=torch.diag_embed(lam)
        )  # (B, n, C), (B, n, C), (B, n), (B, n, n)


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register(
        "universal-il",
        UniversalIL,
        description="Universal-KD, intermediate layers in the output space (Wu et al. 2021, eq. 7)",
    )
    register(
        "universal-cg",
        UniversalCG,
        description="Universal-KD, output layer against attention-weighted pseudo TAs (eq. 8)",
    )
    register("universal-ca", UniversalCA, description="Universal-KD, cross-architecture intermediate layers (eq. 9)")
    register(
        "universal-loss-att",
        UniversalLossAttention,
        description="Universal-KD▲, attention on the losses instead of the logits (Table 6)",
    )

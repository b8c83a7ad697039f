"""Annealing KD (Jafari et al. 2021): close the capacity gap by growing the teacher's logits in steps.

Phase 1 has no labels: the student regresses onto the teacher's raw logits scaled down,

    L₁ = MSE(z_s, z_t · φ(t)),   φ(t) = t / τ_max,

with t = 1 for the first ⌊E₁/τ_max⌋ epochs, 2 for the next ⌊E₁/τ_max⌋ ... up to τ_max, so
the student first fits a soft, low-magnitude version of the teacher and ends on its full
logits. Phase 2 fine-tunes the phase-1 student with CE on the gold labels (MSE for regression).
GLUE defaults: E₁ = 10, E₂ = 3, τ_max = 10 (φ = 0.1, 0.2, ..., 1.0, one step per epoch).

When E₁ < τ_max, ⌊E₁/τ_max⌋ is 0; kdplug then advances t by τ_max/E₁ per epoch, rounded up
(t = ⌈e·τ_max/E₁⌉), so phase 1 still ends on the full logits (E₁ = 2, τ_max = 10: φ = 0.5, 1.0).
t never exceeds τ_max (E₁ = 10, τ_max = 3: φ = ⅓ ×3, ⅔ ×3, 1 ×4).

Phase 1 runs its whole schedule, never stopped early: an early stop would end it before φ reaches 1,
on a student that never saw the teacher's full logits. The run's ``patience`` (and ``min_epochs``)
apply to phase 2 only. Phase 2 starts from the best phase-1 epoch by the task's dev metric: the
trainer keeps each stage's best dev checkpoint (the run's ``best_checkpoint``; ``last`` takes
phase 1's final epoch, the fully annealed student, instead).
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Optional

import torch
from torch import nn

import kdplug
from kdplug.api import Positive, PositiveFloat, Range
from kdplug.errors import ConfigError
from kdplug.types import StepState

log = logging.getLogger("kdplug.recipes.annealing")


def annealing_multiplier(epoch: int, e1: int, tau_max: int) -> float:
    """φ for ``epoch`` (1-based) of a phase 1 of ``e1`` epochs: t / τ_max, see the module docstring."""
    if epoch < 1:
        raise ValueError(f"epochs count from 1, got {epoch}")
    if e1 >= tau_max:
        t = 1 + (epoch - 1) // (e1 // tau_max)
    else:
        t = math.ceil(epoch * tau_max / e1)
    return min(t, tau_max) / tau_max


ANNEALING = """@inproceedings{jafari2021annealing,
  title = {Annealing Knowledge Distillation},
  author = {Jafari, Aref and Rezagholizadeh, Mehdi and Sharma, Pranav and Ghodsi, Ali},
  booktitle = {Proceedings of EACL 2021},
  pages = {2493--2504},
  year = {2021}
}"""


class AnnealingObjective(nn.Module):
    """Phase 1: MSE(z_s, z_t · φ) on raw logits, φ set by the trainer at each epoch; no labels."""

    needs_teacher = True

    def __init__(self, *, tau_max: int, loss: nn.Module) -> None:
        super().__init__()
        self.tau_max, self.loss = tau_max, loss
        self.phi = 1.0 / tau_max

    def set_epoch(self, epoch: int, epochs: int) -> None:
        self.phi = annealing_multiplier(epoch, epochs, self.tau_max)

    def forward(self, state: StepState) -> dict[str, torch.Tensor]:
        mse = self.loss(state.student_logits, state.teacher_logits * self.phi)
        # phi is reported with the loss terms, so each epoch's history shows the schedule
        return {"mse": mse, "phi": mse.new_tensor(self.phi), "loss": mse}


class Annealing:
    """Phase 1: annealed logit regression for ``e1`` epochs; phase 2: CE for ``e2`` epochs.

    Options: ``e1`` (10), ``e2`` (3; 0 skips phase 2), ``tau_max`` (10), ``phase2_lr`` (default:
    the run's learning rate). The run's ``epochs`` is not used: E₁ and E₂ are the schedule, and
    the run's ``patience`` may end phase 2 early, never phase 1.
    """

    citation = ANNEALING
    #: it trains with its own loss: the run's projector is not used (kdplug says so when one is set)
    uses_projector = False
    uses_kd_loss = False  # its loss is an MSE of annealed logits, not the run's kd_loss
    reads_teacher_layers = False  # the teacher's logits only: its cache holds no layer vectors

    def __init__(
        self,
        e1: Positive = 10,
        e2: Annotated[int, Range(0)] = 3,
        tau_max: Positive = 10,
        phase2_lr: Optional[PositiveFloat] = None,
    ) -> None:
        for name, value, least in (("e1", e1, 1), ("e2", e2, 0), ("tau_max", tau_max, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"recipe 'annealing': {name} must be an integer of at least {least}, got {value!r}")
        self.e1, self.e2, self.tau_max, self.phase2_lr = e1, e2, tau_max, phase2_lr

    def run(self, ctx):
        student = ctx.new_student()
        objective = AnnealingObjective(tau_max=self.tau_max, loss=ctx.new_loss("mse"))
        if ctx.settings.patience:
            log.info(
                "annealing: phase 1 runs all its %d epochs (phi up to 1); patience %d applies to phase 2",
                self.e1,
                ctx.settings.patience,
            )
        ctx.train_stage(
            "phase1",
            student,
            None,
            objective=objective,
            epochs=self.e1,
            weights=ctx.weights(None, eta=1.0, lam=0.0, temperature=1.0),
            patience=0,  # the schedule ends on the full logits (phi = 1); stopping early would cut it short
        )
        ctx.record("phase1", phi=[annealing_multiplier(e, self.e1, self.tau_max) for e in range(1, self.e1 + 1)])
        if self.e2:
            ctx.train_stage(
                "phase2", student, None, weights=ctx.weights(None, eta=0.0, lam=0.0), epochs=self.e2, lr=self.phase2_lr
            )
        return student


@kdplug.hookimpl
def kdplug_register_recipes(register):
    register(
        "annealing",
        Annealing,
        description="Annealing KD: MSE to teacher logits scaled up in steps, then CE (Jafari et al. 2021)",
    )

"""DIH, distillation from intermediate heads (Asadian & Salehi-Abari 2021): a capacity-gap baseline.

A linear head on each selected teacher layer is trained with CE while the teacher is frozen,
each kept at its best dev loss: the engine's teacher-head warm-up (``ctx.teacher_heads()``),
stored by fingerprint, so later runs with the same teacher and task reuse the heads. The
heads are cheaper "teachers" of the student: each is a shallower view of the teacher. The
student then learns from the teacher's output and the heads at once, equally weighted. The
reference loss is Σ_{h ∈ {final} ∪ heads} [α·τ²·KL(σ(t_h/τ) ‖ σ(z_s/τ)) + (1 − α)·CE(y, z_s)]: CE
counted once per head, so KD:CE stays α : (1 − α) however many heads there are. kdplug divides
it by the number of terms (same ratio, same optimum):

    L = α · mean_{h ∈ {final} ∪ heads} τ²·KL(σ(t_h/τ) ‖ σ(z_s/τ)) + (1 − α)·CE(y, z_s)

with α = 0.1, τ = 5, and heads on three evenly spaced intermediate teacher layers (n/4, n/2,
3n/4, rounded half up; never the last layer, whose head would duplicate the teacher's own
output). Regression tasks use MSE(z_s, t_h) in place of the KL (and MSE on the gold score in
place of CE).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Annotated, Optional

import torch
from torch import nn

import kdplug
from kdplug.api import PositiveFloat, Range
from kdplug.errors import ConfigError
from kdplug.types import StepState

log = logging.getLogger("kdplug.recipes.dih")


DIH = """@article{asadian2021dih,
  title = {Distilling Knowledge via Intermediate Classifier Heads},
  author = {Asadian, Aryan and Salehi-Abari, Amirali},
  journal = {arXiv preprint arXiv:2103.00497},
  year = {2021}
}"""


class DIHObjective(nn.Module):
    """The DIH student loss over the teacher's output and the heads at ``head_positions``.

    ``head_positions`` index the second axis of ``state.teacher_head_logits`` ``(B, n, C)``.
    """

    needs_teacher = True
    needs_teacher_heads = True

    def __init__(
        self,
        *,
        alpha: float,
        head_positions: Sequence[int],
        kd_loss: Callable,
        task_loss: Callable,
        regression: bool = False,
    ) -> None:
        super().__init__()
        self.alpha = alpha
        self.head_positions = list(head_positions)
        self.kd_loss, self.task_loss, self.regression = kd_loss, task_loss, regression

    def forward(self, state: StepState) -> dict[str, torch.Tensor]:
        targets = [state.teacher_logits] + [state.teacher_head_logits[:, i] for i in self.head_positions]  # (B, C) each
        kd = sum(self.kd_loss(state.student_logits, target) for target in targets) / len(targets)
        terms = {"kd": kd, "loss": self.alpha * kd}
        ce = state.labelled_loss(self.task_loss, self.regression)
        if ce is not None:
            terms["ce"] = ce
            terms["loss"] = terms["loss"] + (1.0 - self.alpha) * ce
        return terms


def default_head_layers(n: int) -> list[int]:
    """Teacher layers n/4, n/2 and 3n/4, rounded half up, without the last layer or repeats."""
    layers = [int(n * fraction + 0.5) for fraction in (0.25, 0.5, 0.75)]
    return list(dict.fromkeys(layer for layer in layers if 1 <= layer < n))


def head_positions(specs: Sequence[kdplug.LayerSpec], layers: Optional[Sequence[int]]) -> list[int]:
    """Positions (in the teacher's matchable layers) of the heads DIH distils from.

    ``layers`` holds teacher layer indices (1..n, as ``LayerSpec.index``); None means the default
    three (:func:`default_head_layers`).
    """
    available = [spec.index for spec in specs]
    if layers is None:
        layers = [available[position - 1] for position in default_head_layers(len(available))]
        if not layers:
            raise ConfigError(
                f"recipe 'dih': the teacher has {len(available)} matchable layer(s), too few for a head "
                f"below its last layer; use another recipe (rkd) or a deeper teacher"
            )
    if isinstance(layers, int):
        layers = [layers]
    unknown = [layer for layer in layers if layer not in available]
    if unknown or not layers:
        raise ConfigError(
            f"recipe 'dih': layers={list(layers)!r} names no head of this teacher; its layers are "
            f"{available} (set e.g. --set 'recipe_options.layers=[{available[len(available) // 2]}, {available[-1]}]', "
            f"or leave layers unset for n/4, n/2 and 3n/4)"
        )
    return [available.index(layer) for layer in dict.fromkeys(layers)]


class DIH:
    """Warm up the teacher's heads (or reuse them), then one distillation stage from all of them.

    Options: ``alpha`` (KD weight, 0.1), ``temperature`` (τ, 5), ``layers`` (teacher layer
    indices whose heads teach; default n/4, n/2 and 3n/4). Epochs and learning rate are the run's;
    the heads' warm-up uses the run's ``head_epochs`` and ``head_lr``.
    """

    citation = DIH
    #: it trains with its own loss: the run's projector is not used (kdplug says so when one is set)
    uses_projector = False
    #: its heads are trained on, and read from, the teacher's cached layer vectors
    reads_teacher_layers = True

    def __init__(
        self,
        alpha: Annotated[float, Range(0, 1)] = 0.1,
        temperature: PositiveFloat = 5.0,
        layers: Optional[Sequence[int]] = None,
    ) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"recipe 'dih': alpha must lie in [0, 1], got {alpha}")
        if temperature <= 0:
            raise ConfigError(f"recipe 'dih': temperature must be positive, got {temperature}")
        self.alpha, self.temperature, self.layers = float(alpha), float(temperature), layers

    def run(self, ctx):
        student = ctx.new_student()
        ctx.teacher_heads()  # warm-up (or reuse), recorded as the stage "teacher_heads"
        specs = ctx.teacher_layer_specs()
        positions = head_positions(specs, self.layers)
        regression = ctx.task.is_regression
        objective = DIHObjective(
            alpha=self.alpha,
            head_positions=positions,
            regression=regression,
            kd_loss=ctx.new_kd_loss(self.temperature),
            task_loss=ctx.new_loss("mse" if regression else "ce"),
        )
        weights = ctx.weights(None, eta=self.alpha, lam=0.0, temperature=self.temperature)
        ctx.train_stage("distill", student, None, weights=weights, objective=objective)
        ctx.record("distill", heads=[specs[i].index for i in positions])
        return student


@kdplug.hookimpl
def kdplug_register_recipes(register):
    register(
        "dih",
        DIH,
        description="DIH: CE-trained heads on teacher layers n/4, n/2, 3n/4, then KD from the "
        "output and the heads (Asadian & Salehi-Abari 2021)",
    )

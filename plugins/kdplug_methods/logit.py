"""The logit-level methods: no intermediate layers are matched, so forward returns no pairs.

- ``nkd``: no KD, the student learns from the gold labels alone (η = λ = 0: L = CE), the
  "w/o KD" / "S_NKD" rows of the papers.
- ``rkd``: Hinton's KD, L = (1−η)·CE + η·τ²·KL(σ(z_t/τ) ‖ σ(z_s/τ)) (MSE(z_s, z_t) for
  regression), ALP-KD's S_RKD. Defaults from ALP-KD Table 7: η = 0.7 (5 of 8 tasks), τ = 10 (its
  SST-2 value and the median; 10 and 20 tie as the most frequent).
"""

from __future__ import annotations

from torch import nn

import kdplug
from kdplug.types import DistillInputs, ProjectionRequest

HINTON = """@article{hinton2015distilling,
  title = {Distilling the Knowledge in a Neural Network},
  author = {Hinton, Geoffrey and Vinyals, Oriol and Dean, Jeff},
  journal = {arXiv preprint arXiv:1503.02531},
  year = {2015}
}"""


class NoKD(nn.Module):
    """CE only: the baseline every distillation method is measured against."""

    ild_loss = "mse"  # required by the contract, never used: forward returns no pairs
    needs_teacher_heads = False
    #: a run with nkd alone needs no teacher outputs (nor a transfer set, which only teaches through them)
    reads_teacher = False
    #: logit methods read no teacher layer: the teacher cache then holds none (rkd inherits this)
    reads_teacher_layers = False
    default_weights = {"eta": 0.0, "lam": 0.0, "temperature": 1.0}

    def __init__(self, request: ProjectionRequest) -> None:
        super().__init__()

    def forward(self, inputs: DistillInputs) -> None:
        return None


class RegularKD(NoKD):
    """Logit KD only (Hinton et al. 2015)."""

    reads_teacher = True
    default_weights = {"eta": 0.7, "lam": 0.0, "temperature": 10.0}
    citation = HINTON


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("nkd", NoKD, description="no KD: cross-entropy on gold labels only")
    register("rkd", RegularKD, description="Hinton's logit KD (η·τ²·KL + (1−η)·CE), no intermediate layers")

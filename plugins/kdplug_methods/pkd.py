"""Patient KD (Sun et al. 2019): each student layer imitates one chosen teacher layer.

L_PT = Σ_j ‖ h_s^j/‖h_s^j‖₂ − h_t^{A(j)}/‖h_t^{A(j)}‖₂ ‖²₂ on the [CLS] vectors (PKD eq. 7), for the
student's intermediate layers j = 1..m−1 (its output layer is covered by the logit KD). With n
teacher and m student layers, the default maps are

- ``pkd-skip``: A(j) = ⌈j·n/m⌉, every (n/m)-th layer   (12→6: 2,4,6,8,10;  12→3: 4,8)
- ``pkd-last``: A(j) = n − m + j, the layers just below the last  (12→6: 7..11;  12→3: 10,11)

and ``layer_map`` sets A by hand, e.g. ``[1, 5, 9]`` for ALP-KD's 12→4 PKD and ``[1]``, ``[6]`` or
``[12]`` for its 12→2 table. Where the widths differ, a learned Linear per matched layer maps the
student vector to the teacher's width before normalisation (PKD itself skips that case).

PKD's objective (eq. 8) is (1−α)·CE + α·L_DS + β·L_PT, three independent weights: in kdplug
``ce_weight`` = 1−α, ``eta`` = α, ``lam`` = β. PKD's code averages L_PT over the hidden dimension
and the layers (``loss_reduction="mean"``), which is what its β ∈ {10, 100, 500, 1000} weighs;
the default ``"sum"`` is eq. 7 as written, which ALP-KD's PKD rows weigh with λ ≤ 0.7.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import nn

import kdplug
from kdplug.errors import UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import check_inputs, check_teacher_layer, common_width, intermediate_student_layers, width_adapter

PKD = """@inproceedings{sun2019patient,
  title = {Patient Knowledge Distillation for {BERT} Model Compression},
  author = {Sun, Siqi and Cheng, Yu and Gan, Zhe and Liu, Jingjing},
  booktitle = {Proceedings of EMNLP-IJCNLP 2019},
  pages = {4314--4323},
  year = {2019}
}"""


class PKDSkip(nn.Module):
    """PKD-Skip: every (n/m)-th teacher layer, the paper's better strategy."""

    name = "pkd-skip"
    ild_loss = "normalized-mse"
    needs_teacher_heads = False
    # ALP-KD Table 8 (its PKD runs), the most frequent values: η = 0.2 (6 of 8 tasks),
    # λ = 0.7 (5 of 8), τ = 5 (5 of 8); SST-2 uses exactly these.
    default_weights = {"eta": 0.2, "lam": 0.7, "temperature": 5.0}
    citation = PKD

    def __init__(
        self, request: ProjectionRequest, *, layer_map: Optional[Sequence[int]] = None, loss_reduction: str = "sum"
    ) -> None:
        super().__init__()
        if loss_reduction not in ("sum", "mean"):
            raise UsageError(
                f"projector {self.name!r}: loss_reduction must be 'sum' (PKD eq. 7, the default) or "
                f"'mean' (PKD's reference code, for its beta of 10-1000), got {loss_reduction!r}"
            )
        self.ild_loss_options = {"reduction": loss_reduction}
        students = intermediate_student_layers(request, self.name)
        self.n, self.m = len(request.teacher_layers), len(request.student_layers)
        if layer_map is None:
            layer_map = self.default_layer_map(self.n, self.m)
        elif not isinstance(layer_map, (list, tuple)) or len(layer_map) != len(students):
            raise UsageError(
                f"projector {self.name!r}: layer_map must list one teacher layer (1..{self.n}) per matched "
                f"student layer h^1..h^{len(students)}, i.e. {len(students)} numbers; got {layer_map!r}"
            )
        self.layer_map = tuple(check_teacher_layer(i, self.n, self.name, "layer_map") for i in layer_map)
        width = common_width([request.teacher_layers[i - 1] for i in self.layer_map], "teacher", self.name)
        self.adapters = nn.ModuleList(width_adapter(spec.width, width) for spec in students)

    def default_layer_map(self, n: int, m: int) -> tuple[int, ...]:
        return tuple(-(-j * n // m) for j in range(1, m))  # ⌈j·n/m⌉

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        check_inputs(inputs, self.n, self.m, self.name)
        students = inputs.student_layers[:-1]
        student = torch.stack([adapt(h) for adapt, h in zip(self.adapters, students)], dim=1)  # (B, m-1, D)
        teacher = torch.stack([inputs.teacher_layers[i - 1].detach() for i in self.layer_map], dim=1)  # (B, m-1, D)
        chosen = torch.tensor([i - 1 for i in self.layer_map], device=teacher.device)
        attention = nn.functional.one_hot(chosen, self.n).to(teacher.dtype)  # (m-1, n)
        return ProjectedPairs(student, teacher, attention=attention.expand(teacher.shape[0], -1, -1))  # (B, m-1, n)

    def extra_repr(self) -> str:
        return f"layer_map={list(self.layer_map)}, loss_reduction={self.ild_loss_options['reduction']!r}"


class PKDLast(PKDSkip):
    """PKD-Last: the m−1 teacher layers just below the last one."""

    name = "pkd-last"

    def default_layer_map(self, n: int, m: int) -> tuple[int, ...]:
        if n < m:
            raise UsageError(
                f"projector 'pkd-last': the teacher's {n} layers cannot supply {m - 1} distinct layers "
                f"below its last; set layer_map by hand (projector_options: {{layer_map: [...]}})"
            )
        return tuple(n - m + j for j in range(1, m))


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("pkd-skip", PKDSkip, description="PKD, every k-th teacher layer (Sun et al. 2019); option layer_map")
    register("pkd-last", PKDLast, description="PKD, the last teacher layers (Sun et al. 2019); option layer_map")

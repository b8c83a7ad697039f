"""Patient KD (Sun et al. 2019): each student layer imitates one chosen teacher layer.

L_PT = Σ_j ‖ h_s^j/‖h_s^j‖₂ − h_t^{A(j)}/‖h_t^{A(j)}‖₂ ‖²₂ on the [CLS] vectors (PKD eq. 7), for the
student's intermediate layers j = 1..m−1 (its output layer is covered by the logit KD). With n
teacher and m student layers, the default maps are

- ``pkd-skip``: A(j) = ⌈j·n/m⌉, every (n/m)-th layer   (12→6: 2,4,6,8,10;  12→3: 4,8)
- ``pkd-last``: A(j) = n − m + j, the layers just below the last  (12→6: 7..11;  12→3: 10,11)

and ``layer_map`` sets A by hand, e.g. ``[1, 5, 9]`` for ALP-KD's 12→4 PKD and ``[1]``, ``[6]`` or
``[12]`` for its 12→2 table, or rearranges the default map (``reverse``, ``random``, ``all-to-one``,
``"1:6,2:3"``: see :mod:`.layers`). ``match_output_layer`` also matches the output layer m, to
A(m) = n (Yu et al.'s setting), which a 2-layer student needs for a map with more than one pair.
Where the widths differ, or the student is no Transformer (a BiLSTM or Gated-CNN), a learned
Linear per matched layer maps the student vector to the teacher's width before normalisation
(PKD itself, BERT to BERT at one width, has no such case).

PKD's objective (eq. 8) is (1−α)·CE + α·L_DS + β·L_PT, three independent weights: in kdplug
``ce_weight`` = 1−α, ``eta`` = α, ``lam`` = β. PKD's code averages L_PT over the hidden dimension
and the layers (``loss_reduction="mean"``), which is what its β ∈ {10, 100, 500, 1000} weighs;
the default ``"sum"`` is eq. 7 as written, which ALP-KD's PKD rows weigh with λ ≤ 0.7.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch
from torch import nn

import kdplug
from kdplug.errors import UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import (
    arrange,
    check_inputs,
    check_layer_map_option,
    check_teacher_layer,
    common_width,
    intermediate_student_layers,
    layer_adapter,
    matching_record,
)

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
    check_options = staticmethod(check_layer_map_option)  # before the models load

    def __init__(
        self,
        request: ProjectionRequest,
        *,
        layer_map: Union[str, Sequence[int], None] = None,
        loss_reduction: str = "sum",
        match_output_layer: bool = False,
    ) -> None:
        super().__init__()
        if loss_reduction not in ("sum", "mean"):
            raise UsageError(
                f"projector {self.name!r}: loss_reduction must be 'sum' (PKD eq. 7, the default) or "
                f"'mean' (PKD's reference code, for its beta of 10-1000), got {loss_reduction!r}"
            )
        if not isinstance(match_output_layer, bool):
            raise UsageError(
                f"projector {self.name!r}: match_output_layer is true or false, got {match_output_layer!r}"
            )
        self.ild_loss_options = {"reduction": loss_reduction}
        self.n, self.m = len(request.teacher_layers), len(request.student_layers)
        # PKD leaves the output layer m to the logit KD; Yu et al. match it too (A(m) = n)
        students = request.student_layers if match_output_layer else intermediate_student_layers(request, self.name)
        self.matched = len(students)
        self.strategy = layer_map if isinstance(layer_map, str) else "forward" if layer_map is None else "given"
        if layer_map is None or isinstance(layer_map, str):
            forward = tuple((i,) for i in self.default_layer_map(self.n, self.m)[: self.matched])
            layer_map = [group[0] for group in arrange(forward, layer_map, self.n, request.seed, self.name)]
        elif not isinstance(layer_map, (list, tuple)) or len(layer_map) != len(students):
            raise UsageError(
                f"projector {self.name!r}: layer_map must list one teacher layer (1..{self.n}) per matched "
                f"student layer h^1..h^{len(students)}, i.e. {len(students)} number(s); got {layer_map!r}"
            )
        self.layer_map = tuple(check_teacher_layer(i, self.n, self.name, "layer_map") for i in layer_map)
        width = common_width([request.teacher_layers[i - 1] for i in self.layer_map], "teacher", self.name)
        teachers = [request.teacher_layers[i - 1] for i in self.layer_map]
        self.adapters = nn.ModuleList(layer_adapter(spec, t, width) for spec, t in zip(students, teachers))

    @property
    def matching(self) -> dict:
        """What the run records: the strategy and the teacher layer of each matched student layer."""
        return matching_record(self.strategy, tuple((t,) for t in self.layer_map))

    def default_layer_map(self, n: int, m: int) -> tuple[int, ...]:
        return tuple(-(-j * n // m) for j in range(1, m + 1))  # ⌈j·n/m⌉, j = 1..m (m: the output layer)

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        check_inputs(inputs, self.n, self.m, self.name)
        students = inputs.student_layers[: self.matched]
        student = torch.stack([adapt(h) for adapt, h in zip(self.adapters, students)], dim=1)  # (B, m-1, D)
        teacher = torch.stack([inputs.teacher_layers[i - 1].detach() for i in self.layer_map], dim=1)  # (B, m-1, D)
        chosen = torch.tensor([i - 1 for i in self.layer_map], device=teacher.device)
        attention = nn.functional.one_hot(chosen, self.n).to(teacher.dtype)  # (m-1, n)
        return ProjectedPairs(student, teacher, attention=attention.expand(teacher.shape[0], -1, -1))  # (B, m-1, n)

    def extra_repr(self) -> str:
        return (
            f"layer_map={list(self.layer_map)} ({self.strategy}), loss_reduction="
            f"{self.ild_loss_options['reduction']!r}, match_output_layer={self.matched == self.m}"
        )


class PKDLast(PKDSkip):
    """PKD-Last: the m−1 teacher layers just below the last one."""

    name = "pkd-last"

    def default_layer_map(self, n: int, m: int) -> tuple[int, ...]:
        if n < m:
            raise UsageError(
                f"projector 'pkd-last': the teacher's {n} layers cannot supply {m - 1} distinct layers "
                f"below its last; set layer_map by hand (projector_options: {{layer_map: [...]}})"
            )
        return tuple(n - m + j for j in range(1, m + 1))


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("pkd-skip", PKDSkip, description="PKD, every k-th teacher layer (Sun et al. 2019); option layer_map")
    register("pkd-last", PKDLast, description="PKD, the last teacher layers (Sun et al. 2019); option layer_map")

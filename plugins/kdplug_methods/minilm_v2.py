"""MiniLMv2 (Wang et al., Findings of ACL 2021): multi-head self-attention relation distillation.

Take one teacher block l and the student's last block m. Their queries Q, keys K and values V
(``(l_x, d)``: all heads side by side) are re-split along the width into A_r relation heads of
d_r = d / A_r (the same A_r for both models, whatever their head counts and widths). For each
relation head a and each of Q-Q, K-K and V-V:

    R_a = softmax(X_a X_aᵀ / √d_r)        (l_x × l_x, softmax over the keys)
    L_XX = 1/(A_r·l_x) Σ_a Σ_t KL(R^T_a,t ‖ R^S_a,t)
    L_ILD = L_QQ + L_KK + L_VV

The projector returns each example's three terms, ``(batch, 3)``. Options: ``teacher_layer``
(1-based, default the last; the paper uses the last for base-size teachers and an upper-middle
one for large ones) and ``relation_heads`` (default 48, or 64 for a teacher wider than 768, as
the paper; lowered to the largest count that divides both widths where that does not).

Where the paper is silent or kdplug chooses:
- **Padding.** Pad keys are masked before the softmax and pad queries left out: l_x is each
  example's true length.
- **Task-specific use.** MiniLMv2 distils a pre-trained model on a general corpus, then fine-tunes
  it. kdplug distils on the task's data: the ``two-stage`` recipe (stage 1 the relations alone,
  stage 2 CE), the paper's order on the run's data; mixing KD into stage 1 (``--set eta=0.3``: KD
  at η, the relations at 1 − η; stage 1 never has CE) is kdplug's extension.
- **Large teachers.** ``teacher_layer`` defaults to the last block whatever the teacher's size; the
  paper takes an upper-middle block of a large teacher: set it (e.g. ``teacher_layer=21`` of 24).
- Relations are computed in fp32 outside autocast (from Q/K/V in the precision the models ran in).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kdplug
from kdplug.errors import PluginError, UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest

from .layers import check_teacher_layer
from .tinybert import require_tokens, token_specs

MINILM_V2 = """@inproceedings{wang2021minilmv2,
  title = {{MiniLMv2}: Multi-Head Self-Attention Relation Distillation for Compressing Pretrained Transformers},
  author = {Wang, Wenhui and Bao, Hangbo and Huang, Shaohan and Dong, Li and Wei, Furu},
  booktitle = {Findings of the Association for Computational Linguistics: ACL-IJCNLP 2021},
  pages = {2140--2151},
  year = {2021}
}"""

RELATIONS = ("queries", "keys", "values")
#: a masked key's score: exp() of it is exactly 0 in fp32, and unlike -inf it keeps KL's 0·log 0 finite
MASKED = -1e9


def paper_relation_heads(teacher_width: int) -> int:
    return 64 if teacher_width > 768 else 48


def default_relation_heads(teacher_width: int, student_width: int) -> int:
    """The paper's count, or the largest count below it that divides both widths."""
    common = math.gcd(teacher_width, student_width)
    return max(a for a in range(1, paper_relation_heads(teacher_width) + 1) if common % a == 0)


def log_relations(x: Tensor, heads: int, mask: Tensor) -> Tensor:
    """``(B, A_r, L, L)`` log-softmax of the scaled dot products within each relation head of ``x``
    ``(B, L, d)``, pad keys masked."""
    batch, length, width = x.shape
    size = width // heads
    x = x.float().view(batch, length, heads, size).transpose(1, 2)  # (B, A_r, L, d_r)
    scores = x @ x.transpose(-1, -2) / math.sqrt(size)
    scores = scores.masked_fill(~mask[:, None, None, :], MASKED)
    return F.log_softmax(scores, dim=-1)


def relation_kl(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """``(batch,)``: KL(teacher ‖ student) of each real query's relation row, averaged over the
    relation heads and the real queries (log-probabilities ``(B, A_r, L, L)``)."""
    kl = (teacher.exp() * (teacher - student)).sum(dim=-1)  # (B, A_r, L)
    real = mask.float()[:, None, :]
    return (kl * real).sum(dim=(1, 2)) / (student.shape[1] * real.sum(dim=(1, 2))).clamp_min(1)


def check_options(*_: object, teacher_layer: object = None, relation_heads: object = None, **__: object) -> None:
    for name, value in (("teacher_layer", teacher_layer), ("relation_heads", relation_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"projector 'minilm-v2': {name} is a positive whole number, got {value!r}")


class MiniLMv2Projector(nn.Module):
    """Q-Q, K-K and V-V self-attention relations of one teacher block and the student's last."""

    name = "minilm-v2"
    ild_loss = None  # its terms are computed here: KL divergences of relation rows
    needs_teacher_heads = False
    needs_tokens = True
    pairs_per_example = False
    # stage 1 of two-stage: the relations alone (beta = eta = 0), stage 2 fine-tunes with CE
    default_weights = {"eta": 0.0, "lam": 1.0, "ce": 0.0, "temperature": 1.0}
    default_recipe = "two-stage"
    check_options = staticmethod(check_options)
    citation = MINILM_V2

    def __init__(
        self, request: ProjectionRequest, *, teacher_layer: Optional[int] = None, relation_heads: Optional[int] = None
    ) -> None:
        super().__init__()
        check_options(teacher_layer=teacher_layer, relation_heads=relation_heads)
        teacher, student = token_specs(request, self.name)
        self.teacher_layer = (
            teacher.layers
            if teacher_layer is None
            else check_teacher_layer(teacher_layer, teacher.layers, self.name, "teacher_layer")
        )
        self.student_layer = student.layers
        if relation_heads is None:
            relation_heads = default_relation_heads(teacher.width, student.width)
        elif teacher.width % relation_heads or student.width % relation_heads:
            common = math.gcd(teacher.width, student.width)
            fits = [a for a in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64) if common % a == 0]
            raise UsageError(
                f"projector 'minilm-v2': relation_heads {relation_heads} must divide both widths (teacher "
                f"{teacher.width}, student {student.width}); e.g. {', '.join(map(str, fits))}"
            )
        self.relation_heads = relation_heads

    @property
    def matching(self) -> dict:
        return {
            "pairs": [[self.student_layer, [self.teacher_layer]]],
            "relation_heads": self.relation_heads,
            "terms": ["Q-Q", "K-K", "V-V"],
        }

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        teacher, student = require_tokens(inputs, self.name)
        if len(teacher.queries) < self.teacher_layer or len(student.queries) != self.student_layer:
            raise PluginError(
                f"projector 'minilm-v2' was built for teacher block {self.teacher_layer} and a {self.student_layer}-"
                f"block student, but got {len(teacher.queries)} and {len(student.queries)} blocks"
            )
        mask = student.mask
        terms = []
        with torch.autocast(mask.device.type, enabled=False):
            for relation in RELATIONS:
                source = getattr(student, relation)[self.student_layer - 1]
                target = getattr(teacher, relation)[self.teacher_layer - 1].detach()
                terms.append(
                    relation_kl(
                        log_relations(source, self.relation_heads, mask),
                        log_relations(target, self.relation_heads, mask),
                        mask,
                    )
                )
        return ProjectedPairs(terms=torch.stack(terms, dim=1))  # (B, 3)

    def extra_repr(self) -> str:
        return f"teacher_layer={self.teacher_layer}, relation_heads={self.relation_heads}"


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register(
        "minilm-v2",
        MiniLMv2Projector,
        description="MiniLMv2: Q-Q/K-K/V-V self-attention relations, any head count and width (teacher in the "
        "loop; Transformer students); options teacher_layer, relation_heads",
    )

"""TinyBERT (Jiao et al., Findings of EMNLP 2020): Transformer distillation token by token.

With a teacher of N blocks and width d, a student of M blocks and width d', and the uniform map
g(m) = m·N/M (g(0) = 0, the embedding layer), the student learns, for every example x:

    L_embd = MSE(E^S W_e, E^T)                               the embedding outputs, (l, d') -> (l, d)
    L_hidn = MSE(H^S_m W_h, H^T_g(m))         for m = 1..M   each block's output
    L_attn = (1/h) Σ_i MSE(A^S_i,m, A^T_i,g(m)) for m = 1..M  each head's scores A = QKᵀ/√d_k, pre-softmax
    L_ILD  = L_embd + Σ_m (L_hidn,m + L_attn,m)

with W_e and W_h learned (d'×d, one W_h for all blocks), then a prediction stage on the logits
(soft cross-entropy at t = 1): the ``tinybert`` recipe, stage ``intermediate`` then ``prediction``.
The projector returns each example's terms, ``(batch, 2M + 1)``: the embeddings, then the hidden
states and the attention scores of each matched block.

Where the paper is silent or kdplug chooses:
- **Padding.** The MSEs average over the example's real tokens (hidden states: its l·d values;
  attention: the h·l·l scores between real tokens); the reference code averages over the padded
  batch, pads included, so its loss depends on how a batch is padded.
- **Projections.** The paper's W_e and W_h, two matrices without bias, one W_h for all blocks; the
  reference code shares one Linear with bias for both.
- **Attention scores** are QKᵀ/√d_k rebuilt from the hooked Q and K (absolute-position encoders).
- **Layer map.** g(m) = ⌈m·N/M⌉ where M does not divide N (the code asserts it does); every
  ``layer_map`` of the layer-matching methods applies (``reverse``, ``random``, ``"1:2,2:6"`` ...).
- **Heads.** The attention term compares head i with head i, so both models need the same head
  count; otherwise the run stops with a usage error (``attention=false`` keeps the hidden states,
  or ``minilm-v2`` re-splits heads).
- **Data.** The paper distils on an augmented set (``--augment teacher-words`` is its procedure);
  kdplug distils on the run's data, transfer set included.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Union

import torch
from torch import Tensor, nn

import kdplug
from kdplug.errors import PluginError, UsageError
from kdplug.types import DistillInputs, ProjectedPairs, ProjectionRequest, TokenSignals, TokenSpec

from .layers import arrange, check_layer_map_option, matching_record

log = logging.getLogger("kdplug.methods.tinybert")

TINYBERT = """@inproceedings{jiao2020tinybert,
  title = {{TinyBERT}: Distilling {BERT} for Natural Language Understanding},
  author = {Jiao, Xiaoqi and Yin, Yichun and Shang, Lifeng and Jiang, Xin and Chen, Xiao and Li, Linlin and
            Wang, Fang and Liu, Qun},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2020},
  pages = {4163--4174},
  year = {2020}
}"""


def token_specs(request: ProjectionRequest, method: str) -> tuple[TokenSpec, TokenSpec]:
    """Both models' per-token shapes, or a usage error naming what has none."""
    if request.student_tokens is None:
        raise UsageError(
            f"projector {method!r} distils per-token hidden states and attention, but the student pools each "
            f"sentence into one vector per layer (a BiLSTM or CNN): use a Transformer student (bert-k, "
            f"distilroberta, --student DIR), or a method for pooled students (universal-ca, cka, rkd)"
        )
    if request.teacher_tokens is None:
        raise UsageError(
            f"projector {method!r} needs a Transformer teacher whose blocks kdplug can read (query/key/value "
            f"projections, as BERT and RoBERTa have); this teacher has none (a decoder-only language model, "
            f"fine-tuned or prompted, attends causally and is read at one position): use a method that reads its "
            f"pooled vectors or logits (kd, rkd, pkd, alp, cka, universal-ca)"
        )
    return request.teacher_tokens, request.student_tokens


def require_tokens(inputs: DistillInputs, method: str) -> tuple[TokenSignals, TokenSignals]:
    if inputs.teacher_tokens is None or inputs.student_tokens is None:
        raise PluginError(
            f"projector {method!r} reads per-token signals (needs_tokens), but the inputs carry none; the engine "
            f"hands them over when the projector's needs_tokens is True"
        )
    return inputs.teacher_tokens, inputs.student_tokens


def token_mse(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """``(batch,)``: each example's mean squared error over its real tokens and every width,
    ``(B, L, d)`` sides."""
    mask = mask.float()
    squared = (student - teacher).pow(2).mean(dim=-1)  # (B, L)
    return (squared * mask).sum(dim=-1) / mask.sum(dim=-1).clamp_min(1)


def score_mse(student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
    """``(batch,)``: each example's mean squared error over the heads and the scores between its
    real tokens, ``(B, h, L, L)`` sides."""
    real = mask.float()
    pairs = real[:, None, :, None] * real[:, None, None, :]  # (B, 1, L, L): query and key both real
    squared = (student - teacher).pow(2) * pairs
    return squared.sum(dim=(1, 2, 3)) / (student.shape[1] * pairs.sum(dim=(1, 2, 3))).clamp_min(1)


def check_options(
    *_: object, layer_map: object = None, attention: object = True, embeddings: object = True, **__: object
) -> None:
    """What can be said of the options before the models are loaded."""
    check_layer_map_option(layer_map=layer_map)
    for name, value in (("attention", attention), ("embeddings", embeddings)):
        if not isinstance(value, bool):
            raise UsageError(f"projector 'tinybert': {name} is true or false, got {value!r}")


class TinyBERTProjector(nn.Module):
    """TinyBERT's embedding, hidden-state and attention terms (see the module docstring)."""

    name = "tinybert"
    ild_loss = None  # its terms are computed here: per-token MSEs of two kinds and widths
    needs_teacher_heads = False
    needs_tokens = True
    pairs_per_example = False  # no pair vectors to record: the terms are per-token MSEs
    # the intermediate stage: the ILD terms alone (the paper and its code: no CE, no prediction loss)
    default_weights = {"eta": 0.0, "lam": 1.0, "ce": 0.0, "temperature": 1.0}
    default_recipe = "tinybert"
    check_options = staticmethod(check_options)
    citation = TINYBERT

    def __init__(
        self,
        request: ProjectionRequest,
        *,
        layer_map: Union[str, Sequence[int], None] = None,
        attention: bool = True,
        embeddings: bool = True,
    ) -> None:
        super().__init__()
        check_options(layer_map=layer_map, attention=attention, embeddings=embeddings)
        teacher, student = token_specs(request, self.name)
        if attention and teacher.heads != student.heads:
            raise UsageError(
                f"projector 'tinybert' compares attention head by head, but the teacher has {teacher.heads} heads and "
                f"the student {student.heads}; set projector_options.attention=false (hidden states only), or use "
                f"minilm-v2, which re-splits heads"
            )
        self.n, self.m = teacher.layers, student.layers
        uniform = tuple((-(-j * self.n // self.m),) for j in range(1, self.m + 1))  # g(m) = ⌈m·N/M⌉
        self.layer_map = layer_map
        self.pairs = arrange(uniform, layer_map, self.n, request.seed, self.name)
        self.attention, self.embeddings = attention, embeddings
        self.hidden_projection = nn.Linear(student.width, teacher.width, bias=False)  # W_h
        self.embedding_projection = nn.Linear(student.width, teacher.width, bias=False) if embeddings else None  # W_e

    @property
    def matching(self) -> dict:
        record = matching_record(self.layer_map, self.pairs)
        record["terms"] = self.term_names()
        return record

    def term_names(self) -> list[str]:
        blocks = [f"{j + 1}:{group[0]}" for j, group in enumerate(self.pairs)]
        return (
            (["embeddings 0:0"] if self.embeddings else [])
            + [f"hidden {b}" for b in blocks]
            + ([f"attention {b}" for b in blocks] if self.attention else [])
        )

    def forward(self, inputs: DistillInputs) -> ProjectedPairs:
        teacher, student = require_tokens(inputs, self.name)
        if len(teacher.hidden) != self.n + 1 or len(student.hidden) != self.m + 1:
            raise PluginError(
                f"projector 'tinybert' was built for {self.n} teacher and {self.m} student blocks but got hidden "
                f"states of {len(teacher.hidden) - 1} and {len(student.hidden) - 1}"
            )
        mask = student.mask
        with torch.autocast(mask.device.type, enabled=False):  # the arithmetic in fp32 (inputs may be bf16)
            terms = []
            if self.embedding_projection is not None:
                projected = self.embedding_projection(student.hidden[0].float())
                terms.append(token_mse(projected, teacher.hidden[0].detach().float(), mask))
            for j, group in enumerate(self.pairs, start=1):
                projected = self.hidden_projection(student.hidden[j].float())
                terms.append(token_mse(projected, teacher.hidden[group[0]].detach().float(), mask))
            if self.attention:
                for j, group in enumerate(self.pairs, start=1):
                    scores = student.attention_scores(j)
                    terms.append(score_mse(scores, teacher.attention_scores(group[0]).detach(), mask))
        return ProjectedPairs(terms=torch.stack(terms, dim=1))  # (B, P)

    def extra_repr(self) -> str:
        return f"pairs={[[j + 1, g[0]] for j, g in enumerate(self.pairs)]}, attention={self.attention}"


class TinyBERTRecipe:
    """TinyBERT's task-specific distillation: stage ``intermediate`` distils the embeddings, hidden
    states and attention (the projector's terms alone), stage ``prediction`` the logits (KD alone,
    at the run's temperature, default t = 1, where the paper's soft cross-entropy differs from KD's
    KL by the teacher's entropy, a constant). No stage sees a gold label, as in the paper.

    Options: ``stage2_epochs`` (default: the run's epochs), ``stage2_lr``.
    """

    citation = TINYBERT

    def __init__(self, stage2_epochs: int | None = None, stage2_lr: float | None = None) -> None:
        self.stage2_epochs, self.stage2_lr = stage2_epochs, stage2_lr

    def run(self, ctx):
        fixed = [key for key in ("eta", "lam", "ce_weight") if ctx.settings[key] is not None]
        if fixed:
            log.warning(
                "the tinybert recipe fixes each stage's weights (intermediate: the layer terms alone; prediction: KD "
                "alone), so %s are not used; --recipe standard weighs the terms as the run sets them",
                ", ".join(fixed),
            )
        student = ctx.new_student()
        projector = ctx.new_projector(student)
        ctx.train_stage("intermediate", student, projector, weights=ctx.weights(projector, eta=0.0, lam=1.0, ce=0.0))
        ctx.train_stage(
            "prediction",
            student,
            None,
            weights=ctx.weights(None, eta=1.0, lam=0.0, ce=0.0),
            epochs=self.stage2_epochs,
            lr=self.stage2_lr,
        )
        return student


@kdplug.hookimpl
def kdplug_register_projectors(register):
    register(
        "tinybert",
        TinyBERTProjector,
        description="TinyBERT: per-token embedding, hidden-state and attention MSE (teacher in the loop; "
        "Transformer students)",
    )


@kdplug.hookimpl
def kdplug_register_recipes(register):
    register("tinybert", TinyBERTRecipe, description="TinyBERT: stage 1 intermediate layers, stage 2 KD on the logits")

"""What the BiLSTM and Gated-CNN students share: attention-sum pooling, the pooled encoder
around a stack of sequence layers, its output type, saving, and its layer extractor.

Universal-KD (Sec. 5.3) reduces the encoded sequence to one vector with the attention sum of
Bahdanau et al. (2015). kdplug applies it to *every* layer, so that each layer has one vector
to distil into, the analogue of a Transformer's [CLS] state (METHODS.md, Models).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

import kdplug
from kdplug.types import LayerSpec

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

#: The papers give no embedding size. Half the hidden size (384 for the papers' 768) puts both
#: students at the "similar capacity of around 25M trainable parameters" of Universal-KD Sec. 5.3
#: with BERT's 30,522-word vocabulary: 23.0M (BiLSTM) and 26.5M (Gated-CNN); 300 would give
#: 20.1M and 23.5M.
DEFAULT_EMBEDDING_DIM = 384
#: used when the teacher's width cannot be read
PAPER_HIDDEN_SIZE = 768


def teacher_width(teacher: Any) -> int:
    """The width of the teacher's last layer: a student as wide as its teacher is the papers'
    setting (768 under BERT-base), and scales down with a smaller teacher (384 under MiniLM)."""
    model = getattr(teacher, "model", None)
    try:
        specs = kdplug.find_layer_extractor(model).layer_specs(model)
        return specs[-1].width
    except (kdplug.KdplugError, AttributeError, IndexError):
        return PAPER_HIDDEN_SIZE

#: values of the students' ``tokenizer`` option that name a tokenizer rather than give one
TEACHER_TOKENIZER, SENTENCEPIECE_TOKENIZER = "teacher", "sentencepiece"


@dataclass
class PooledOutput:
    """Forward output of a pooled student.

    logits: ``(batch, C)``; hidden_states: one pooled ``(batch, width)`` vector per layer;
    pooling_weights: one ``(batch, seq)`` attention distribution per layer (zero on padding).
    """

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    pooling_weights: tuple[torch.Tensor, ...] = ()


class AttentionPooling(nn.Module):
    """Additive (Bahdanau) attention sum without a query: a_t = softmax_t(v · tanh(W h_t + b)),
    pooled = Σ_t a_t h_t. Padding gets exactly zero weight, so padding never changes the result."""

    def __init__(self, width: int, attention_dim: Optional[int] = None) -> None:
        super().__init__()
        attention_dim = attention_dim or width
        self.proj = nn.Linear(width, attention_dim)
        self.score = nn.Linear(attention_dim, 1, bias=False)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.score(torch.tanh(self.proj(states))).squeeze(-1)  # (batch, seq, 1) -> (batch, seq)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        pooled = torch.einsum("bt,btd->bd", weights, states)  # (batch, width)
        return pooled, weights


class PooledEncoderClassifier(nn.Module):
    """Token embeddings -> a stack of sequence layers -> attention-sum pooling of every layer ->
    a linear classifier on the last layer's pooled vector.

    Subclasses build ``self.layers``: modules called as ``layer(x, mask) -> x`` on
    ``(batch, seq, dim)`` states with a boolean ``(batch, seq)`` mask, each returning
    ``self.width`` features. ``self.config`` holds the constructor's keyword arguments, which
    is what :meth:`save_pretrained` writes and :meth:`from_pretrained` passes back.
    """

    #: LayerSpec.kind of this architecture's layers
    layer_kind = "other"
    #: learning rate used when the run sets none: trained from scratch, not fine-tuned
    default_lr = 1e-3

    def __init__(self, *, vocab_size: int, embedding_dim: int, width: int, num_layers: int,
                 num_outputs: int, pad_token_id: int = 0, dropout: float = 0.1,
                 attention_dim: Optional[int] = None) -> None:
        super().__init__()
        self.width = width
        self.embeddings = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_token_id)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList()  # filled by the subclass
        self.poolers = nn.ModuleList(AttentionPooling(width, attention_dim) for _ in range(num_layers))
        self.classifier = nn.Linear(width, num_outputs)
        self.tokenizer: Any = None

    @property
    def num_layers(self) -> int:
        return len(self.poolers)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                **unused: Any) -> PooledOutput:
        # token_type_ids are ignored on purpose: a pair is one sequence to this encoder (Universal-KD, App. A.2).
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.dropout(self.embeddings(input_ids))  # (batch, seq, embedding_dim)
        pooled, weights = [], []
        for layer, pooler in zip(self.layers, self.poolers):
            x = self.dropout(layer(x, mask))  # (batch, seq, width)
            vector, attention = pooler(x, mask)
            pooled.append(vector)
            weights.append(attention)
        logits = self.classifier(self.dropout(pooled[-1]))  # (batch, C)
        return PooledOutput(logits=logits, hidden_states=tuple(pooled), pooling_weights=tuple(weights))

    # -- saving --------------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json``, ``model.safetensors`` and the tokenizer; see :meth:`from_pretrained`."""
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, CONFIG_NAME), "w") as handle:
            json.dump({"kdplug_architecture": type(self).__name__, **self.config}, handle, indent=2)
        state = {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()}
        save_file(state, os.path.join(directory, WEIGHTS_NAME))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike):
        from safetensors.torch import load_file

        config_path = os.path.join(directory, CONFIG_NAME)
        if not os.path.isfile(config_path):
            raise kdplug.UsageError(f"{directory} holds no {CONFIG_NAME}: it was not written by "
                                    f"{cls.__name__}.save_pretrained")
        with open(config_path) as handle:
            config = json.load(handle)
        architecture = config.pop("kdplug_architecture", None)
        if architecture != cls.__name__:
            raise kdplug.UsageError(f"{directory} holds a {architecture or 'foreign'} checkpoint, "
                                    f"not a {cls.__name__}; load it with the matching student")
        model = cls(**config)
        model.load_state_dict(load_file(os.path.join(directory, WEIGHTS_NAME)))
        if os.path.isfile(os.path.join(directory, "tokenizer_config.json")):
            from transformers import AutoTokenizer

            model.tokenizer = AutoTokenizer.from_pretrained(directory)
        return model


class PooledLayerExtractor:
    """Layer extractor for one :class:`PooledEncoderClassifier` subclass: its pooled vectors
    are the layers (indices 1..L; there is no embedding layer to report)."""

    def __init__(self, model_class: type[PooledEncoderClassifier]) -> None:
        self.model_class = model_class

    def supports(self, model: nn.Module) -> bool:
        return isinstance(model, self.model_class)

    def layer_specs(self, model: PooledEncoderClassifier) -> list[LayerSpec]:
        return [LayerSpec(index, model.width, model.layer_kind) for index in range(1, model.num_layers + 1)]

    def __call__(self, model: PooledEncoderClassifier, outputs: PooledOutput) -> list[torch.Tensor]:
        return list(outputs.hidden_states)


def student_vocabulary(teacher: Any, tokenizer: Any = None) -> tuple[Any, int, int]:
    """The tokenizer a non-Transformer student reads with (its own if given, as an object or a
    directory; the teacher's for None or ``"teacher"``), its vocabulary size and padding id."""
    if isinstance(tokenizer, str) and tokenizer == TEACHER_TOKENIZER:
        tokenizer = None
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        if not os.path.isdir(tokenizer):
            raise kdplug.UsageError(f"student option tokenizer={tokenizer!r} is not a directory; pass "
                                    f"{TEACHER_TOKENIZER!r}, {SENTENCEPIECE_TOKENIZER!r} or a directory written "
                                    f"by a tokenizer's save_pretrained")
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    tokenizer = tokenizer if tokenizer is not None else getattr(teacher, "tokenizer", None)
    if tokenizer is None:
        raise kdplug.UsageError("this student needs a tokenizer: the teacher has none, so pass the student "
                                "option tokenizer=/path/to/tokenizer_dir")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return tokenizer, len(tokenizer), pad


def build_pooled_student(model_class: type[PooledEncoderClassifier], task: Any, teacher: Any, *,
                         embedding_dim: Optional[int], tokenizer: Any, init_embeddings_from_teacher: bool,
                         source: Optional[str], sentencepiece_vocab_size: int = 8000,
                         sentencepiece_model_type: str = "unigram", **architecture: Any) -> PooledEncoderClassifier:
    """The body of the BiLSTM and Gated-CNN student factories.

    ``source`` reloads a student its ``save_pretrained`` wrote; otherwise the vocabulary is the
    tokenizer's (``"sentencepiece"``: one trained on the task's training text, see
    sentencepiece_tokenizer.py). ``hidden_size`` defaults to the teacher's width (768 under BERT-base,
    the papers' setting; 384 under MiniLM), ``embedding_dim`` to half of it, or to the teacher's
    embedding width when the embeddings are copied from the teacher (see docs/models.md).
    """
    if source is not None:
        return model_class.from_pretrained(source)
    if architecture.get("hidden_size") is None:
        architecture["hidden_size"] = teacher_width(teacher)
    if isinstance(tokenizer, str) and tokenizer == SENTENCEPIECE_TOKENIZER:
        from .sentencepiece_tokenizer import task_sentencepiece_tokenizer

        tokenizer = task_sentencepiece_tokenizer(task, vocab_size=sentencepiece_vocab_size,
                                                 model_type=sentencepiece_model_type)
    tokenizer, vocab_size, pad = student_vocabulary(teacher, tokenizer)
    if embedding_dim is None and init_embeddings_from_teacher:
        embedding_dim = teacher.model.get_input_embeddings().embedding_dim
    elif embedding_dim is None:
        embedding_dim = architecture["hidden_size"] // 2
    model = model_class(vocab_size=vocab_size, num_outputs=kdplug.num_outputs(task), embedding_dim=embedding_dim,
                        pad_token_id=pad, **architecture)
    if init_embeddings_from_teacher:
        copy_teacher_embeddings(model, teacher)
    model.tokenizer = tokenizer
    return model


def copy_teacher_embeddings(student: PooledEncoderClassifier, teacher: Any) -> None:
    """Initialise the student's word embeddings from the teacher's input embeddings."""
    source = teacher.model.get_input_embeddings().weight
    target = student.embeddings.weight
    if source.shape != target.shape:
        raise kdplug.UsageError(
            f"init_embeddings_from_teacher needs the teacher's vocabulary and width: the teacher's "
            f"embeddings are {tuple(source.shape)}, the student's {tuple(target.shape)}. Use the teacher's "
            f"tokenizer and embedding_dim={source.shape[1]}, or drop init_embeddings_from_teacher")
    with torch.no_grad():
        target.copy_(source)

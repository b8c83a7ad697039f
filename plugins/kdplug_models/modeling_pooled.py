"""What the BiLSTM and Gated-CNN students share, as Hugging Face models: config, attention-sum
pooling, the pooled encoder around a stack of sequence layers, and its output type.

Universal-KD (Sec. 5.3) reduces the encoded sequence to one vector with the attention sum of
Bahdanau et al. (2015). kdplug applies it to *every* layer, so that each layer has one vector
to distil into, the analogue of a Transformer's [CLS] state (docs/models.md, Non-Transformer students).

The students are ``PreTrainedModel``s with their own ``PretrainedConfig``: ``save_pretrained`` /
``from_pretrained``, ``AutoModelForSequenceClassification`` and ``pipeline`` work on them without
``trust_remote_code`` once kdplug is imported (see ``kdplug_models.auto``). These modeling modules
import nothing of kdplug: ``save_pretrained`` copies them next to the weights with an ``auto_map``
(transformers' custom-code convention), so a student also loads where kdplug is not installed,
with ``trust_remote_code=True``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

try:  # within kdplug a bad size is a usage error (exit 2); in a copy next to the weights, a ValueError
    from kdplug.errors import UsageError as StudentConfigError
except ImportError:  # pragma: no cover - exercised by the standalone-loading test in a fresh environment
    StudentConfigError = ValueError


def register_auto_classes(config: type[PretrainedConfig], model: type[PreTrainedModel]) -> None:
    """Let ``AutoConfig`` / ``AutoModelForSequenceClassification`` (and ``pipeline``) load this model type."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    AutoConfig.register(config.model_type, config, exist_ok=True)
    AutoModelForSequenceClassification.register(config, model, exist_ok=True)


class PooledStudentConfig(PretrainedConfig):
    """The sizes of a pooled student. ``hidden_size`` is each layer's output width (both directions
    of a BiLSTM together); ``attention_dim`` the pooling's inner width (None: ``hidden_size``)."""

    def __init__(
        self,
        vocab_size: int = 30522,
        embedding_dim: int = 384,
        hidden_size: int = 768,
        num_layers: int = 3,
        dropout: float = 0.1,
        attention_dim: Optional[int] = None,
        pad_token_id: int = 0,
        **kwargs: Any,
    ) -> None:
        self.vocab_size, self.embedding_dim, self.hidden_size = vocab_size, embedding_dim, hidden_size
        self.num_layers, self.dropout, self.attention_dim = num_layers, dropout, attention_dim
        super().__init__(pad_token_id=pad_token_id, **kwargs)


@dataclass
class PooledClassifierOutput(SequenceClassifierOutput):
    """``logits`` ``(batch, C)``; ``hidden_states``: one pooled ``(batch, width)`` vector per layer;
    ``pooling_weights``: one ``(batch, seq)`` attention distribution per layer (zero on padding)."""

    pooling_weights: Optional[tuple[torch.Tensor, ...]] = None


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


class PooledStudentForSequenceClassification(PreTrainedModel):
    """Token embeddings -> a stack of sequence layers -> attention-sum pooling of every layer ->
    a linear classifier on the last layer's pooled vector.

    Subclasses implement ``build_layer(index, input_dim)``: a module called as ``layer(x, mask)``
    on ``(batch, seq, dim)`` states with a boolean ``(batch, seq)`` mask, returning
    ``config.hidden_size`` features.
    """

    config_class = PooledStudentConfig
    base_model_prefix = "encoder"  # no such submodule: checkpoints hold this model's own names
    main_input_name = "input_ids"
    #: LayerSpec.kind of this architecture's layers
    layer_kind = "other"
    #: learning rate used when the run sets none: trained from scratch with Adam, not fine-tuned
    default_lr = 1e-3
    #: a run that sets no epochs trains up to this many optimizer steps (at most
    #: ``max_default_epochs`` epochs), stopping early once dev stops improving: a student trained
    #: from scratch has not converged after the 300 steps that suffice to fine-tune a Transformer
    default_steps = 3000
    max_default_epochs = 50
    #: no pre-trained weights: with few labelled examples a transfer set pays most (kdplug says so)
    from_scratch = True

    def __init__(self, config: PooledStudentConfig) -> None:
        super().__init__(config)
        self.width = config.hidden_size
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            self.build_layer(index, config.embedding_dim if index == 0 else config.hidden_size)
            for index in range(config.num_layers)
        )
        self.poolers = nn.ModuleList(
            AttentionPooling(config.hidden_size, config.attention_dim) for _ in range(config.num_layers)
        )
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.tokenizer: Any = None
        self.post_init()

    def build_layer(self, index: int, input_dim: int) -> nn.Module:
        raise NotImplementedError

    def _init_weights(self, module: nn.Module) -> None:
        """PyTorch's own initialisation of each layer (what a from-scratch RNN/CNN uses)."""

    @property
    def num_layers(self) -> int:
        return len(self.poolers)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        **unused: Any,
    ) -> PooledClassifierOutput:
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
        loss = None
        if labels is not None:
            loss = (
                F.mse_loss(logits.squeeze(-1), labels.float())
                if self.config.num_labels == 1
                else F.cross_entropy(logits, labels.long())
            )
        return PooledClassifierOutput(
            loss=loss, logits=logits, hidden_states=tuple(pooled), pooling_weights=tuple(weights)
        )

    # -- the tokenizer travels with the weights (TAKD's stored assistants, --set student_options.source) --
    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        super().save_pretrained(save_directory, **kwargs)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, info) with output_loading_info
        if os.path.isfile(os.path.join(pretrained_model_name_or_path, "tokenizer_config.json")):
            from transformers import AutoTokenizer

            # the model's own config: AutoTokenizer would otherwise load it again, and ask again whether
            # to run the code this directory carries; the tokenizer itself never needs code of its own
            model.tokenizer = AutoTokenizer.from_pretrained(
                pretrained_model_name_or_path, config=model.config, trust_remote_code=False
            )
        return loaded

"""The BiLSTM student of Universal-KD's cross-architecture experiments (Sec. 5.3, Table 5), as a
Hugging Face model (``model_type: kdplug-bilstm``).

The paper gives: 3 layers, hidden size 768, attention-sum pooling (Bahdanau) to one vector,
~25M trainable parameters, one encoder for sentence pairs. It leaves the rest open; kdplug reads
"hidden size 768" as the width of each layer's output, i.e. 384 units per direction of a
bidirectional LSTM, with 384-dimensional word embeddings, which lands at the paper's ~25M
(23.0M with BERT's 30,522-word vocabulary; 20.1M with 300-wide embeddings, 35.9M with 768-wide
ones; see docs/models.md). Each layer is its own ``nn.LSTM`` so that every layer's sequence can
be pooled into that layer's vector.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .modeling_pooled import (
    PooledClassifierOutput,
    PooledStudentConfig,
    PooledStudentForSequenceClassification,
    StudentConfigError,
)


class BiLSTMConfig(PooledStudentConfig):
    model_type = "kdplug-bilstm"

    def __init__(self, bidirectional: bool = True, num_layers: int = 3, **kwargs: Any) -> None:
        self.bidirectional = bidirectional
        super().__init__(num_layers=num_layers, **kwargs)


class LSTMLayer(nn.Module):
    """One (bi)LSTM layer over packed sequences, so padding never reaches the recurrence."""

    def __init__(self, input_dim: int, width: int, bidirectional: bool) -> None:
        super().__init__()
        if bidirectional and width % 2:
            raise StudentConfigError(
                f"a bidirectional LSTM splits hidden_size over two directions; "
                f"hidden_size={width} is odd, pick an even one"
            )
        self.lstm = nn.LSTM(
            input_dim, width // 2 if bidirectional else width, batch_first=True, bidirectional=bidirectional
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        output, _ = self.lstm(packed)
        output, _ = pad_packed_sequence(output, batch_first=True, total_length=x.size(1))  # (batch, seq, width)
        return output


class BiLSTMForSequenceClassification(PooledStudentForSequenceClassification):
    """Stacked (bi)LSTM layers, each pooled by its own attention sum; see the module docstring."""

    config_class = BiLSTMConfig
    layer_kind = "lstm"

    def build_layer(self, index: int, input_dim: int) -> nn.Module:
        return LSTMLayer(input_dim, self.config.hidden_size, self.config.bidirectional)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, **kwargs: Any
    ) -> PooledClassifierOutput:
        if attention_mask is not None and not torch.jit.is_tracing():
            _require_right_padding(attention_mask)
        return super().forward(input_ids, attention_mask, **kwargs)


def _require_right_padding(attention_mask: torch.Tensor) -> None:
    lengths = attention_mask.sum(dim=1, keepdim=True)
    positions = torch.arange(attention_mask.size(1), device=attention_mask.device)
    if not torch.equal(attention_mask.bool(), positions < lengths):
        raise StudentConfigError(
            "the bilstm student reads right-padded batches (each row's tokens first, then "
            "padding); set tokenizer.padding_side = 'right'"
        )


# save_pretrained copies this module (and modeling_pooled) next to the weights, with an auto_map
BiLSTMConfig.register_for_auto_class()
BiLSTMForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

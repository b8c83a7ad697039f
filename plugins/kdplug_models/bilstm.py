"""The BiLSTM student of Universal-KD's cross-architecture experiments (Sec. 5.3, Table 5).

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

import kdplug
from kdplug.types import Task, Teacher

from .pooling import DEFAULT_EMBEDDING_DIM, PooledEncoderClassifier, PooledLayerExtractor, build_pooled_student


class LSTMLayer(nn.Module):
    """One (bi)LSTM layer over packed sequences, so padding never reaches the recurrence."""

    def __init__(self, input_dim: int, width: int, bidirectional: bool) -> None:
        super().__init__()
        if bidirectional and width % 2:
            raise kdplug.UsageError(f"a bidirectional LSTM splits hidden_size over two directions; "
                                    f"hidden_size={width} is odd, pick an even one")
        self.lstm = nn.LSTM(input_dim, width // 2 if bidirectional else width,
                            batch_first=True, bidirectional=bidirectional)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        output, _ = self.lstm(packed)
        output, _ = pad_packed_sequence(output, batch_first=True, total_length=x.size(1))  # (batch, seq, width)
        return output


class BiLSTMClassifier(PooledEncoderClassifier):
    """Stacked (bi)LSTM layers, each pooled by its own attention sum; see the module docstring."""

    layer_kind = "lstm"

    def __init__(self, *, vocab_size: int, num_outputs: int, embedding_dim: int = DEFAULT_EMBEDDING_DIM,
                 hidden_size: int = 768, num_layers: int = 3, bidirectional: bool = True, dropout: float = 0.1,
                 attention_dim: Optional[int] = None, pad_token_id: int = 0) -> None:
        super().__init__(vocab_size=vocab_size, embedding_dim=embedding_dim, width=hidden_size,
                         num_layers=num_layers, num_outputs=num_outputs, pad_token_id=pad_token_id,
                         dropout=dropout, attention_dim=attention_dim)
        self.config = dict(vocab_size=vocab_size, num_outputs=num_outputs, embedding_dim=embedding_dim,
                           hidden_size=hidden_size, num_layers=num_layers, bidirectional=bidirectional,
                           dropout=dropout, attention_dim=attention_dim, pad_token_id=pad_token_id)
        self.layers.extend(LSTMLayer(embedding_dim if index == 0 else hidden_size, hidden_size, bidirectional)
                           for index in range(num_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, **unused: Any):
        if attention_mask is not None:
            _require_right_padding(attention_mask)
        return super().forward(input_ids, attention_mask)


def _require_right_padding(attention_mask: torch.Tensor) -> None:
    lengths = attention_mask.sum(dim=1, keepdim=True)
    positions = torch.arange(attention_mask.size(1), device=attention_mask.device)
    if not torch.equal(attention_mask.bool(), positions < lengths):
        raise kdplug.UsageError("the bilstm student reads right-padded batches (each row's tokens first, then "
                                "padding); set tokenizer.padding_side = 'right'")


def bilstm_student(task: Task, teacher: Teacher, *, embedding_dim: Optional[int] = None, hidden_size: Optional[int] = None,
                   num_layers: int = 3, bidirectional: bool = True, dropout: float = 0.1,
                   attention_dim: Optional[int] = None, tokenizer: Any = "teacher",
                   init_embeddings_from_teacher: bool = False, source: Optional[str] = None,
                   sentencepiece_vocab_size: int = 8000, sentencepiece_model_type: str = "unigram") -> BiLSTMClassifier:
    """Build the BiLSTM student (``source``: a directory its ``save_pretrained`` wrote, to resume)."""
    return build_pooled_student(BiLSTMClassifier, task, teacher, embedding_dim=embedding_dim, tokenizer=tokenizer,
                                init_embeddings_from_teacher=init_embeddings_from_teacher, source=source,
                                sentencepiece_vocab_size=sentencepiece_vocab_size,
                                sentencepiece_model_type=sentencepiece_model_type,
                                hidden_size=hidden_size, num_layers=num_layers, bidirectional=bidirectional,
                                dropout=dropout, attention_dim=attention_dim)


@kdplug.hookimpl
def kdplug_register_students(register):
    register("bilstm", bilstm_student,
             description="3-layer BiLSTM, 768 wide, attention-sum pooling per layer (Universal-KD, ~23M params)")


@kdplug.hookimpl
def kdplug_register_layer_extractors(register):
    register("bilstm", PooledLayerExtractor(BiLSTMClassifier),
             description="the attention-pooled vector of every BiLSTM layer (kind 'lstm')")

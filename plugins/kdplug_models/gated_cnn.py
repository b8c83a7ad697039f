"""The Gated-CNN student of Universal-KD's cross-architecture experiments (Sec. 5.3, Table 5).

The paper gives: 4 layers of gated convolutions (Dauphin et al. 2017), hidden size 768,
attention-sum pooling, a capacity similar to the BiLSTM's (~25M). It gives neither the kernel
size nor the embedding size; kdplug uses 3 and 384 (26.5M parameters with BERT's vocabulary).
Each layer is a GLU block, h = (x*W + b) ⊗ σ(x*V + c), with a residual connection where the
widths agree (every layer but a first one that changes the width), as in Dauphin et al.'s
residual blocks. The convolutions are centred (not causal: the encoder reads the whole
sentence), and padded positions are zeroed before every convolution, so a padded batch gives the
same result as the unpadded sentences.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn
from torch.nn import functional as F

import kdplug
from kdplug.types import Task, Teacher

from .pooling import DEFAULT_EMBEDDING_DIM, PooledEncoderClassifier, PooledLayerExtractor, build_pooled_student


class GatedConvLayer(nn.Module):
    """One GLU convolution, residual when input and output widths agree."""

    def __init__(self, input_dim: int, width: int, kernel_size: int) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise kdplug.UsageError(f"kernel_size={kernel_size}: a centred convolution needs an odd kernel size")
        self.conv = nn.Conv1d(input_dim, 2 * width, kernel_size, padding=kernel_size // 2)
        self.residual = input_dim == width

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)  # padding looks like the convolution's own zero padding
        h = self.conv(x.transpose(1, 2))  # (batch, dim, seq) -> (batch, 2 * width, seq)
        h = F.glu(h, dim=1).transpose(1, 2)  # (batch, width, seq) -> (batch, seq, width)
        return x + h if self.residual else h


class GatedCNNClassifier(PooledEncoderClassifier):
    """Stacked gated convolutions, each pooled by its own attention sum; see the module docstring."""

    layer_kind = "conv"

    def __init__(self, *, vocab_size: int, num_outputs: int, embedding_dim: int = DEFAULT_EMBEDDING_DIM,
                 hidden_size: int = 768, num_layers: int = 4, kernel_size: int = 3, dropout: float = 0.1,
                 attention_dim: Optional[int] = None, pad_token_id: int = 0) -> None:
        super().__init__(vocab_size=vocab_size, embedding_dim=embedding_dim, width=hidden_size,
                         num_layers=num_layers, num_outputs=num_outputs, pad_token_id=pad_token_id,
                         dropout=dropout, attention_dim=attention_dim)
        self.config = dict(vocab_size=vocab_size, num_outputs=num_outputs, embedding_dim=embedding_dim,
                           hidden_size=hidden_size, num_layers=num_layers, kernel_size=kernel_size,
                           dropout=dropout, attention_dim=attention_dim, pad_token_id=pad_token_id)
        self.layers.extend(GatedConvLayer(embedding_dim if index == 0 else hidden_size, hidden_size, kernel_size)
                           for index in range(num_layers))


def gated_cnn_student(task: Task, teacher: Teacher, *, embedding_dim: Optional[int] = None, hidden_size: Optional[int] = None,
                      num_layers: int = 4, kernel_size: int = 3, dropout: float = 0.1,
                      attention_dim: Optional[int] = None, tokenizer: Any = "teacher",
                      init_embeddings_from_teacher: bool = False, source: Optional[str] = None,
                      sentencepiece_vocab_size: int = 8000,
                      sentencepiece_model_type: str = "unigram") -> GatedCNNClassifier:
    """Build the Gated-CNN student (``source``: a directory its ``save_pretrained`` wrote, to resume)."""
    return build_pooled_student(GatedCNNClassifier, task, teacher, embedding_dim=embedding_dim, tokenizer=tokenizer,
                                init_embeddings_from_teacher=init_embeddings_from_teacher, source=source,
                                sentencepiece_vocab_size=sentencepiece_vocab_size,
                                sentencepiece_model_type=sentencepiece_model_type,
                                hidden_size=hidden_size, num_layers=num_layers, kernel_size=kernel_size,
                                dropout=dropout, attention_dim=attention_dim)


@kdplug.hookimpl
def kdplug_register_students(register):
    register("gated-cnn", gated_cnn_student,
             description="4 gated (GLU) convolution layers, 768 wide, attention-sum pooling per layer (Universal-KD)")


@kdplug.hookimpl
def kdplug_register_layer_extractors(register):
    register("gated-cnn", PooledLayerExtractor(GatedCNNClassifier),
             description="the attention-pooled vector of every gated convolution layer (kind 'conv')")

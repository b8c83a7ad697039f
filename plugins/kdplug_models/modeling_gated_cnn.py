"""The Gated-CNN student of Universal-KD's cross-architecture experiments (Sec. 5.3, Table 5), as a
Hugging Face model (``model_type: kdplug-gated-cnn``).

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

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .modeling_pooled import PooledStudentConfig, PooledStudentForSequenceClassification, StudentConfigError


class GatedCNNConfig(PooledStudentConfig):
    model_type = "kdplug-gated-cnn"

    def __init__(self, kernel_size: int = 3, num_layers: int = 4, **kwargs: Any) -> None:
        self.kernel_size = kernel_size
        super().__init__(num_layers=num_layers, **kwargs)


class GatedConvLayer(nn.Module):
    """One GLU convolution, residual when input and output widths agree."""

    def __init__(self, input_dim: int, width: int, kernel_size: int) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise StudentConfigError(f"kernel_size={kernel_size}: a centred convolution needs an odd kernel size")
        self.conv = nn.Conv1d(input_dim, 2 * width, kernel_size, padding=kernel_size // 2)
        self.residual = input_dim == width

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x.masked_fill(~mask.unsqueeze(-1), 0.0)  # padding looks like the convolution's own zero padding
        h = self.conv(x.transpose(1, 2))  # (batch, dim, seq) -> (batch, 2 * width, seq)
        h = F.glu(h, dim=1).transpose(1, 2)  # (batch, width, seq) -> (batch, seq, width)
        return x + h if self.residual else h


class GatedCNNForSequenceClassification(PooledStudentForSequenceClassification):
    """Stacked gated convolutions, each pooled by its own attention sum; see the module docstring."""

    config_class = GatedCNNConfig
    layer_kind = "conv"

    def build_layer(self, index: int, input_dim: int) -> nn.Module:
        return GatedConvLayer(input_dim, self.config.hidden_size, self.config.kernel_size)


# save_pretrained copies this module (and modeling_pooled) next to the weights, with an auto_map
GatedCNNConfig.register_for_auto_class()
GatedCNNForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

"""int8 students: dynamic quantization in PyTorch and in ONNX Runtime.

Dynamic quantization stores weights as int8 and quantizes activations on the fly, per batch: no
calibration data, and it suits what distilled students are made of (Linear layers; LSTMs).
- PyTorch: ``torch.ao.quantization.quantize_dynamic`` on ``nn.Linear`` and ``nn.LSTM`` (every
  family: BERT-k and DistilRoBERTa are Linear layers, the BiLSTM's recurrence is an LSTM, the
  Gated-CNN's classifier and poolings are Linear; its convolutions stay fp32). The package keeps
  its fp32 weights and says ``quantization`` in ``kdplug_student.json``: the int8 modules are built
  when it is loaded (a quantized module's packed weights have no safetensors form).
- ONNX Runtime: ``onnxruntime.quantization.quantize_dynamic`` with int8 weights (MatMul, and LSTM
  as ``DynamicQuantizeLSTM``): the model file itself shrinks about 4x.
Both are checked against the fp32 student before they are kept (kdplug/export.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

INT8 = "int8"
#: what ``kdplug_student.json`` records of a quantized PyTorch package
TORCH_RECIPE = {"method": "dynamic", "dtype": "qint8", "modules": ["Linear", "LSTM"]}


def quantize_torch(model: nn.Module) -> nn.Module:
    """``model`` with its Linear and LSTM layers dynamically quantized to int8 (a new module; CPU)."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices: it still works, and is checked
        warnings.simplefilter("ignore")
        return quantize_dynamic(model.cpu(), {nn.Linear, nn.LSTM}, dtype=torch.qint8)


def apply_recipe(model: nn.Module, recipe: Any) -> nn.Module:
    """Rebuild the int8 modules a package's ``quantization`` record asks for (None: ``model`` as is)."""
    if not recipe:
        return model
    if recipe != TORCH_RECIPE:
        raise ValueError(f"unknown quantization record {recipe!r}; this kdplug builds {TORCH_RECIPE}")
    return quantize_torch(model)


def quantize_onnx(source: Path, target: Path) -> None:
    """``source`` (an fp32 ONNX model) with int8 weights, written to ``target``."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    quiet = _DropMessage("pre-processing before quantization")  # advice for static quantization, not ours
    root.addFilter(quiet)
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    finally:
        root.removeFilter(quiet)


class _DropMessage:
    """A logging filter that drops records whose message contains ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def filter(self, record: Any) -> bool:
        return self.text not in record.getMessage()

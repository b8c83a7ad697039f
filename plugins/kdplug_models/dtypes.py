"""``teacher_options.dtype``: the dtype a teacher's weights are loaded in.

Unset, a checkpoint loads in fp32, as it always has. ``auto`` is fp32 on a CPU (which emulates
the half types slowly, and is where fine-tuning needs fp32 anyway) and bf16 on a CUDA GPU that
has it, else fp16. A half type halves the teacher's memory and speeds its pass on a GPU; fp16 on
a machine without a CUDA GPU is refused (many CPU kernels have no fp16 path, and those that do
run slower than fp32): choose fp32 or bf16 there.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from kdplug.errors import UsageError

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def load_dtype(option: Any, what: str = "teacher") -> Optional[torch.dtype]:
    """The torch dtype ``{what}_options.dtype`` asks for on this machine; None when unset."""
    if option is None:
        return None
    name = ALIASES.get(str(option).lower(), str(option).lower())
    cuda = torch.cuda.is_available()
    if name == "auto":
        if not cuda:
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in DTYPES:
        raise UsageError(f"{what}_options.dtype must be auto, fp32, bf16 or fp16; got {option!r}")
    if name == "fp16" and not cuda:
        raise UsageError(
            f"{what}_options.dtype=fp16 needs a CUDA GPU, and this machine has none: CPUs lack fp16 kernels or run "
            f"them slower than fp32. Use bf16 (half the memory, runs on a CPU) or fp32 (or auto: fp32 here)"
        )
    if name == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise UsageError(
            f"{what}_options.dtype=bf16: this GPU ({torch.cuda.get_device_name()}) has no bf16; use fp16 or auto"
        )
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return {value: key for key, value in DTYPES.items()}.get(dtype, str(dtype))

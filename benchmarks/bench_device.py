"""The device a benchmark runs on, and a clock that is honest about it.

Shared by the benchmarks' ``--device`` option: ``auto`` is what ``kdplug run`` uses (the GPU when
PyTorch sees one, else the CPU). CUDA work is asynchronous, so every timing reads the clock through
:func:`clock`, which waits for the device first; without it a GPU timing measures the launches only.
"""

from __future__ import annotations

import time
from typing import Any

import torch

DEVICES = ("auto", "cpu", "cuda")


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when available, else the CPU; ``cuda`` where there is none is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: PyTorch {torch.__version__} sees no CUDA device")
    return torch.device(name)


def accelerator_on(device: torch.device) -> Any:
    """kdplug's fp32 accelerator (``build_accelerator``), placed on ``device``: a CPU run on a
    machine with a GPU needs Accelerate's ``cpu`` flag, which kdplug sets only when there is no GPU."""
    from accelerate import Accelerator, DataLoaderConfiguration

    from kdplug.engine.trainer import build_accelerator

    if device.type == "cpu" and torch.cuda.is_available():
        return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    return build_accelerator("fp32")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the work queued on ``device`` has finished."""
    synchronize(device)
    return time.perf_counter()


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (PyTorch {torch.__version__})"
    return f"CPU, {torch.get_num_threads()} threads (PyTorch {torch.__version__})"

"""How much smaller and faster the student is than its teacher, measured on the run's device.

For each model: parameters, the size of its weights as stored (fp32 safetensors), the latency of
one example at batch size 1 and the throughput at batch size 32, each the median of timed
repetitions after warm-up, on real dev inputs (the first dev examples, in each model's own
tokenisation). The speed-up is the teacher's time over the student's at batch 32: the papers'
headline (PKD Table 4: BERT-6 1.94x faster than BERT-12), measured rather than quoted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from .data import Collator, EncodedSplit
from .objective import model_forward

#: examples timed one by one, and the batch size of the throughput measurement
SINGLE_EXAMPLES, BATCH_SIZE = 16, 32
WARMUP, REPEATS = 2, 7


@dataclass
class Speed:
    parameters: int
    weights_mb: float  # fp32 safetensors: 4 bytes a parameter (plus buffers)
    latency_ms: float  # one example at batch size 1, median
    throughput: float  # examples per second at batch size 32, median
    batch_size: int  # examples in the throughput batch (fewer when dev has fewer)
    device: str

    def as_dict(self) -> dict:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}


def weights_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer once, as safetensors stores them."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _median_seconds(call: Callable[[], None], device: torch.device, repeats: int = REPEATS) -> float:
    def timed() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for _ in range(WARMUP):
        call()
    return statistics.median(timed() for _ in range(repeats))


@torch.inference_mode()
def measure(model: nn.Module, split: EncodedSplit, device: torch.device | str) -> Speed:
    """Time ``model`` (eval mode, fp32) on the first dev examples of ``split``."""
    device = torch.device(device)
    was_training = model.training
    model.eval().to(device)
    collate = Collator(split.pad_id, split.is_regression)
    count = min(BATCH_SIZE, len(split))
    batch = {key: value.to(device) for key, value in collate([split[i] for i in range(count)]).items()}
    singles = [
        {key: value.to(device) for key, value in collate([split[i]]).items()}
        for i in range(min(SINGLE_EXAMPLES, len(split)))
    ]
    # batch size 1: the median over examples of each example's median time
    latency = statistics.median(
        _median_seconds(lambda one=one: model_forward(model, one), device, repeats=3) for one in singles
    )
    batch_seconds = _median_seconds(lambda: model_forward(model, batch), device)
    model.train(was_training)
    return Speed(
        parameters=sum(p.numel() for p in model.parameters()),
        weights_mb=weights_bytes(model) / 2**20,
        latency_ms=latency * 1000,
        throughput=count / batch_seconds,
        batch_size=count,
        device=str(device),
    )


def speedup(teacher: Optional[Speed], student: Optional[Speed]) -> Optional[float]:
    """Teacher time over student time at batch size 32 (>1: the student is faster)."""
    if teacher is None or student is None or teacher.throughput <= 0:
        return None
    return student.throughput / teacher.throughput

"""How much smaller and faster the student is than its teacher, measured on the run's device.

For each model: parameters, the size of its weights as stored (fp32 safetensors, in MB), the
latency of one example at batch size 1 and the throughput at batch size 32, each the median of
timed repetitions after warm-up with their spread (:mod:`kdplug.timing`, the routine ``kdplug
export`` uses too), on real dev inputs (the first dev examples, in each model's own tokenisation).
Figures measured while other processes kept the CPU busy, or whose repeats disagree, are flagged.
The speed-up is the teacher's time over the student's at batch 32: the papers'
headline (PKD Table 4: BERT-6 1.94x faster than BERT-12), measured rather than quoted.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import nn

from ..threads import other_load
from ..timing import megabytes, time_call, unreliable
from .data import Collator, EncodedSplit
from .objective import model_forward

#: examples timed one by one, and the batch size of the throughput measurement
SINGLE_EXAMPLES, BATCH_SIZE = 16, 32


@dataclass
class Speed:
    parameters: int
    weights_mb: float  # fp32 safetensors: 4 bytes a parameter (plus buffers), in MB (10^6 bytes)
    latency_ms: float  # one example at batch size 1, median
    throughput: float  # examples per second at batch size 32, median
    batch_size: int  # examples in the throughput batch (fewer when dev has fewer)
    device: str
    latency_spread: float = 0.0  # (slowest - fastest) / median of the repeats
    throughput_spread: float = 0.0
    unreliable: Optional[str] = None  # why the figures are not to be trusted (a busy machine), if so

    def as_dict(self) -> dict:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}


def served_remotely(model: nn.Module) -> bool:
    """A teacher whose model answers over HTTP (``kdplug_remote``): timing it would send requests, and its
    weights, and so its size, are not in this process."""
    return bool(getattr(model, "kdplug_remote", False))  # not through capabilities(): the model's own marker


def weights_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer once, as safetensors stores them."""
    seen, total = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


@torch.inference_mode()
def measure(model: nn.Module, split: EncodedSplit, device: torch.device | str, *, move: bool = True) -> Speed:
    """Time ``model`` (eval mode, fp32) on the first dev examples of ``split``; ``move``: put it on
    ``device`` first (a teacher sharded by a device map stays where it is, its inputs on ``device``)."""
    device = torch.device(device)
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    was_training = model.training
    model.eval()
    if move:
        model.to(device)
    collate = Collator(split.pad_id, split.is_regression)
    count = min(BATCH_SIZE, len(split))
    batch = {key: value.to(device) for key, value in collate([split[i] for i in range(count)]).items()}
    singles = [
        {key: value.to(device) for key, value in collate([split[i]]).items()}
        for i in range(min(SINGLE_EXAMPLES, len(split)))
    ]
    load = other_load()  # before: while the model runs, this process is one of the busy ones
    # batch size 1: the median over examples of each example's median time
    per_example = [
        time_call(lambda one=one: model_forward(model, one), repeats=3, synchronize=synchronize) for one in singles
    ]
    batched = time_call(lambda: model_forward(model, batch), synchronize=synchronize)
    model.train(was_training)
    latency = statistics.median(timing.median for timing in per_example)
    return Speed(
        parameters=sum(p.numel() for p in model.parameters()),
        weights_mb=megabytes(weights_bytes(model)),
        latency_ms=latency * 1000,
        throughput=count / batched.median,
        batch_size=count,
        device=str(device),
        latency_spread=statistics.median(timing.spread for timing in per_example),
        throughput_spread=batched.spread,
        unreliable=unreliable([batched], load if device.type == "cpu" else None),
    )


def in_sequence(speeds: list[Speed]) -> Speed:
    """The speed of models run one after the other on the same inputs (an ensemble's members): their
    parameters, weights and latencies add up, their times per example at batch 32 too."""
    if len(speeds) == 1:
        return speeds[0]
    return Speed(
        parameters=sum(speed.parameters for speed in speeds),
        weights_mb=sum(speed.weights_mb for speed in speeds),
        latency_ms=sum(speed.latency_ms for speed in speeds),
        throughput=1 / sum(1 / speed.throughput for speed in speeds),
        batch_size=min(speed.batch_size for speed in speeds),
        device=speeds[0].device,
        latency_spread=max(speed.latency_spread for speed in speeds),
        throughput_spread=max(speed.throughput_spread for speed in speeds),
        unreliable=next((speed.unreliable for speed in speeds if speed.unreliable), None),
    )


def speedup(teacher: Optional[Speed], student: Optional[Speed]) -> Optional[float]:
    """Teacher time over student time at batch size 32 (>1: the student is faster)."""
    if teacher is None or student is None or teacher.throughput <= 0:
        return None
    return student.throughput / teacher.throughput

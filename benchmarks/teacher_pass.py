"""The teacher pass's throughput in fp32 and in bf16 autocast: kdplug's ``build_cache`` (logits and
every layer's [CLS] vector, to disk), examples per second.

The teacher is a randomly initialised BERT-base (12 x 768; ``--teacher minilm`` for a MiniLM-L6-sized
one): speed does not depend on the weights. The examples have SST-2-like lengths (4 to 64 tokens).
Each round builds the cache once per precision, in a rotated order, into a fresh directory, after
one untimed warm-up pass (CUDA's context, cuBLAS's handles, autocast's kernels); the table gives
the median over rounds. On a GPU bf16 runs on the tensor cores; on a CPU without native bf16
(AVX512-BF16, AMX) it is emulated and slower, which is why kdplug's ``auto`` runs fp32 there.

    python benchmarks/teacher_pass.py [--examples 4096] [--rounds 3] [--device cuda]
    python benchmarks/teacher_pass.py --quick        # a smoke run
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification

import kdplug
from kdplug.engine import teacher as teacher_stage
from kdplug.engine.data import EncodedSplit
from kdplug.engine.trainer import Trainer, inference_precision
from kdplug.testing.tiny import TinyTask, wordpiece_tokenizer
from kdplug.types import Teacher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_device import DEVICES, accelerator_on, clock, describe, pick_device  # noqa: E402

SIZES = {
    "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
}


def random_teacher(size: str) -> Teacher:
    torch.manual_seed(0)
    config = BertConfig(**SIZES[size], output_hidden_states=True)
    model = BertForSequenceClassification(config).eval().requires_grad_(False)
    tokenizer = wordpiece_tokenizer([f"w{i}" for i in range(config.vocab_size - 5)])
    return Teacher(model=model, tokenizer=tokenizer, source=f"random-{size}", finetuned=True)


def sst2_like(count: int, vocab: int, seed: int = 0) -> EncodedSplit:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.9, 0.5, count).astype(int), 4, 64)
    ids = [[101, *rng.integers(1000, vocab, n - 2).tolist(), 102] for n in lengths]
    return EncodedSplit(input_ids=ids, token_type_ids=None, labels=[0] * count, is_regression=False, pad_id=0)


def teacher_pass(teacher: Teacher, trainer: Trainer, split: EncodedSplit, precision: str) -> float:
    """Seconds of one ``build_cache`` over ``split`` into a fresh directory."""
    device = trainer.accelerator.device
    with tempfile.TemporaryDirectory() as root:
        started = clock(device)
        teacher_stage.build_cache(
            teacher,
            kdplug.find_layer_extractor(teacher.model),
            trainer,
            TinyTask(),
            "train",
            split,
            root=Path(root),
            precision=precision,
            teacher_fingerprint=f"bench-{precision}",
            tokenizer_fingerprint="bench",
        )
        return clock(device) - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32, help="the run's batch size (the pass uses twice it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--teacher", choices=sorted(SIZES), default="bert-base")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="auto (default): CUDA when available")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 examples, a tiny teacher, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.rounds, args.teacher = 64, 1, "tiny"
    device = pick_device(args.device)
    logging.getLogger("kdplug").setLevel(logging.ERROR)
    teacher = random_teacher(args.teacher)
    split = sst2_like(args.examples, teacher.model.config.vocab_size)
    trainer = Trainer(accelerator_on(device), TinyTask(), batch_size=args.batch_size, seed=0)
    print(
        f"teacher pass: {args.examples} examples (SST-2-like lengths), pass batch {args.batch_size * 2}, "
        f"teacher {args.teacher} (random weights), {describe(device)}, {args.rounds} rounds after a warm-up\n"
    )
    precisions = ("fp32", "bf16")
    warm_up = sst2_like(min(args.examples, args.batch_size * 4), teacher.model.config.vocab_size, seed=1)
    for precision in precisions:
        teacher_pass(teacher, trainer, warm_up, precision)
    seconds: dict[str, list[float]] = {precision: [] for precision in precisions}
    for round_index in range(args.rounds):
        for precision in precisions[round_index % 2 :] + precisions[: round_index % 2]:
            seconds[precision].append(teacher_pass(teacher, trainer, split, precision))
    header = f"{'precision':<10} {'ran as':<7} {'median s':>9} {'examples/s':>11} {'x fp32':>7}"
    print(header)
    print("-" * len(header))
    fp32 = statistics.median(seconds["fp32"])
    rates = {}
    for precision in precisions:
        median = statistics.median(seconds[precision])
        rates[precision] = args.examples / median
        ran_as = inference_precision(precision, device)
        print(f"{precision:<10} {ran_as:<7} {median:9.2f} {rates[precision]:11.0f} {fp32 / median:6.2f}x")
    print(
        f"\nteacher pass throughput: fp32 {rates['fp32']:.0f} ex/s, bf16 {rates['bf16']:.0f} ex/s "
        f"({rates['bf16'] / rates['fp32']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

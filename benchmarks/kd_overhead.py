"""How much does distillation cost over training the student alone?

Measures, in one run and on the same batches, the time of a training epoch of each student
(BiLSTM at the papers' size, BERT-2 built from the teacher) for:
  - ``nkd``: CE only, no teacher (the reference);
  - each method (``rkd``, ``pkd-skip``, ``alp``, ``universal-ca``) reading the teacher from
    kdplug's teacher cache;
  - the same method with the teacher in the loop (a teacher forward pass every step, as most KD
    code does);
  - the token-level methods (``tinybert``, ``minilm-v2``, BERT-2 only), whose teacher runs on
    every batch by design (the engine's LiveTeacher: fp32 on a CPU without native bf16).
and prints the ratios (target: cached KD <= 1.10x nkd) as the median and range over interleaved
rounds (every variant timed once per round, ratios taken within a round: a single timing on a
shared machine moved the ratio between 0.90 and 1.07), plus the padding ratio of
length-grouped batches on SST-2-like lengths (target <= 1.15) and the speed of bf16 teacher
inference against fp32.

The teacher is a randomly initialised BERT-base (12 layers, 768 wide): speed does not depend
on the weights, and nothing is downloaded. Run: ``python benchmarks/kd_overhead.py`` (a few
minutes on 2 CPU cores); ``--quick`` for a smoke run; ``--device cuda`` on a GPU (the default,
``auto``, is the GPU when PyTorch sees one).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import kdplug
from kdplug.capabilities import ProjectorCapabilities, capabilities
from kdplug.compare import t_interval
from kdplug.engine import teacher as teacher_stage
from kdplug.engine.data import Collator, EncodedSplit, LengthGroupedBatchSampler, padding_ratio
from kdplug.engine.objective import DistillationModule, TeacherHeads, WeightedObjective
from kdplug.engine.recipe import token_spec
from kdplug.engine.trainer import Trainer, inference_autocast, make_optimizer, native_bf16
from kdplug.testing.tiny import TinyTask, wordpiece_tokenizer
from kdplug.types import ProjectionRequest, Teacher, matchable_layers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_device import DEVICES, accelerator_on, clock, describe, pick_device  # noqa: E402

METHODS = ("rkd", "pkd-skip", "alp", "universal-ca")
#: token-level methods: the teacher runs on every batch by design (kdplug's LiveTeacher), Transformer students only
TOKEN_METHODS = ("tinybert", "minilm-v2")


def sst2_like_lengths(n: int, seed: int = 0) -> list[int]:
    """Short sentences with a long tail, like SST-2 under a 64-token limit."""
    rng = random.Random(seed)
    return [min(64, max(4, int(rng.lognormvariate(2.9, 0.5)))) for _ in range(n)]


def synthetic_split(lengths: list[int], vocab: int, seed: int = 0) -> EncodedSplit:
    rng = random.Random(seed)
    ids = [[101] + [rng.randrange(1000, vocab) for _ in range(n - 2)] + [102] for n in lengths]
    return EncodedSplit(
        input_ids=ids, token_type_ids=None, labels=[rng.randrange(2) for _ in lengths], is_regression=False, pad_id=0
    )


def placeholder_tokenizer(size: int):
    """A WordPiece tokenizer with BERT's vocabulary size (students size their embeddings by it)."""
    return wordpiece_tokenizer([f"w{i}" for i in range(size - 5)])


TEACHER_SIZES = {
    "bert-base": {},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128},
}


def bert_base_teacher(task, size: str = "bert-base") -> Teacher:
    """A random BERT teacher: BERT-base's sizes, or a 2-layer 64-wide one for the suite's smoke run."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(num_labels=2, output_hidden_states=True, **TEACHER_SIZES[size])
    model = BertForSequenceClassification(config).eval().requires_grad_(False)
    tokenizer = placeholder_tokenizer(config.vocab_size)
    return Teacher(model=model, tokenizer=tokenizer, source=f"random-{size}", finetuned=True)


class TeacherInTheLoop:
    """Quacks like a TeacherCache, but runs the teacher for every batch it is asked for."""

    def __init__(self, teacher: Teacher, split: EncodedSplit, precision: str, device: torch.device) -> None:
        self.model, self.split, self.precision, self.device = teacher.model, split, precision, device
        self.collate = Collator(split.pad_id, False)
        extractor = kdplug.find_layer_extractor(self.model)
        specs = extractor.layer_specs(self.model)
        self.extractor, self.positions = extractor, [i for i, s in enumerate(specs) if s.matchable]

    @torch.no_grad()
    def fetch(self, index: torch.Tensor, device="cpu"):
        batch = on_device(self.collate([self.split[i] for i in index.tolist()]), self.device)
        self.model.to(self.device)
        with inference_autocast(self.precision, self.device):  # as the engine's LiveTeacher
            outputs = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            layers = self.extractor(self.model, outputs)
        return outputs.logits.float(), [layers[i].float() for i in self.positions]


def on_device(batch: dict, device: torch.device) -> dict:
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


def epoch_seconds(
    module: DistillationModule,
    split: EncodedSplit,
    batches: list[list[int]],
    source,
    device: torch.device,
    live=None,
) -> float:
    """Wall time of one training epoch over ``batches`` (forward, backward, optimizer step) on
    ``device``; ``live``: the engine's LiveTeacher, for a token-level method's per-token signals."""
    module.to(device)
    optimizer = make_optimizer(module, 1e-4, 0.0)
    collate = Collator(split.pad_id, False)
    module.train()
    started = clock(device)
    for rows in batches:
        batch = collate([split[i] for i in rows])
        index, batch = batch["index"], on_device(batch, device)
        teacher = {}
        if source is not None:
            logits, layers = source.fetch(index, device)
            teacher = {"teacher_logits": logits, "teacher_layers": layers}
        if live is not None:
            teacher["teacher_tokens"] = live(batch, device)
        loss = module(batch, **teacher)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return clock(device) - started


def build(registry, task, teacher, student_name, projector_name, student_options, heads):
    torch.manual_seed(0)
    student = registry.create("student", student_name, task, teacher, **student_options)
    extractor = kdplug.find_layer_extractor(student)
    if projector_name == "nkd":
        objective = WeightedObjective(
            eta=0.0, lam=0.0, task_loss=registry.create("loss", "ce"), kd_loss=None, ild_loss=None
        )
        return DistillationModule(student, extractor, None, objective)
    teacher_extractor = kdplug.find_layer_extractor(teacher.model)
    request = ProjectionRequest(
        matchable_layers(teacher_extractor.layer_specs(teacher.model)),
        matchable_layers(extractor.layer_specs(student)),
        2,
        teacher_tokens=teacher_extractor.token_spec(teacher.model),
        student_tokens=token_spec(extractor, student),
    )
    projector = registry.create("projector", projector_name, request)
    weights = dict(projector.default_weights)
    objective = WeightedObjective(
        eta=weights["eta"],
        lam=weights["lam"],
        task_loss=registry.create("loss", "ce"),
        kd_loss=registry.create("loss", "kd", temperature=weights.get("temperature", 1.0)),
        ild_loss=registry.create("loss", projector.ild_loss) if weights["lam"] > 0 and projector.ild_loss else None,
    )
    needs_heads = capabilities(ProjectorCapabilities, projector).needs_teacher_heads
    return DistillationModule(
        student, extractor, projector if weights["lam"] > 0 else None, objective, heads if needs_heads else None
    )


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=640, help="training examples per epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (each times every variant once)")
    parser.add_argument("--students", nargs="+", choices=["bilstm", "bert-2"], help="only these students")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few examples, one repeat, BiLSTM only")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="auto (default): CUDA when available")
    parser.add_argument(
        "--teacher",
        choices=sorted(TEACHER_SIZES),
        default="bert-base",
        help="the random teacher's size: bert-base (default), or tiny (2 x 64) to check that the benchmark runs",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.rounds = 96, 2
    return args


def padding() -> float:
    """Prints (and returns) the padding of length-grouped batches, against random ones."""
    many = sst2_like_lengths(20_000, seed=1)
    grouped = padding_ratio(many, LengthGroupedBatchSampler(many, 32, seed=0).batches())
    plain = padding_ratio(many, LengthGroupedBatchSampler(many, 32, seed=0, window_batches=1).batches())
    print(
        f"padding: padded tokens / real tokens = {grouped:.3f} length-grouped (target <= 1.15), "
        f"{plain:.3f} random batches\n"
    )
    return grouped


def timed_cache(args, teacher, trainer, task, split, root: Path, device):
    """The teacher cache, built once in fp32 and once in bf16 (the speeds printed); the bf16 one."""
    timings = {}
    for precision in ("fp32", "bf16"):
        started = clock(device)
        cache = teacher_stage.build_cache(
            teacher,
            kdplug.find_layer_extractor(teacher.model),
            trainer,
            task,
            "train",
            split,
            root=root,
            precision=precision,
            teacher_fingerprint="bench",
            tokenizer_fingerprint="bench",
        )
        timings[precision] = clock(device) - started
    print(
        f"teacher cache build (one pass over {args.examples} examples): fp32 {timings['fp32']:.1f}s, "
        f"bf16 autocast {timings['bf16']:.1f}s -> bf16 is {timings['fp32'] / timings['bf16']:.2f}x faster\n"
    )
    return cache


def print_header(rounds: int) -> None:
    print(
        f"cached KD / nkd: each round times one epoch of every variant, in a rotated order, so load that "
        f"comes and goes hits all of them; the ratio is taken within a round. {rounds} rounds: median "
        f"[min, max], and a 95% t-interval of the geometric mean ratio (it resolves a 5% difference when it "
        f"excludes 1.05 or 0.95)\n"
    )
    header = (
        f"{'student':<8} {'method':<13} {'nkd s':>7} {'KD s':>7} {'ratio median':>12} {'[min, max]':>14} "
        f"{'95% CI (geo.)':>16} {'in-loop x nkd':>13}  target"
    )
    print(header)
    print("-" * len(header))


@dataclass
class Setup:
    """What every timed epoch shares."""

    registry: Any
    task: Any
    teacher: Teacher
    split: EncodedSplit
    batches: list
    cache: Any
    device: torch.device
    heads: TeacherHeads
    live: Any


def interleaved_seconds(args, setup: Setup, student_name, options, variants, tokens) -> dict[str, list[float]]:
    """Each variant's epoch times, one per round, in an order rotated each round."""
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    for round_index in range(args.rounds):
        shift = round_index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            module = build(setup.registry, setup.task, setup.teacher, student_name, variant, options, setup.heads)
            source = None if variant == "nkd" else setup.cache
            live = setup.live if variant in tokens else None
            seconds[variant].append(epoch_seconds(module, setup.split, setup.batches, source, setup.device, live))
    return seconds


def time_student(args, setup: Setup, in_loop, live_dtype: str, student_name: str, options: dict) -> int:
    """Prints one student's rows; returns how many targets it missed."""
    registry, task, teacher, split, batches, device, heads = (
        setup.registry,
        setup.task,
        setup.teacher,
        setup.split,
        setup.batches,
        setup.device,
        setup.heads,
    )
    tokens = TOKEN_METHODS if student_name != "bilstm" else ()  # a pooled student has no tokens
    seconds = interleaved_seconds(args, setup, student_name, options, ["nkd", *METHODS, *tokens], tokens)
    failures = 0
    for method in METHODS:
        ratios = [kd / ref for kd, ref in zip(seconds[method], seconds["nkd"])]
        looped = epoch_seconds(
            build(registry, task, teacher, student_name, method, options, heads),
            split,
            batches,
            in_loop,
            device,
        )
        median = statistics.median(ratios)
        low, high = (math.exp(bound) for bound in t_interval([math.log(r) for r in ratios]))
        ok = median <= 1.10
        failures += not ok
        print(
            f"{student_name:<8} {method:<13} {statistics.median(seconds['nkd']):7.2f} "
            f"{statistics.median(seconds[method]):7.2f} {median:12.3f} "
            f"{f'[{min(ratios):.3f}, {max(ratios):.3f}]':>14} {f'[{low:.3f}, {high:.3f}]':>16} "
            f"{looped / statistics.median(seconds['nkd']):13.2f}  {'ok' if ok else 'MISSED'} (<= 1.10)"
        )
    for method in tokens:
        ratios = [kd / ref for kd, ref in zip(seconds[method], seconds["nkd"])]
        low, high = (math.exp(bound) for bound in t_interval([math.log(r) for r in ratios]))
        print(
            f"{student_name:<8} {method:<13} {statistics.median(seconds['nkd']):7.2f} "
            f"{statistics.median(seconds[method]):7.2f} {statistics.median(ratios):12.3f} "
            f"{f'[{min(ratios):.3f}, {max(ratios):.3f}]':>14} {f'[{low:.3f}, {high:.3f}]':>16} "
            f"{'(is)':>13}  teacher in the loop by design, {live_dtype}"
        )
    return failures


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    registry = kdplug.get_plugin_manager().registry
    task = TinyTask()
    teacher = bert_base_teacher(task, args.teacher)
    lengths = sst2_like_lengths(args.examples)
    split = synthetic_split(lengths, teacher.model.config.vocab_size)
    batches = LengthGroupedBatchSampler(lengths, args.batch_size, seed=0).batches()
    print(
        f"kdplug KD overhead benchmark: {args.examples} examples, batch {args.batch_size}, "
        f"{describe(device)}, teacher {'BERT-base' if args.teacher == 'bert-base' else args.teacher} (random weights)\n"
    )
    grouped = padding()
    accelerator = accelerator_on(device)
    trainer = Trainer(accelerator, task, batch_size=args.batch_size, seed=0)
    with tempfile.TemporaryDirectory() as root:
        cache = timed_cache(args, teacher, trainer, task, split, Path(root), device)
        heads = TeacherHeads([s.width for s in cache.specs], 2)
        in_loop = TeacherInTheLoop(teacher, split, "auto", device)
        live = teacher_stage.LiveTeacher(teacher, kdplug.find_layer_extractor(teacher.model), "auto")
        live_dtype = "bf16" if native_bf16(device) else "fp32 (this CPU has no native bf16)"
        setup = Setup(registry, task, teacher, split, batches, cache, device, heads, live)

        # bert-2 takes the random teacher's first layers: a random teacher names no pre-trained checkpoint
        students = {"bilstm": {}} if args.quick else {"bilstm": {}, "bert-2": {"init": "teacher"}}
        students = {name: options for name, options in students.items() if name in (args.students or students)}
        print_header(args.rounds)
        failures = sum(
            time_student(args, setup, in_loop, live_dtype, name, options) for name, options in students.items()
        )
        print(f"\n{'all targets met' if not failures and grouped <= 1.15 else 'some targets missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

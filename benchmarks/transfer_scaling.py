"""Does a transfer set 10x or 20x the training set keep memory flat and time per example constant?

For each size (1x, 10x, 20x the labelled set) a fresh process builds a transfer set through
kdplug's own code (texts streamed into the store, token ids memory-mapped, the teacher's outputs
cached), then trains the student for one epoch over labelled + transfer examples with kdplug's
training loop. Each process reports its peak resident memory and the epoch's seconds per example;
this script prints both as ratios to the 1x run (targets: memory within 10%, time per example
within 10%).

The teacher is a tiny random BERT and the student a BiLSTM at kdplug's default size: memory and
time per example do not depend on the weights, and nothing is downloaded. Run:
``python benchmarks/transfer_scaling.py`` (about 1.5 minutes on 2 CPU cores); ``--quick`` for a
smoke run.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FACTORS = (1, 10, 20)


def sentences(count: int, seed: int, words: list[str]) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(count)]


class StepClock:
    """Receives the training loop's per-step reports (the tracking interface) and keeps their times,
    so the epoch's time per example excludes set-up and the dev evaluation."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def log_step(self, stage, step, terms, lr) -> None:
        self.times.append(time.perf_counter())

    def log_epoch(self, stage, step, epoch, metrics) -> None:
        pass


def child(factor: int, examples: int, directory: Path) -> dict:
    """Build a transfer set ``factor`` times ``examples`` and train one epoch on it (in this process)."""
    import torch

    import kdplug
    from kdplug.engine import transfer
    from kdplug.engine.cache import ConcatCache
    from kdplug.engine.data import WithTransfer, encode
    from kdplug.engine.objective import DistillationModule, WeightedObjective
    from kdplug.engine.teacher import build_cache, freeze
    from kdplug.engine.trainer import Trainer, build_accelerator
    from kdplug.testing.tiny import TINY_WORDS, TinyTask, make_tiny_bert
    from kdplug.types import Example

    torch.set_num_threads(max(1, torch.get_num_threads()))
    registry = kdplug.get_plugin_manager().registry
    task = TinyTask()
    teacher = freeze(
        registry.create("teacher", "hf", task, source=make_tiny_bert(directory / "bert", num_layers=4, hidden=64))
    )
    words = [w for w in TINY_WORDS if w.isalpha()]
    train = [Example(text, i % 2) for i, text in enumerate(sentences(examples, 0, words))]
    dev = [Example(text, i % 2) for i, text in enumerate(sentences(64, 1, words))]
    # the transfer texts go straight to the store, as --transfer FILE's would: never a list in memory
    store = directory / "transfer" / f"x{factor}"
    store.mkdir(parents=True)
    rng = random.Random(2)
    with open(store / transfer.TEXTS_FILE, "w", encoding="utf-8") as handle:
        for _ in range(factor * examples):
            handle.write(json.dumps([" ".join(rng.choice(words) for _ in range(rng.randint(5, 30)))]) + "\n")
    transfer_set = transfer.TransferSet(store, {"examples": factor * examples})
    trainer = Trainer(build_accelerator("fp32"), task, batch_size=32, seed=0)
    labelled = encode(train, teacher.tokenizer, 64, is_regression=False)
    unlabelled = transfer_set.encode(teacher.tokenizer, 64, is_regression=False)
    common = dict(root=directory, precision="auto", teacher_fingerprint="bench", tokenizer_fingerprint="bench")
    extractor = kdplug.find_layer_extractor(teacher.model)
    caches = ConcatCache(
        build_cache(teacher, extractor, trainer, task, "train", labelled, **common),
        build_cache(teacher, extractor, trainer, task, "transfer", unlabelled, **common),
    )
    student = registry.create("student", "bilstm", task, teacher)
    objective = WeightedObjective(
        eta=0.7,
        lam=0.0,
        task_loss=registry.create("loss", "ce"),
        kd_loss=registry.create("loss", "kd", temperature=10.0),
        ild_loss=None,
    )
    module = DistillationModule(student, kdplug.find_layer_extractor(student), None, objective)
    mixed = WithTransfer(labelled, unlabelled)
    trainer.tracking = clock = StepClock()
    trainer.fit(
        "bench",
        module,
        mixed,
        {"dev": encode(dev, teacher.tokenizer, 64, is_regression=False)},
        epochs=1,
        lr=1e-3,
        teacher_cache=caches,
    )
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    warm = min(10, (len(clock.times) - 1) // 2)  # steps left out: the first pay for allocator and kernel warm-up
    steps = len(clock.times) - 1 - warm
    seconds = clock.times[-1] - clock.times[warm]
    per_example = seconds / (steps * trainer.batch_size)
    return {
        "factor": factor,
        "examples": mixed.epoch_size,
        "seconds": seconds,
        "per_example_ms": 1000 * per_example,
        "peak_mib": peak_kib / 1024,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000, help="labelled training examples")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 examples")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.examples = 40
    if args.child is not None:
        print(json.dumps(child(args.child, args.examples, Path(args.directory))))
        return 0
    print(
        f"kdplug transfer-set scaling benchmark: {args.examples} labelled examples, BiLSTM student, "
        f"one process per size\n"
    )
    results = []
    for factor in FACTORS:
        with tempfile.TemporaryDirectory() as directory:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(factor),
                    "--examples",
                    str(args.examples),
                    "--directory",
                    directory,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = results[0]
    header = f"{'transfer':>8} {'examples/epoch':>14} {'peak MiB':>9} {'x 1x':>6} {'ms/example':>11} {'x 1x':>6}"
    print(header)
    print("-" * len(header))
    failures = 0
    for result in results:
        memory, time_ratio = result["peak_mib"] / base["peak_mib"], result["per_example_ms"] / base["per_example_ms"]
        failures += memory > 1.10 or time_ratio > 1.10
        print(
            f"{str(result['factor']) + 'x':>8} {result['examples']:>14} {result['peak_mib']:>9.0f} {memory:>6.2f} "
            f"{result['per_example_ms']:>11.2f} {time_ratio:>6.2f}"
        )
    print(f"\ntargets (memory and time per example within 10% of 1x): {'met' if not failures else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory and time as the data grows: 10k, 100k and 1M labelled sentences through kdplug's steps.

For each size N, a fresh process reads a generated CSV task of N training sentences (and N/10 dev,
at most 10,000) with the ``local`` task, tokenises it, runs the teacher pass (the teacher cache of
train and dev), trains a BiLSTM student for one epoch with logit KD (rkd) from that cache, and
predicts dev. Up to 100k sentences (``--transfer-up-to``) it also builds and tokenises a transfer
set of Tang et al.'s augmentation: 20 copies a sentence, POS-guided by spaCy (the ``augment``
extra). It prints each step's seconds and rows per second, the peak resident memory after the
step, and the cache's size on disk. A tiny random BERT teacher (2 layers, 32 wide, a WordPiece
vocabulary of the generated words) and a small BiLSTM (32 wide) keep the model's arithmetic small,
so what grows with N is kdplug's own handling of the data. Memory should not grow with N beyond the
token ids (4 bytes a token) and the labels; time should grow linearly.

    python benchmarks/scale.py [--sizes 10000 100000 1000000]
    python benchmarks/scale.py --quick      # a smoke run: 2,000 sentences
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the words of the generated reviews (and the tiny teacher's vocabulary)
GOOD = "superb moving gripping brilliant charming warm funny clever tender vivid".split()
BAD = "dull tedious lifeless clumsy bland flat hollow messy stale shallow".split()
ASPECTS = "plot acting film story ending script cast music pacing dialogue".split()
FILLER = "the was and but really quite very this that a of it".split()


def write_task(directory: Path, train: int, dev: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train), ("dev", dev)):
        with open(directory / f"{name}.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for _ in range(count):
                label = rng.randrange(2)
                words = GOOD if label else BAD
                text = " ".join(
                    [rng.choice(FILLER), rng.choice(ASPECTS), rng.choice(FILLER), rng.choice(words)]
                    + rng.choices(FILLER + ASPECTS + GOOD + BAD, k=rng.randint(2, 18))
                )
                writer.writerow([text, "positive" if label else "negative"])


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_transfer_set(registry, task, teacher, train_examples, dev_examples, cache_root: Path, step) -> dict:
    """Tang's transfer set built on the training split (timed by ``step``): its size and its bytes on disk."""
    from kdplug.config import RunConfig
    from kdplug.engine import transfer

    settings = RunConfig(augment="tang")
    factor = transfer.augment_factor(settings, task)
    started = time.perf_counter()
    built = transfer.build_or_load(
        settings, registry, task, teacher, train_examples, {"dev": dev_examples},
        root=cache_root, seed=0, echo=lambda _: None,
    )  # fmt: skip
    built.encode(teacher.tokenizer, 64, is_regression=False)
    step(f"tang transfer set (x{factor})", len(train_examples) * factor, started)
    return {"kept": len(built), "candidates": len(train_examples) * factor, "bytes": disk_bytes(built.directory)}


def child(size: int, root: Path, transfer_up_to: int) -> dict:
    """Every step for one size, in this process; what each cost."""
    import torch

    import kdplug
    from kdplug.engine import teacher as teacher_stage
    from kdplug.engine.data import encode
    from kdplug.engine.objective import DistillationModule, WeightedObjective
    from kdplug.engine.trainer import Trainer, build_accelerator
    from kdplug.testing.tiny import make_tiny_bert

    logging.getLogger("kdplug").setLevel(logging.ERROR)
    torch.manual_seed(0)
    registry = kdplug.get_plugin_manager().registry
    steps: dict[str, dict] = {}

    def step(name: str, rows: int, started: float) -> None:
        seconds = time.perf_counter() - started
        steps[name] = {"seconds": round(seconds, 2), "rows_per_s": round(rows / seconds), "peak_mib": round(peak_mib())}

    started = time.perf_counter()
    task = registry.create("task", "local", data_dir=str(root / "data"), labels=["negative", "positive"])
    train_examples, dev_examples = task.load_split("train"), task.load_split("dev")
    step("read", len(train_examples) + len(dev_examples), started)

    bert = make_tiny_bert(
        root / "teacher", num_layers=2, hidden=32, vocab_words=sorted(set(GOOD + BAD + ASPECTS + FILLER))
    )
    teacher = kdplug.create_teacher("hf", task, source=bert)
    started = time.perf_counter()
    train = encode(train_examples, teacher.tokenizer, 64, is_regression=False)
    dev = encode(dev_examples, teacher.tokenizer, 64, is_regression=False)
    step("tokenise", len(train) + len(dev), started)
    cache_root = root / "cache"
    transfer_set = None
    if size <= transfer_up_to:  # candidates: every training sentence's augmented copies
        transfer_set = timed_transfer_set(registry, task, teacher, train_examples, dev_examples, cache_root, step)
    del train_examples, dev_examples

    trainer = Trainer(build_accelerator("fp32"), task, batch_size=32, seed=0)
    extractor = kdplug.find_layer_extractor(teacher.model)
    started = time.perf_counter()
    caches = {
        name: teacher_stage.build_cache(
            teacher,
            extractor,
            trainer,
            task,
            name,
            split,
            root=cache_root,
            precision="fp32",
            teacher_fingerprint="scale",
            tokenizer_fingerprint="scale",
        )  # fmt: skip
        for name, split in (("train", train), ("dev", dev))
    }
    step("teacher pass", len(train) + len(dev), started)

    student = registry.create("student", "bilstm", task, teacher, embedding_dim=32, hidden_size=32)
    objective = WeightedObjective(
        eta=0.7, lam=0.0, ce=0.3, task_loss=registry.create("loss", "ce"),
        kd_loss=registry.create("loss", "kd", temperature=10.0), ild_loss=None,
    )  # fmt: skip
    module = DistillationModule(student, kdplug.find_layer_extractor(student), None, objective)
    started = time.perf_counter()
    trainer.fit("distill", module, train, {"dev": dev}, epochs=1, lr=1e-3, teacher_cache=caches["train"])
    step("student epoch (+ dev eval)", len(train), started)

    started = time.perf_counter()
    trainer.predict(student, dev)
    step("predict dev", len(dev), started)
    disk = disk_bytes(cache_root) - (transfer_set["bytes"] if transfer_set else 0)
    return {"size": size, "dev": len(dev), "steps": steps, "cache_bytes": disk, "transfer_set": transfer_set}


def disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 sentences")
    parser.add_argument(
        "--transfer-up-to",
        type=int,
        default=100_000,
        metavar="N",
        help="build a tang transfer set (20 augmented copies a sentence) at sizes up to N (default 100,000)",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, Path(args.root), args.transfer_up_to)))
        return 0
    sizes = [2_000] if args.quick else args.sizes
    print(f"{'N':>9} {'step':<28} {'seconds':>9} {'rows/s':>9} {'peak MiB':>9}")
    for size in sizes:
        with tempfile.TemporaryDirectory() as root:
            write_task(Path(root) / "data", size, min(10_000, max(10, size // 10)))
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    str(size),
                    "--root",
                    root,
                    "--transfer-up-to",
                    str(args.transfer_up_to),
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
        for name, measured in result["steps"].items():
            print(
                f"{size:>9} {name:<28} {measured['seconds']:9.2f} {measured['rows_per_s']:9d} {measured['peak_mib']:9d}"
            )
        print(f"{size:>9} {'teacher cache on disk':<28} {result['cache_bytes'] / 1e6:9.1f} MB")
        if result["transfer_set"]:
            kept = result["transfer_set"]
            print(
                f"{size:>9} {'transfer set on disk':<28} {kept['bytes'] / 1e6:9.1f} MB "
                f"({kept['kept']:,} of {kept['candidates']:,} copies kept, the rest duplicates or degenerate)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

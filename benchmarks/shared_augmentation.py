"""Building a transfer set in one process and in several: the seconds of each, and the same set.

Generates N labelled sentences (as benchmarks/scale.py does), then builds a ``tang`` transfer set of
them (20 copies a sentence, POS-guided by spaCy: the ``augment`` extra) twice, each into a fresh
cache: in one process, then under ``torchrun --nproc_per_node P`` with one thread a process, where
each process tags a share of the sentences and augments a share of the examples and rank 0 writes
the set. Prints both times, their ratio, and whether the two sets are byte for byte the same.

    python benchmarks/shared_augmentation.py [--sentences 20000] [--processes 2]
    python benchmarks/shared_augmentation.py --quick      # a smoke run: 300 sentences
"""

from __future__ import annotations

import argparse
import filecmp
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import ASPECTS, BAD, FILLER, GOOD, write_task  # noqa: E402


def child(root: Path, cache: Path) -> None:
    """One process of the build (alone, or one rank of a torchrun launch)."""
    import kdplug
    from kdplug.config import RunConfig
    from kdplug.engine import transfer
    from kdplug.engine.shares import ONE_PROCESS, Processes

    logging.getLogger("kdplug").setLevel(logging.ERROR)
    processes = ONE_PROCESS
    if "RANK" in os.environ:
        import torch.distributed as dist

        dist.init_process_group("gloo")

        def broadcast(value):
            box = [value]
            dist.broadcast_object_list(box, src=0)
            return box[0]

        processes = Processes(dist.get_rank(), dist.get_world_size(), broadcast)
    registry = kdplug.get_plugin_manager().registry
    task = registry.create("task", "local", data_dir=str(root / "data"), labels=["negative", "positive"])
    train, dev = task.load_split("train"), task.load_split("dev")
    teacher = kdplug.create_teacher("hf", task, source=str(root / "teacher"))
    started = time.perf_counter()
    built = transfer.build_or_load(
        RunConfig(augment="tang"), registry, task, teacher, train, {"dev": dev},
        root=cache, seed=0, echo=lambda _: None, processes=processes,
    )  # fmt: skip
    if processes.leads:
        print(
            json.dumps({"seconds": time.perf_counter() - started, "examples": len(built), "dir": str(built.directory)})
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300 sentences")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]))
        return 0
    sentences = 300 if args.quick else args.sentences
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        write_task(root / "data", sentences, max(10, sentences // 20))
        from kdplug.testing.tiny import make_tiny_bert

        make_tiny_bert(
            root / "teacher", num_layers=2, hidden=32, vocab_words=sorted(set(GOOD + BAD + ASPECTS + FILLER))
        )
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.processes)]
        launches = {
            "1 process": [sys.executable],
            f"{args.processes} processes (torchrun, 1 thread each)": torchrun,
        }
        results = {}
        for name, launcher in launches.items():
            env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if launcher is torchrun else {})}
            done = subprocess.run(
                [*launcher, __file__, "--child", str(root), str(root / name.split()[0])],
                capture_output=True, text=True, env=env,
            )  # fmt: skip
            if done.returncode != 0:
                print(done.stdout[-2000:], done.stderr[-3000:], file=sys.stderr)
                return 1
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        alone, shared = results.values()
        same = filecmp.cmp(Path(alone["dir"]) / "texts.jsonl", Path(shared["dir"]) / "texts.jsonl", shallow=False)
    print(f"tang transfer set of {sentences:,} sentences x 20: {alone['examples']:,} texts kept")
    for name, result in results.items():
        print(f"  {name:<40} {result['seconds']:8.1f} s")
    verdict = "the same" if same else "DIFFERENT"
    print(f"  speed-up {alone['seconds'] / shared['seconds']:.2f}x; the two sets are {verdict}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())

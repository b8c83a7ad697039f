"""The served teacher (``served:MODEL``) against the test kit's OpenAI-compatible server on localhost,
serving a tiny random GPT-2-style causal LM: examples per second at each concurrency, next to the same
model as the in-process prompted teacher, and what a resumed teacher pass saves.

Each concurrency scores the same examples (two labels, echo scoring: two requests an example) into a
fresh answer store, in batches of 64 as the engine's teacher pass gives them. The resume line: the
server goes away after half the answers, the pass fails; run again (a new server on the same port),
it asks only for the rest: requests and seconds of the second pass against a pass from scratch.

    python benchmarks/served_teacher.py [--examples 512] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from pathlib import Path

import torch

from kdplug.errors import KdplugError
from kdplug.plugins import get_plugin_manager
from kdplug.storage import building_under
from kdplug.testing.decoders import make_tiny_causal_lm
from kdplug.testing.openai_server import OpenAIServer
from kdplug.testing.tiny import TINY_WORDS, TinyTask
from kdplug.types import Example

TEMPLATE = "Review: {text}\nSentiment:"
VERBALIZER = {"negative": " bad", "positive": " good"}
BATCH = 64


def examples(count: int) -> list[Example]:
    generator = torch.Generator().manual_seed(0)
    words = list(TINY_WORDS)
    rows = []
    for i in range(count):
        length = int(torch.randint(4, 20, (1,), generator=generator))
        picked = torch.randint(0, len(words), (length,), generator=generator).tolist()
        rows.append(Example(" ".join(words[j] for j in picked), i % 2))
    return rows


def teacher(name: str, task: TinyTask, root: Path, **options):
    with building_under(root):
        return get_plugin_manager().registry.create(
            "teacher", name, task, prompt=TEMPLATE, verbalizer=VERBALIZER, **options
        )


def teacher_pass(built, rows: list[Example]) -> float:
    """Seconds to score ``rows`` in the engine's batches (encoder, then forward)."""
    from kdplug.engine.data import Collator, encode

    split = encode(rows, built.encoder, 64, is_regression=False)
    collate = Collator(split.pad_id, False)
    started = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(split), BATCH):
            batch = collate([split[i] for i in range(start, min(start + BATCH, len(split)))])
            built.model(batch["input_ids"], batch["attention_mask"])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    rows = examples(args.examples)
    task = TinyTask(examples={"train": rows[:8], "dev": rows[:8]})
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        lm = make_tiny_causal_lm(root / "gpt2", "gpt2")
        seconds = teacher_pass(teacher("prompted-lm", task, root / "inprocess", source=lm), rows)
        print(f"in process (prompted-lm): {len(rows) / seconds:8.1f} examples/s")
        with OpenAIServer(lm) as server:
            served = {"base_url": server.base_url, "tokenizer": lm}
            for concurrency in args.concurrency:
                built = teacher(
                    f"served:{server.name}", task, root / f"c{concurrency}", concurrency=concurrency, **served
                )
                seconds = teacher_pass(built, rows)
                print(f"served, concurrency {concurrency:3d}: {len(rows) / seconds:8.1f} examples/s")
            port = server.port
        resume(lm, task, rows, root, port)


def resume(lm: str, task: TinyTask, rows: list[Example], root: Path, port: int) -> None:
    """A pass stopped halfway, then resumed: requests and seconds against a pass from scratch."""
    total = 2 * len(rows)
    first = OpenAIServer(lm, port=port).start()
    options = {"base_url": first.base_url, "tokenizer": lm, "max_retries": 0, "concurrency": 8}

    def stop_at_half() -> None:
        while sum(first.answered.values()) < total // 2:
            time.sleep(0.001)
        first.stop()

    threading.Thread(target=stop_at_half, daemon=True).start()
    started = time.perf_counter()
    try:
        teacher_pass(teacher(f"served:{first.name}", task, root / "resume", **options), rows)
    except KdplugError:
        pass
    stopped_after = time.perf_counter() - started
    with OpenAIServer(lm, port=port) as second:
        seconds = teacher_pass(teacher(f"served:{second.name}", task, root / "resume", **options), rows)
        asked = sum(second.answered.values())
        with OpenAIServer(lm) as fresh:
            scratch = teacher_pass(
                teacher(f"served:{fresh.name}", task, root / "scratch", base_url=fresh.base_url, tokenizer=lm), rows
            )
    print(
        f"resumed pass: {asked} of {total} requests sent ({total - asked} saved, "
        f"{sum(first.answered.values())} answered before the server went away after {stopped_after:.1f} s); "
        f"{seconds:.2f} s against {scratch:.2f} s from scratch ({scratch - seconds:.2f} s saved)"
    )


if __name__ == "__main__":
    main()

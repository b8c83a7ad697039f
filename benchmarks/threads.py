"""Which intra-op thread count is fastest, on an idle machine and on a busy one?

For each model family kdplug runs on a CPU (the demo's BiLSTM student training a batch, a
MiniLM-sized teacher's forward pass over a batch, as in the teacher pass and evaluation), times
one step with 1 thread and with every usable core, first with nothing else running, then with
``--load N`` busy processes (plain Python loops, one core each: what other users' jobs do to a
shared machine). Steps are timed in interleaved rounds (1 thread, all threads, 1 thread, ...) and
reported as the median with its range, and as the ratio all-threads / 1-thread (above 1: more
threads are slower). The last column is what ``kdplug.threads.choose`` picks in that state.

    python benchmarks/threads.py [--load 2] [--rounds 5]
    python benchmarks/threads.py --quick          # a smoke run
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import torch
from transformers import BertConfig, BertForSequenceClassification

from kdplug import threads


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def bilstm_step(quick: bool):
    """One training step of a BiLSTM student (Universal-KD's 3 layers, BERT's 30,522-word vocabulary)."""
    from kdplug_models.modeling_bilstm import BiLSTMConfig, BiLSTMForSequenceClassification

    options = {"embedding_dim": 32, "hidden_size": 64} if quick else {}
    model = BiLSTMForSequenceClassification(BiLSTMConfig(vocab_size=30522, num_labels=2, **options))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1000, 30000, (32, 24))
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (32,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(input_ids=ids, attention_mask=mask).logits, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def teacher_forward(quick: bool):
    """A MiniLM-L6-sized teacher (6 x 384) on a batch of 32 sentences of 24 tokens, no gradients."""
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64 if quick else 384,
        num_hidden_layers=2 if quick else 6,
        num_attention_heads=4 if quick else 12,
        intermediate_size=128 if quick else 1536,
    )
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(1000, 30000, (32, 24))

    def step() -> None:
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))

    return step


def timed(step, count: int, rounds: int) -> dict[int, list[float]]:
    """Seconds of one step with ``count`` threads and with 1, interleaved over ``rounds``."""
    samples: dict[int, list[float]] = {1: [], count: []}
    for _ in range(rounds):
        for n in samples:
            torch.set_num_threads(n)
            step()  # warm-up at this thread count
            started = time.perf_counter()
            for _ in range(3):
                step()
            samples[n].append((time.perf_counter() - started) / 3)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=int, default=None, help="busy processes for the loaded case (default: cores)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny models, 1 round: a smoke run")
    args = parser.parse_args()
    cores = threads.usable_cores()
    load = cores if args.load is None else args.load
    rounds = 1 if args.quick else args.rounds
    families = {"BiLSTM student, training step": bilstm_step, "MiniLM-L6 teacher, forward": teacher_forward}
    print(f"{cores} usable cores; loaded = {load} busy processes; median (range) of {rounds} rounds, ms a step")
    print(f"{'model':32s} {'machine':8s} {'1 thread':>22s} {f'{cores} threads':>22s} {'ratio':>6s}  kdplug picks")
    for state in ("idle", "loaded"):
        spinners = []
        if state == "loaded":
            spinners = [multiprocessing.Process(target=spin, args=(3600,), daemon=True) for _ in range(load)]
            for process in spinners:
                process.start()
            time.sleep(1.0)
        try:
            picked = threads.choose(cores=cores, load=threads.other_load())
            for name, build in families.items():
                samples = timed(build(args.quick), cores, rounds)

                def cell(values: list[float]) -> str:
                    return f"{statistics.median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"

                ratio = statistics.median(samples[cores]) / statistics.median(samples[1])
                print(
                    f"{name:32s} {state:8s} {cell(samples[1]):>22s} {cell(samples[cores]):>22s} {ratio:5.2f}x  "
                    f"{picked.threads} ({picked.reason})"
                )
        finally:
            for process in spinners:
                process.kill()
                process.join()


if __name__ == "__main__":
    main()

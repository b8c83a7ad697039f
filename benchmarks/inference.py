"""Inference speed of the teacher and every student family at the papers' sizes, PyTorch and ONNX Runtime.

    python benchmarks/inference.py [--length 64] [--repeats 20] [--device cpu|cuda] [--threads N]

Models (random weights: speed does not depend on them): BERT-base (the teacher, 12 x 768), its
BERT-6 and BERT-4 students (PKD, ALP-KD, Universal-KD), the BiLSTM (3 x 768) and the Gated-CNN
(4 x 768) of Universal-KD, with BERT's 30,522-word vocabulary. Each is timed at batch size 1 and
32 on sequences of --length tokens, the median of --repeats runs after warm-up, in PyTorch and,
exported with ``kdplug.export``'s exporter, in ONNX Runtime. Ratios are against the teacher in
the same runtime, measured in this one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

VOCAB = 30522


def models() -> dict[str, torch.nn.Module]:
    from transformers import BertConfig, BertForSequenceClassification

    import kdplug  # noqa: F401  (registers the pooled students' model types)
    from kdplug_models.modeling_bilstm import BiLSTMConfig, BiLSTMForSequenceClassification
    from kdplug_models.modeling_gated_cnn import GatedCNNConfig, GatedCNNForSequenceClassification

    def bert(layers: int) -> torch.nn.Module:
        return BertForSequenceClassification(BertConfig(num_hidden_layers=layers, num_labels=2))

    torch.manual_seed(0)
    return {
        "teacher BERT-base (12x768)": bert(12),
        "BERT-6": bert(6),
        "BERT-4": bert(4),
        "BiLSTM (3x768)": BiLSTMForSequenceClassification(BiLSTMConfig(vocab_size=VOCAB, num_labels=2)),
        "Gated-CNN (4x768)": GatedCNNForSequenceClassification(GatedCNNConfig(vocab_size=VOCAB, num_labels=2)),
    }


def inputs(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(1000, VOCAB, (batch, length), generator=generator)
    return ids, torch.ones_like(ids)


def median_seconds(call, repeats: int) -> float:
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_torch(model: torch.nn.Module, batch: int, length: int, repeats: int, device: str) -> float:
    model = model.eval().to(device)
    ids, mask = (t.to(device) for t in inputs(batch, length))

    def call() -> None:
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask)
        if device == "cuda":
            torch.cuda.synchronize()

    return median_seconds(call, repeats)


def time_onnx(
    model: torch.nn.Module, directory: str, name: str, batch: int, length: int, repeats: int, threads: int
) -> float:
    import onnxruntime

    from kdplug.export import OPSET, _LogitsOnly

    path = os.path.join(directory, f"{abs(hash(name))}.onnx")
    if not os.path.exists(path):
        ids, mask = inputs(2, length)
        wrapper = _LogitsOnly(model.eval().cpu(), ["input_ids", "attention_mask"])
        axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
        with torch.inference_mode():
            torch.onnx.export(
                wrapper,
                (ids, mask),
                path,
                input_names=["input_ids", "attention_mask"],
                output_names=["logits"],
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ids, mask = inputs(batch, length)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    return median_seconds(lambda: session.run(["logits"], feed), repeats)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--length", type=int, default=64, help="tokens per example (the papers' single-sentence length)"
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-onnx", action="store_true", help="PyTorch only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import warnings

    warnings.simplefilter("ignore")
    print(
        f"device {args.device}, {args.threads} threads, {args.length} tokens per example, median of "
        f"{args.repeats} runs; torch {torch.__version__}"
    )
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as directory:
        for name, model in models().items():
            parameters = sum(p.numel() for p in model.parameters())
            row = {"params": parameters / 1e6}
            for batch in (1, 32):
                row[f"torch b={batch}"] = time_torch(model, batch, args.length, args.repeats, args.device) / batch
                if not args.no_onnx and args.device == "cpu":
                    row[f"onnx b={batch}"] = (
                        time_onnx(model, directory, name, batch, args.length, args.repeats, args.threads) / batch
                    )
            results[name] = row
    teacher = next(iter(results.values()))
    columns = [c for c in next(iter(results.values())) if c != "params"]
    header = f"{'model':<28}{'params':>9}" + "".join(f"{c + ' ms/ex':>18}{'x':>7}" for c in columns)
    print(header)
    print("-" * len(header))
    for name, row in results.items():
        cells = "".join(f"{row[c] * 1000:>18.3f}{teacher[c] / row[c]:>6.2f}x" for c in columns)
        print(f"{name:<28}{row['params']:>8.1f}M{cells}")
    print("x = the teacher's time per example over this model's, same runtime and batch size (higher: faster)")
    if "onnx b=1" in columns:
        print(
            "ONNX Runtime over PyTorch, same model: "
            + ", ".join(
                f"{name.split(' (')[0]} b=1 {row['torch b=1'] / row['onnx b=1']:.2f}x, b=32 "
                f"{row['torch b=32'] / row['onnx b=32']:.2f}x"
                for name, row in results.items()
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

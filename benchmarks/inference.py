"""Inference speed of the teacher and every student family at the papers' sizes, PyTorch and ONNX Runtime;
or, with --run, of a trained run's own teacher and student in every deployable form.

    python benchmarks/inference.py [--length 64] [--repeats 20] [--device cpu|cuda] [--threads N]
    python benchmarks/inference.py --quick [--device cuda]   # 3 repeats, PyTorch only
    python benchmarks/inference.py --run RUN_DIR [--repeats 20]

--run: the run's fine-tuned teacher and its student, each as fp32 PyTorch, fp32 ONNX Runtime,
int8 PyTorch and int8 ONNX Runtime (dynamic quantization, kdplug/quantize.py), and the student
also int8 in ONNX Runtime with its vocabulary trimmed to the task (kdplug/vocab.py): size, dev
accuracy (the task's main metric), ms per example at batch 1 and examples/s at batch 32, each with
1 thread and with all threads, on the run's own dev texts (tokenised once: the model's time), the
ratios against the fp32 PyTorch teacher and against the int8 ONNX Runtime teacher measured in this
one run. Every variant is built with ``kdplug export``'s code and checked as it checks it. An
ensemble's members are timed one by one, and the ensemble in each form as its members run one after
the other (sizes and times per example add up; its score is not measured here: metrics.json has it).

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
from typing import Any, Optional

import torch

# transformers' and the hub's progress bars (save_pretrained's "Writing model shards") go to stderr as the
# table goes to stdout, and a terminal shows them through it: off, as kdplug's own commands have them
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_device import pick_device, synchronize  # noqa: E402

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
        synchronize(torch.device(device))  # CUDA returns before the work is done

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


def run_variants(run: Path, repeats: int) -> int:
    """The table of --run (see the module docstring)."""
    import json

    import kdplug  # noqa: F401  (registers the pooled students' model types)
    from kdplug.config import build_config
    from kdplug.export import DevSet
    from kdplug.layout import INFO_FILE
    from kdplug.plugins import PluginManager

    metrics = json.loads((run / "metrics.json").read_text())
    config = build_config(file=str(run / "config.yaml"))
    task = PluginManager().registry.create("task", config.task, data_dir=config.data_dir, **config.task_options)
    examples = task.load_split(task.dev_splits[0])
    texts = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]
    labels = [e.label for e in examples]
    dev = DevSet(texts, labels, task.compute_metrics, task.main_metric, task.is_regression)
    train = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in task.load_split("train")]
    info = json.loads((run / "student" / INFO_FILE).read_text())
    teachers, served = _teachers(metrics["teacher"])
    with tempfile.TemporaryDirectory() as scratch:
        rows = _exported_forms(run, teachers, info, dev, train, Path(scratch))
        table = [
            (f"{who}: {name}", _measured(path, options, task, dev, texts, labels, repeats))
            for who, name, path, options in rows
        ]
    # an ensemble with a served member has no time of its own here: its rows would be the others' alone
    table = _with_ensemble(table, 0 if served else len(metrics["teacher"].get("members") or []))
    for name in served:
        print(f"{name} is a served teacher: its time is its server's and the network's, not timed", file=sys.stderr)
    _print_table(run, task, texts, info, repeats, table)
    return 0


def _teachers(teacher: dict) -> tuple[list[tuple[str, Path]], list[str]]:
    """``(who, checkpoint)`` of the run's teacher, or of each member of its ensemble, but the served ones
    (their time is their server's), and the served ones' names."""
    members = teacher.get("members")
    found, served = [], []
    for record in members or [teacher]:
        if record.get("served_remotely"):
            served.append(record["name"])
            continue
        finetuned = record.get("finetuned", {})
        who = f"teacher {record['index']}" if members else "teacher"
        found.append((who, Path(finetuned.get("stored") or finetuned.get("reused") or record["source"])))
    return found, served


def _with_ensemble(table: list[tuple[str, dict]], members: int) -> list[tuple[str, dict]]:
    """``table`` with an ``ensemble: FORM`` row per form its members have, run one after the other: sizes and
    times per example add up (examples/s: the inverse of the summed seconds); no score (not measured here)."""
    if members < 2:
        return table
    forms = [name.split(": ", 1)[1] for name, _ in table if name.startswith("teacher 0: ")]
    combined = []
    for form in forms:
        cells = [dict(table)[f"teacher {index}: {form}"] for index in range(members)]
        row = {"size": sum(c["size"] for c in cells), "score": None}
        for key in cells[0]:
            if key.startswith("ms "):
                row[key] = sum(c[key] for c in cells)
            elif key.startswith("ex/s "):
                row[key] = 1 / sum(1 / c[key] for c in cells)
        combined.append((f"ensemble: {form}", row))
    return table[: members * len(forms)] + combined + table[members * len(forms) :]


def _exported_forms(
    run: Path, teachers: list[tuple[str, Path]], info: dict, dev: Any, train: list, scratch: Path
) -> list[tuple]:
    """``(who, form, path, load options)`` of the teacher (each ensemble member) and the student in each
    exported form."""
    import json
    import shutil

    from kdplug.export import export_student
    from kdplug.layout import INFO_FILE

    rows: list[tuple[str, str, Any, dict]] = []
    sources = []
    for who, teacher_dir in teachers:  # each teacher as a package, so that export builds its forms too
        package = scratch / who.replace(" ", "-")
        shutil.copytree(teacher_dir, package)
        (package / INFO_FILE).write_text(json.dumps({**info, "student": "teacher"}))
        sources.append((who, package))
    for who, source in (*sources, ("student", run / "student")):
        rows.append((who, "fp32 PyTorch", source, {"runtime": "torch"}))
        for name, fmt, quantize, trim in (
            ("fp32 ONNX Runtime", "onnx", None, False),
            ("int8 PyTorch", "hf", "int8", False),
            ("int8 ONNX Runtime", "onnx", "int8", False),
            ("int8 ONNX Runtime, trimmed vocab", "onnx", "int8", True),
        ):
            if trim and who != "student":
                continue
            target = scratch / f"{who.replace(' ', '-')}-{fmt}-{quantize}-{trim}"
            export_student(
                source,
                target,
                fmt=fmt,
                dev=dev,
                quantize=quantize,
                trim_texts=train if trim else None,
                allow_drop=True,
                measure=False,
            )
            rows.append((who, name, target, {"runtime": "onnx" if fmt == "onnx" else "torch"}))
    return rows


def _measured(path: Path, options: dict, task: Any, dev: Any, texts: list, labels: list, repeats: int) -> dict:
    """One row's cells: size, dev score, and speed at batch 1 and 32 on 1 thread and on all."""
    from kdplug.export import _encode
    from kdplug.inference import load_student

    student = load_student(path, device="cpu", **options)
    predictions = student.predict(texts)
    predicted = [p.score if dev.is_regression else student.labels.index(p.label) for p in predictions]
    score = task.compute_metrics(predicted, labels)[task.main_metric]
    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.suffix in (".safetensors", ".onnx")) / 1e6
    cells = {"size": size, "score": score}
    single = [_encode(student, [t]) for t in texts[:repeats]]
    batch = _encode(student, (texts * 32)[:32])
    for threads in (1, torch.get_num_threads()):
        _threads(student, threads)
        with torch.inference_mode():
            b1 = statistics.median(median_seconds(lambda s=s, m=student: m.logits(s), 3) for s in single)
            b32 = median_seconds(lambda m=student, b=batch: m.logits(b), repeats)
        cells[f"ms b=1 t={threads}"], cells[f"ex/s b=32 t={threads}"] = b1 * 1000, 32 / b32
    return cells


def _print_table(run: Path, task: Any, texts: list, info: dict, repeats: int, table: list) -> None:
    all_threads = torch.get_num_threads()
    teacher = "ensemble" if any(name.startswith("ensemble: ") for name, _ in table) else "teacher"
    # no reference where the teacher is served (or an ensemble has a served member): no ratio, not a wrong one
    fp32_teacher = dict(table).get(f"{teacher}: fp32 PyTorch")
    int8_teacher = dict(table).get(f"{teacher}: int8 ONNX Runtime")
    print(
        f"run {run}: {task.name}, {len(texts)} dev texts, {info['max_length']} tokens at most; median of "
        f"{repeats} runs; threads 1 and {all_threads}; torch {torch.__version__}"
    )
    header = (
        f"{'model':<42}{'MB':>7}{task.main_metric[:8]:>9}"
        + "".join(f"{'ms b=1 t=' + str(t):>13}{'ex/s b=32 t=' + str(t):>16}" for t in (1, all_threads))
        + f"{'x fp32 teacher':>16}{'x int8 teacher':>16}"
    )
    print(header)
    print("-" * len(header))
    for name, cells in table:
        speeds = "".join(f"{cells[f'ms b=1 t={t}']:>13.2f}{cells[f'ex/s b=32 t={t}']:>16.0f}" for t in (1, all_threads))
        key = f"ex/s b=32 t={all_threads}"
        ratios = "".join(
            f"{cells[key] / reference[key]:>15.2f}x" if reference else f"{'–':>16}"
            for reference in (fp32_teacher, int8_teacher)
        )
        print(f"{name:<42}{cells['size']:>7.1f}{score(cells['score']):>9}{speeds}{ratios}")
    if fp32_teacher is None:
        print("x: none: a served teacher, or an ensemble with a served member, has no time measured here")
        return
    print(
        f"x = examples/s at batch 32 with {all_threads} threads over the fp32 PyTorch {teacher}'s, and over the int8 "
        f"ONNX Runtime {teacher}'s, both measured in this run"
    )


def score(value: Optional[float]) -> str:
    return "–" if value is None else f"{value * 100:.2f}"


def _threads(student: Any, threads: int) -> None:
    """Run ``student`` on ``threads`` threads (PyTorch's pool; a new ONNX Runtime session)."""
    torch.set_num_threads(threads)
    if student.session is not None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        student.session = onnxruntime.InferenceSession(
            student.session._model_path, options, providers=["CPUExecutionProvider"]
        )


def busy_machine() -> Optional[str]:
    """Why this machine's timings are not to be trusted now (other processes keep cores busy), as the
    run and the export say it (kdplug.threads.other_load, kdplug.timing.unreliable); None when idle.
    Measured before any model runs: while they do, this process is one of the busy ones."""
    from kdplug.threads import other_load
    from kdplug.timing import RETIME, unreliable

    reason = unreliable([], other_load())
    return f"the timings below are not reliable: {reason}. Time them again {RETIME}" if reason else None


def main() -> int:
    busy = busy_machine()
    if busy:
        print(f"warning: {busy}", file=sys.stderr)
    code = measure()
    if busy:
        print(busy.replace("the timings below", "these timings"))  # under the table, where it is read
    return code


def measure() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a trained run directory: its teacher and student in every form")
    parser.add_argument(
        "--length", type=int, default=64, help="tokens per example (the papers' single-sentence length)"
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-onnx", action="store_true", help="PyTorch only")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 repeats, PyTorch only")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.no_onnx = 3, True
    args.device = str(pick_device(args.device))
    if args.run is not None:
        return run_variants(args.run, args.repeats)
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

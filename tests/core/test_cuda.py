"""kdplug on a GPU: runs in bf16 and fp16, the teacher cache, the teacher in the loop, predict and export.

Every test here is marked ``cuda`` and skipped where PyTorch sees no CUDA device, so the default
suite (CPU-only CI) skips them. ``benchmarks/gpu_check.sh`` runs them on a GPU machine
(``pytest -m cuda``). They use the tiny random fixtures: what they check is that the CUDA paths
run and agree with the CPU, not how well a student learns.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import kdplug
from kdplug.cli import main

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs these)"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 3, dev=SST2_DEV)


def tiny_run(output, teacher, data, student: str, projector: str, precision: str) -> None:
    """``kdplug run`` in a child process, as a user runs it: Accelerate keeps one precision per
    process, so runs in bf16 and fp16 cannot share one."""
    argv = [
        sys.executable,
        "-m",
        "kdplug.cli",
        "run",
        "--teacher",
        teacher,
        "--task",
        "sst2",
        "--data-dir",
        str(data),
        "--student",
        student,
        "--projector",
        projector,
        "--epochs",
        "2",
        "--precision",
        precision,
        "--set",
        "teacher_epochs=1",
        "--set",
        "allow_weak_teacher=true",
        "--set",
        "head_epochs=1",
        "--set",
        "lr=0.01",
        "--output",
        str(output),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def finite_numbers(value) -> list[float]:
    """Every number in a JSON value (metrics.json), so that none is NaN or inf."""
    if isinstance(value, dict):
        return [number for item in value.values() for number in finite_numbers(item)]
    if isinstance(value, list):
        return [number for item in value for number in finite_numbers(item)]
    return [value] if isinstance(value, float) else []


def margin(prediction) -> float:
    """How far apart the two labels' probabilities are."""
    return abs(prediction.probabilities["positive"] - prediction.probabilities["negative"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir, data):
    """A finished run (BERT-2 student, pkd-skip: the teacher's layers from the cache) per GPU precision."""
    root = tmp_path_factory.mktemp("cuda-runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("cuda-cache")))
        for precision in ("bf16", "fp16"):
            tiny_run(root / precision, tiny_bert_dir, data, "bert-2", "pkd-skip", precision)
    return {precision: root / precision for precision in ("bf16", "fp16")}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_run_on_cuda_gives_finite_metrics_and_a_student_that_loads(runs, precision):
    metrics = json.loads((runs[precision] / "metrics.json").read_text())
    assert 0.0 <= metrics["student"]["dev"]["dev"]["accuracy"] <= 1.0
    numbers = finite_numbers(metrics)
    assert numbers and all(math.isfinite(number) for number in numbers)
    assert metrics["stages"]["distill"]["history"][0]["train"]["ild"] >= 0.0  # the cached layers were read
    # the run evaluated its student on the GPU in mixed precision; on the CPU in fp32 it predicts the
    # same, except where the two labels are too close for half precision to tell apart
    dev = json.loads((runs[precision] / "predictions.json").read_text())["dev"]["predictions"]
    on_cpu = kdplug.predict(runs[precision], [text for text, _ in SST2_DEV], device="cpu")
    assert len(on_cpu) == len(dev) == len(SST2_DEV)
    clear = [(p.label, ["negative", "positive"][i]) for p, i in zip(on_cpu, dev) if margin(p) > 0.05]
    assert all(cpu == gpu for cpu, gpu in clear)


@pytest.mark.parametrize("architecture", ["bert", "llama"])
def test_the_teacher_cache_built_on_cuda_matches_the_teacher_on_the_cpu(tiny_bert_dir, tmp_path, architecture):
    """build_cache on the GPU (fp32 and bf16 autocast) against the same teacher run in fp32 on the CPU:
    an encoder read at [CLS], a decoder (no padding token of its own) at each example's last real token."""
    from accelerate.state import AcceleratorState

    from kdplug.engine import teacher as teacher_stage
    from kdplug.engine.data import Collator, EncodedSplit
    from kdplug.engine.trainer import Trainer, build_accelerator
    from kdplug.testing.decoders import make_tiny_decoder
    from kdplug.testing.tiny import TinyTask

    task = TinyTask()
    source = tiny_bert_dir if architecture == "bert" else make_tiny_decoder(tmp_path / "llama", "llama")
    teacher = kdplug.create_teacher("hf", task, source=source)
    tokenizer = teacher.tokenizer
    texts = [text for text, _ in SST2_TRAIN * 2]
    ids = [tokenizer(text, truncation=True, max_length=64)["input_ids"] for text in texts]
    split = EncodedSplit(
        input_ids=ids, token_type_ids=None, labels=[0] * len(ids), is_regression=False, pad_id=tokenizer.pad_token_id
    )
    extractor = kdplug.find_layer_extractor(teacher.model)
    AcceleratorState._reset_state(reset_partial_state=True)  # this process's first fp32 accelerator
    trainer = Trainer(build_accelerator("fp32"), task, batch_size=8, seed=0)
    assert trainer.accelerator.device.type == "cuda"

    model = teacher.model.float().cpu().eval()
    batch = Collator(split.pad_id, False)([split[i] for i in range(len(split))])
    with torch.no_grad():
        outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        reads_inputs = getattr(extractor, "reads_inputs", False)
        read = extractor(model, outputs, inputs) if reads_inputs else extractor(model, outputs)
        reference_layers = [layer.float() for layer in read]
    reference_logits = outputs.logits.float()
    _, positions = teacher_stage.matchable_specs(extractor, model)
    reference_layers = [reference_layers[i] for i in positions]

    tolerance = {"fp32": 1e-3, "bf16": 3e-2}  # relative to the values' scale: fp16 storage, bf16 arithmetic
    for precision, tokens in (("fp32", None), ("bf16", None), ("fp32", 256), ("bf16", 256)):
        trainer.teacher_tokens_per_batch = tokens  # and batches by a budget of padded tokens
        cache = teacher_stage.build_cache(
            teacher,
            extractor,
            trainer,
            task,
            "train",
            split,
            root=tmp_path / f"{precision}-{tokens}",
            precision=precision,
            teacher_fingerprint="tiny",
            tokenizer_fingerprint="tiny",
        )
        logits, layers = cache.fetch(torch.arange(len(split)), "cpu")
        scale = reference_logits.abs().max().item()
        assert torch.allclose(logits, reference_logits, atol=tolerance[precision] * scale, rtol=0), precision
        assert len(layers) == len(reference_layers)
        for got, want in zip(layers, reference_layers):
            scale = want.abs().max().item()
            assert torch.allclose(got.float(), want, atol=tolerance[precision] * scale, rtol=0), precision
    assert teacher.model.training is False


@pytest.mark.parametrize("projector", ["tinybert", "minilm-v2"])
def test_token_methods_run_the_live_teacher_on_cuda(tmp_path, tiny_bert_dir, data, projector):
    tiny_run(tmp_path / "run", tiny_bert_dir, data, "bert-2", projector, "bf16")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    numbers = finite_numbers(metrics)
    assert numbers and all(math.isfinite(number) for number in numbers)
    assert kdplug.load_student(tmp_path / "run", device="cpu").model is not None


def test_predict_on_cuda_gives_the_cpu_predictions(runs, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"{text}\n" for text, _ in SST2_DEV))
    rows = {}
    for device in ("cpu", "cuda"):
        output = tmp_path / f"{device}.jsonl"
        code = main(["predict", str(runs["bf16"]), "--input", str(texts), "--output", str(output), "--device", device])
        assert code == 0, capsys.readouterr().err
        rows[device] = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows["cuda"]) == len(SST2_DEV)
    assert [row["label"] for row in rows["cuda"]] == [row["label"] for row in rows["cpu"]]
    loaded = kdplug.load_student(runs["bf16"], device="cuda")
    assert next(loaded.model.parameters()).device.type == "cuda"
    on_gpu = kdplug.predict(loaded, [text for text, _ in SST2_DEV])
    on_cpu = kdplug.predict(runs["bf16"], [text for text, _ in SST2_DEV], device="cpu")
    gpu = np.array([[p.probabilities[k] for k in sorted(p.probabilities)] for p in on_gpu])
    cpu = np.array([[p.probabilities[k] for k in sorted(p.probabilities)] for p in on_cpu])
    assert np.allclose(gpu, cpu, atol=1e-3)


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_export_after_a_cuda_run_predicts_what_the_run_predicted(runs, tmp_path, fmt):
    if fmt == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    output = tmp_path / "export"
    assert main(["export", str(runs["bf16"]), "--format", fmt, "--output", str(output)]) == 0
    texts = [text for text, _ in SST2_DEV]
    exported = kdplug.predict(output, texts, device="cpu")
    packaged = kdplug.predict(runs["bf16"], texts, device="cpu")
    assert [p.label for p in exported] == [p.label for p in packaged]
    for mine, theirs in zip(exported, packaged):
        assert mine.probabilities == pytest.approx(theirs.probabilities, abs=1e-4)

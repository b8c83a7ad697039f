"""The benchmarks still run against the code they measure: each one's smoke mode, end to end.

A benchmark is run by hand, rarely, so an engine change that breaks it (a new argument of
``build_cache``) would otherwise be found only by the next person who needs its numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "script, args, expected",
    [
        ("transfer_scaling.py", ["--quick"], "peak MiB"),
        ("kd_overhead.py", ["--quick", "--teacher", "tiny"], "teacher cache build"),
        ("inference.py", ["--repeats", "1", "--length", "8", "--no-onnx"], "BiLSTM (3x768)"),
        ("threads.py", ["--quick", "--load", "1"], "kdplug picks"),
        ("overhead.py", ["--quick"], "kdplug trainer, an epoch + dev eval"),
        ("scale.py", ["--quick"], "transfer set on disk"),
        ("shared_augmentation.py", ["--quick"], "the two sets are the same"),
        ("teacher_pass.py", ["--quick"], "teacher pass throughput"),
        ("teacher_pass.py", ["--batching", "--quick"], "teacher pass batching tiny: count"),
        ("digest_filter.py", ["--quick"], "the same first occurrences: True"),
        ("structure_report.py", [], "import circles"),
    ],
)
def test_a_benchmark_runs_in_its_smoke_mode(script, args, expected, tmp_path):
    env = {**os.environ, "KDPLUG_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert expected in result.stdout, result.stdout[-3000:]


def test_the_inference_benchmark_warns_on_a_busy_machine_and_keeps_progress_bars_off_its_table(
    tmp_path, tiny_bert_dir, sst2_dir
):
    """As the run and the export do: measured before any model runs, with a real process keeping a
    core busy; and save_pretrained's progress bars (stderr) no longer run through the table (stdout)."""
    from kdplug.cli import main
    from kdplug.testing import tiny_run_args

    env = {**os.environ, "KDPLUG_CACHE": str(tmp_path / "cache")}
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", env["KDPLUG_CACHE"])
        settings = dict(student_options={"hidden_size": 8, "embedding_dim": 8}, output=str(run))
        assert (
            main(["run", *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), **settings)]) == 0
        )
    burner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 8\nwhile time.time() < end: pass"]
    )
    try:
        result = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "inference.py"), "--run", str(run), "--repeats", "1"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        burner.kill()
        burner.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: the timings below are not reliable: other processes kept" in result.stderr
    assert result.stdout.splitlines()[-1].startswith("these timings are not reliable: other processes kept")
    assert "student: int8 ONNX Runtime" in result.stdout
    assert "Writing model shards" not in result.stderr and "it/s]" not in result.stderr, result.stderr[-2000:]


def test_the_inference_benchmark_times_an_ensembles_members_and_the_ensemble(tmp_path, sst2_dir):
    """Before, an ensemble run stopped it with KeyError: 'source'."""
    from kdplug.cli import main
    from kdplug.testing import tiny_run_args
    from kdplug.testing.tiny import make_tiny_classifier

    env = {**os.environ, "KDPLUG_CACHE": str(tmp_path / "cache")}
    run, pair = (
        tmp_path / "run",
        [make_tiny_classifier(tmp_path / name, seed=seed) for name, seed in (("a", 0), ("b", 1))],
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", env["KDPLUG_CACHE"])
        settings = dict(student_options={"hidden_size": 8, "embedding_dim": 8}, output=str(run), teacher=None)
        argv = [
            *tiny_run_args(task="sst2", data_dir=str(sst2_dir), **settings),
            "--teacher",
            pair[0],
            "--teacher",
            pair[1],
        ]
        assert main(["run", *argv]) == 0
    command = [sys.executable, str(ROOT / "benchmarks" / "inference.py"), "--run", str(run), "--repeats", "1"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("  ")[0]: line for line in result.stdout.splitlines()}
    assert {"teacher 0: int8 ONNX Runtime", "teacher 1: fp32 PyTorch", "ensemble: fp32 PyTorch"} <= set(rows)
    assert rows["ensemble: fp32 PyTorch"].split()[-2] == "1.00x"  # the reference: its own examples/s over its own
    assert "over the fp32 PyTorch ensemble's" in result.stdout


def safetensors_bytes(data: bytes, metadata: dict) -> bytes:
    """A safetensors file of one uint8 tensor, its header's keys in the order given (as safetensors writes them:
    in an order that changes from process to process)."""
    tensor = {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}
    header = json.dumps({"__metadata__": metadata, "weights": tensor}).encode()
    return len(header).to_bytes(8, "little") + header + data


def fake_capture(root: Path, *, seconds: float, weights: bytes, loss: float, work: str) -> Path:
    """What ``behaviour_snapshot.py capture`` keeps in OUT/raw for one run (no kdplug run: a capture takes
    minutes): its metrics, its weights, its stdout, from a scratch folder at ``work``."""
    run = root / "raw" / "runs" / "tiny"
    (run / "student").mkdir(parents=True)
    (root / "raw" / "work_path.txt").write_text(f"{work}\n")
    metrics = {"wall_seconds": seconds, "config": {"output": f"{work}/runs/tiny"}, "history": [{"loss": loss}]}
    (run / "metrics.json").write_text(json.dumps(metrics))
    metadata = {"stage": "distill", "split": "dev"} if seconds > 5 else {"split": "dev", "stage": "distill"}
    (run / "student" / "model.safetensors").write_bytes(safetensors_bytes(weights, metadata))
    outputs = root / "raw" / "outputs" / "tiny"
    outputs.mkdir(parents=True)
    (outputs / "stdout.txt").write_text(f"time: distill {seconds} s; results in {work}/runs/tiny\n")
    (outputs / "stderr.txt").write_text(f"INFO kdplug.engine.trainer: distill epoch 1/1 ({seconds} s)\n")
    return root


def test_the_behaviour_snapshot_masks_timings_and_paths_and_names_each_difference(tmp_path):
    """Two captures differing only in timings, in the scratch folder's place and in the order of a safetensors
    header compare identical; a changed loss and a changed weights file are each named, and compare exits 1."""
    script = [sys.executable, str(ROOT / "benchmarks" / "behaviour_snapshot.py"), "compare"]
    before = fake_capture(tmp_path / "before", seconds=1.5, weights=b"w1", loss=0.25, work="/tmp/a")
    same = fake_capture(tmp_path / "same", seconds=7.25, weights=b"w1", loss=0.25, work="/tmp/b")
    changed = fake_capture(tmp_path / "changed", seconds=1.5, weights=b"w2", loss=0.5, work="/tmp/a")
    result = subprocess.run([*script, str(before), str(same)], capture_output=True, text=True)
    assert result.returncode == 0 and "identical" in result.stdout, result.stdout + result.stderr
    result = subprocess.run([*script, str(before), str(changed)], capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "-history[0].loss = 0.25" in result.stdout and "+history[0].loss = 0.5" in result.stdout
    assert "--- runs/tiny/weights.txt" in result.stdout and "2 file(s) differ" in result.stdout

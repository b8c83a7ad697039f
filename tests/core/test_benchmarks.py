"""The benchmarks still run against the code they measure: each one's smoke mode, end to end.

A benchmark is run by hand, rarely, so an engine change that breaks it (a new argument of
``build_cache``) would otherwise be found only by the next person who needs its numbers.
"""

from __future__ import annotations

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
        ("digest_filter.py", ["--quick"], "the same first occurrences: True"),
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

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

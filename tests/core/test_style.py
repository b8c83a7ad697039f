"""The code base stays formatted and linted as pyproject.toml's [tool.ruff] says (ruff format, ruff check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ["kdplug", "plugins", "tests", "benchmarks", "zoo", "examples"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CODE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_code_is_formatted():
    result = ruff("format", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_linter_finds_nothing():
    result = ruff("check", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr

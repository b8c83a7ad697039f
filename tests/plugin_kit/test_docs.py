"""docs/writing-a-plugin.md: its files, built into a package exactly as printed, pass their own tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-a-plugin.md"
BLOCK = re.compile(r"```(?:python|toml)\n# file: (\S+)\n(.*?)```", re.S)


def tutorial_files() -> dict[str, str]:
    return dict(BLOCK.findall(DOC.read_text(encoding="utf-8")))


def test_the_tutorial_shows_a_whole_package():
    assert set(tutorial_files()) == {
        "pyproject.toml",
        "src/kdplug_mean_combine/__init__.py",
        "src/kdplug_mean_combine/projector.py",
        "tests/conftest.py",
        "tests/test_mean_combine.py",
    }


def test_the_tutorial_package_passes_its_tests(tmp_path):
    for path, body in tutorial_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"\b4[0-9] passed", result.stdout), result.stdout[-500:]

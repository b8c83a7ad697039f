"""The third-party path end to end: .ci/plugin-kit.sh installs the example distribution and a
generated skeleton into a fresh virtual environment, runs their contract tests, and uses the
example projector in `kdplug run` (about 3 minutes on 2 cores, most of it pip)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "plugin-kit.sh"


@pytest.mark.slow
def test_example_distribution_and_skeleton_work_when_installed():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "plugin kit: OK" in done.stdout

"""Shared fixtures: offline, an isolated cache, tiny random checkpoints and task files."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# huggingface_hub reads HF_HUB_OFFLINE once, when it is imported: set after that (as the fixture below
# does), a hub name still went to the network and waited out its retries (about 45 s a load here)
os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
if "huggingface_hub" in sys.modules:
    sys.modules["huggingface_hub"].constants.HF_HUB_OFFLINE = True

# pytest-xdist runs the suite in two workers (pyproject's addopts), one per core: each worker and the
# processes its tests start take one intra-op thread, so no test's thread count hangs on the other's load
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# transformers copies a checkpoint's own code (the students' auto_map) into HF_MODULES_CACHE under the
# folder's name: one per test process, so two workers never write one file, and the user's is not touched
if "HF_MODULES_CACHE" not in os.environ:
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="kdplug-tests-hf-modules-")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)

from kdplug.testing.contracts import TINY_SST2_DEV, TINY_SST2_TRAIN, write_tiny_sst2
from kdplug.testing.tiny import make_tiny_bert


@pytest.fixture(autouse=True)
def _offline_and_isolated(monkeypatch, tmp_path_factory):
    """No test reaches a hub, and none reads or writes the user's cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("kdplug-cache")))
    monkeypatch.delenv("KDPLUG_DISABLE_PLUGINS", raising=False)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "bert", num_layers=4, hidden=32)


SST2_TRAIN, SST2_DEV = TINY_SST2_TRAIN, TINY_SST2_DEV


def interrupted_run(argv, run_dir, **planned: str) -> subprocess.CompletedProcess:
    """``kdplug <argv> --output run_dir`` in a child process with a planned fault, e.g.
    ``KDPLUG_SIGNAL_AT="distill:2:8:SIGKILL"`` (see kdplug/engine/faults.py); its completed process."""
    return subprocess.run(
        [sys.executable, "-m", "kdplug.cli", *argv, "--output", str(run_dir)],
        env={**os.environ, **planned},
        capture_output=True,
        text=True,
        timeout=300,
    )


def write_sst2(directory, train=SST2_TRAIN, dev=SST2_DEV):
    """A directory in the GLUE SST-2 layout (``sentence<TAB>label`` with a header)."""
    return Path(write_tiny_sst2(directory, train, dev))


@pytest.fixture
def sst2_dir(tmp_path):
    return write_sst2(tmp_path / "SST-2")

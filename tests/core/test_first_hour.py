"""What a new user meets in the first hour, in real processes: each line of the run once on the
terminal, no run directory left by a run refused for its data, no library warnings before
export's first line, and a model card that names what ran."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kdplug.cli import main

from ..conftest import SST2_DEV, write_sst2

TINY = [
    "--student",
    "bilstm",
    "--projector",
    "rkd",
    "--epochs",
    "1",
    "--set",
    "teacher_epochs=1",
    "--set",
    "allow_weak_teacher=true",
    "--set",
    "student_options.embedding_dim=16",
    "--set",
    "student_options.hidden_size=16",
]


def kdplug(*argv, cwd=None) -> subprocess.CompletedProcess:
    """``kdplug ARGV`` in a child process, its stderr merged into its stdout as a terminal shows them."""
    return subprocess.run(
        [sys.executable, "-m", "kdplug.cli", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_the_teacher_line_reaches_the_terminal_once_and_log_txt_too(tmp_path, tiny_bert_dir):
    data = write_sst2(tmp_path / "SST-2", dev=SST2_DEV * 3)
    output = tmp_path / "run"
    done = kdplug("run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", data, *TINY, "--output", output)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert sum("the majority class scores" in line for line in lines) == 1, done.stdout
    log = (output / "log.txt").read_text()
    assert "the majority class scores" in log and "allow_weak_teacher is set" in log


@pytest.mark.parametrize("command", ["run", "zoo run"])
def test_a_run_refused_for_missing_data_leaves_no_run_directory(tmp_path, tiny_bert_dir, command):
    output = tmp_path / "run"
    missing = tmp_path / "no-such-dir"
    if command == "run":
        argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", missing, *TINY]
    else:
        argv = ["zoo", "run", "alp-kd/table1-sst2-alp", "--set", f"teacher={tiny_bert_dir}", "--data-dir", missing]
    code = main([*map(str, argv), "--output", str(output)])
    assert code == 2
    assert not output.exists()

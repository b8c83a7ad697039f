"""The first hour on a busy machine: threads chosen for the cores other processes leave free, and
time you can see (each epoch's seconds and the stage's time left)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kdplug import threads

from .test_nothing_lost import run, tiny_argv


def test_the_cgroup_quota_caps_the_usable_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # cgroup v2: 1.5 cores
    assert threads.cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_quota(tmp_path) == 3.0


def test_other_processes_busy_on_every_core_leave_one_thread(monkeypatch):
    for variable in threads.TORCH_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    cores = threads.usable_cores()
    spinners = [
        subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
        for _ in range(cores)
    ]
    try:
        time.sleep(1.0)  # they are running
        busy = threads.other_load()
        choice = threads.choose(cores=cores, load=busy)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert busy is not None and busy > cores - 0.6, busy  # each spinner keeps one core busy
    assert choice.threads == 1 and "busy with other processes" in choice.reason


def test_an_idle_machine_gets_every_usable_core_and_the_users_count_wins(monkeypatch):
    for variable in threads.TORCH_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert threads.choose(cores=8, load=0.2).threads == 8
    assert threads.choose(cores=8, load=3.0).threads == 5
    assert threads.choose(3, cores=8, load=7.5).threads == 3  # --threads
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    choice = threads.choose(cores=8, load=0.0)
    assert choice.threads == 2 and choice.reason == "OMP_NUM_THREADS"


@pytest.mark.parametrize("given, expected", [(["--threads", "1"], "--threads"), ([], None)])
def test_a_run_records_its_threads_and_times_its_epochs(capsys, tmp_path, tiny_bert_dir, sst2_dir, given, expected):
    output = tmp_path / "run"
    code, out, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output, "--epochs", "3", *given))
    assert code == 0, err
    recorded = json.loads((output / "metrics.json").read_text())["threads"]
    assert recorded["threads"] == (1 if given else __import__("torch").get_num_threads())
    assert recorded["reason"] == expected or (expected is None and recorded["reason"] in (
        "OMP_NUM_THREADS", "MKL_NUM_THREADS") or "usable cores" in recorded["reason"])  # fmt: skip
    assert f"threads: {recorded['threads']} (" in out
    history = json.loads((output / "metrics.json").read_text())["stages"]["distill"]["history"]
    assert all(record["seconds"] >= 0 for record in history) and len(history) == 3
    log = (output / "log.txt").read_text()
    assert "distill epoch 1/3: " in log and " left for 2 more epochs)" in log


def test_threads_must_be_positive(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run", "--threads", "0"))
    assert code == 2 and "threads must be at least 1" in err
    assert not (tmp_path / "run").exists()


def test_a_child_process_with_omp_num_threads_keeps_it(tmp_path):
    script = (
        "from kdplug import threads; c = threads.apply(threads.choose()); import torch; "
        "print(c.reason, torch.get_num_threads())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True
    ).stdout
    assert out.split() == ["OMP_NUM_THREADS", "1"]


def test_speed_measured_on_a_busy_machine_is_flagged_not_printed_as_a_fact(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    spinners = [
        subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: pass"])
        for _ in range(threads.usable_cores())
    ]
    try:
        code, out, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run"))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert code == 0, err
    speed = json.loads((tmp_path / "run" / "metrics.json").read_text())["speed"]
    assert "other processes kept" in speed["unreliable"] and "cores busy while it was measured" in speed["unreliable"]
    assert speed["student"]["throughput_spread"] >= 0 and speed["teacher"]["weights_mb"] > 0
    assert "the speed columns are not reliable: other processes kept" in out
    assert " ±" in out  # each timing with its spread

"""Nothing lost, part 3: one writer per run directory, checkpoints verified before they are resumed,
and no user file replaced by a sweep, a report or a cache clear (real processes, real files)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdplug.errors import UsageError

from .test_nothing_lost import cache_root, run, tiny_argv

#: four steps an epoch on the tiny SST-2 (12 sentences), so a run can be stopped inside one
STEPS = ["--set", "batch_size=3", "--epochs", "2"]


def kdplug_process(argv, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kdplug.cli", *map(str, argv)],
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_stopped(process: subprocess.Popen, timeout: float = 240) -> None:
    """Until ``process`` has stopped itself (SIGSTOP, state T in /proc), holding what it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.2)
    raise AssertionError("the run never reached its planned stop")


# -- one writer per run directory ---------------------------------------------------------------


def test_a_run_directory_has_one_writer_while_its_run_lives(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    output = tmp_path / "run"
    first = kdplug_process(tiny_argv(tiny_bert_dir, sst2_dir, output, *STEPS), KDPLUG_SIGNAL_AT="distill:1:2:SIGSTOP")
    try:
        wait_until_stopped(first)  # a live run, in the middle of its first distillation epoch
        for extra in (["--overwrite"], ["--seed", "7", "--overwrite"]):
            code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output, *STEPS, *extra))
            assert code == 2, err
            assert f"run directory {output} is being written by kdplug process {first.pid}" in err
        code, _, err = run(capsys, "run", "--resume", output)
        assert code == 2 and f"kdplug process {first.pid}" in err
        assert json.loads((output / "kdplug_run.json").read_text())["status"] == "running"
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["config"]["seed"] == 42
    assert "resuming" not in (output / "log.txt").read_text()
    # the lock went with its process: the same directory is free again, and a killed run frees it too
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output, *STEPS, "--overwrite"))[0] == 0


def test_a_killed_run_leaves_no_lock_behind(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    output = tmp_path / "run"
    killed = kdplug_process(tiny_argv(tiny_bert_dir, sst2_dir, output, *STEPS), KDPLUG_SIGNAL_AT="distill:1:2")
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL and (output / "kdplug_run.lock").is_file()
    code, _, err = run(capsys, "run", "--resume", output)
    assert code == 0, err
    assert json.loads((output / "metrics.json").read_text())["status"] == "completed"


def test_an_output_on_a_dangling_symlink_is_a_usage_error(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone")
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, link))
    assert code == 2 and "is a symbolic link to" in err and "which does not exist" in err
    assert link.is_symlink() and not (tmp_path / "gone").exists()


# -- checkpoints: every file verified, resumed only by the configuration that wrote them ----------


@pytest.fixture
def killed_run(tmp_path, tiny_bert_dir, sst2_dir) -> Path:
    """A run killed in its second distillation epoch: the first epoch's checkpoint (with a best
    state) is on disk."""
    output = tmp_path / "killed"
    argv = tiny_argv(tiny_bert_dir, sst2_dir, output, *STEPS)
    killed = kdplug_process(argv, KDPLUG_SIGNAL_AT="distill:2:2")
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert (output / "checkpoints" / "distill" / "best.safetensors").is_file()
    return output


def test_a_checkpoint_that_lost_a_file_is_not_resumed(capsys, killed_run):
    checkpoint = killed_run / "checkpoints" / "distill"
    (checkpoint / "best.safetensors").unlink()
    code, _, err = run(capsys, "run", "--resume", killed_run)
    assert code == 2, err
    assert f"the checkpoint of stage 'distill' ({checkpoint}) cannot be resumed: best.safetensors is missing" in err
    assert f"remove {checkpoint} and continue with 'kdplug run --resume {killed_run}'" in err
    assert not (killed_run / "student").exists()  # no other student was exported
    assert json.loads((killed_run / "metrics.json").read_text())["status"] == "failed"


def test_a_changed_checkpoint_file_is_named_not_unpickled(capsys, killed_run):
    optimizer = killed_run / "checkpoints" / "distill" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:-64] + b"\0" * 64)
    code, _, err = run(capsys, "run", "--resume", killed_run)
    assert code == 2 and "optimizer.pt fails its checksum" in err
    assert "weights_only" not in err  # torch's advice to unpickle the file is not relayed


def test_a_pickled_optimizer_with_matching_checksums_is_refused_without_torchs_advice(capsys, killed_run):
    """A file that passes its checksum (whoever wrote it could write the checksum file too) but holds
    objects torch will only unpickle with weights_only=False: kdplug says why and never relays that advice."""
    import fractions

    import torch

    from kdplug.storage import write_checksums

    checkpoint = killed_run / "checkpoints" / "distill"
    torch.save({"optimizer": {}, "scheduler": fractions.Fraction(1, 3)}, checkpoint / "optimizer.pt")
    write_checksums(checkpoint)
    code, _, err = run(capsys, "run", "--resume", killed_run)
    assert code == 2, err
    assert "optimizer.pt holds Python objects besides tensors, which kdplug does not unpickle" in err
    assert "weights_only" not in err and "Weights only load failed" not in err


def test_a_checkpoint_resumes_only_under_its_own_configuration(capsys, killed_run):
    code, _, err = run(capsys, "run", "--resume", killed_run, "--set", "lr=0.01")
    assert code == 2 and "the options given change what it trains (lr" in err and "0.01 now" in err
    # config.yaml edited by hand: the checkpoint knows the configuration that trained it
    config = killed_run / "config.yaml"
    config.write_text(config.read_text().replace("seed: 42", "seed: 7"))
    code, _, err = run(capsys, "run", "--resume", killed_run)
    assert code == 2 and "was written by another configuration: seed 42 there, 7 now" in err
    config.write_text(config.read_text().replace("seed: 7", "seed: 42"))
    code, _, err = run(capsys, "run", "--resume", killed_run, "--set", "num_workers=0")  # not what it trains
    assert code == 0, err


def test_a_checkpoint_resumes_only_on_the_data_it_was_trained_on(capsys, killed_run, sst2_dir):
    """Data edited in place (or another folder of the same relative name, config.yaml's data_dir being read
    from the current directory) between the kill and the resume: before, the run went on with it, exit 0."""
    train = sst2_dir / "train.tsv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join([lines[0], "a different sentence altogether\t1", *lines[2:]]) + "\n")
    code, _, err = run(capsys, "run", "--resume", killed_run)
    assert code == 2 and "was written by another configuration: content of the data " in err, err
    assert "resume from the directory the run started in" in err
    assert not (killed_run / "student").exists()
    train.write_text("\n".join(lines) + "\n")  # the data it read: it resumes
    assert run(capsys, "run", "--resume", killed_run)[0] == 0


def test_a_flag_given_with_resume_is_checked_like_a_set_never_ignored(capsys, killed_run, sst2_dir, tiny_bert_dir):
    """Before, every flag but --set and the teacher's was ignored with --resume: --epochs 5 resumed the
    2-epoch run and exited 0."""
    from kdplug.engine.pipeline import resume_config
    from kdplug.engine.plan import dry_run
    from kdplug.plugins import PluginManager

    changes = {
        ("--epochs", "5"): "epochs 2 in config.yaml, 5 now",
        ("--student", "gated-cnn"): "student bilstm in config.yaml, gated-cnn now",
        ("--seed", "7"): "seed 42 in config.yaml, 7 now",
        ("--augment", "tang"): "augment unset in config.yaml, tang now",
    }
    for flags, named in changes.items():
        code, _, err = run(capsys, "run", "--resume", killed_run, *flags)
        assert code == 2 and "the options given change what it trains (" in err and named in err, (flags, err)
    for flags in (["--seeds", "2"], ["--overwrite"], ["--config", killed_run / "config.yaml"]):
        code, _, err = run(capsys, "run", "--resume", killed_run, *flags)
        assert code == 2 and f"{flags[0]} starts a new run and --resume continues the run in {killed_run}" in err
    code, _, err = run(capsys, "run", "--resume", killed_run, "--output", killed_run.parent / "elsewhere")
    assert code == 2 and "drop --output" in err and not (killed_run.parent / "elsewhere").exists()
    # --set output= is the same key: it was let through and the run ended in a FileNotFoundError traceback
    code, _, err = run(capsys, "run", "--resume", killed_run, "--set", f"output={killed_run.parent / 'elsewhere'}")
    assert code == 2 and "drop --output or --set output=" in err and not (killed_run.parent / "elsewhere").exists()
    assert not (killed_run / "student").exists()  # nothing resumed yet
    # its dry run times what is left: the distillation epoch it was killed in (before: the whole stage again)
    printed = []
    plan = dry_run(resume_config(killed_run), PluginManager().registry, resume=True, echo=printed.append)
    per_epoch = plan["stages"]["distill"]["estimate"]["seconds_per_epoch"]
    assert plan["stages"]["distill"]["epochs"] == 2 and " left (distill " in printed[0], printed
    assert plan["time"]["parts"]["distill"] == (round(per_epoch, 1), round(per_epoch, 1)), plan["time"]
    # the run's own values, spelt another way (the teacher's folder through a link was refused), and where it
    # executes go on
    teacher_link, data_link = killed_run.parent / "teacher-link", killed_run.parent / "data-link"
    teacher_link.symlink_to(tiny_bert_dir)
    data_link.symlink_to(sst2_dir)
    same = ["--epochs", "2", "--seed", "042", "--data-dir", f"{sst2_dir}/.", "--output", f"{killed_run}/"]
    same += ["--threads", "1", "--teacher", teacher_link, "--set", f"data_dir={data_link}"]
    code, _, err = run(capsys, "run", "--resume", killed_run, *same)
    assert code == 0, err
    metrics = json.loads((killed_run / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["threads"]["threads"] == 1


def test_resumed_values_that_name_what_config_yaml_names_are_no_change(tmp_path, sst2_dir, tiny_bert_dir):
    """Before, a transfer file or an ensemble member's folder given through a link or another relative
    spelling, and --augment-factor 20 where config.yaml leaves Tang's 20 unset, were refused as changes."""
    from kdplug.commands.run import check_resume_settings, keep_written_spelling
    from kdplug.config import build_config
    from kdplug.plugins import PluginManager

    (tmp_path / "extra.txt").write_text("a fine film\n")
    (tmp_path / "extra-link.txt").symlink_to(tmp_path / "extra.txt")
    (tmp_path / "bert-link").symlink_to(tiny_bert_dir)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    members = [{"teacher": str(tiny_bert_dir)}, {"teacher": "minilm"}]
    keys = {"task": "sst2", "data_dir": str(sst2_dir), "augment": "tang", "output": str(run_dir), "teachers": members}
    written = build_config(flags={**keys, "transfer": [str(tmp_path / "extra.txt")]})
    spelt = [f"teachers.0.teacher={tmp_path}/bert-link/", f"transfer=[{tmp_path}/extra-link.txt]", "augment_factor=20"]
    resumed = build_config(flags=keys, overrides=spelt)
    keep_written_spelling(written, resumed, PluginManager())
    check_resume_settings(written, resumed)  # no change
    assert resumed.augment_factor is None and resumed.transfer == written.transfer
    for other in ("augment_factor=10", "teachers.1.teacher=minilm-l12", f"transfer=[{sst2_dir}/train.tsv]"):
        resumed = build_config(flags=keys, overrides=[other])
        keep_written_spelling(written, resumed, PluginManager())
        with pytest.raises(UsageError, match="the options given change what it trains"):
            check_resume_settings(written, resumed)


# -- sweeps, reports and the cache never replace what they did not write --------------------------


def test_a_sweep_and_a_report_never_replace_a_users_files(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("results.md", "results.json", "report.md", "report.html"):
        (mine / name).write_text(f"my own {name}")
    code, _, err = run(
        capsys, "sweep", "--set", f"teacher={tiny_bert_dir}", "--set", "task=sst2", "--set", f"data_dir={sst2_dir}",
        "--grid", "lr=0.001,0.002", "--output", mine,
    )  # fmt: skip
    assert code == 2 and f"--output {mine} holds files kdplug did not write (e.g. report.html)" in err
    run_dir = tmp_path / "run"
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, run_dir))[0] == 0
    code, _, err = run(capsys, "report", run_dir, "--output", mine, "--resamples", "0")
    assert code == 2 and "holds files kdplug did not write" in err
    assert sorted(p.name for p in mine.iterdir()) == ["report.html", "report.md", "results.json", "results.md"]
    assert all((mine / p).read_text() == f"my own {p}" for p in ("results.md", "report.md"))
    report = tmp_path / "report"
    for _ in range(2):  # its own directory, written again
        assert run(capsys, "report", run_dir, "--output", report, "--resamples", "0")[0] == 0
    assert (report / "kdplug_report.json").is_file() and (report / "report.md").is_file()


def test_cache_clear_needs_a_real_key(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run"))[0] == 0
    stored = sorted(p.name for p in cache_root().rglob("*"))
    key = next(p.name for p in (cache_root() / "teachers").iterdir() if p.is_dir())
    for bad, says in (("", "--key is empty"), ("  ", "--key is empty"), (key[:2], "too short to name an entry")):
        code, _, err = run(capsys, "cache", "clear", "--key", bad)
        assert code == 2 and says in err
    assert sorted(p.name for p in cache_root().rglob("*")) == stored  # nothing removed
    code, out, _ = run(capsys, "cache", "clear", "--key", key[:4])
    assert code == 0 and f"removed 1 entries whose key starts with '{key[:4]}'" in out
    assert not (cache_root() / "teachers" / key).exists()

"""Nothing lost, part 2: kdplug never deletes what it did not write, repairs what it stored, and a
failed run leaves a directory that says why (real files, real processes, real permissions)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdplug.cli import main
from kdplug.testing import tiny_run_args


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tiny_argv(teacher, data, output, *extra):
    return ["run", *tiny_run_args(teacher=teacher, task="sst2", data_dir=data), *extra, "--output", output]


def cache_root() -> Path:
    return Path(os.environ["KDPLUG_CACHE"])


# -- the output directory ----------------------------------------------------------------------


def test_overwrite_removes_only_what_a_run_wrote(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    output = tmp_path / "run"
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output))[0] == 0
    (output / "my-notes.txt").write_text("mine")
    (output / "analysis").mkdir()
    (output / "analysis" / "plot.py").write_text("mine too")
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output))
    assert code == 2 and "already holds a run" in err and "--overwrite" in err
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output), "--overwrite")[0] == 0
    assert (output / "my-notes.txt").read_text() == "mine" and (output / "analysis" / "plot.py").is_file()
    assert json.loads((output / "kdplug_run.json").read_text())["status"] == "completed"


def test_a_folder_of_the_users_files_is_never_an_output(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    folder = tmp_path / "documents"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    for extra in ([], ["--overwrite"]):
        code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, folder), *extra)
        assert code == 2 and "files kdplug did not write (e.g. thesis.tex)" in err
    assert [p.name for p in folder.iterdir()] == ["thesis.tex"]


def test_the_data_directory_is_never_an_output(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    before = sorted(p.name for p in sst2_dir.iterdir())
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, sst2_dir), "--overwrite")
    assert code == 2 and "data directory" in err
    assert sorted(p.name for p in sst2_dir.iterdir()) == before


def test_a_failed_run_says_why_and_the_same_command_replaces_it(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    # word vectors of another width than the student's: found once the teacher is loaded, after the
    # run directory was made (bad data is refused before it is made, and leaves none)
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("good 0.1 0.2 0.3\nbad 0.3 0.2 0.1\n")
    output = tmp_path / "run"
    argv = tiny_argv(tiny_bert_dir, sst2_dir, output, "--set", f"student_options.embeddings={vectors}")
    code, _, err = run(capsys, *argv)
    assert code == 2 and "are 3 wide" in err
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["status"] == "failed" and "are 3 wide" in metrics["error"]
    log = (output / "log.txt").read_text()
    assert "the run failed" in log and "Traceback" in log and "are 3 wide" in log
    vectors.write_text("".join(f"{word} {' '.join(['0.1'] * 16)}\n" for word in ("good", "bad", "film")))  # fixed
    code, _, err = run(capsys, *argv)  # the same command replaces the failed run
    assert code == 0, err
    assert json.loads((output / "metrics.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("option", ["--output", "--cache-dir"])
def test_an_unwritable_directory_is_a_usage_error_before_any_work(capsys, tmp_path, tiny_bert_dir, sst2_dir, option):
    # /proc refuses new files even to root: a real read-only location on any Linux machine
    argv = tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run") + [option, "/proc/kdplug-test"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "/proc/kdplug-test" in err and option in err
    assert not (tmp_path / "run").exists()


# -- what kdplug stores ------------------------------------------------------------------------


def test_a_damaged_stored_teacher_is_reported_moved_aside_and_rebuilt(
    capsys, caplog, tmp_path, tiny_bert_dir, sst2_dir
):
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "first"))[0] == 0
    stored = next(p for p in (cache_root() / "teachers").iterdir() if p.is_dir())
    weights = stored / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100] + b"\0" * 100)  # a flipped disk block
    code, out, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "second"))
    assert code == 0, err
    assert "fine-tuning" in out  # not "reusing": the damaged copy is not trusted
    assert any(
        "is damaged" in r.message and "model.safetensors fails its checksum" in r.message for r in caplog.records
    )
    aside = [p for p in (cache_root() / "teachers").iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and (aside[0] / "model.safetensors").is_file()  # kept for inspection
    assert run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "third"))[1].count("reusing") == 1


def test_stored_files_follow_the_users_umask(tmp_path, tiny_bert_dir, sst2_dir):
    script = (
        f"import os, sys; os.umask(0o002); from kdplug.cli import main; "
        f"sys.exit(main({[str(a) for a in tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / 'run')]!r}))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    checked = 0
    for path in cache_root().rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o020, f"{path} is not group-writable ({oct(mode)})"  # a team can share the cache
        checked += 1
    assert checked > 5


def test_two_runs_at_once_fine_tune_the_teacher_once(tmp_path, tiny_bert_dir, sst2_dir):
    commands = [
        [sys.executable, "-m", "kdplug.cli", *map(str, tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / name))]
        for name in ("one", "two")
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), [err for _, err in outputs]
    said = [out for out, _ in outputs]
    assert sum("teacher: fine-tuning" in out for out in said) == 1
    assert sum("reusing the fine-tuned teacher" in out for out in said) == 1
    assert len([p for p in (cache_root() / "teachers").iterdir() if p.is_dir()]) == 1


def test_cache_list_and_clear_find_what_killed_runs_left(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    argv = [sys.executable, "-m", "kdplug.cli", *map(str, tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run"))]
    killed = subprocess.run(
        argv,
        env={**os.environ, "KDPLUG_FAULT_AT": "cache-write:1:SIGKILL"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9
    staging = [p for p in (cache_root() / "teacher-cache").iterdir() if p.name.startswith(".staging-")]
    assert len(staging) == 1
    long_ago = time.time() - 3600
    os.utime(staging[0], (long_ago, long_ago))  # the killed build: an hour old, and no process holds its lock
    code, out, _ = run(capsys, "cache", "list")
    assert code == 0 and "staging folder of a killed run" in out and "kdplug cache clear --stale" in out
    assert "fine-tuned teachers" in out and "task sst2" in out and "stored " in out  # what, for what, when
    code, out, _ = run(capsys, "cache", "clear", "--stale")
    assert code == 0 and "removed 1 stale entries" in out
    assert not staging[0].exists() and any((cache_root() / "teachers").iterdir())  # the teacher stays
    key = next(p.name for p in (cache_root() / "teachers").iterdir() if p.is_dir())
    code, out, _ = run(capsys, "cache", "clear", "--key", key[:8])
    assert code == 0 and not (cache_root() / "teachers" / key).exists()
    assert run(capsys, "cache", "clear", "--key", "nosuchkey")[0] == 2


def test_a_new_run_refuses_a_checkpoints_link_and_leaves_what_it_points_to(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    scratch, output = tmp_path / "scratch", tmp_path / "out"
    (scratch / "teacher").mkdir(parents=True)
    (scratch / "teacher" / "notes.txt").write_text("mine")
    output.mkdir()
    (output / "checkpoints").symlink_to(scratch, target_is_directory=True)
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, output))
    assert code == 2, err
    assert f"{output / 'checkpoints'} is a symbolic link (to {scratch})" in err
    assert (scratch / "teacher" / "notes.txt").read_text() == "mine"
    assert sorted(path.name for path in scratch.rglob("*")) == ["notes.txt", "teacher"]
    assert [path.name for path in output.iterdir()] == ["checkpoints"]


def test_replacing_a_directory_refuses_one_kdplug_did_not_write(tmp_path):
    from kdplug.errors import UsageError
    from kdplug.storage import atomic_directory, replace_directory

    target = tmp_path / "teacher"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    staging = tmp_path / "new"
    staging.mkdir()
    with pytest.raises(UsageError, match=f"{target} holds files kdplug did not write"):
        replace_directory(staging, target)
    assert (target / "notes.txt").read_text() == "mine" and not (tmp_path / "teacher.previous").exists()
    with atomic_directory(tmp_path / "ours", "a copy") as building:  # one kdplug wrote is replaced
        (building / "a.txt").write_text("1")
    with atomic_directory(tmp_path / "ours", "a copy") as building:
        (building / "a.txt").write_text("2")
    assert (tmp_path / "ours" / "a.txt").read_text() == "2"


def test_the_first_line_of_a_run_whose_output_is_a_link_names_the_real_directory(tmp_path):
    from kdplug.engine.pipeline import where_written

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    assert where_written(tmp_path / "link") == f"{tmp_path / 'link'} (a link: written in {tmp_path / 'real'})"
    assert where_written(tmp_path / "real") == str(tmp_path / "real")

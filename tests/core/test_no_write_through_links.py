"""kdplug writes through no symbolic link it did not make, and every staging file is its own
process's: real symlinks, a real directory in a lock's place, two real concurrent predict commands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kdplug.layout import LOCK_FILE

from ..conftest import write_sst2
from .test_nothing_lost import run, tiny_argv

ROWS = 6_000


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_bert_dir, data) -> Path:
    output = tmp_path_factory.mktemp("links") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("links-cache")))
        from kdplug.cli import main

        assert main([str(a) for a in tiny_argv(tiny_bert_dir, data, output)]) == 0
    return output


def a_copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    return copy


# -- the run's lock -------------------------------------------------------------------------------


def test_the_run_lock_is_never_written_through_a_link(capsys, tmp_path, finished_run, tiny_bert_dir, data):
    run_dir = a_copy(finished_run, tmp_path)
    outside = tmp_path / "precious.txt"
    outside.write_text("a file outside the run directory")
    (run_dir / LOCK_FILE).unlink()
    (run_dir / LOCK_FILE).symlink_to(outside)
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, data, run_dir), "--overwrite")
    assert code == 2 and f"{run_dir / LOCK_FILE} is a symbolic link (to {outside})" in err, err
    assert outside.read_text() == "a file outside the run directory"


def test_a_directory_in_the_locks_place_is_a_usage_error(capsys, tmp_path, finished_run, tiny_bert_dir, data):
    run_dir = a_copy(finished_run, tmp_path)
    (run_dir / LOCK_FILE).unlink()
    (run_dir / LOCK_FILE).mkdir()
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, data, run_dir), "--overwrite")
    assert code == 2 and f"the lock file {run_dir / LOCK_FILE} is a directory" in err, err
    assert "Traceback" not in err


def test_a_folder_in_the_place_of_a_runs_file_is_never_deleted_by_overwrite(
    capsys, tmp_path, finished_run, tiny_bert_dir, data
):
    run_dir = a_copy(finished_run, tmp_path)
    (run_dir / "log.txt").unlink()
    (run_dir / "log.txt").mkdir()
    (run_dir / "log.txt" / "notes").write_text("mine")
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, data, run_dir), "--overwrite")
    assert code == 2 and f"{run_dir / 'log.txt'} is a folder, where a run writes a file" in err, err
    assert (run_dir / "log.txt" / "notes").read_text() == "mine"
    assert (run_dir / "metrics.json").is_file()  # nothing of the earlier run was removed either


# -- predict's staging file -----------------------------------------------------------------------


def predict(run_dir: Path, source: Path, output: Path) -> subprocess.Popen:
    argv = ["predict", run_dir, "--input", source, "--output", output, "--overwrite"]
    return subprocess.Popen(
        [sys.executable, "-m", "kdplug.cli", *map(str, argv)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_predicts_to_one_output_each_write_a_whole_file(tmp_path, finished_run):
    sources = {}
    for name in ("a", "b"):
        sources[name] = tmp_path / f"{name}.tsv"
        sources[name].write_text("sentence\n" + "".join(f"text {name}{i} is fine\n" for i in range(ROWS)))
    output = tmp_path / "out" / "predictions.tsv"
    output.parent.mkdir()
    processes = [predict(finished_run, sources[name], output) for name in ("a", "b")]
    results = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], results
    rows = output.read_text().splitlines()[1:]
    inputs = {row.split(" ")[1][0] for row in rows}  # the 'a' or 'b' of 'text a12 is fine'
    assert len(rows) == ROWS and len(inputs) == 1, (len(rows), inputs)  # one command's whole file
    assert [p.name for p in output.parent.iterdir()] == ["predictions.tsv"]  # no staging file left


def test_predict_never_touches_a_users_file_named_like_its_staging_file(capsys, tmp_path, finished_run):
    source = tmp_path / "in.tsv"
    source.write_text("sentence\na fine film\n")
    output = tmp_path / "out" / "predictions.tsv"
    output.parent.mkdir()
    mine = output.parent / ".staging-predictions.tsv"
    mine.write_text("my own notes")
    code, _, err = run(capsys, "predict", finished_run, "--input", source, "--output", output)
    assert code == 0, err
    assert mine.read_text() == "my own notes" and len(output.read_text().splitlines()) == 2
    assert sorted(p.name for p in output.parent.iterdir()) == [".staging-predictions.tsv", "predictions.tsv"]


def test_predict_refuses_a_dangling_link_as_output_without_overwrite(capsys, tmp_path, finished_run):
    (tmp_path / "in.txt").write_text("a fine film\n")
    (tmp_path / "out.tsv").symlink_to(tmp_path / "nowhere")
    code, _, err = run(
        capsys, "predict", finished_run, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.tsv"
    )
    assert code == 2 and "is a symbolic link (to nothing); choose another file or pass --overwrite" in err, err
    assert (tmp_path / "out.tsv").is_symlink()


def test_a_written_file_replaces_a_link_and_leaves_its_target(tmp_path):
    from kdplug.storage import write_atomic

    target = tmp_path / "elsewhere.json"
    target.write_text("not kdplug's")
    (tmp_path / "metrics.json").symlink_to(target)
    write_atomic(tmp_path / "metrics.json", json.dumps({"a": 1}))
    assert target.read_text() == "not kdplug's" and not (tmp_path / "metrics.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.json", "metrics.json"]


# -- export reads nothing from outside the package --------------------------------------------------


@pytest.mark.parametrize("verify", [[], ["--no-verify"]])
def test_export_refuses_a_link_out_of_the_package(capsys, tmp_path, finished_run, verify):
    run_dir = a_copy(finished_run, tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("a private note")
    readme = run_dir / "student" / "README.md"
    readme.unlink()
    readme.symlink_to(secret)
    code, _, err = run(capsys, "export", run_dir, "--format", "hf", "--output", tmp_path / "hf", *verify)
    assert code == 2 and f"holds {readme}, a symbolic link to {secret}, outside the package" in err, err
    assert not (tmp_path / "hf").exists()


def test_a_previous_copy_kdplug_did_not_write_is_never_deleted_in_its_place(tmp_path):
    import kdplug
    from kdplug.storage import atomic_directory

    export = tmp_path / "export"
    for _ in range(2):
        with atomic_directory(export, "an export") as staging:
            (staging / "model.bin").write_bytes(b"weights")
    (tmp_path / "export.previous").mkdir()
    (tmp_path / "export.previous" / "mine.txt").write_text("my own folder")
    with pytest.raises(kdplug.UsageError, match=r"export.previous is in the way: .* it did not write what is there"):
        with atomic_directory(export, "an export") as staging:
            (staging / "model.bin").write_bytes(b"new weights")
    assert (tmp_path / "export.previous" / "mine.txt").read_text() == "my own folder"
    assert (export / "model.bin").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "export.previous"]


def test_predict_blames_output_only_for_its_own_write_failures(tmp_path):
    """An error reading the input (or predicting) inside the output's block is not a failed write of
    --output; a write that reaches the file-size limit is, and leaves nothing behind."""
    import resource
    import signal

    from kdplug.commands.predict import open_output
    from kdplug.errors import KdplugError

    output = tmp_path / "predictions.tsv"
    with pytest.raises(FileNotFoundError):
        with open_output(str(output)) as out:
            out.write("text\tlabel\n")
            (tmp_path / "input-gone.txt").read_text()  # the input, read as it goes, fails
    assert list(tmp_path.iterdir()) == []
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, limits[1]))
    try:
        with pytest.raises(KdplugError, match=f"writing --output {output} failed .*nothing was written there"):
            with open_output(str(output)) as out:
                for _ in range(100):
                    out.write("a row of predictions\t0.5\n" * 40)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert list(tmp_path.iterdir()) == []


def test_predict_refuses_a_package_whose_tokenizer_links_outside_it(capsys, tmp_path, finished_run):
    copy = a_copy(finished_run, tmp_path)
    tokenizer = copy / "student" / "tokenizer.json"
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(tokenizer, elsewhere)  # the same bytes, so the checksums still pass through the link
    tokenizer.symlink_to(elsewhere)
    (tmp_path / "in.txt").write_text("a fine film\n")
    code, out, err = run(capsys, "predict", copy, "--input", tmp_path / "in.txt", "--output", "-")
    assert code == 2, err
    assert f"holds {tokenizer}, a symbolic link to {elsewhere}, outside the package" in err and out == ""


def test_predict_names_staging_files_a_killed_predict_left_and_removes_none(capsys, tmp_path, finished_run):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a process id no process has now
    output = tmp_path / "out" / "predictions.tsv"
    output.parent.mkdir()
    left = output.parent / f".staging-predictions.tsv.{ended.pid}.abcd1234"
    left.write_text("sentence\tlabel\nhalf a ro")
    live = output.parent / f".staging-predictions.tsv.{os.getpid()}.efgh5678"  # a predict running now
    live.write_text("")
    (tmp_path / "in.txt").write_text("a fine film\n")
    code, _, err = run(capsys, "predict", finished_run, "--input", tmp_path / "in.txt", "--output", output)
    assert code == 0, err
    assert f"{left} was left by a kdplug predict that has ended (process {ended.pid})" in err
    assert f"rm {left}" in err and str(live) not in err
    assert left.exists() and live.exists()

"""``kdplug report`` says what data each run read (its folder and a fingerprint of its examples),
never compares data edited in place with its earlier version, shows a run stopped at the teacher
check as stopped, and names its figures briefly and without paths (real tiny runs)."""

from __future__ import annotations

import json
import re

from kdplug.cli import main
from kdplug.fingerprint import of_examples
from kdplug.plugins import PluginManager
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN


def write_local(directory, train, dev):
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        lines = ["text,label"] + [f"{text.replace(',', '')},{'pos' if label else 'neg'}" for text, label in rows]
        (directory / f"{name}.csv").write_text("\n".join(lines) + "\n")
    return directory


def local_run(tiny_bert_dir, data, output, **settings):
    argv = ["run", *tiny_run_args(teacher=tiny_bert_dir, task="local", data_dir=str(data), **settings)]
    return main([*argv, "--set", "measure_speed=false", "--output", str(output)])


def test_the_runs_table_names_the_data_and_stopped_runs_and_figures_are_short(tmp_path, tiny_bert_dir, capsys):
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "nested"
    movies = write_local(deep / "movies", SST2_TRAIN * 3, SST2_DEV)
    hotels = write_local(deep / "hotels", SST2_TRAIN * 3, SST2_DEV[:3])
    assert local_run(tiny_bert_dir, movies, tmp_path / "movies-1") == 0
    assert local_run(tiny_bert_dir, hotels, tmp_path / "hotels-1") == 0
    before = json.loads((tmp_path / "movies-1" / "metrics.json").read_text())["data"]
    write_local(movies, SST2_TRAIN * 3, [(text, 1 - label) for text, label in SST2_DEV])  # edited in place
    assert local_run(tiny_bert_dir, movies, tmp_path / "movies-2", projector="nkd") == 0
    after = json.loads((tmp_path / "movies-2" / "metrics.json").read_text())["data"]
    # stopped at the teacher check: a weak teacher, not allowed
    weak = write_local(deep / "weak", SST2_TRAIN * 3, SST2_DEV * 3)
    assert local_run(tiny_bert_dir, weak, tmp_path / "stopped", allow_weak_teacher=False) == 2
    capsys.readouterr()

    assert before["name"] == after["name"] == "movies" and before["fingerprint"] != after["fingerprint"]
    task = PluginManager().registry.create("task", "local", data_dir=str(movies))
    assert after["fingerprint"] == of_examples({s: task.load_split(s) for s in ("train", "dev")})  # not the path

    runs = [str(tmp_path / name) for name in ("movies-1", "hotels-1", "movies-2", "stopped")]
    out = tmp_path / "report"
    assert main(["report", *runs, "--output", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    table = {line.split("|")[1].strip(): line for line in markdown.splitlines() if line.startswith("| ")}
    assert f"| movies #{before['fingerprint'][:8]} |" in table["movies-1"]
    assert f"| movies #{after['fingerprint'][:8]} |" in table["movies-2"]
    assert "| hotels #" in table["hotels-1"]
    assert (
        "**stopped** (failed)" in table["stopped"] and "0.00" not in table["stopped"] and "0.0K" not in table["stopped"]
    )
    assert "stopped stopped before it finished (failed: " in markdown
    # three data sets, three setups of one method each: the edited data never compared with its earlier version
    assert json.loads((out / "comparisons.json").read_text()) == []
    assert f"local (movies #{before['fingerprint'][:8]})" in markdown and "local (hotels #" in markdown
    drawn = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert drawn and all(len(name) <= 24 and "/" not in name and "folder" not in name for name in drawn), drawn
    assert all((out / name).is_file() for name in drawn)

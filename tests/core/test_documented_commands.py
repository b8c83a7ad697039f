"""Every documented command is one a user will paste: each shell block of README.md and docs/*.md
parses with ``bash -n``, and each ``kdplug run`` line runs with ``--dry-run`` (everything resolved
and checked, nothing trained) against small local stand-ins for what it names: tiny checkpoints
in a Hugging Face cache for hub ids, tiny files in the task's layout for data directories."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from kdplug.cli import main
from kdplug.testing.contracts import write_tiny_sst2
from kdplug.testing.tiny import cache_as_hub_model, make_tiny_bert, make_tiny_roberta
from kdplug_tasks.glue import SPECS

from ..plugin_kit.conftest import write_glue_task

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = re.compile(r"^```(bash|sh|shell)\n(.*?)^```", re.S | re.M)
#: documented commands that continue something a dry run cannot stand in for
NEEDS_A_PREVIOUS_RUN = ("--resume",)


def shell_blocks():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for found in SHELL.finditer(text):
            yield pytest.param(found.group(2), id=f"{page.name}:{text[: found.start()].count(chr(10)) + 1}")


@pytest.mark.parametrize("block", list(shell_blocks()))
def test_every_shell_block_parses(block):
    checked = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert not re.search(r"\\[ \t]+$", block, re.M), "a space after a line-continuation backslash"


def documented_runs():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for found in SHELL.finditer(text):
            line = text[: found.start()].count("\n") + 1
            body = re.sub(r"\\\n", " ", found.group(2))
            for command in body.splitlines():
                for part in re.split(r"&&|;|\|", command):
                    words = shlex.split(part, comments=True)
                    # kdplug run ..., or under a launcher: accelerate launch ... -m kdplug.cli run ...
                    starts = [
                        i + 2
                        for i in range(len(words) - 1)
                        if words[i] in ("kdplug", "kdplug.cli") and words[i + 1] == "run"
                    ]
                    if starts and "..." not in words:
                        args = words[starts[0] :]
                        yield pytest.param(args, id=f"{page.name}:{line}:{' '.join(args)[:60]}")


def option(words, flag):
    values = [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]
    return values[-1] if values else None


def set_values(words):
    return dict(
        words[i + 1].split("=", 1) for i, word in enumerate(words[:-1]) if word == "--set" and "=" in words[i + 1]
    )


def model_stand_in(name: str, hub_cache: Path) -> None:
    """A tiny checkpoint where ``name`` points: a directory, or a hub id in the local cache."""
    make = make_tiny_roberta if "roberta" in name.lower() else make_tiny_bert
    if name.startswith((".", "/", "~")):
        path = Path(name).expanduser()
        if not path.exists():
            make(path, num_layers=4, hidden=32)
    elif "/" in name or name.endswith(("-uncased", "-cased", "-base", "-large")):
        cache_as_hub_model(
            make(hub_cache.parent / "made" / name.replace("/", "--"), num_layers=4, hidden=32), name, hub_cache
        )


def data_stand_in(words, settings) -> None:
    task = option(words, "--task") or settings.get("task") or "demo"
    data_dir = option(words, "--data-dir")
    if data_dir and task in SPECS and not Path(data_dir).exists():
        spec = SPECS[task]
        made = write_glue_task(Path("stand-ins"), spec) if task != "sst2" else write_tiny_sst2("stand-ins/SST-2")
        Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        Path(made).rename(data_dir)
    if task == "local":
        text, label = (
            settings.get("task_options.text_column", "text"),
            settings.get("task_options.label_column", "label"),
        )
        rows = (
            "\n".join(
                [
                    f"{text},{label}",
                    "a great film,positive",
                    "a dull film,negative",
                    "i loved it,positive",
                    "i hated it,negative",
                ]
            )
            + "\n"
        )
        files = [settings.get("task_options.train_file", "train.csv"), settings.get("task_options.dev_file", "dev.csv")]
        for file in files:
            path = Path(data_dir or ".") / file
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_text(rows, encoding="utf-8")


def file_stand_ins(words) -> None:
    config = option(words, "--config")
    if config and not Path(config).exists():
        Path(config).write_text("task: demo\nstudent: bilstm\n", encoding="utf-8")
    transfer = []
    for i, word in enumerate(words):
        if word == "--transfer":  # one or more paths, up to the next option
            for value in words[i + 1 :]:
                if value.startswith("-"):
                    break
                transfer.append(value)
    for path in map(Path, transfer):
        if not path.exists():
            texts = ["what a film", "a lifeless plot", "the acting shines"]
            if path.suffix == ".jsonl":
                content = "\n".join(json.dumps({"text": t}) for t in texts)
            else:  # a table has a header naming its text column; plain text is one text a line
                content = "\n".join(["text", *texts] if path.suffix in (".tsv", ".csv") else texts)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content + "\n", encoding="utf-8")


@pytest.mark.parametrize("words", list(documented_runs()))
def test_every_documented_run_resolves_with_dry_run(words, tmp_path, monkeypatch, capsys):
    if any(flag in words for flag in NEEDS_A_PREVIOUS_RUN):
        pytest.skip("continues an earlier run")
    monkeypatch.chdir(tmp_path)
    hub_cache = tmp_path / "hub-cache" / "hub"
    hub_cache.mkdir(parents=True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache))
    settings = set_values(words)
    from kdplug_models.hf import HUB_TEACHERS

    for flag in ("--teacher", "--student"):
        name = option(words, flag)
        if name:
            model_stand_in(HUB_TEACHERS.get(name, name), hub_cache)
    data_stand_in(words, settings)
    file_stand_ins(words)
    code = main(["run", *words, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, f"kdplug run {' '.join(words)} --dry-run exited {code}:\n{err}"
    assert "the plan (nothing was trained, nothing written)" in out

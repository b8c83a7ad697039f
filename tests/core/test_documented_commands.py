"""Every documented command is one a user will paste: each shell block of README.md and docs/*.md
parses with ``bash -n``, and each ``kdplug run`` line runs with ``--dry-run`` (everything resolved
and checked, nothing trained) against small local stand-ins for what it names: tiny checkpoints
in a Hugging Face cache for hub ids, tiny files in the task's layout for data directories."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kdplug.cli import main
from kdplug.testing import tiny_run_args
from kdplug.testing.contracts import TINY_SST2_DEV, write_tiny_sst2
from kdplug.testing.decoders import make_tiny_causal_lm
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
    values = every_option(words, flag)
    return values[-1] if values else None


def every_option(words, flag):
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]


def set_values(words):
    return dict(
        words[i + 1].split("=", 1) for i, word in enumerate(words[:-1]) if word == "--set" and "=" in words[i + 1]
    )


def model_stand_in(name: str, hub_cache: Path, causal_lm: bool = False) -> None:
    """A tiny checkpoint where ``name`` points: a directory, or a hub id in the local cache; a causal
    language model for the prompted teacher."""
    make = make_tiny_roberta if "roberta" in name.lower() else make_tiny_bert
    if causal_lm:
        make = lambda path, **_: make_tiny_causal_lm(path)  # noqa: E731
    if name.startswith((".", "/", "~")):
        path = Path(name).expanduser()
        if not path.exists():
            make(path, num_layers=4, hidden=32)
    elif "/" in name or name.endswith(("-uncased", "-cased", "-base", "-large")):
        cache_as_hub_model(
            make(hub_cache.parent / "made" / name.replace("/", "--"), num_layers=4, hidden=32), name, hub_cache
        )


#: dev rows a stand-in repeats its few sentences to: enough for the teacher to be judged (at least 10)
STAND_IN_DEV_ROWS = 12


def repeat_dev_rows(directory: Path, spec) -> None:
    """Each dev file of a GLUE stand-in with its rows repeated up to STAND_IN_DEV_ROWS."""
    for split in spec.dev_splits:
        path = directory / f"{split}.tsv"
        lines = path.read_text(encoding="utf-8").splitlines()
        header, rows = ([], lines) if spec.fieldnames else (lines[:1], lines[1:])
        rows = (rows * STAND_IN_DEV_ROWS)[:STAND_IN_DEV_ROWS]
        path.write_text("\n".join(header + rows) + "\n", encoding="utf-8")


def data_stand_in(words, settings) -> None:
    task = option(words, "--task") or settings.get("task") or "demo"
    data_dir = option(words, "--data-dir")
    if data_dir and (ROOT / data_dir).is_dir() and not Path(data_dir).exists():  # shipped: examples/reviews
        Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        Path(data_dir).symlink_to(ROOT / data_dir)
        return
    if data_dir and task in SPECS and not Path(data_dir).exists():
        spec = SPECS[task]
        if task == "sst2":
            made = Path(write_tiny_sst2("stand-ins/SST-2", dev=TINY_SST2_DEV * 3))
        else:
            made = Path(write_glue_task(Path("stand-ins"), spec))
            repeat_dev_rows(made, spec)
        Path(data_dir).parent.mkdir(parents=True, exist_ok=True)
        made.rename(data_dir)
    if task == "local":
        text, label = (
            settings.get("task_options.text_column", "text"),
            settings.get("task_options.label_column", "label"),
        )
        examples = ["a great film,positive", "a dull film,negative", "i loved it,positive", "i hated it,negative"]
        rows = "\n".join([f"{text},{label}", *(examples * 3)]) + "\n"
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
    # one timed step after the warm-up, not three: the estimate runs, and its precision is not what is checked here
    monkeypatch.setattr("kdplug.engine.estimate.TIMED_STEPS", 1)
    hub_cache = tmp_path / "hub-cache" / "hub"
    hub_cache.mkdir(parents=True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache))
    settings = set_values(words)
    from kdplug_models.hf import HUB_TEACHERS

    for flag, name in [("--teacher", name) for name in every_option(words, "--teacher")] + [
        ("--student", option(words, "--student"))
    ]:  # an ensemble's every member
        if flag == "--teacher" and name == "prompted-lm":  # the language model it prompts is its option source
            model_stand_in(settings["teacher_options.source"], hub_cache, causal_lm=True)
        elif flag == "--teacher" and (name or "").startswith("served:"):  # sends no request; reads the tokenizer
            model_stand_in(settings["teacher_options.tokenizer"], hub_cache, causal_lm=True)
        elif name:
            model_stand_in(HUB_TEACHERS.get(name, name), hub_cache)
    for entry in yaml.safe_load(settings.get("teachers", "[]")) or []:  # an ensemble's members
        model_stand_in(HUB_TEACHERS.get(entry["teacher"], entry["teacher"]), hub_cache)
    if settings.get("student_options.source"):  # the pre-trained encoder a student starts from
        model_stand_in(settings["student_options.source"], hub_cache)
    data_stand_in(words, settings)
    file_stand_ins(words)
    code = main(["run", *words, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, f"kdplug run {' '.join(words)} --dry-run exited {code}:\n{err}"
    assert "the plan (nothing was trained, nothing written)" in out


# -- the Python snippets ------------------------------------------------------------------------

PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: an HTML comment on the line before a ```python fence that the docs test honours (invisible on
#: the rendered page): ``<!-- docs-test: skip (why) -->`` for a snippet that cannot run offline in seconds
SKIP_MARKER = re.compile(r"<!-- docs-test: skip \((.+?)\) -->\s*$")
#: a snippet that is a file of a package (``# file: src/...``): tests/plugin_kit/test_docs.py builds and tests them
FILE_SNIPPET = "# file: "


def python_blocks():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for found in PYTHON.finditer(text):
            before = text[: found.start()].rstrip("\n").rsplit("\n", 1)[-1]
            skip = SKIP_MARKER.search(before)
            line = text[: found.start()].count("\n") + 1
            yield pytest.param(page, found.group(1), skip.group(1) if skip else None, id=f"{page.name}:{line}")


def imported_modules(code: str) -> set[str]:
    import ast

    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    return modules


def project_extras() -> tuple[set[str], dict[str, set[str]]]:
    """kdplug's own dependencies and, per extra, what it adds (distribution names, normalised)."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(requirements):
        return {Requirement(r).name.lower().replace("_", "-") for r in requirements}

    extras = {name: names(reqs) for name, reqs in project["optional-dependencies"].items() if name != "test"}
    return names(project["dependencies"]) | {"kdplug"}, extras


@pytest.mark.parametrize("page, code, skip", list(python_blocks()))
def test_every_python_snippet_names_the_extra_it_needs(page, code, skip):
    """A snippet that imports what kdplug's own install lacks (``datasets``) sits on a page that
    names the extra bringing it (``pip install ... ".[glue]"``)."""
    from importlib.metadata import packages_distributions

    if code.startswith(FILE_SNIPPET):
        pytest.skip("a file of the tutorial's own package, with its own dependencies")
    base, extras = project_extras()
    distributions = packages_distributions()
    text = page.read_text(encoding="utf-8")
    for module in imported_modules(code):
        found = {name.lower().replace("_", "-") for name in distributions.get(module, [])}
        if not found or found & base:
            continue  # the standard library, kdplug, or what kdplug installs
        bringing = [extra for extra, names in extras.items() if found & names]
        assert bringing, f"{page.name}: the snippet imports {module}, which no extra of kdplug brings"
        assert any(re.search(rf"\[[\w,]*\b{extra}\b[\w,]*\]", text) for extra in bringing), (
            f"{page.name}: the snippet imports {module}: the page should name the extra {bringing} that brings it"
        )


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory, tiny_bert_dir):
    """What the snippets load: a tiny BiLSTM run on an SST-2 stand-in and a tiny regression run."""
    root = tmp_path_factory.mktemp("documented-runs")
    tiny = tiny_run_args(measure_speed=False)
    runs = {}
    for name, task, data in (
        ("demo", "sst2", write_tiny_sst2(root / "SST-2")),
        ("stsb", "stsb", write_glue_task(root, SPECS["stsb"])),
    ):
        runs[name] = root / "runs" / name
        argv = ["run", "--teacher", tiny_bert_dir, "--task", task, "--data-dir", str(data), *tiny]
        assert main([*argv, "--output", str(runs[name])]) == 0
    return runs


def python_stand_ins(code: str, runs: dict[str, Path]) -> None:
    """In the current directory: every ``runs/...`` the snippet names, and the GLUE directory it reads."""
    for found in set(re.findall(r"[\"'](runs/[\w.-]+)", code)):
        target = runs["stsb"] if "stsb" in found else runs["demo"]
        Path(found).parent.mkdir(parents=True, exist_ok=True)
        if not Path(found).exists():
            Path(found).symlink_to(target, target_is_directory=True)
    for found in set(re.findall(r"data_dir=[\"']([\w./-]+)[\"']", code)):
        if not Path(found).exists():
            write_tiny_sst2(Path(found) / "SST-2")
    for found in set(re.findall(r"[\"'](deploy/onnx)[/\"']", code)):  # an ONNX export of the demo run
        if not Path(found).exists():
            assert main(["export", str(runs["demo"]), "--format", "onnx", "--output", found]) == 0


@pytest.mark.parametrize("page, code, skip", list(python_blocks()))
def test_every_python_snippet_runs(page, code, skip, trained_runs, tmp_path, monkeypatch):
    if skip:
        pytest.skip(skip)
    if code.startswith(FILE_SNIPPET):
        pytest.skip("a file of the tutorial's package: tests/plugin_kit/test_docs.py builds and tests it")
    monkeypatch.chdir(tmp_path)
    python_stand_ins(code, trained_runs)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, f"{page.name} snippet failed:\n{done.stderr[-3000:]}"
    assert "Do you wish to run the custom code" not in done.stdout + done.stderr, (
        f"{page.name} snippet asks to run code"
    )

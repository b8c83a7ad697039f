"""``kdplug check-plugin`` (verdicts, exit codes) and ``kdplug new-plugin`` (a skeleton whose tests pass)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import tomllib

from kdplug.cli import main
from kdplug.testing import contracts

BROKEN_DIST = """
import kdplug
from torch import nn
from kdplug.types import ProjectedPairs

class Forgetful(nn.Module):
    ild_loss, needs_teacher_heads, default_weights = "mse", False, {"eta": 0.5, "lam": 0.3}
    def __init__(self, request):
        super().__init__()
        self.map = nn.Linear(request.student_layers[-1].width, request.teacher_layers[-1].width)
        self.unused = nn.Linear(2, 2)
    def forward(self, inputs):
        return ProjectedPairs(student=self.map(inputs.student_layers[-1]).unsqueeze(1),
                              teacher=inputs.teacher_layers[-1].detach().unsqueeze(1))

@kdplug.hookimpl
def kdplug_register_projectors(register):
    register("forgetful", Forgetful, description="forgets to use a parameter")
"""


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def broken_dist(tmp_path, monkeypatch):
    """An installed distribution (module + dist-info with an entry point) whose projector is broken."""
    (tmp_path / "kdplug_forgetful.py").write_text(textwrap.dedent(BROKEN_DIST))
    info = tmp_path / "kdplug_forgetful-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kdplug-forgetful\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kdplug]\nforgetful = kdplug_forgetful\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    importlib.invalidate_caches()


# -- check-plugin --------------------------------------------------------------------------------


def test_a_passing_projector_exits_0_with_a_verdict(capsys):
    code, out, _ = run_cli(capsys, "check-plugin", "pkd-skip")
    assert code == 0
    assert "projector 'pkd-skip' (plugin 'pkd' (kdplug" in out
    assert "PASS  gradients reach every parameter" in out and "verdict: PASSED" in out


def test_a_failing_plugin_exits_1_naming_the_check_and_why(capsys, broken_dist):
    code, out, _ = run_cli(capsys, "check-plugin", "kdplug-forgetful")  # by distribution name
    assert code == 1
    assert "kdplug-forgetful 1.0" in out
    line = next(row for row in out.splitlines() if "gradients reach every parameter" in row)
    assert line.lstrip().startswith("FAIL") and "unused.weight (no gradient)" in line
    assert "verdict: FAILED, 1 of 11 checks failed: gradients reach every parameter" in out


def test_a_plugin_name_checks_all_its_components(capsys):
    code, out, _ = run_cli(capsys, "check-plugin", "pkd", "--kind", "projector")
    assert code == 0
    assert "projector 'pkd-skip'" in out and "projector 'pkd-last'" in out
    assert "2 components: 2 passed, 0 failed" in out


def test_projector_options_are_passed_to_the_factory(capsys):
    code, out, _ = run_cli(capsys, "check-plugin", "pkd-skip", "--option", "layer_map=[1]")
    assert code == 1  # one mapped layer fits only the students with two layers
    assert "layer_map must list one teacher layer" in out and "FAIL  builds for the layer shapes" in out


def test_unknown_name_exits_2_with_a_suggestion(capsys):
    code, _, err = run_cli(capsys, "check-plugin", "pkd-skp")
    assert code == 2 and "Did you mean 'pkd-skip'" in err


def test_a_task_needs_its_data_dir(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "check-plugin", "sst2", "--kind", "task")
    assert code == 1 and "verdict: NOT CHECKED, needs data" in out
    data = contracts.write_tiny_sst2(tmp_path / "SST-2")
    code, out, _ = run_cli(capsys, "check-plugin", "sst2", "--kind", "task", "--data-dir", data)
    assert code == 0 and "PASS  labels in range" in out


def test_json_output(capsys):
    code, out, _ = run_cli(capsys, "check-plugin", "mse", "--json")
    (report,) = json.loads(out)
    assert code == 0 and report["kind"] == "loss" and report["ok"]
    assert {"check": "zero for identical inputs", "status": "passed", "detail": "", "case": ""} in report["results"]


# A plugin that is installed (its entry point is there) but whose module does not import.
UNIMPORTABLE = {
    "missing dependency": (
        "import kdplug\nimport kdplug_no_such_dependency\n",
        "ModuleNotFoundError: No module named 'kdplug_no_such_dependency' (at {module}:2)",
        "install the package that provides the missing module (a dependency of kdplug-unimportable)",
    ),
    "syntax error": (
        "import kdplug\n\ndef register(:\n    pass\n",
        "SyntaxError: invalid syntax (at {module}:3)",
        "fix the error at that line",
    ),
}


def check_plugin_in_a_child(site, *argv):
    """``kdplug check-plugin`` in a fresh process that sees the distributions installed in ``site``."""
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "kdplug.cli", *argv],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("fault", sorted(UNIMPORTABLE))
@pytest.mark.parametrize("name", ["unimportable", "kdplug-unimportable"])  # entry-point and distribution names
def test_a_plugin_that_fails_to_import_is_found_and_its_error_shown(tmp_path, fault, name):
    source, error, advice = UNIMPORTABLE[fault]
    module = tmp_path / "kdplug_unimportable.py"
    module.write_text(source)
    info = tmp_path / "kdplug_unimportable-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kdplug-unimportable\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kdplug]\nunimportable = kdplug_unimportable\n")
    result = check_plugin_in_a_child(tmp_path, "check-plugin", name)
    assert result.returncode == 1, result.stderr  # the plugin exists: not an unknown name (2), a failed check
    assert (
        "plugin 'unimportable' (entry point 'unimportable = kdplug_unimportable' of kdplug-unimportable) "
        "was found but failed to import: " + error.format(module=module) + ". To check it, " + advice
    ) in result.stderr
    assert "no component, plugin or distribution" not in result.stderr and "Traceback" not in result.stderr


def test_an_unknown_name_mentions_the_plugins_that_failed_to_load_and_a_disabled_one_says_so(tmp_path):
    (tmp_path / "kdplug_unimportable.py").write_text(UNIMPORTABLE["missing dependency"][0])
    info = tmp_path / "kdplug_unimportable-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kdplug-unimportable\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kdplug]\nunimportable = kdplug_unimportable\n")
    unknown = check_plugin_in_a_child(tmp_path, "check-plugin", "its-projector")  # a name inside the broken module
    assert unknown.returncode == 2
    assert "Plugins that failed to load may provide it: 'unimportable' ('kdplug plugins' says why)" in unknown.stderr
    disabled = check_plugin_in_a_child(tmp_path, "--disable-plugin", "pkd", "check-plugin", "pkd")
    assert disabled.returncode == 2
    assert "plugin 'pkd' is disabled (--disable-plugin or KDPLUG_DISABLE_PLUGINS): enable it to check it" in (
        disabled.stderr
    )


# -- new-plugin ----------------------------------------------------------------------------------

SKELETON_FILES = {
    "projector": ["src/kdplug_fit_hints/projector.py"],
    "loss": ["src/kdplug_fit_hints/loss.py"],
    "student": ["src/kdplug_fit_hints/student.py"],
    "teacher": ["src/kdplug_fit_hints/teacher.py"],
    "task": ["src/kdplug_fit_hints/task.py", "tests/data/dev.jsonl", "tests/data/train.jsonl"],
    "recipe": ["src/kdplug_fit_hints/recipe.py"],
    "augmenter": ["src/kdplug_fit_hints/augmenter.py"],
}


@pytest.mark.parametrize("kind", sorted(SKELETON_FILES))
def test_new_plugin_writes_a_skeleton_of_each_kind(capsys, tmp_path, kind):
    """The files and the entry point; that the skeleton's own tests pass as generated is checked
    once it is installed, as its author installs it (.ci/plugin-kit.sh, run by test_distribution.py)."""
    target = tmp_path / "kdplug-fit-hints"
    code, out, _ = run_cli(capsys, "new-plugin", "fit-hints", "--kind", kind, "--output", str(target))
    assert code == 0 and "pip install -e ." in out
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == sorted(
        [
            "README.md",
            "pyproject.toml",
            "src/kdplug_fit_hints/__init__.py",
            "tests/conftest.py",
            "tests/test_kdplug_fit_hints.py",
            *SKELETON_FILES[kind],
        ]
    )
    project = tomllib.loads((target / "pyproject.toml").read_text())
    assert project["project"]["name"] == "kdplug-fit-hints"
    assert project["project"]["entry-points"]["kdplug"] == {"fit-hints": f"kdplug_fit_hints.{kind}"}
    assert project["project"]["dependencies"] == ["kdplug>=0.1"]
    assert "${" not in "".join((target / f).read_text() for f in files)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["new-plugin", "alp"], "already registered by plugin 'alp'"),
        (["new-plugin", "My_Proj"], "lowercase letters and digits"),
    ],
)
def test_new_plugin_refuses_bad_or_taken_names(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, *argv, "--output", str(tmp_path / "out"))
    assert code == 2 and message in err
    assert not (tmp_path / "out").exists()


def test_new_plugin_does_not_overwrite(capsys, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    code, _, err = run_cli(capsys, "new-plugin", "fit-hints", "--output", str(tmp_path))
    assert code == 2 and "not empty" in err and (tmp_path / "keep.txt").read_text() == "mine"


# -- the pytest plugin reports a broken contract -------------------------------------------------


def test_contract_classes_report_the_failed_check(tmp_path):
    (tmp_path / "kdplug_forgetful.py").write_text(textwrap.dedent(BROKEN_DIST))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["kdplug.testing.pytest_plugin"]\n')
    (tmp_path / "test_forgetful.py").write_text(
        textwrap.dedent("""
        from kdplug.testing.pytest_plugin import ProjectorContract

        class TestForgetful(ProjectorContract):
            name = "forgetful"
            plugin = "kdplug_forgetful"
    """)
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 1
    assert "5 failed" in result.stdout  # one per shape of the grid
    assert (
        "FAILED test_forgetful.py::TestForgetful::test_contract[12x768-4x384-gradients-reach-every-parameter]"
        in result.stdout
    )
    assert (
        "projector 'forgetful' failed the check 'gradients reach every parameter' on 12x768-4x384: "
        "2 of 4 parameters got no useful gradient from the ILD loss: unused.weight (no gradient)"
    ) in result.stdout

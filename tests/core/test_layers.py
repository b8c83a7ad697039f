"""The layers hold, by contract: the core never imports a plugin, plugins import only kdplug's public
modules (an allow-list), commands sit on the engine, and no module of kdplug imports the package
root (import-linter contracts in pyproject.toml, checked here on the project and on a violation)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import tomllib

import kdplug
import kdplug.api

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PACKAGES = ["kdplug_models", "kdplug_methods", "kdplug_tasks", "kdplug_recipes", "kdplug_augment"]


def lint_imports(*args, cwd=ROOT, pythonpath=()):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(ROOT), str(ROOT / "plugins")])}
    command = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", command, "--no-cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def project_contracts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def as_toml(config: dict) -> str:
    """``[tool.importlinter]`` with its contracts: strings and lists of strings, as JSON writes them."""

    def table(values: dict) -> list[str]:
        return [f"{key} = {json.dumps(value)}" for key, value in values.items()]

    lines = ["[tool.importlinter]", *table({k: v for k, v in config.items() if k != "contracts"})]
    for contract in config["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]", *table(contract)]
    return "\n".join(lines) + "\n"


def test_the_contracts_hold():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_every_module_of_kdplug_has_its_layer():
    layers = next(c for c in project_contracts()["contracts"] if c["type"] == "layers")["layers"]
    placed = {module.strip() for layer in layers for module in layer.split(":")}
    modules = {f"kdplug.{path.stem}" for path in (ROOT / "kdplug").glob("*.py") if path.stem != "__init__"}
    packages = {f"kdplug.{path.parent.name}" for path in (ROOT / "kdplug").glob("*/__init__.py")}
    assert modules | packages <= placed, sorted((modules | packages) - placed)


def test_the_allow_list_is_the_public_api():
    contract = next(c for c in project_contracts()["contracts"] if c["type"] == "public_api")
    assert set(contract["source_modules"]) == set(PLUGIN_PACKAGES)
    listed = set(contract["public_modules"])
    assert listed == set(kdplug.api.PUBLIC_MODULES) - {"kdplug.testing"} | {"kdplug.testing.**"}


@pytest.mark.parametrize(
    "line, imported",
    [
        ("from kdplug.engine.cache import TeacherCache", "kdplug.engine.cache"),  # the engine
        ("from kdplug.launchers import submitit_executor", "kdplug.launchers"),  # a module no deny-list named
        ("from kdplug.config import RunConfig", "kdplug.config"),
    ],
)
def test_a_plugin_that_imports_a_private_module_breaks_the_projects_own_contracts(tmp_path, line, imported):
    package = tmp_path / "kdplug_badplugin"
    package.mkdir()
    (package / "__init__.py").write_text(f"import kdplug.api\n{line}  # private\n")
    config = project_contracts()
    config["root_packages"] = [*config["root_packages"], "kdplug_badplugin"]
    for contract in config["contracts"]:
        if contract["type"] == "public_api":
            contract["source_modules"] = [*contract["source_modules"], "kdplug_badplugin"]
    (tmp_path / "contracts.toml").write_text(as_toml(config))
    result = lint_imports("--config", str(tmp_path / "contracts.toml"), cwd=tmp_path, pythonpath=[tmp_path])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Plugins import only kdplug's public modules BROKEN" in result.stdout
    assert f"kdplug_badplugin -> {imported} (l.2): not a public module" in result.stdout
    assert "kdplug_badplugin -> kdplug.api" not in result.stdout  # the public API is fine


def test_no_module_of_kdplug_imports_the_package_root():
    graph = grimp.build_graph("kdplug")
    importers = sorted(graph.find_modules_that_directly_import("kdplug"))
    assert importers == [], importers


def test_the_public_api_is_one_import_away():
    for name in kdplug.api.__all__:
        assert hasattr(kdplug.api, name), name
        assert getattr(kdplug, name) is getattr(kdplug.api, name), name  # the root re-exports it unchanged
    # what the first-party plugins use is all there
    for name in (
        "hookimpl",
        "StepState",
        "Teacher",
        "LayerSpec",
        "file_lock",
        "atomic_directory",
        "fingerprint",
        "RecipeContext",
        "Weights",
        "Settings",
        "StageResult",
    ):
        assert name in kdplug.api.__all__
    assert kdplug.Student is kdplug.api.Student and kdplug.LoadedStudent is not kdplug.Student

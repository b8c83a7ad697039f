"""The layers hold: the core never imports a plugin, plugins use only the public API, commands sit
on the engine (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kdplug
import kdplug.api

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(*args, cwd=ROOT, pythonpath=()):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(ROOT), str(ROOT / "plugins")])}
    command = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", command, "--no-cache", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_contracts_hold():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_a_plugin_that_imports_the_engine_breaks_the_contract(tmp_path):
    package = tmp_path / "kdplug_badplugin"
    package.mkdir()
    (package / "__init__.py").write_text("from kdplug.engine.cache import TeacherCache  # private\n")
    config = tmp_path / "contracts.ini"
    config.write_text(textwrap.dedent("""
        [importlinter]
        root_packages =
            kdplug
            kdplug_badplugin

        [importlinter:contract:public-api]
        name = Plugins use only kdplug's public API
        type = forbidden
        source_modules = kdplug_badplugin
        forbidden_modules = kdplug.engine
        allow_indirect_imports = true
    """))
    result = lint_imports("--config", str(config), cwd=tmp_path, pythonpath=[tmp_path])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and "kdplug_badplugin -> kdplug.engine.cache" in result.stdout


def test_the_public_api_is_one_import_away():
    for name in kdplug.api.__all__:
        assert hasattr(kdplug.api, name), name
    # what the first-party plugins use is all there
    for name in ("hookimpl", "StepState", "Teacher", "LayerSpec", "file_lock", "atomic_directory", "fingerprint"):
        assert name in kdplug.api.__all__

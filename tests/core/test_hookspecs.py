"""Every hook is documented in the contract and in docs/hooks.md, and exercised by a test."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kdplug import hookspecs
from kdplug.registry import KINDS

ROOT = Path(__file__).resolve().parents[2]
HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("kdplug_"))


def test_every_hook_is_a_registry_kind():
    assert sorted(KINDS.values()) == HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_docstring_says_when_parameters_and_returns(hook):
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert "When:" in doc, f"{hook}: say when the hook is called"
    assert "Parameters:" in doc, f"{hook}: document each parameter"
    assert "return" in doc.lower(), f"{hook}: say what the factory returns"
    for parameter in inspect.signature(getattr(hookspecs, hook)).parameters:
        assert f"{parameter}:" in doc, f"{hook}: parameter {parameter!r} is not documented"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_in_docs_hooks_md(hook):
    page = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    assert f"## `{hook}(" in page, f"docs/hooks.md has no section for {hook}"
    assert inspect.getdoc(getattr(hookspecs, hook)) in page, f"docs/hooks.md is out of date for {hook}"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_exercised_by_a_test(hook):
    """Some test other than this file registers or calls components of this hook's kind."""
    kind = next(kind for kind, name in KINDS.items() if name == hook)
    needles = (hook, f"create_{kind}", f"list_{kind}", f'"{kind}"')
    this = Path(__file__).resolve()
    found = [
        path
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.resolve() != this and any(n in path.read_text(encoding="utf-8") for n in needles)
    ]
    assert found, f"no test exercises {hook}"

"""The engine does not know its plugins by name: what it says to users (its strings, docstrings
aside) names no first-party component; a list of them comes from the registry, or the message
points at ``kdplug plugins``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kdplug

ROOT = Path(__file__).resolve().parents[2]
#: the modules already free of plugin names (grow it as others are cleaned)
CLEAN = ["kdplug/engine/preflight.py", "kdplug/commands/cache.py", "kdplug/engine/pipeline.py"]
#: registered names that are ordinary words in a message
WORDS = {"hf", "local", "standard", "demo", "kd", "ce", "mse", "kl", "dist"}


def first_party_names() -> set[str]:
    names = {entry.name for entry in kdplug.get_plugin_manager().registry if entry.distribution.lower() == "kdplug"}
    return {name for name in names if name not in WORDS and "{" not in name}


def strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


@pytest.mark.parametrize("module", CLEAN)
def test_the_engines_text_names_no_plugin(module):
    names = first_party_names()
    assert {"rkd", "bilstm", "alp", "takd"} <= names  # the check has names to look for
    pattern = re.compile(
        r"(?<![\w-])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")(?![\w-])"
    )
    found = [f"{module}:{line}: {match.group(1)!r} in {text!r}" for line, text in strings(ROOT / module)
             for match in pattern.finditer(text)]  # fmt: skip
    assert not found, "\n".join(found)

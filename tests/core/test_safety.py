"""Nothing is unpickled from files: a static check over the shipped code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("kdplug", "plugins") for p in (ROOT / d).rglob("*.py")]


def test_torch_load_always_sets_weights_only():
    for path in SOURCES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if re.search(r"\btorch\.load\(", line) and not line.lstrip().startswith(("#", "``")) and "``" not in line:
                assert "weights_only=True" in line, f"{path}:{number}: torch.load without weights_only=True"


def test_no_pickle_imports():
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|from)\s+(c?pickle|dill|joblib)\b", text, re.M), f"{path} imports a pickler"


def test_remote_code_is_opt_in():
    """kdplug never passes ``trust_remote_code=True`` itself (a user's option may): no call in the
    shipped code sets it to a true constant. Text that tells a user how to load a package (a model
    card's example) is not a call."""
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "trust_remote_code":
                        value = keyword.value
                        assert not (isinstance(value, ast.Constant) and value.value), f"{path}:{node.lineno}"

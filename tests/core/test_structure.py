"""The size limits and the shape of the code, kept by a test rather than by trimming prose.

No module over 600 lines and no function over 80 in kdplug/, plugins/ or benchmarks/; no circle of
imports among the modules of kdplug or of a plugin package (module-level imports, those under
TYPE_CHECKING included; not those inside a function); no ``getattr``/``hasattr`` of a declared capability's name
outside kdplug/capabilities.py (the engine reads them through ``capabilities()``). The checks are
benchmarks/structure_report.py's (which prints the same measures, and says what counts as what);
each one is shown to fail on a planted violation. The layers themselves are import-linter's
(tests/core/test_layers.py); ruff keeps the style (tests/core/test_style.py).
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("structure_report", ROOT / "benchmarks" / "structure_report.py")
structure = sys.modules.setdefault("structure_report", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(structure)

#: what breaks a limit today, each with the work that removes it: the test fails on anything else,
#: and on an entry that is gone (delete it then, so that it cannot hide a new one)
KNOWN: set[str] = set()


def violations(root: Path) -> list[str]:
    """What breaks a limit under ``root``, one line each, as KNOWN names it."""
    trees = structure.parsed(root)
    found = [f"module {f.path}" for f in structure.long_modules(trees)]
    found += [f"function {f.path} {f.what.split(':')[0]}" for f in structure.long_functions(trees)]
    found += [f"circle {' '.join(circle)}" for circle in structure.import_circles(root)]
    names = structure.declared_capabilities(root / "kdplug" / "capabilities.py")
    found += [f"capability read {f}" for f in structure.unwaived(structure.capability_reads(trees, names))]
    return found


def test_the_code_keeps_its_limits():
    found = violations(ROOT)
    over = sorted(set(found) - KNOWN)
    assert not over, "over a limit (benchmarks/structure_report.py says more):\n" + "\n".join(over)
    fixed = sorted(KNOWN - set(found))
    assert not fixed, "fixed: delete these entries of KNOWN:\n" + "\n".join(fixed)


CAPABILITIES_PY = """
class Capabilities:
    stores: dict = {}


class ProjectorCapabilities(Capabilities):
    ild_loss: str = None
"""

PLANTED = {
    "a module over 600 lines": (
        {"kdplug/big.py": "x = 1\n" * 601},
        "module kdplug/big.py",
    ),
    "a function over 80 lines": (
        {"plugins/kdplug_things/long.py": "def long():\n" + "    x = 1\n" * 80},
        "function plugins/kdplug_things/long.py long",
    ),
    "a benchmark's function over 80 lines": (
        {"benchmarks/slow.py": "@decorated\ndef main():\n" + "    x = 1\n" * 79},
        "function benchmarks/slow.py main",
    ),
    "a circle of top-level imports": (
        {"kdplug/engine/a.py": "from . import b\n", "kdplug/engine/b.py": "from .a import thing\n"},
        "circle kdplug.engine.a kdplug.engine.b",
    ),
    "a circle through TYPE_CHECKING": (
        {
            "kdplug/engine/a.py": "from .b import thing\n",
            "kdplug/engine/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
            "kdplug/engine/c.py": "import kdplug.engine.a\n",
        },
        "circle kdplug.engine.a kdplug.engine.b kdplug.engine.c",
    ),
    "a circle in a plugin package": (
        {
            "plugins/kdplug_things/a.py": "from .b import x\n",
            "plugins/kdplug_things/b.py": "from kdplug_things.a import y\n",
        },
        "circle kdplug_things.a kdplug_things.b",
    ),
    "a getattr of a declared capability": (
        {"kdplug/engine/stage.py": "def f(projector):\n    return getattr(projector, 'ild_loss', None)\n"},
        "capability read kdplug/engine/stage.py:2: getattr(projector, 'ild_loss', None)",
    ),
    "a hasattr of a declared capability, in a plugin": (
        {"plugins/kdplug_things/p.py": "def f(component):\n    return hasattr(component, 'stores')\n"},
        "capability read plugins/kdplug_things/p.py:2: hasattr(component, 'stores')",
    ),
}


def plant(root: Path, files: dict[str, str]) -> None:
    """A tree shaped like kdplug's, with ``files`` in it besides a clean package."""
    base = {
        "kdplug/__init__.py": "",
        "kdplug/capabilities.py": CAPABILITIES_PY,
        "kdplug/engine/__init__.py": "",
        "kdplug/engine/ok.py": "from ..capabilities import ProjectorCapabilities\n",
        "plugins/kdplug_things/__init__.py": "",
        "benchmarks/bench.py": "def main():\n    pass\n",
    }
    for path, text in {**base, **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_clean_tree_passes(tmp_path):
    plant(tmp_path, {"kdplug/engine/reads.py": "def f(tokenizer):\n    return getattr(tokenizer, 'unk_token', None)\n"})
    assert violations(tmp_path) == []


@pytest.mark.parametrize("case", PLANTED, ids=list(PLANTED))
def test_a_planted_violation_is_found(tmp_path, case):
    files, expected = PLANTED[case]
    plant(tmp_path, files)
    assert violations(tmp_path) == [expected]


def test_an_import_inside_a_function_makes_no_circle_but_is_reported(tmp_path):
    """A lazy import (torch, a re-export) runs after every module has loaded."""
    plant(
        tmp_path,
        {"kdplug/a.py": "from kdplug.engine import b\n", "kdplug/engine/b.py": "def f():\n    from ..a import thing\n"},
    )
    assert violations(tmp_path) == []
    every = (structure.AT_IMPORT, structure.TYPING, structure.DEFERRED)
    assert structure.import_circles(tmp_path, every) == [["kdplug.a", "kdplug.engine.b"]]


def test_a_read_of_another_objects_attribute_passes_only_where_it_says_so(tmp_path):
    line = "    return getattr(tokenizer, 'ild_loss', None)"
    plant(tmp_path, {"kdplug/t.py": f"def f(tokenizer):\n{line}  # not through capabilities(): the tokenizer's own\n"})
    assert violations(tmp_path) == []
    plant(tmp_path, {"kdplug/t.py": f"def f(tokenizer):\n{line}\n"})
    assert violations(tmp_path) == ["capability read kdplug/t.py:2: getattr(tokenizer, 'ild_loss', None)"]


def test_the_architecture_page_names_every_module_of_the_engine():
    """docs/architecture.md groups the engine's modules by what they do; a module it does not name is
    one a newcomer cannot place (wherever the engine's folders put it: the page names modules)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = {path.stem for path in (ROOT / "kdplug" / "engine").rglob("*.py") if path.stem != "__init__"}
    assert sorted(name for name in modules if f"`{name}`" not in page) == []


def test_the_report_says_why_it_cannot_measure_a_folder(tmp_path, capsys):
    assert structure.main([str(tmp_path)]) == 2  # not a kdplug checkout
    assert "is not a kdplug checkout (no kdplug/capabilities.py)" in capsys.readouterr().err
    (tmp_path / "kdplug").mkdir()
    (tmp_path / "kdplug" / "capabilities.py").write_text(CAPABILITIES_PY)
    (tmp_path / "kdplug" / "bad.py").write_text("def f(:\n")
    assert structure.main([str(tmp_path)]) == 2
    assert "bad.py:1: invalid syntax; fix it to measure" in capsys.readouterr().err

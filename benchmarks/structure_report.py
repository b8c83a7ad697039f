"""The code's size and shape: the measures the size limits are kept by, read from the source with ``ast``.

Prints the modules over 600 lines, the functions over 80 and over 60 lines, the classes over 300,
the circles of imports among the modules of each package, the ``getattr`` reads of a declared
capability outside kdplug/capabilities.py, and the lines of the engine's largest modules.
tests/core/test_structure.py runs the same functions and fails on what breaks a limit.

    python benchmarks/structure_report.py [ROOT]    # ROOT: a checkout of kdplug (default: this one)

What counts as an import, for the circles: an ``import`` or ``from ... import`` at a module's top
level (inside a top-level ``if``/``try``/``with`` too) and one under ``if TYPE_CHECKING:``. The second
never runs, but the module still needs the other to be read: a circle hidden under TYPE_CHECKING is
still two modules that each need the other (the issue's inputs -> recipe -> stage -> recipe). An
import inside a function does not count: it is how kdplug loads a module lazily (torch, which
``kdplug --help`` need not load; ``kdplug.types.RecipeContext``, re-exported from the module built on
those types), and it runs after every module has loaded. The report prints the circles they would
add, so that they stay visible.
``from package import name`` imports ``package.name`` where that is a module, else ``package``.
Importing a module also runs its parents' ``__init__``; like import-linter, the graph leaves those
edges out.

What counts as a capability read: ``getattr(x, "name", ...)`` or ``hasattr(x, "name")`` with a name
that a class of kdplug/capabilities.py declares. The engine reads those through ``capabilities()``,
which refuses a misspelt name instead of reading its default for ever. A few declared names are also
other objects' own attributes (a tokenizer's ``mask_token``, a teacher's ``tokenizer`` field), and a
contract test checks what a component itself declares, not its default; such a read says why on its
line or the line above, ``# not through capabilities(): <why>``, which the check accepts and the
report counts.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kdplug", "plugins", "benchmarks")
MODULE_LIMIT, FUNCTION_LIMIT, CLASS_LIMIT = 600, 80, 300
WAIVER = "# not through capabilities():"
WATCHED = (
    "kdplug/engine/recipe.py",
    "kdplug/engine/plan.py",
    "kdplug/engine/shares.py",
    "kdplug/engine/cache.py",
    "plugins/kdplug_models/hf.py",
)


@dataclass(frozen=True)
class Found:
    """One place in the source: ``path:line``, and what is there."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def python_files(root: Path, folders: Iterable[str] = SOURCES) -> Iterator[Path]:
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if "skeleton" not in path.relative_to(root).parts:  # kdplug.testing's templates are not code
                yield path


@dataclass(frozen=True)
class Source:
    """A Python file: its lines, its tree, and the nodes the checks look at (one walk of the tree)."""

    lines: list[str]
    tree: ast.Module
    functions: list[ast.AST]
    classes: list[ast.ClassDef]
    calls: list[ast.Call]


def read(path: Path) -> Source:
    return _walked(path.read_text(encoding="utf-8"), str(path))


@functools.cache
def _walked(text: str, filename: str) -> Source:
    """A file's text, parsed and walked once per process (the checks look at the same files)."""
    tree = ast.parse(text, filename)
    functions, classes, calls = [], [], []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append(node)
        elif isinstance(node, ast.ClassDef):
            classes.append(node)
        elif isinstance(node, ast.Call):
            calls.append(node)
    return Source(text.splitlines(), tree, functions, classes, calls)


def parsed(root: Path, folders: Iterable[str] = SOURCES) -> dict[str, Source]:
    """Each Python file under ``folders``, by its path relative to ``root``."""
    return {path.relative_to(root).as_posix(): read(path) for path in python_files(root, folders)}


def long_modules(trees: dict[str, Source], limit: int = MODULE_LIMIT) -> list[Found]:
    return [Found(path, len(s.lines), f"{len(s.lines)} lines") for path, s in trees.items() if len(s.lines) > limit]


def _span(node: ast.AST) -> int:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return node.end_lineno - first + 1


def _longer(trees: dict[str, Source], kind: str, limit: int) -> list[Found]:
    return [
        Found(path, node.lineno, f"{node.name}: {_span(node)} lines")
        for path, source in trees.items()
        for node in getattr(source, kind)
        if _span(node) > limit
    ]


def long_functions(trees: dict[str, Source], limit: int = FUNCTION_LIMIT) -> list[Found]:
    """The functions longer than ``limit`` lines, decorators and docstring included."""
    return _longer(trees, "functions", limit)


def long_classes(trees: dict[str, Source], limit: int = CLASS_LIMIT) -> list[Found]:
    return _longer(trees, "classes", limit)


def declared_capabilities(capabilities_py: Path) -> frozenset[str]:
    """The names the classes of kdplug/capabilities.py declare (their annotated attributes)."""
    tree = ast.parse(capabilities_py.read_text(encoding="utf-8"))
    return frozenset(
        statement.target.id
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name.endswith("Capabilities")
        for statement in node.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    )


def capability_reads(trees: dict, names: frozenset[str], exempt: str = "kdplug/capabilities.py") -> list[Found]:
    """``getattr``/``hasattr`` calls that read a declared capability by its name (waived ones marked)."""
    found = []
    for path, source in trees.items():
        if path == exempt:
            continue
        for node in source.calls:
            if not isinstance(node.func, ast.Name) or node.func.id not in ("getattr", "hasattr") or len(node.args) < 2:
                continue
            name = node.args[1]
            if isinstance(name, ast.Constant) and name.value in names:
                lines = source.lines
                waived = any(WAIVER in lines[i - 1] for i in range(max(1, node.lineno - 1), node.end_lineno + 1))
                found.append(Found(path, node.lineno, ("waived " if waived else "") + ast.unparse(node)))
    return found


def unwaived(found: list[Found]) -> list[Found]:
    return [f for f in found if not f.what.startswith("waived ")]


# --- imports -----------------------------------------------------------------------------------------------


def packages(root: Path) -> dict[str, Path]:
    """The packages whose modules may not import each other in a circle: kdplug and each plugin package."""
    found = {"kdplug": root / "kdplug"}
    for init in sorted((root / "plugins").glob("*/__init__.py")):
        found[init.parent.name] = init.parent
    return found


def module_names(package: str, folder: Path) -> dict[str, Path]:
    names = {}
    for path in sorted(folder.rglob("*.py")):
        if "skeleton" in path.relative_to(folder).parts:
            continue
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


#: how an import runs: when the module is imported, only for a type checker, or when a function is called
AT_IMPORT, TYPING, DEFERRED = "import", "typing", "deferred"


def import_statements(tree: ast.Module) -> Iterator[tuple[ast.stmt, str]]:
    """Each import statement, with how it runs (see the module's docstring)."""

    def walk(statements: list[ast.stmt], how: str) -> Iterator[tuple[ast.stmt, str]]:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, how
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(node.body, DEFERRED)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.body, DEFERRED if how == DEFERRED else TYPING)
                yield from walk(node.orelse, how)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, field, None) or []
                    yield from walk([c for c in children if isinstance(c, ast.AST)], how)

    return walk(tree.body, AT_IMPORT)


def imported_modules(module: str, is_package: bool, node: ast.stmt, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``node``, in ``module``, imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join([*here, *([base] if base else [])])
    modules = {f"{base}.{alias.name}" for alias in node.names}
    return (modules & known) | ({base} & known if modules - known else set())


def import_graph(package: str, folder: Path, kinds: Iterable[str]) -> dict[str, set[str]]:
    """The imports among the modules of ``package`` (in ``folder``) that run as ``kinds`` say."""
    names = module_names(package, folder)
    known, kinds = set(names), set(kinds)
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for node, how in import_statements(read(path).tree):
            if how in kinds:
                graph[name].update(imported_modules(name, path.name == "__init__.py", node, known) - {name})
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def import_circles(root: Path, kinds: Iterable[str] = (AT_IMPORT, TYPING)) -> list[list[str]]:
    """The circles of imports that run as ``kinds`` say, in kdplug and in each plugin package."""
    return [
        circle for package, folder in packages(root).items() for circle in circles(import_graph(package, folder, kinds))
    ]


# --- the report --------------------------------------------------------------------------------------------


def section(title: str, found: list) -> None:
    print(f"{title}: {len(found)}")
    for item in found:
        print(f"  {' -> '.join(item) if isinstance(item, list) else item}")


def report(root: Path) -> None:
    trees = parsed(root)
    print(f"kdplug at {root}: {len(trees)} Python files under {', '.join(SOURCES)}")
    section(f"modules over {MODULE_LIMIT} lines", long_modules(trees))
    section(f"functions over {FUNCTION_LIMIT} lines", long_functions(trees))
    section("functions over 60 lines", long_functions(trees, 60))
    section(f"classes over {CLASS_LIMIT} lines", long_classes(trees))
    section("import circles (module-level imports, TYPE_CHECKING included)", import_circles(root))
    every = import_circles(root, (AT_IMPORT, TYPING, DEFERRED))
    section("import circles counting imports inside functions too", every)
    reads = capability_reads(trees, declared_capabilities(root / "kdplug" / "capabilities.py"))
    section("getattr reads of a declared capability outside capabilities.py", unwaived(reads))
    section(
        "reads of a declared name that say why they are not through capabilities()",
        [r for r in reads if r not in unwaived(reads)],
    )
    print("lines:")
    for path in WATCHED:
        source = trees.get(path)
        print(f"  {path}: {len(source.lines) if source else 'absent'}")


def main(argv: list[str]) -> int:
    """Exit 2, saying why, for a folder that is not a kdplug checkout or holds a file Python cannot parse."""
    root = Path(argv[0]).resolve() if argv else ROOT
    if not (root / "kdplug" / "capabilities.py").is_file():
        print(f"structure_report: {root} is not a kdplug checkout (no kdplug/capabilities.py)", file=sys.stderr)
        return 2
    try:
        report(root)
    except SyntaxError as exc:
        print(f"structure_report: {exc.filename}:{exc.lineno}: {exc.msg}; fix it to measure", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

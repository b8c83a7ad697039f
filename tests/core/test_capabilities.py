"""What a component may declare: one declaration per kind (kdplug.capabilities), read through one
function that refuses an undeclared name, and listed in docs/hooks.md exactly as declared.

``python tests/core/test_capabilities.py`` prints the docs section from the declarations."""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path

import pytest
from torch import nn

import kdplug.capabilities as declarations
from kdplug.capabilities import (
    CAPABILITIES,
    Capabilities,
    ObjectiveCapabilities,
    ProjectorCapabilities,
    RecipeCapabilities,
    StudentCapabilities,
    capabilities,
    declared,
)
from kdplug.engine import preflight
from kdplug.plugins import get_plugin_manager
from kdplug.registry import Registry

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## Capabilities: what a component declares"
DECLARATIONS = [Capabilities, *dict.fromkeys(c for c in CAPABILITIES.values() if c is not Capabilities)]
DECLARATIONS.insert(DECLARATIONS.index(RecipeCapabilities) + 1, ObjectiveCapabilities)


def meanings() -> dict[tuple[str, str], str]:
    """``(class, name) -> meaning``: the docstring under each declared attribute, one line."""
    found = {}
    for node in ast.parse(inspect.getsource(declarations)).body:
        if isinstance(node, ast.ClassDef):
            for target, text in zip(node.body, node.body[1:]):
                if isinstance(target, ast.AnnAssign) and isinstance(text, ast.Expr):
                    found[(node.name, target.target.id)] = " ".join(text.value.value.split())
    return found


def own_names(declaration: type) -> list[str]:
    return [name for name in declared(declaration) if name in inspect.get_annotations(declaration)]


def render() -> str:
    """The docs section, from the declarations."""
    meaning = meanings()
    lines = [
        HEADING,
        "",
        "What the engine reads from a component, it reads from these attributes, declared with their",
        "types, defaults and meanings in `kdplug.types` (one class per kind) and read through",
        "`kdplug.types.capabilities` alone. Set the ones your component needs as class attributes (or, where",
        "it says so, on the factory function); or inherit its kind's declaration for the defaults and an",
        "editor's completion: `class MyProjector(nn.Module, ProjectorCapabilities)`. An attribute not",
        "listed here is not read. Every kind's declaration includes those of `Capabilities`.",
    ]
    for declaration in DECLARATIONS:
        lines += ["", f"### `{declaration.__name__}`", "", " ".join(inspect.getdoc(declaration).split()), ""]
        lines += ["| attribute | default | meaning |", "|---|---|---|"]
        for name in own_names(declaration):
            default = declared(declaration)[name]
            lines.append(f"| `{name}` | `{default!r}` | {meaning[(declaration.__name__, name)]} |")
    return "\n".join(lines) + "\n"


def documented() -> str:
    page = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    start = page.index(HEADING)
    end = page.find("\n## ", start + len(HEADING))
    return page[start : end if end >= 0 else len(page)]


def test_docs_list_every_declared_capability_with_its_default_and_meaning():
    assert documented() == render(), "docs/hooks.md: paste `python tests/core/test_capabilities.py` over the section"


def test_every_declared_capability_has_a_meaning():
    meaning = meanings()
    for declaration in DECLARATIONS:
        for name in own_names(declaration):
            assert meaning.get((declaration.__name__, name)), f"{declaration.__name__}.{name} says nothing"


def test_a_name_no_declaration_declares_fails_loudly():
    class Projector:
        needs_tokens = True

    with pytest.raises(AttributeError, match="ProjectorCapabilities declares no capability 'needs_token'"):
        capabilities(ProjectorCapabilities, Projector).needs_token  # noqa: B018
    with pytest.raises(AttributeError, match="declares no capability 'reads_teacher'"):
        capabilities(RecipeCapabilities, Projector).reads_teacher  # noqa: B018


def test_a_component_says_what_it_declares_and_the_rest_is_the_default():
    class Projector(nn.Module):
        needs_tokens = True
        reads_teacher = False

    projector = Projector()
    assert capabilities(ProjectorCapabilities, projector).needs_tokens is True
    assert capabilities(ProjectorCapabilities, Projector).reads_teacher is False
    assert capabilities(ProjectorCapabilities, projector).default_recipe is None
    assert capabilities(ProjectorCapabilities, projector).pairs_per_example is True
    assert capabilities(RecipeCapabilities, object()).reads_teacher_layers is None  # the projector decides


def test_a_component_may_inherit_its_declaration():
    class Projector(nn.Module, ProjectorCapabilities):
        needs_tokens = True

    projector = Projector()
    assert projector.needs_tokens and not projector.needs_teacher_heads and projector.ild_loss_options == {}
    assert capabilities(ProjectorCapabilities, projector).reads_teacher is True


def test_the_engine_reads_a_registered_factory_through_a_partial():
    class Recipe:
        uses_projector = False

    registry = Registry()
    registry.add("recipe", "own-loss", functools.partial(Recipe))
    registry.add("student", "pooled", lambda task, teacher: None)
    registry.entries("student")[0].factory.token_signals = False
    assert preflight.declared(registry, RecipeCapabilities, "own-loss").uses_projector is False
    assert preflight.declared(registry, RecipeCapabilities, "own-loss").is_default is False
    assert preflight.declared(registry, StudentCapabilities, "pooled").token_signals is False


def test_first_party_components_declare_values_of_the_declared_types():
    registry = get_plugin_manager().registry
    checked = 0
    for kind, declaration in CAPABILITIES.items():
        for entry in registry.entries(kind):
            factory = getattr(entry.factory, "func", entry.factory)
            read = capabilities(declaration, factory)
            for name, default in declared(declaration).items():
                value = getattr(read, name)
                if isinstance(default, bool):
                    assert isinstance(value, bool), f"{kind} {entry.name}: {name} = {value!r} is not a bool"
                elif isinstance(default, str) or name in ("citation", "default_recipe", "ild_loss", "name"):
                    assert value is None or isinstance(value, str), f"{kind} {entry.name}: {name} = {value!r}"
                checked += 1
    assert checked > 100


if __name__ == "__main__":
    print(render(), end="")

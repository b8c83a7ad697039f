"""Components by name, from the process's plugin manager: ``list_projectors("alp*")``,
``create_projector(name, request)`` (timm's registry helpers).

This module is the only place that reads the process-wide plugin manager
(:func:`kdplug.plugins.get_plugin_manager`): it serves users at a prompt, ``kdplug.distill`` (through
:func:`process_manager`) and plugin tests (through :func:`process_registry`). The engine never does:
a run looks components up in the registry it was given, so ``kdplug.distill`` with its own manager,
or the testing kit's isolated one, sees exactly the plugins it was meant to.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import ArgumentError, UsageError, close_matches
from .plugins import PluginManager, get_plugin_manager
from .registry import KINDS, Registry
from .types import LayerExtractor, ProjectionRequest, Task, Teacher


def process_manager() -> PluginManager:
    """The process's plugin manager: the CLI's (``--disable-plugin`` applied), or the one
    :func:`kdplug.set_plugin_manager` installed."""
    return get_plugin_manager()


def process_registry() -> Registry:
    """The components the process's plugins registered."""
    return process_manager().registry


def list_components(kind: str, pattern: str = "*") -> list[str]:
    """Registered names of ``kind`` (``"projector"``, ``"student"`` ...) matching a glob."""
    if not isinstance(kind, str) or kind not in KINDS:
        close = close_matches(str(kind), KINDS)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown component kind {kind!r}.{hint} Kinds: {', '.join(KINDS)}")
    if not isinstance(pattern, str):
        raise ArgumentError(f"pattern= takes a glob (str) such as 'pkd-*', got {type(pattern).__name__} {pattern!r}")
    return process_registry().names(kind, pattern)


def _create(kind: str, name: Any, *args: Any, **options: Any) -> Any:
    """``create_KIND(name, ...)``: the component ``name`` names (a str: objects are not names)."""
    if not isinstance(name, str):
        raise ArgumentError(
            f"create_{kind} takes a {kind}'s registered name (str; list_components({kind!r}) lists them), "
            f"got {type(name).__name__} {name!r}"[:200]
        )
    return process_registry().create(kind, name, *args, **options)


def list_teachers(pattern: str = "*") -> list[str]:
    return list_components("teacher", pattern)


def list_students(pattern: str = "*") -> list[str]:
    return list_components("student", pattern)


def list_projectors(pattern: str = "*") -> list[str]:
    return list_components("projector", pattern)


def list_losses(pattern: str = "*") -> list[str]:
    return list_components("loss", pattern)


def list_tasks(pattern: str = "*") -> list[str]:
    return list_components("task", pattern)


def list_recipes(pattern: str = "*") -> list[str]:
    return list_components("recipe", pattern)


def list_layer_extractors(pattern: str = "*") -> list[str]:
    return list_components("layer_extractor", pattern)


def list_augmenters(pattern: str = "*") -> list[str]:
    return list_components("augmenter", pattern)


def create_teacher(name: str, task: Task, **options: Any) -> Teacher:
    return _create("teacher", name, task, **options)


def create_student(name: str, task: Task, teacher: Teacher, **options: Any):
    return _create("student", name, task, teacher, **options)


def create_projector(name: str, request: ProjectionRequest, **options: Any):
    return _create("projector", name, request, **options)


def create_loss(name: str, **options: Any):
    return _create("loss", name, **options)


def create_task(name: str, data_dir: str | None = None, **options: Any) -> Task:
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise ArgumentError(f"data_dir= takes a directory (str or pathlib.Path), got {type(data_dir).__name__}")
    return _create("task", name, data_dir=data_dir, **options)


def create_recipe(name: str, **options: Any):
    return _create("recipe", name, **options)


def create_augmenter(name: str, teacher: Teacher, **options: Any):
    return _create("augmenter", name, teacher, **options)


def find_layer_extractor(model: Any) -> LayerExtractor:
    """The first registered layer extractor that supports ``model``."""
    return process_registry().find_layer_extractor(model)

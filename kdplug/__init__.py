"""kdplug: knowledge distillation for NLP models, built from plugins.

Public API: the ``hookimpl`` marker, ``create_*`` / ``list_*`` helpers per component kind, and
the types of :mod:`kdplug.types`.
"""

from __future__ import annotations

from typing import Any

from .config import RunConfig
from .errors import (
    ConfigError,
    DataError,
    KdplugError,
    OfflineError,
    PluginError,
    UnknownComponentError,
    UsageError,
)
from .inference import Prediction, Student, load_student, predict
from .plugins import PluginManager, get_plugin_manager, hookimpl, set_plugin_manager
from .types import (
    DistillInputs,
    Example,
    LayerExtractor,
    LayerSpec,
    ProjectedPairs,
    ProjectionRequest,
    Task,
    Teacher,
    matchable_layers,
    num_outputs,
)

__version__ = "0.1.0"


def _registry():
    return get_plugin_manager().registry


def list_components(kind: str, pattern: str = "*") -> list[str]:
    """Registered names of ``kind`` (``"projector"``, ``"student"`` ...) matching a glob."""
    return _registry().names(kind, pattern)


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
    return _registry().create("teacher", name, task, **options)


def create_student(name: str, task: Task, teacher: Teacher, **options: Any):
    return _registry().create("student", name, task, teacher, **options)


def create_projector(name: str, request: ProjectionRequest, **options: Any):
    return _registry().create("projector", name, request, **options)


def create_loss(name: str, **options: Any):
    return _registry().create("loss", name, **options)


def create_task(name: str, data_dir: str | None = None, **options: Any) -> Task:
    return _registry().create("task", name, data_dir=data_dir, **options)


def create_recipe(name: str, **options: Any):
    return _registry().create("recipe", name, **options)


def create_augmenter(name: str, teacher: Teacher, **options: Any):
    return _registry().create("augmenter", name, teacher, **options)


def find_layer_extractor(model: Any) -> LayerExtractor:
    """The first registered layer extractor that supports ``model``."""
    for entry in _registry().entries("layer_extractor"):
        if entry.factory.supports(model):
            return entry.factory
    names = ", ".join(_registry().names("layer_extractor")) or "(none registered)"
    raise PluginError(
        f"no layer extractor supports a {type(model).__name__}; registered extractors: {names}. "
        f"A plugin that adds this model must also register a layer extractor for it."
    )


from . import model_types as _model_types


def distill(*args: Any, **kwargs: Any):
    """Run a distillation from Python, exactly as ``kdplug run`` does; see :func:`kdplug.python_api.distill`."""
    from .python_api import distill as run_distillation

    return run_distillation(*args, **kwargs)


_model_types.install()  # transformers' Auto classes learn plugins' model types (kdplug_models: BiLSTM, Gated-CNN)

__all__ = [
    "ConfigError", "DataError", "DistillInputs", "Example", "KdplugError", "LayerExtractor", "LayerSpec",
    "OfflineError", "PluginError", "PluginManager", "ProjectedPairs", "ProjectionRequest", "Task", "Teacher",
    "UnknownComponentError", "UsageError", "create_loss", "create_projector", "create_recipe", "create_student",
    "create_task", "create_teacher", "find_layer_extractor", "get_plugin_manager", "hookimpl", "list_components",
    "list_layer_extractors", "list_losses", "list_projectors", "list_recipes", "list_students", "list_tasks",
    "list_teachers", "list_augmenters", "create_augmenter", "matchable_layers", "num_outputs", "set_plugin_manager",
    "Prediction", "Student", "load_student", "predict", "RunConfig", "distill",
]

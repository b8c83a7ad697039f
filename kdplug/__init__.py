"""kdplug: knowledge distillation for NLP models, built from plugins.

The package root is what a user imports: the plugin API of :mod:`kdplug.api` (hookimpl, the
types and protocols, errors, storage, fingerprints, text and hub helpers) plus ``distill``,
``load_student`` / ``predict``, ``RunConfig`` and the ``create_*`` / ``list_*`` component helpers
of :mod:`kdplug.components`. No module inside kdplug imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import startup as _startup  # noqa: F401  first: a Ctrl-C in the seconds of imports below (the CLI)
from .api import *  # noqa: F403  the plugin API: every name of kdplug.api
from .api import __all__ as _api_names
from .components import (
    create_augmenter,
    create_loss,
    create_projector,
    create_recipe,
    create_student,
    create_task,
    create_teacher,
    find_layer_extractor,
    list_augmenters,
    list_components,
    list_layer_extractors,
    list_losses,
    list_projectors,
    list_recipes,
    list_students,
    list_tasks,
    list_teachers,
)
from .config import RunConfig
from .errors import ArgumentError
from .integrity import PackageIntegrityError
from .plugins import PluginManager, get_plugin_manager, set_plugin_manager

if TYPE_CHECKING:  # for editors and type checkers; at run time __getattr__ imports them
    from .inference import LoadedStudent, Prediction, load_student, predict

#: names of kdplug.inference, imported on first use: it needs torch, which `kdplug --help` need not load
_INFERENCE_NAMES = ("LoadedStudent", "Prediction", "load_student", "predict")


def __getattr__(name: str) -> Any:
    if name in _INFERENCE_NAMES:
        from . import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'kdplug' has no attribute {name!r}")


def distill(*args: Any, **kwargs: Any):
    """Run a distillation from Python, exactly as ``kdplug run`` does; see :func:`kdplug.python_api.distill`."""
    from .python_api import distill as run_distillation

    return run_distillation(*args, **kwargs)


from . import model_types as _model_types  # noqa: E402  after the names it may need

_model_types.install()  # transformers' Auto classes learn plugins' model types (kdplug_models: BiLSTM, Gated-CNN)

#: the plugin API (kdplug.api) and what a user reaches for: distil, load and predict, components by name
__all__ = [
    *_api_names,
    "RunConfig",
    "distill",
    "LoadedStudent",
    "Prediction",
    "load_student",
    "predict",
    "ArgumentError",
    "PackageIntegrityError",
    "PluginManager",
    "get_plugin_manager",
    "set_plugin_manager",
    "create_augmenter",
    "create_loss",
    "create_projector",
    "create_recipe",
    "create_student",
    "create_task",
    "create_teacher",
    "find_layer_extractor",
    "list_augmenters",
    "list_components",
    "list_layer_extractors",
    "list_losses",
    "list_projectors",
    "list_recipes",
    "list_students",
    "list_tasks",
    "list_teachers",
]

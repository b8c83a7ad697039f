"""Everything a plugin may use, in one place: the stable plugin API.

Plugins (kdplug's own included) import from this module, from the package root ``kdplug`` (which
re-exports the same names), or from the public modules listed below, and from nothing else:
``kdplug.engine`` and the command-line modules are private to kdplug and change without notice.
``tests/core/test_layers.py`` enforces it with import-linter contracts (see pyproject.toml).

The compatibility promise of docs/hooks.md covers every name here: within a major version a name
keeps its meaning, functions and dataclasses only gain optional arguments and fields.

Public modules: ``kdplug.api`` (this one), ``kdplug.types``, ``kdplug.errors``, ``kdplug.storage``,
``kdplug.fingerprint``, ``kdplug.textio``, ``kdplug.hub``, ``kdplug.hookspecs`` and ``kdplug.testing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import fingerprint, hub, storage, textio
from .errors import (ConfigError, DataError, KdplugError, OfflineError, PluginError, UnknownComponentError,
                     UsageError, close_matches)
from .plugins import hookimpl
from .storage import (StorageError, atomic_directory, complete_copy, default_cache_root, file_lock, move_aside,
                      raise_as_storage_error, verify, write_atomic)
from .types import (Augmenter, DistillInputs, Example, LayerExtractor, LayerSpec, ProjectedPairs, Projector, ProjectionRequest,
                    Register, StepState, Student, Task, Teacher, matchable_layers, num_outputs, text_columns)

if TYPE_CHECKING:  # a recipe's ``run(ctx)`` receives one; annotate with it, never construct it
    from .engine.recipe import RecipeContext, Weights  # noqa: F401

__all__ = [
    # hooks
    "hookimpl",
    # types that cross the plugin boundary
    "Augmenter", "DistillInputs", "Example", "LayerExtractor", "LayerSpec", "ProjectedPairs", "Projector", "ProjectionRequest",
    "Register", "StepState", "Student", "Task", "Teacher", "matchable_layers", "num_outputs", "text_columns",
    # errors (UsageError and its subclasses exit 2)
    "ConfigError", "DataError", "KdplugError", "OfflineError", "PluginError", "StorageError", "UnknownComponentError",
    "UsageError", "close_matches",
    # storing things for reuse: fingerprints, locks, atomic checksummed directories, the cache root
    "fingerprint", "storage", "atomic_directory", "complete_copy", "default_cache_root", "file_lock", "move_aside",
    "raise_as_storage_error", "verify", "write_atomic",
    # reading the user's text files in any encoding
    "textio",
    # the Hugging Face hub: load by hub id or fail fast offline (hub.load_pretrained, hub.require)
    "hub",
]

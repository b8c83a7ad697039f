"""The plugin API: everything a plugin may use, in one place.

Plugins (kdplug's own included) import from this module, from the package root ``kdplug`` (which
re-exports every name here, plus the user-level names), or from the public modules listed
below, and from nothing else. Every other module of kdplug is private: ``kdplug.engine``, the
command line, the configuration and the registry change without notice, and a module added to
kdplug is private until it is added here. ``tests/core/test_layers.py`` enforces it with an
import-linter allow-list contract (``kdplug.testing.import_contract``, pyproject.toml).

The compatibility promise of docs/hooks.md covers every name here: within a major version a name
keeps its meaning, functions and dataclasses only gain optional arguments and fields.

Public modules: ``kdplug.api`` (this one), ``kdplug.types``, ``kdplug.errors``, ``kdplug.storage``,
``kdplug.fingerprint``, ``kdplug.textio``, ``kdplug.words``, ``kdplug.hub``, ``kdplug.hookspecs``, ``kdplug.version``,
``kdplug.components`` and ``kdplug.testing``.
"""

from __future__ import annotations

from . import fingerprint, hub, storage, textio, words
from .errors import (
    ConfigError,
    DataError,
    KdplugError,
    OfflineError,
    PluginError,
    UnknownComponentError,
    UsageError,
    close_matches,
)
from .interrupt import RunInterrupted
from .interrupt import requested as stop_requested
from .options import Positive, PositiveFloat, Range, check_option_values, forwards_options
from .plugins import hookimpl
from .progress import progress
from .recipe_context import RecipeContext
from .storage import (
    StorageError,
    atomic_directory,
    cache_root,
    complete_copy,
    default_cache_root,
    file_lock,
    move_aside,
    raise_as_storage_error,
    verify,
    write_atomic,
)
from .types import (
    Augmenter,
    AugmenterCapabilities,
    Capabilities,
    DistillInputs,
    Example,
    LayerExtractor,
    LayerExtractorCapabilities,
    LayerSpec,
    ModelShape,
    ObjectiveCapabilities,
    ProjectedPairs,
    ProjectionRequest,
    Projector,
    ProjectorCapabilities,
    RecipeCapabilities,
    Register,
    Settings,
    StageResult,
    StepState,
    Student,
    StudentCapabilities,
    Task,
    TaskCapabilities,
    Teacher,
    TeacherCapabilities,
    TokenSignals,
    TokenSpec,
    Weights,
    matchable_layers,
    num_outputs,
    text_columns,
)
from .version import __version__

#: the public modules: a plugin may import these and the package root, nothing else of kdplug
PUBLIC_MODULES = (
    "kdplug",
    "kdplug.api",
    "kdplug.types",
    "kdplug.recipe_context",
    "kdplug.errors",
    "kdplug.storage",
    "kdplug.fingerprint",
    "kdplug.textio",
    "kdplug.words",
    "kdplug.hub",
    "kdplug.hookspecs",
    "kdplug.version",
    "kdplug.components",
    "kdplug.testing",
)

__all__ = [
    # hooks
    "hookimpl",
    # types that cross the plugin boundary, and what a recipe's run(ctx) receives
    "Augmenter",
    "DistillInputs",
    "Example",
    "LayerExtractor",
    "LayerSpec",
    "ModelShape",
    "ProjectedPairs",
    "Projector",
    "ProjectionRequest",
    "RecipeContext",
    "Register",
    "Settings",
    "StageResult",
    "StepState",
    "Student",
    "Task",
    "Teacher",
    "TokenSignals",
    "TokenSpec",
    "Weights",
    "matchable_layers",
    "num_outputs",
    "text_columns",
    # what a component may declare (its capabilities), one class per kind
    "AugmenterCapabilities",
    "Capabilities",
    "LayerExtractorCapabilities",
    "ObjectiveCapabilities",
    "ProjectorCapabilities",
    "RecipeCapabilities",
    "StudentCapabilities",
    "TaskCapabilities",
    "TeacherCapabilities",
    # an option's allowed values, in its annotation: Annotated[int, Range(1)] (kdplug/options.py)
    "Positive",
    "PositiveFloat",
    "Range",
    "check_option_values",
    "forwards_options",
    # errors (UsageError and its subclasses exit 2)
    "ConfigError",
    "DataError",
    "KdplugError",
    "OfflineError",
    "PluginError",
    "StorageError",
    "UnknownComponentError",
    "UsageError",
    "close_matches",
    # storing things for reuse: fingerprints, locks, atomic checksummed directories, the cache root
    "fingerprint",
    "storage",
    "atomic_directory",
    "cache_root",
    "complete_copy",
    "default_cache_root",
    "file_lock",
    "move_aside",
    "raise_as_storage_error",
    "verify",
    "write_atomic",
    # reading the user's text files in any encoding
    "textio",
    # stop words and content words, for augmenters
    "words",
    # the Hugging Face hub: load by hub id or fail fast offline (hub.load_pretrained, hub.require)
    "hub",
    # a progress bar on terminals and in notebooks, never in logs (a long loop of a plugin's own: requests)
    "progress",
    # SIGINT/SIGTERM during a run: the signal that asked it to stop (None: none), and the error that ends it
    "stop_requested",
    "RunInterrupted",
    "__version__",
]

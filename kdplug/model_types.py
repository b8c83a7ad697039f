"""Plugins' own Hugging Face model types, known to transformers' Auto classes once kdplug is imported.

A plugin that brings a model family of its own (kdplug's BiLSTM and Gated-CNN students) lists a
function under the ``kdplug.model_types`` entry-point group; the function registers its config
and model classes with ``AutoConfig`` / ``AutoModelForSequenceClassification``. After
``import kdplug``, a saved student then loads with plain transformers::

    import kdplug
    from transformers import AutoModelForSequenceClassification, pipeline
    model = AutoModelForSequenceClassification.from_pretrained("runs/demo/student")

Importing ``PreTrainedModel`` costs seconds, so ``import kdplug`` does not do it: the
registration runs right after transformers' Auto model classes are imported
(``transformers.models.auto.modeling_auto``, which ``AutoModel*`` and ``pipeline`` need), or at
once if they already are. Plugins' modeling modules register themselves when they are imported,
so a module that was itself importing transformers finishes its own registration.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata as metadata
import importlib.util
import sys
import threading
import warnings
from typing import Any, Optional

ENTRY_POINT_GROUP = "kdplug.model_types"
_lock = threading.Lock()
_registered = False
_pending: list[metadata.EntryPoint] = []  # registrations whose module was still being imported


def register_model_types() -> None:
    """Run every plugin's registration (once per process); a broken one is reported, not fatal.

    A plugin module that imports transformers' Auto classes at its top sets off the registration
    while it is itself half imported: its registration waits, and runs at the next call (kdplug
    calls again once its plugins are loaded, and before it loads a saved model)."""
    global _registered
    with _lock:
        if _registered:
            waiting, _pending[:] = list(_pending), []
        else:
            _registered = True
            waiting = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    for entry_point in waiting:
        if _being_imported(entry_point.module):
            _pending.append(entry_point)
            continue
        try:
            entry_point.load()()
        except Exception as exc:  # a broken plugin must not break `import transformers`
            warnings.warn(
                f"kdplug: model types of {entry_point.name!r} ({entry_point.value}) could not be "
                f"registered with transformers: {type(exc).__name__}: {exc}",
                stacklevel=2,
            )


def register_pending() -> None:
    """Run the registrations that waited for their module's import to finish; nothing else."""
    if _pending:
        register_model_types()


def _being_imported(name: str) -> bool:
    """Whether module ``name`` (or a package above it) is in the middle of its own import."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:end]))
        if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
            return True
    return False


AUTO_MODELS = "transformers.models.auto.modeling_auto"


class _AfterAutoModels(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it wraps the loading of transformers' Auto model classes so that the
    model types are registered as soon as that module has been executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Optional[Any]:
        if fullname != AUTO_MODELS:
            return None
        sys.meta_path.remove(self)  # one shot, and the real finders answer the question below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_and_register(module: Any) -> None:
            execute(module)
            register_model_types()

        spec.loader.exec_module = exec_and_register
        return spec


def install() -> None:
    """Register now if the Auto model classes are loaded, else right after they are."""
    if AUTO_MODELS in sys.modules:
        register_model_types()
    elif not any(isinstance(finder, _AfterAutoModels) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterAutoModels())

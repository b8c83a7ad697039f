"""Make transformers' Auto classes and ``pipeline`` know kdplug's own model types.

Listed under the ``kdplug.model_types`` entry-point group, so ``import kdplug`` arranges for it to
run as soon as ``transformers`` is imported (see :mod:`kdplug.model_types`): then
``AutoModelForSequenceClassification.from_pretrained(run/student)`` loads a BiLSTM or Gated-CNN
student like any Hugging Face model, without ``trust_remote_code``. Each modeling module
registers its own classes when it is imported; this only imports them (a module still being
imported, the one whose ``import transformers`` brought us here, registers itself when it ends).
"""

from __future__ import annotations

import importlib

MODULES = ("kdplug_models.modeling_bilstm", "kdplug_models.modeling_gated_cnn")


def register_model_types() -> None:
    for module in MODULES:
        importlib.import_module(module)

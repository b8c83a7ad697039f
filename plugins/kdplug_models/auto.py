"""Make transformers' Auto classes and ``pipeline`` know kdplug's own model types.

Listed under the ``kdplug.model_types`` entry-point group, so ``import kdplug`` arranges for it to
run as soon as ``transformers`` is imported (see :mod:`kdplug.model_types`): then
``AutoModelForSequenceClassification.from_pretrained(run/student)`` loads a BiLSTM or Gated-CNN
student like any Hugging Face model, without ``trust_remote_code``. The modeling modules register
nothing themselves: the copies of them that travel with a student's weights must not touch the
Auto classes of a process where kdplug is installed.
"""

from __future__ import annotations


def register_model_types() -> None:
    from .modeling_bilstm import BiLSTMConfig, BiLSTMForSequenceClassification
    from .modeling_gated_cnn import GatedCNNConfig, GatedCNNForSequenceClassification
    from .modeling_pooled import register_auto_classes

    register_auto_classes(BiLSTMConfig, BiLSTMForSequenceClassification)
    register_auto_classes(GatedCNNConfig, GatedCNNForSequenceClassification)

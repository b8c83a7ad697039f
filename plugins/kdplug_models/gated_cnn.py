"""The Gated-CNN student of Universal-KD's cross-architecture experiments (Sec. 5.3, Table 5).

The model is in ``modeling_gated_cnn.py`` (``GatedCNNForSequenceClassification``, a Hugging Face
model); this module registers its factory and layer extractor.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import kdplug
from kdplug.api import Positive, Range
from kdplug.types import Task, Teacher

from .pooling import PooledLayerExtractor, build_pooled_student, check_pooled_options, pooled_shape
from .sentencepiece_tokenizer import STORES

MODEL = "modeling_gated_cnn:GatedCNNForSequenceClassification"


def gated_cnn_student(
    task: Task,
    teacher: Teacher,
    *,
    embedding_dim: Optional[Positive] = None,
    hidden_size: Optional[Positive] = None,
    num_layers: Positive = 4,
    kernel_size: Positive = 3,
    dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.1,
    attention_dim: Optional[Positive] = None,
    tokenizer: Any = None,
    init_embeddings_from_teacher: Optional[bool] = None,
    embeddings: Optional[str] = None,
    source: Optional[str] = None,
    sentencepiece_vocab_size: Positive = 8000,
    sentencepiece_model_type: Literal["unigram", "bpe"] = "unigram",
):
    """Build the Gated-CNN student (``source``: a directory its ``save_pretrained`` wrote, to resume;
    ``tokenizer``: ``teacher``, ``sentencepiece`` or a directory, by default the teacher's unless its
    vocabulary is an LLM's, see student_vocabulary.py)."""
    return build_pooled_student(
        MODEL,
        task,
        teacher,
        embedding_dim=embedding_dim,
        tokenizer=tokenizer,
        init_embeddings_from_teacher=init_embeddings_from_teacher,
        embeddings=embeddings,
        source=source,
        sentencepiece_vocab_size=sentencepiece_vocab_size,
        sentencepiece_model_type=sentencepiece_model_type,
        hidden_size=hidden_size,
        num_layers=num_layers,
        kernel_size=kernel_size,
        dropout=dropout,
        attention_dim=attention_dim,
    )


gated_cnn_student.check_options = check_pooled_options
gated_cnn_student.shape = pooled_shape(MODEL, default_layers=4)
gated_cnn_student.stores = STORES  # its tokenizer=sentencepiece option trains and keeps them there
gated_cnn_student.token_signals = False  # one pooled vector per layer: no tokens for TinyBERT or MiniLMv2


@kdplug.hookimpl
def kdplug_register_students(register):
    register(
        "gated-cnn",
        gated_cnn_student,
        description="4 gated (GLU) convolution layers, as wide as the teacher, attention-sum pooling per "
        "layer (Universal-KD)",
    )


@kdplug.hookimpl
def kdplug_register_layer_extractors(register):
    register(
        "gated-cnn",
        PooledLayerExtractor(MODEL),
        description="the attention-pooled vector of every gated convolution layer (kind 'conv')",
    )

"""The BiLSTM student of Universal-KD's cross-architecture experiments (Sec. 5.3, Table 5).

The model is in ``modeling_bilstm.py`` (``BiLSTMForSequenceClassification``, a Hugging Face
model); this module registers its factory and layer extractor.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

import kdplug
from kdplug.api import Positive, Range
from kdplug.types import Task, Teacher

from .pooling import PooledLayerExtractor, build_pooled_student, check_pooled_options, pooled_shape
from .sentencepiece_tokenizer import STORES

MODEL = "modeling_bilstm:BiLSTMForSequenceClassification"


def bilstm_student(
    task: Task,
    teacher: Teacher,
    *,
    embedding_dim: Optional[Positive] = None,
    hidden_size: Optional[Positive] = None,
    num_layers: Positive = 3,
    bidirectional: bool = True,
    dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.1,
    attention_dim: Optional[Positive] = None,
    tokenizer: Any = None,
    init_embeddings_from_teacher: Optional[bool] = None,
    embeddings: Optional[str] = None,
    source: Optional[str] = None,
    sentencepiece_vocab_size: Positive = 8000,
    sentencepiece_model_type: Literal["unigram", "bpe"] = "unigram",
):
    """Build the BiLSTM student (``source``: a directory its ``save_pretrained`` wrote, to resume;
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
        bidirectional=bidirectional,
        dropout=dropout,
        attention_dim=attention_dim,
    )


bilstm_student.check_options = check_pooled_options
bilstm_student.shape = pooled_shape(MODEL, default_layers=3)
bilstm_student.stores = STORES  # its tokenizer=sentencepiece option trains and keeps them there
bilstm_student.token_signals = False  # one pooled vector per layer: no tokens for TinyBERT or MiniLMv2


@kdplug.hookimpl
def kdplug_register_students(register):
    register(
        "bilstm",
        bilstm_student,
        description="3-layer BiLSTM, as wide as the teacher (768 under BERT-base), attention-sum pooling per "
        "layer (Universal-KD)",
    )


@kdplug.hookimpl
def kdplug_register_layer_extractors(register):
    register(
        "bilstm",
        PooledLayerExtractor(MODEL),
        description="the attention-pooled vector of every BiLSTM layer (kind 'lstm')",
    )

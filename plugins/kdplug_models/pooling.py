"""The factories and the layer extractor of the BiLSTM and Gated-CNN students.

The models themselves are in ``modeling_bilstm.py`` / ``modeling_gated_cnn.py`` (Hugging Face
``PreTrainedModel``s); they are imported only when a student is built or inspected, so loading
the plugins stays fast.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, Optional

import torch
from torch import nn

import kdplug
from kdplug.types import LayerSpec, ModelShape, Task, num_outputs

from .embeddings import from_file, from_teacher, vector_file_width
from .student_vocabulary import SENTENCEPIECE_TOKENIZER, TEACHER_TOKENIZER, announce_own_vocabulary, default_tokenizer

#: The papers give no embedding size. Half the hidden size (384 for the papers' 768) puts both
#: students at the "similar capacity of around 25M trainable parameters" of Universal-KD Sec. 5.3
#: with BERT's 30,522-word vocabulary: 23.0M (BiLSTM) and 26.5M (Gated-CNN); 300 would give
#: 20.1M and 23.5M.
PAPER_HIDDEN_SIZE = 768


def model_class(path: str) -> type:
    """``"modeling_bilstm:BiLSTMForSequenceClassification"`` -> the class, imported on first use."""
    module, name = path.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def teacher_width(teacher: Any) -> int:
    """The width of the teacher's last layer: a student as wide as its teacher is the papers'
    setting (768 under BERT-base), and scales down with a smaller teacher (384 under MiniLM)."""
    model = getattr(teacher, "model", None)
    try:
        return kdplug.find_layer_extractor(model).layer_specs(model)[-1].width
    except (kdplug.KdplugError, AttributeError, IndexError):
        return PAPER_HIDDEN_SIZE


class PooledLayerExtractor:
    """Layer extractor for one pooled student class: its pooled vectors are the layers (indices
    1..L; there is no embedding layer to report)."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path

    def supports(self, model: nn.Module) -> bool:
        return isinstance(model, model_class(self.model_path))

    def layer_specs(self, model: Any) -> list[LayerSpec]:
        return [LayerSpec(index, model.width, model.layer_kind) for index in range(1, model.num_layers + 1)]

    def __call__(self, model: Any, outputs: Any) -> list[torch.Tensor]:
        return list(outputs.hidden_states)


def student_vocabulary(teacher: Any, tokenizer: Any = None) -> tuple[Any, int, int]:
    """The tokenizer a non-Transformer student reads with (its own if given, as an object or a
    directory; the teacher's for None or ``"teacher"``), its vocabulary size and padding id."""
    if isinstance(tokenizer, str) and tokenizer == TEACHER_TOKENIZER:
        tokenizer = None
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        if not os.path.isdir(tokenizer):
            raise kdplug.UsageError(
                f"student option tokenizer={tokenizer!r} is not a directory; pass "
                f"{TEACHER_TOKENIZER!r}, {SENTENCEPIECE_TOKENIZER!r} or a directory written "
                f"by a tokenizer's save_pretrained"
            )
        tokenizer = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=False)
    # not through capabilities(): the teacher's field (a teacher may be None)
    tokenizer = tokenizer if tokenizer is not None else getattr(teacher, "tokenizer", None)
    if tokenizer is None:
        raise kdplug.UsageError(
            "this student needs a tokenizer: the teacher has none, so pass the student "
            "option tokenizer=/path/to/tokenizer_dir"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return tokenizer, len(tokenizer), pad


def build_pooled_student(
    model_path: str,
    task: Task,
    teacher: Any,
    *,
    embedding_dim: Optional[int],
    tokenizer: Any,
    init_embeddings_from_teacher: Optional[bool],
    source: Optional[str],
    embeddings: Optional[str] = None,
    sentencepiece_vocab_size: int = 8000,
    sentencepiece_model_type: str = "unigram",
    **architecture: Any,
):
    """The body of the BiLSTM and Gated-CNN student factories.

    ``source`` reloads a student its ``save_pretrained`` wrote; otherwise the vocabulary is the
    tokenizer's (``"sentencepiece"``: one trained on the task's training text, see
    sentencepiece_tokenizer.py; None: the teacher's, or a SentencePiece one where the teacher's
    is an LLM's, see student_vocabulary.py). ``hidden_size`` defaults to the teacher's width (768 under BERT-base,
    the papers' setting; 384 under MiniLM), ``embedding_dim`` to half of it (a file of word vectors:
    the file's width). The word embeddings start from ``embeddings`` (a GloVe / word2vec text file)
    if given, else from the teacher's table where the student reads the teacher's tokenizer
    (``init_embeddings_from_teacher``, None: wherever it can), else at random (see docs/models.md).
    """
    cls = model_class(model_path)
    if source is not None:
        model = cls.from_pretrained(
            source, trust_remote_code=False
        )  # kdplug's own class: the directory's code never runs
        model.kdplug_init = {"init": "checkpoint", "from": str(source)}
        return model
    if architecture.get("hidden_size") is None:
        architecture["hidden_size"] = teacher_width(teacher)
    chosen_for_it = tokenizer is None  # the run names none: by the size of the teacher's vocabulary
    if chosen_for_it:
        tokenizer = default_tokenizer(teacher, init_embeddings_from_teacher=init_embeddings_from_teacher)
    if isinstance(tokenizer, str) and tokenizer == SENTENCEPIECE_TOKENIZER:
        from .sentencepiece_tokenizer import task_sentencepiece_tokenizer

        tokenizer = task_sentencepiece_tokenizer(
            task, vocab_size=sentencepiece_vocab_size, model_type=sentencepiece_model_type
        )
    tokenizer, vocab_size, pad = student_vocabulary(teacher, tokenizer)
    # not through capabilities(): the teacher's field
    own_vocabulary = chosen_for_it and tokenizer is not getattr(teacher, "tokenizer", None)
    vocabulary_note = {"tokenizer": announce_own_vocabulary(teacher, tokenizer)} if own_vocabulary else {}
    if embeddings is not None:
        embedding_dim = file_width(embeddings, embedding_dim, init_embeddings_from_teacher)
        init_embeddings_from_teacher = False
    if embedding_dim is None:
        embedding_dim = architecture["hidden_size"] // 2
    if init_embeddings_from_teacher is None:
        init_embeddings_from_teacher = teacher_table_fits(teacher, tokenizer, vocab_size, embedding_dim)
    labels = (
        {}
        if task.is_regression
        else {"id2label": dict(enumerate(task.labels)), "label2id": {label: i for i, label in enumerate(task.labels)}}
    )
    config = cls.config_class(
        vocab_size=vocab_size,
        embedding_dim=embedding_dim,
        pad_token_id=pad,
        num_labels=num_outputs(task),
        **labels,
        problem_type="regression" if task.is_regression else "single_label_classification",
        **architecture,
    )
    model = cls(config)
    init: dict[str, Any] = {"init": "random"}
    if init_embeddings_from_teacher:
        init = {"init": "embeddings from the teacher", **from_teacher(model, teacher)}
    elif embeddings is not None:
        init = {"init": "word vectors", **from_file(model, tokenizer, embeddings)}
    model.tokenizer = tokenizer
    model.kdplug_init = {**init, **vocabulary_note}
    return model


def file_width(embeddings: str, embedding_dim: Optional[int], init_embeddings_from_teacher: Optional[bool]) -> int:
    """The width a file of word vectors gives the student's embeddings (read from its first line);
    the options that contradict it are usage errors."""
    if init_embeddings_from_teacher:
        raise kdplug.UsageError(
            "student_options.embeddings and init_embeddings_from_teacher both set the word embeddings; keep one"
        )
    width = vector_file_width(embeddings)
    if embedding_dim is not None and embedding_dim != width:
        raise kdplug.UsageError(
            f"student_options.embedding_dim={embedding_dim}, but the vectors of {embeddings} are {width} wide; "
            f"drop embedding_dim (it follows the file)"
        )
    return width


def check_pooled_options(
    task: Task,
    teacher: Any,
    *,
    embeddings: Optional[str] = None,
    embedding_dim: Optional[int] = None,
    init_embeddings_from_teacher: Optional[bool] = None,
    source: Optional[str] = None,
    **_: Any,
) -> None:
    """What the BiLSTM and Gated-CNN factories would reject, checked when the teacher is loaded: before
    it is fine-tuned, not when the student is built after it. A word-vector file is read to its
    first line only; a bad line further down is found when the student is built. A student reloaded
    from ``source`` reads no vectors."""
    if embeddings is not None and source is None:
        file_width(embeddings, embedding_dim, init_embeddings_from_teacher)


def pooled_shape(model_path: str, default_layers: int) -> Callable[..., Optional[ModelShape]]:
    """The ``shape`` of a pooled student factory (see the student hook): ``num_layers`` pooled
    vectors of ``hidden_size`` (the teacher's width unless set), or those of the ``source`` it reloads."""

    def shape(
        task: Task,
        teacher: ModelShape,
        *,
        hidden_size: Optional[int] = None,
        num_layers: int = default_layers,
        source: Optional[str] = None,
        **_: Any,
    ) -> Optional[ModelShape]:
        cls = model_class(model_path)
        if source is not None:
            config = cls.config_class.from_pretrained(source, trust_remote_code=False)  # kdplug's own class
            hidden_size, num_layers = config.hidden_size, config.num_layers
        width = teacher.width if hidden_size is None else hidden_size
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (width, num_layers)):
            return None  # the factory refuses these itself
        return ModelShape(tuple(LayerSpec(index, width, cls.layer_kind) for index in range(1, num_layers + 1)))

    return shape


def teacher_table_fits(teacher: Any, tokenizer: Any, vocab_size: int, embedding_dim: int) -> bool:
    """Whether the teacher's embedding table can start the student's: the student reads the
    teacher's tokenizer, the rows match and the student's embeddings are at most as wide."""
    if tokenizer is not getattr(teacher, "tokenizer", None):  # not through capabilities(): the teacher's field
        return False
    try:
        table = teacher.model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # a teacher model without an input table
        return False
    rows, width = getattr(table, "num_embeddings", None), getattr(table, "embedding_dim", None)
    return rows == vocab_size and width is not None and embedding_dim <= width

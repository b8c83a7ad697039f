"""Which vocabulary a BiLSTM or Gated-CNN student reads with where the run does not say.

The student's embedding table has a row for every entry of its vocabulary. Under BERT's 30,522
entries that table is already the largest part of the paper-sized BiLSTM (11.7M of its 23.0M
parameters); under an LLM's tokenizer (Llama 3: 128,256 entries, Gemma: 256,000) it outweighs
the rest of the student several times over, for a task whose text uses a few thousand pieces. So
above :data:`LARGE_TEACHER_VOCABULARY` entries the student reads a SentencePiece vocabulary
trained on the task's own training text (``tokenizer=sentencepiece``, see
sentencepiece_tokenizer.py), and the log and the dry run say so. Below it nothing changes: the
student reads the teacher's tokenizer and may start from its embedding table.

Universal-KD compares the two models in output space and through pooled layer vectors, never
token by token, so a student need not share the teacher's tokens: the engine encodes the data
once with each tokenizer and pairs the examples, not the tokens.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

log = logging.getLogger("kdplug.models.vocabulary")

#: the most entries a teacher's vocabulary may have for its student to inherit it by default
#: (64k, 2**16): BERT's 30,522 and RoBERTa's 50,265 are below, the LLMs' 100k-256k above
LARGE_TEACHER_VOCABULARY = 65_536

#: values of the students' ``tokenizer`` option that name a tokenizer rather than give one
TEACHER_TOKENIZER, SENTENCEPIECE_TOKENIZER = "teacher", "sentencepiece"


def teacher_vocabulary_size(teacher: Any) -> Optional[int]:
    """The entries of the teacher's tokenizer (what a student inheriting it would have as rows)."""
    tokenizer = getattr(teacher, "tokenizer", None)  # not through capabilities(): the teacher's (None: no teacher)
    return None if tokenizer is None else len(tokenizer)


def default_tokenizer(teacher: Any, *, init_embeddings_from_teacher: Optional[bool]) -> str:
    """``"teacher"`` or ``"sentencepiece"``: the tokenizer a student reads with where the run names
    none, by the size of the teacher's vocabulary. ``init_embeddings_from_teacher=True`` asks for the
    teacher's table, which only the teacher's vocabulary fits, so it keeps that vocabulary."""
    entries = teacher_vocabulary_size(teacher)
    if entries is None or entries <= LARGE_TEACHER_VOCABULARY:
        return TEACHER_TOKENIZER
    if init_embeddings_from_teacher:
        log.info(
            "student vocabulary: the teacher's %s entries, as init_embeddings_from_teacher=true needs them",
            f"{entries:,}",
        )
        return TEACHER_TOKENIZER
    return SENTENCEPIECE_TOKENIZER


def announce_own_vocabulary(teacher: Any, tokenizer: Any) -> str:
    """Log, and return for the run's record and the dry run, why the student reads ``tokenizer``
    (trained on the task's text by default) and how to keep the teacher's instead."""
    note = (
        f"student vocabulary: {len(tokenizer):,} sentencepiece pieces trained on the task's text, since the "
        f"teacher's has {teacher_vocabulary_size(teacher):,} entries (more than {LARGE_TEACHER_VOCABULARY:,}); "
        f"student_options.tokenizer=teacher keeps the teacher's"
    )
    log.info("%s", note)
    return note

"""Where a student trained from scratch starts its word embeddings: the teacher's, or word vectors.

Both are scaled to the unit standard deviation of the student's own random initialisation
(``nn.Embedding``'s N(0, 1)). The scale matters: a Transformer's table is small (all-MiniLM-L6-v2's
entries have std 0.05), and a recurrent or convolutional layer initialised for unit-scale inputs
starts nearly blind to it. On the demo task a BiLSTM starting from MiniLM's table unscaled scored
below one starting from random vectors; scaled, 7.6 points above (its top 192 principal components) and
10.2 above (a copy at its width) over 3 seeds (docs/models.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

import kdplug

#: word-start marks (SentencePiece's, byte-level BPE's) and WordPiece's continuation mark: a
#: piece ``▁good`` or ``Ġgood`` is the word "good" in a file of word vectors, ``##ing`` is no word
WORD_STARTS, CONTINUATION = ("\u2581", "\u0120"), "##"


def set_scaled(target: torch.Tensor, vectors: torch.Tensor, rows: Optional[torch.Tensor] = None) -> float:
    """Write ``vectors`` (into ``rows`` of ``target``, else all of it) scaled to unit std; the scale."""
    spread = float(vectors.std()) if vectors.numel() > 1 else 0.0
    scale = 1.0 / spread if spread > 0 else 1.0
    with torch.no_grad():
        if rows is None:
            target.copy_(vectors * scale)
        else:
            target[rows] = (vectors * scale).to(target.dtype)
    return round(scale, 4)


def from_teacher(student: Any, teacher: Any) -> dict[str, Any]:
    """The teacher's input embeddings: a copy at the teacher's width, else their projection on the
    top ``embedding_dim`` principal components (PCA of the teacher's table); scaled. What was done."""
    table = teacher.model.get_input_embeddings().weight  # read where a sharded teacher offloaded it
    source = kdplug.api.fingerprint.readable(teacher.model, table).detach().float()
    target = student.embeddings.weight
    (rows, width), wanted = source.shape, target.shape[1]
    if target.shape[0] != rows or wanted > width:
        raise kdplug.UsageError(
            f"init_embeddings_from_teacher needs the teacher's vocabulary and at most its width: the teacher's "
            f"embeddings are {tuple(source.shape)}, the student's {tuple(target.shape)}. Use the teacher's "
            f"tokenizer and an embedding_dim of at most {width}, or drop init_embeddings_from_teacher"
        )
    done: dict[str, Any] = {"embeddings": "the teacher's"}
    vectors = source
    if wanted < width:
        # the principal directions from the width x width covariance (in float64): no vocab-sized factor
        centred = (source - source.mean(dim=0, keepdim=True)).double()
        variances, directions = torch.linalg.eigh(centred.T @ centred)  # ascending
        top = directions[:, -wanted:].flip(1)
        # each direction's sign made definite (its largest entry positive), so a run is reproducible
        signs = torch.sign(top.gather(0, top.abs().argmax(dim=0, keepdim=True)))
        vectors = (centred @ (top * signs)).float()
        kept = float(variances[-wanted:].sum() / variances.sum())
        done = {"embeddings": f"the teacher's, PCA {width} -> {wanted}", "variance_kept": round(kept, 4)}
    return {**done, "scaled_by": set_scaled(target, vectors)}


def _fields(line: str, width: int) -> list[str]:
    """A line's word and numbers: the last ``width`` space-separated fields are the numbers (a few
    GloVe "words" hold spaces themselves)."""
    return line.rstrip().rsplit(" ", width)


def _is_header(fields: list[str]) -> bool:
    return len(fields) == 2 and all(part.isdigit() for part in fields)  # word2vec's "count width"


def vector_file_width(path: str) -> int:
    """The width of the vectors in a GloVe / word2vec text file (read from its first line that is not blank)."""
    with open(check_file(path), encoding="utf-8", errors="replace") as handle:
        first = next((line.rstrip().split(" ") for line in handle if line.strip()), [])
    if _is_header(first):
        return int(first[1])
    if len(first) < 2:
        raise kdplug.UsageError(f"student_options.embeddings={path}: its first line holds no word vector")
    return len(first) - 1


def check_file(path: str) -> Path:
    """``path`` as a readable file, else a usage error that says what it is instead."""
    file = Path(path).expanduser()
    where = f"student_options.embeddings={path}" + ("" if file.is_absolute() else f" ({file.absolute()})")
    if file.is_dir():
        problem = "is a directory"
    elif not file.is_file():
        problem = "no such file"
    else:
        try:
            with open(file, "rb"):
                return file
        except OSError as error:
            problem = f"cannot be read ({error.strerror})"
    raise kdplug.UsageError(
        f"{where}: {problem}; give a file of word vectors in the GloVe or word2vec text format (a word, then its "
        f"numbers, one word a line)"
    )


def vocabulary_words(tokenizer: Any, rows: int) -> dict[str, list[int]]:
    """Each whole word of the vocabulary and the rows that hold it (``▁good`` and ``good`` are one)."""
    words: dict[str, list[int]] = {}
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token, index in tokenizer.get_vocab().items():
        if index in special or index >= rows or token.startswith(CONTINUATION):
            continue
        word = token[1:] if token.startswith(WORD_STARTS) else token
        if word:
            words.setdefault(word, []).append(index)
    return words


def from_file(student: Any, tokenizer: Any, path: str) -> dict[str, Any]:
    """Rows of the student's vocabulary found in a GloVe / word2vec text file take its vectors;
    the rest keep their random start. A word takes the vector of the same word if the file has it,
    else of its first case-insensitive match (files list frequent words first: "the" before "The").
    A piece ``▁word`` / ``Ġword`` is looked up as ``word``. Vectors are scaled to unit std."""
    target = student.embeddings.weight
    width = target.shape[1]
    words = vocabulary_words(tokenizer, target.shape[0])
    by_lower: dict[str, list[int]] = {}
    for word, indices in words.items():
        by_lower.setdefault(word.lower(), []).extend(indices)
    vectors = torch.zeros(target.shape, dtype=torch.float32)
    exact: set[int] = set()
    folded: set[int] = set()
    # streamed: GloVe's largest files are several GB; a word that is not UTF-8 matches no token anyway
    with open(check_file(path), encoding="utf-8", errors="replace") as handle:
        first = True  # the first line that is not blank may be word2vec's header
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            fields = _fields(line, width)
            if first and _is_header(fields):
                first = False
                continue
            first = False
            if len(fields) != width + 1:
                raise kdplug.UsageError(
                    f"student_options.embeddings={path}, line {number}: {len(fields) - 1} numbers after the word, "
                    f"expected {width} (the file's width, which sets the student's embedding_dim)"
                )
            word = fields[0]
            hits = [(i, True) for i in words.get(word, ()) if i not in exact]
            hits += [(i, False) for i in by_lower.get(word.lower(), ()) if i not in exact and i not in folded]
            if not hits:
                continue
            try:
                vector = torch.tensor([float(x) for x in fields[1:]])
            except ValueError:
                raise kdplug.UsageError(
                    f"student_options.embeddings={path}, line {number}: a field after the word is not a number"
                ) from None
            for index, is_exact in hits:
                vectors[index] = vector
                (exact if is_exact else folded).add(index)
    found = sorted(exact | folded)
    if not found:
        raise kdplug.UsageError(
            f"student_options.embeddings={path}: none of the student's {len(words)} vocabulary words is in the "
            f"file; check that it holds word vectors for the task's language"
        )
    rows = torch.tensor(found)
    scale = set_scaled(target, vectors[rows], rows)
    return {"embeddings": str(path), "words_found": len(found), "vocabulary": len(words), "scaled_by": scale}

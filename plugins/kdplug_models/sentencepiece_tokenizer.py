"""A SentencePiece vocabulary trained on the task's own training text, for the non-Transformer students.

Universal-KD matches teacher and student in output space (the student's layer vectors are
projected and compared through the teacher's classifier), never token by token, so a student
need not read the teacher's vocabulary: a BiLSTM or Gated-CNN may use a smaller one fitted to
the task. SentencePiece (Kudo & Richardson 2018) trains it on the task's training texts.

The trained pieces and scores are converted into a Hugging Face fast tokenizer (a ``tokenizers``
Unigram or BPE model in ``PreTrainedTokenizerFast``), so the engine encodes, pads, truncates,
fingerprints, saves and reloads it like any other tokenizer, and a saved student needs nothing
but ``transformers`` to read its text again. The conversion segments exactly as SentencePiece
does (tests/plugins/test_sentencepiece.py checks it). Both sides see the same text: it is
NFKC-normalised with runs of whitespace collapsed before SentencePiece trains on it (its own
normaliser is switched off), and the fast tokenizer applies that same normaliser.

A pair is one sequence, ``A </s> B </s>``, as Universal-KD's students read pairs (App. A.2); a
single text is ``A </s>``, so no encoding is ever empty. Trained models are stored under the
run's cache directory (``<cache>/sentencepiece/<fingerprint>/sentencepiece.model``, with kdplug's
checksums: ``kdplug cache`` lists and clears them), keyed by the texts and the settings, so runs,
stages and processes over the same data train once.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

import kdplug
from kdplug import fingerprint, storage
from kdplug.storage import atomic_directory, complete_copy, file_lock, raise_as_storage_error, verify

log = logging.getLogger("kdplug.models.sentencepiece")

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"  # ids 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe")
DEFAULT_VOCAB_SIZE = 8000
#: bumped whenever training settings or the stored layout change, so that older stored models are not reused
#: (2: a checksummed folder per model, under the run's cache directory)
FORMAT_VERSION = 2
#: the model's file in its folder
MODEL_FILE = "sentencepiece.model"
#: the folder of the cache root the trained models go to, for ``kdplug cache`` (a student using them declares it)
STORE = "sentencepiece"
STORES = {STORE: "SentencePiece student tokenizers"}


def _normalizer():
    from tokenizers import Regex, normalizers

    return normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()])


def normalize_text(text: str) -> str:
    """The text as SentencePiece is trained on it and the tokenizer reads it: NFKC, single spaces."""
    return _normalizer().normalize_str(text)


def task_texts(task: Any) -> list[str]:
    """Every text of the task's training split (``text_a``, and ``text_b`` of pairs)."""
    texts = []
    for example in task.load_split("train"):
        texts.append(example.text_a)
        if example.text_b is not None:
            texts.append(example.text_b)
    return texts


def task_sentencepiece_tokenizer(
    task: Any, *, vocab_size: int = DEFAULT_VOCAB_SIZE, model_type: str = "unigram", cache_root: Optional[Path] = None
):
    """The SentencePiece tokenizer of ``task``'s training text (trained once, then reused)."""
    texts = task_texts(task)
    if not texts:
        raise kdplug.DataError(  # not through capabilities(): the task's name
            f"task {getattr(task, 'name', task)!r} has no training text to train a SentencePiece "
            f"vocabulary on; use the teacher's tokenizer (student option tokenizer=teacher)"
        )
    return sentencepiece_tokenizer(texts, vocab_size=vocab_size, model_type=model_type, cache_root=cache_root)


def sentencepiece_tokenizer(
    texts: Sequence[str],
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_type: str = "unigram",
    cache_root: Optional[Path] = None,
):
    """A fast tokenizer over a SentencePiece model of ``texts``.

    ``vocab_size`` is an upper bound: a text too small for it gets the largest vocabulary it
    supports (SentencePiece's soft limit), and the log says so.
    """
    path = trained_model(texts, vocab_size=vocab_size, model_type=model_type, cache_root=cache_root)
    return tokenizer_from_model(path.read_bytes(), model_type)


def trained_model(
    texts: Sequence[str],
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_type: str = "unigram",
    cache_root: Optional[Path] = None,
) -> Path:
    """The path of the stored SentencePiece model of ``texts``, training it on first use."""
    import sentencepiece

    if model_type not in MODEL_TYPES:
        raise kdplug.UsageError(f"sentencepiece_model_type={model_type!r} is not supported; use one of {MODEL_TYPES}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise kdplug.UsageError(f"sentencepiece_vocab_size={vocab_size!r} must be a positive integer")
    normalize = _normalizer().normalize_str
    texts = [normalize(text) for text in texts]  # what the fast tokenizer's own normaliser will read
    settings = {
        "format": FORMAT_VERSION,
        "sentencepiece": sentencepiece.__version__,
        "vocab_size": vocab_size,
        "model_type": model_type,
    }
    key = fingerprint.of_values(settings, _digest(texts))
    # the run's cache directory (--cache-dir), which its preflight checked is writable
    directory = Path(cache_root or storage.cache_root()) / STORE
    target = directory / key
    try:
        with file_lock(directory / f"{key}.lock"):
            found = _stored(target)
            if found is not None:
                return found
            model = _train(texts, vocab_size=vocab_size, model_type=model_type)
            with atomic_directory(target, f"the SentencePiece model {target}") as staging:
                (staging / MODEL_FILE).write_bytes(model)
    except OSError as exc:
        raise_as_storage_error(exc, f"the SentencePiece model in {directory}", "nothing was stored")
        raise
    path = target / MODEL_FILE
    pieces = sentencepiece.SentencePieceProcessor(model_proto=model).get_piece_size()
    log.info(
        "sentencepiece: trained a %s vocabulary of %d pieces on %d texts -> %s", model_type, pieces, len(texts), path
    )
    if pieces < vocab_size:
        log.info(
            "sentencepiece: the training text supports %d pieces, fewer than sentencepiece_vocab_size=%d",
            pieces,
            vocab_size,
        )
    return path


def _stored(target: Path) -> Optional[Path]:
    """The stored model's file, where it is complete and reads back; None (after saying why) where not."""
    import sentencepiece

    found = complete_copy(target, lambda path: (path / MODEL_FILE).is_file())
    if found is None:
        return None
    problems = verify(found)
    try:
        if not problems:
            sentencepiece.SentencePieceProcessor(model_file=str(found / MODEL_FILE))
            log.info("sentencepiece: reusing %s", found / MODEL_FILE)
            return found / MODEL_FILE
    except (RuntimeError, OSError) as exc:
        problems = [str(exc)]
    log.warning("sentencepiece: %s is unreadable (%s); training it again", found, "; ".join(problems))
    return None


def _digest(texts: Iterable[str]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def _train(texts: Sequence[str], *, vocab_size: int, model_type: str) -> bytes:
    """Serialized SentencePiece model; deterministic (one thread, every sentence, no sampling) and
    quiet (``minloglevel=3``: its progress log would otherwise flood stderr)."""
    import sentencepiece

    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            model_type=model_type,
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            normalization_rule_name="identity",
            character_coverage=1.0,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            pad_piece=PAD,
            unk_piece=UNK,
            bos_piece=BOS,
            eos_piece=EOS,
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            minloglevel=3,
        )
    except RuntimeError as exc:
        raise kdplug.UsageError(
            f"SentencePiece could not train a {model_type} vocabulary of {vocab_size} "
            f"pieces on {len(texts)} texts: {exc}. Raise sentencepiece_vocab_size "
            f"(it must at least hold every character of the text)"
        ) from None
    return model.getvalue()


def tokenizer_from_model(model: bytes, model_type: str):
    """A ``PreTrainedTokenizerFast`` that segments as the serialized SentencePiece ``model``."""
    import sentencepiece
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    unk_id = processor.unk_id()
    if model_type == "unigram":
        backend = Tokenizer(models.Unigram(pieces, unk_id=unk_id, byte_fallback=False))
    else:
        vocab = {piece: index for index, (piece, _) in enumerate(pieces)}
        backend = Tokenizer(models.BPE(vocab, _bpe_merges(processor, pieces), unk_token=UNK, fuse_unk=True))
    backend.normalizer = _normalizer()
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    eos_id = processor.eos_id()
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="right",
        truncation_side="right",
        model_input_names=["input_ids", "attention_mask"],
    )


def _bpe_merges(processor: Any, pieces: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """The merges that reproduce SentencePiece's BPE: it joins the adjacent pair whose union
    scores highest, so every split of a piece into two pieces ranks by the union's score."""
    ids = {piece: index for index, (piece, _) in enumerate(pieces)}
    normal = [
        index
        for index in range(len(pieces))
        if not (processor.is_control(index) or processor.is_unknown(index) or processor.is_unused(index))
    ]
    merges = []
    for index in sorted(normal, key=lambda i: (-pieces[i][1], i)):
        piece = pieces[index][0]
        splits = [
            (piece[:cut], piece[cut:]) for cut in range(1, len(piece)) if piece[:cut] in ids and piece[cut:] in ids
        ]
        merges.extend(sorted(splits, key=lambda pair: (ids[pair[0]], ids[pair[1]])))
    return merges

"""A vocabulary trimmed to the task: the embedding rows of the tokens a task's texts use, and a
tokenizer that matches (what TextPruner calls vocabulary pruning).

A student that reads with its teacher's tokenizer carries all of its rows (BERT's 30,522 x 384
for kdplug's BiLSTM under MiniLM: most of its weights), while a task uses a few thousand. The
trimmed tokenizer keeps exactly the tokens that tokenising the task's texts produced, plus every
special token, renumbered in their old order; the model keeps those rows of its input embeddings.

Why the texts it was built from tokenise exactly as before: WordPiece takes the longest
vocabulary match at each position, and every piece it took is kept, so it is still the longest;
a unigram model takes the most probable segmentation, and every piece of it is kept, so it is
still the most probable. Each kept token then has its old embedding row, so the model computes
what it computed. Text from outside that set may now meet a missing piece, and a word WordPiece
cannot piece together from what is left becomes the unknown token, as any unseen word would.
Byte-level BPE (RoBERTa) is not trimmed: its merges would have to be pruned too.

What is kept, and why: the texts the student will read. The training split and the transfer set
alone are too few (the demo's training set uses 480 of BERT's 30,522 tokens, and words as common
as ``film`` or ``again`` then read as unknown), so a corpus the user names (``--vocab-corpus``:
unlabelled text of the domain the student will serve) adds every token it uses at least
``min_count`` times. The dev split is not used to build the vocabulary: it is the held-out sample
on which the share of tokens now read as unknown is measured and reported, and above
:data:`UNKNOWN_WARNING` kdplug warns.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from .errors import UsageError

Text = Any  # a string, or a (text, pair) tuple

#: the share of unknown tokens, on texts the vocabulary was not built from, above which kdplug warns. With
#: the full WordPiece vocabulary English text has next to none; at 1% a sentence of 20 tokens has about
#: one chance in five (1 - 0.99**20) of losing a word the student could read before.
UNKNOWN_WARNING = 0.01

#: the tokenizer models whose segmentation is unchanged by keeping the pieces it used (see above)
TRIMMABLE = ("WordPiece", "Unigram")


@dataclass
class TrimReport:
    """What trimming kept: ``kept`` old token ids in their new order, and the sizes before and after."""

    kept: list[int]
    vocab_before: int
    vocab_after: int
    embedding_dim: int

    def describe(self) -> str:
        mb = lambda rows: rows * self.embedding_dim * 4 / 1e6  # noqa: E731  float32 bytes, as MB
        return (
            f"vocabulary {self.vocab_before} -> {self.vocab_after} tokens; embedding table "
            f"{mb(self.vocab_before):.1f} MB -> {mb(self.vocab_after):.1f} MB"
        )


def token_counts(tokenizer: Any, texts: Iterable[Text], *, chunk: int = 1024) -> Counter:
    """How often each token id occurs when ``texts`` are tokenised (untruncated), special tokens included."""
    counts: Counter = Counter()
    batch: list[Text] = []

    def flush() -> None:
        first = [t[0] if isinstance(t, tuple) else t for t in batch]
        second = [t[1] for t in batch] if batch and isinstance(batch[0], tuple) else None
        for ids in tokenizer(first, second, truncation=False, verbose=False)["input_ids"]:
            counts.update(ids)
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) >= chunk:
            flush()
    if batch:
        flush()
    return counts


def used_token_ids(tokenizer: Any, texts: Iterable[Text], *, chunk: int = 1024) -> set[int]:
    """Every token id that tokenising ``texts`` (untruncated) produces, special tokens included."""
    return set(token_counts(tokenizer, texts, chunk=chunk))


def kept_token_ids(tokenizer: Any, texts: Iterable[Text], corpus: Sequence[Text] = (), min_count: int = 1) -> set[int]:
    """The tokens a trimmed vocabulary keeps: every token of ``texts`` (the training split and the
    transfer set) and those of ``corpus`` that occur at least ``min_count`` times."""
    kept = used_token_ids(tokenizer, texts)
    kept.update(token for token, count in token_counts(tokenizer, corpus).items() if count >= min_count)
    return kept


def unknown_share(tokenizer: Any, texts: Sequence[Text]) -> float:
    """The share of the tokens of ``texts`` (special tokens aside) that ``tokenizer`` reads as unknown."""
    unknown = tokenizer.unk_token_id
    specials = set(tokenizer.all_special_ids) - {unknown}
    counts = token_counts(tokenizer, texts)
    total = sum(count for token, count in counts.items() if token not in specials)
    return counts.get(unknown, 0) / total if total else 0.0


@dataclass
class Coverage:
    """How a trimmed vocabulary reads texts it was not built from (``where``): the share of their
    tokens read as unknown before (the full vocabulary) and after."""

    where: str
    before: float
    after: float

    def describe(self) -> str:
        return (
            f"on the {self.where} (not used to build it) {self.after * 100:.1f}% of the tokens are unknown "
            f"({self.before * 100:.1f}% with the full vocabulary)"
        )

    def warning(self, fix: str) -> Optional[str]:
        """What to tell the user when the trimmed vocabulary leaves too much unread, else None."""
        if self.after - self.before <= UNKNOWN_WARNING:
            return None
        return (
            f"the trimmed vocabulary reads {self.after * 100:.1f}% of the tokens of the {self.where} as unknown, "
            f"against {self.before * 100:.1f}% with the full vocabulary (kdplug warns {UNKNOWN_WARNING * 100:.0f} "
            f"point above it): the student will not read words it could read before. {fix}"
        )

    def record(self) -> dict:
        return {"measured_on": self.where, "unknown_before": self.before, "unknown_after": self.after}


def measure_coverage(full: Any, trimmed: Any, texts: Sequence[Text], where: str) -> Coverage:
    return Coverage(where, unknown_share(full, texts), unknown_share(trimmed, texts))


def read_corpus(path: str, option: str) -> list[str]:
    """The texts of a vocabulary corpus: a UTF-8 (or BOM-marked) text file, one text per line."""
    from pathlib import Path

    from . import textio

    path = str(Path(path).expanduser())
    if not Path(path).is_file():
        raise UsageError(f"{option} {path}: no such file; name a text file, one text per line")
    lines = [line for line in textio.read_text(path, option=None).splitlines() if line]  # no option: UTF-8 only
    if not lines:
        raise UsageError(f"{option} {path} holds no text; name a text file, one text per line")
    return lines


def trim_tokenizer(tokenizer: Any, keep: Iterable[int]) -> tuple[Any, list[int]]:
    """A fast tokenizer with only the tokens ``keep`` (plus every special token), renumbered in
    their old order; returns it and the kept old ids, position = new id."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UsageError(f"a {type(tokenizer).__name__} is not a fast tokenizer: kdplug trims only those")
    data = json.loads(backend.to_str())
    model = data["model"]
    if model["type"] not in TRIMMABLE:
        raise UsageError(
            f"the student's tokenizer is a {model['type']} model; kdplug trims {' and '.join(TRIMMABLE)} "
            f"vocabularies, whose segmentation of the kept texts cannot change (a byte-level BPE's merges "
            f"would have to be pruned too). Export without --trim-vocab"
        )
    specials = set(tokenizer.all_special_ids) | {t["id"] for t in data.get("added_tokens", [])}
    kept = sorted(set(keep) | specials)
    new_id = {old: new for new, old in enumerate(kept)}
    if model["type"] == "WordPiece":
        old_vocab = {index: token for token, index in model["vocab"].items()}
        model["vocab"] = {old_vocab[old]: new for old, new in new_id.items()}
    else:  # Unigram: a list of [piece, score], a piece's id its position
        model["vocab"] = [model["vocab"][old] for old in kept]
        if model.get("unk_id") is not None:
            model["unk_id"] = new_id[model["unk_id"]]
    for added in data.get("added_tokens", []):
        added["id"] = new_id[added["id"]]
    _renumber_post_processor(data.get("post_processor"), new_id)
    trimmed = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        model_max_length=tokenizer.model_max_length,
        padding_side=tokenizer.padding_side,
        truncation_side=tokenizer.truncation_side,
        **tokenizer.special_tokens_map,
    )
    return trimmed, kept


def _renumber_post_processor(processor: Any, new_id: dict[int, int]) -> None:
    """The ids the post-processor inserts ([CLS], [SEP], <s> ...) in the new numbering."""
    if not processor:
        return
    kind = processor.get("type")
    if kind == "Sequence":
        for inner in processor.get("processors", []):
            _renumber_post_processor(inner, new_id)
    elif kind == "TemplateProcessing":
        for special in processor.get("special_tokens", {}).values():
            special["ids"] = [new_id[i] for i in special["ids"]]
    elif kind in ("BertProcessing", "RobertaProcessing"):
        for key in ("sep", "cls"):
            token, index = processor[key]
            processor[key] = [token, new_id[index]]


def trim_embeddings(model: nn.Module, kept: Sequence[int]) -> None:
    """Keep only the rows ``kept`` of ``model``'s input embeddings, in that order (row i of the new
    table is row ``kept[i]`` of the old), and say so in its config."""
    old = model.get_input_embeddings()
    index = torch.tensor(list(kept), dtype=torch.long, device=old.weight.device)
    config = getattr(model, "config", None)
    pad = getattr(config, "pad_token_id", None)
    new_pad = list(kept).index(pad) if pad is not None and pad in kept else None
    table = nn.Embedding(len(kept), old.embedding_dim, padding_idx=new_pad, device=old.weight.device)
    with torch.no_grad():
        table.weight.copy_(old.weight.index_select(0, index))  # (vocab_before, dim) -> (vocab_after, dim)
    model.set_input_embeddings(table)
    if config is not None:
        config.vocab_size = len(kept)
        if new_pad is not None:
            config.pad_token_id = new_pad


def trim(
    model: nn.Module, tokenizer: Any, texts: Iterable[Text], corpus: Sequence[Text] = (), min_count: int = 1
) -> tuple[Any, TrimReport]:
    """Trim ``model`` (in place) and ``tokenizer`` to the tokens :func:`kept_token_ids` keeps; the new tokenizer."""
    embeddings = model.get_input_embeddings()
    if embeddings is None:
        raise UsageError(f"a {type(model).__name__} does not expose its input embeddings: it cannot be trimmed")
    before = embeddings.num_embeddings
    if before != len(tokenizer):
        raise UsageError(
            f"the model's embedding table has {before} rows but its tokenizer {len(tokenizer)} tokens: the two "
            f"do not belong together, so kdplug cannot tell which rows a token uses"
        )
    trimmed, kept = trim_tokenizer(tokenizer, kept_token_ids(tokenizer, texts, corpus, min_count))
    trim_embeddings(model, kept)
    return trimmed, TrimReport(kept, before, len(kept), embeddings.embedding_dim)

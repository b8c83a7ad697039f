"""TinyBERT-style word replacement with the teacher's own knowledge of words.

Jiao et al. (2020), "TinyBERT", Algorithm 1: every word is replaced with probability p_t = 0.4
by one of K = 15 candidates; as in the reference code, stop words and tokens with non-letters
(punctuation attached) are left alone, and the sides of a pair are augmented each on its own.
For a word the tokenizer keeps whole, the candidates are the masked-language model's top-K
predictions at its position; TinyBERT takes the others' from GloVe
neighbours. Here both come from the teacher: its MLM head where its pre-trained checkpoint has
one (BERT, RoBERTa), otherwise (sentence encoders such as all-MiniLM-L6-v2, which ship no MLM
head, and words split into pieces) the K whole words nearest in the teacher's input embeddings
(cosine; a word's vector is the mean of its pieces').
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Annotated, Optional

import torch

import kdplug
from kdplug.api import Positive, Range
from kdplug.errors import ConfigError
from kdplug.words import is_replaceable

log = logging.getLogger(__name__)

CITATION = (
    "Jiao, Yin, Shang, Jiang, Chen, Li, Wang, Liu. TinyBERT: Distilling BERT for Natural Language "
    "Understanding. Findings of EMNLP 2020"
)
SOURCES = ("auto", "mlm", "embeddings")


def load_mlm(source: Optional[str], *, trust_remote_code: bool = False):
    """The masked-language model of a pre-trained checkpoint, or None when it has no MLM head (its
    weights would be newly initialised) or cannot be loaded without the network. Its own code runs
    only where the user allowed the teacher's (``teacher_options.trust_remote_code``)."""
    if not source:
        return None
    from transformers import AutoModelForMaskedLM

    try:
        # the teacher was loaded from the same checkpoint, so its files are local already
        model, info = AutoModelForMaskedLM.from_pretrained(
            source, output_loading_info=True, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as exc:
        log.info("no masked-language model for %s (%s)", source, exc)
        return None
    head_missing = any(key.startswith(("cls.", "lm_head", "vocab_", "predictions")) for key in info["missing_keys"])
    return None if head_missing else model.eval()


class TeacherWordsAugmenter:
    """Replace each word with probability ``p_replace`` by one of ``candidates`` teacher-chosen words."""

    citation = CITATION
    pair_schedule = "cycle"
    reads_teacher_weights = True  # its input embeddings and MLM head

    def __init__(
        self,
        teacher,
        *,
        p_replace: Annotated[float, Range(0, 1)] = 0.4,
        candidates: Positive = 15,
        source: str = "auto",
    ) -> None:
        self.check_options(p_replace=p_replace, candidates=candidates, source=source)
        self.p_replace, self.k = float(p_replace), int(candidates)
        self.tokenizer = teacher.tokenizer
        trusted = bool(teacher.extra.get("trust_remote_code"))
        self.mlm = (
            load_mlm(teacher.pretrained or teacher.source, trust_remote_code=trusted)
            if source != "embeddings"
            else None
        )
        if source == "mlm" and self.mlm is None:
            raise ConfigError(
                f"augment_options.source=mlm: the teacher's checkpoint {teacher.pretrained or teacher.source} "
                f"has no masked-language-model head here; use source=embeddings (or auto)"
            )
        self.source = "mlm" if self.mlm is not None else "embeddings"
        table = teacher.model.get_input_embeddings().weight  # read where a sharded teacher offloaded it
        embeddings = kdplug.api.fingerprint.readable(teacher.model, table).detach().float().cpu()
        self.embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
        vocab = self.tokenizer.get_vocab()
        special = set(self.tokenizer.all_special_ids)
        # whole words only: no continuation pieces (##ing), no special or unused tokens, letters only
        self.word_ids = torch.tensor(
            sorted(i for token, i in vocab.items() if i not in special and token.isalpha() and i < len(embeddings))
        )
        self.id_to_token = {i: token for token, i in vocab.items()}
        self._neighbours: dict[str, list[str]] = {}
        self._mlm_candidates: dict[str, list[Optional[list[str]]]] = {}

    @staticmethod
    def check_options(*, p_replace: float = 0.4, candidates: int = 15, source: str = "auto", **_: object) -> None:
        """Valid values, asked before the run's expensive work."""
        if not isinstance(p_replace, (int, float)) or not 0.0 <= float(p_replace) <= 1.0:
            raise ConfigError(f"augment_options.p_replace must be a probability between 0 and 1, got {p_replace!r}")
        if not isinstance(candidates, int) or candidates < 1:
            raise ConfigError(f"augment_options.candidates must be a whole number, at least 1, got {candidates!r}")
        if source not in SOURCES:
            raise ConfigError(f"augment_options.source must be one of {', '.join(SOURCES)}, got {source!r}")

    def neighbours(self, word: str) -> list[str]:
        """The ``k`` whole words nearest to ``word`` in the teacher's input embeddings."""
        if word not in self._neighbours:
            ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
            if not ids:
                self._neighbours[word] = []
            else:
                vector = torch.nn.functional.normalize(self.embeddings[ids].mean(0), dim=0)
                scores = self.embeddings[self.word_ids] @ vector
                best = self.word_ids[scores.topk(min(self.k + len(ids), len(scores))).indices].tolist()
                self._neighbours[word] = [self.id_to_token[i] for i in best if i not in ids][: self.k]
        return self._neighbours[word]

    @torch.no_grad()
    def mlm_candidates(self, words: Sequence[str]) -> list[Optional[list[str]]]:
        """Per word: the MLM's top-k predictions with the word masked, for single-piece words (None otherwise)."""
        pieces = [self.tokenizer(word, add_special_tokens=False)["input_ids"] for word in words]
        single = [i for i, ids in enumerate(pieces) if len(ids) == 1]
        found: list[Optional[list[str]]] = [None] * len(words)
        if not single:
            return found
        base = self.tokenizer(list(words), is_split_into_words=True, truncation=True, max_length=128)
        word_of = base.word_ids()
        rows, positions = [], []
        for i in single:
            if i not in word_of:
                continue  # truncated away
            position = word_of.index(i)
            ids = list(base["input_ids"])
            ids[position] = self.tokenizer.mask_token_id
            rows.append(ids)
            positions.append((i, position))
        if not rows:
            return found
        logits = self.mlm(input_ids=torch.tensor(rows)).logits
        special = set(self.tokenizer.all_special_ids)
        for row, (i, position) in enumerate(positions):
            ranked = logits[row, position].topk(self.k + 8).indices.tolist()
            found[i] = [self.id_to_token[t] for t in ranked if t not in special and t != pieces[i][0]][: self.k]
        return found

    def candidates(self, text: str) -> list[list[str]]:
        if text not in self._mlm_candidates:
            words = text.split()
            from_mlm = self.mlm_candidates(words) if self.mlm is not None else [None] * len(words)
            self._mlm_candidates[text] = [c if c is not None else self.neighbours(w) for w, c in zip(words, from_mlm)]
        return self._mlm_candidates[text]

    def __call__(self, text: str, rng: random.Random) -> str:
        words = text.split()
        options = self.candidates(text)
        # as TinyBERT's code: stop words and tokens with punctuation attached are kept as they are
        return " ".join(
            rng.choice(choices) if choices and is_replaceable(word) and rng.random() < self.p_replace else word
            for word, choices in zip(words, options)
        )


@kdplug.hookimpl
def kdplug_register_augmenters(register):
    register(
        "teacher-words",
        TeacherWordsAugmenter,
        description="TinyBERT-style: each word (p 0.4) -> one of 15 teacher MLM predictions or embedding neighbours",
    )

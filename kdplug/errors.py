"""Errors that the CLI turns into a clear message and an exit code.

``UsageError`` and its subclasses mean the user asked for something that cannot work (exit 2);
the message always says what is wrong and how to fix it. For Python callers a ``UsageError`` is
also a ``ValueError``, and an :class:`ArgumentError` (an argument of the wrong type) a
``TypeError``, so ``except ValueError`` catches what it would catch from any other library.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Sequence

#: set to 1 (or ``kdplug --debug``) for tracebacks on the terminal, not only in a run's log.txt
DEBUG_ENV = "KDPLUG_DEBUG"


def debugging() -> bool:
    """Whether the user asked for tracebacks on the terminal."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


class KdplugError(Exception):
    """Base class of kdplug's own errors."""

    exit_code = 1


class UsageError(KdplugError, ValueError):
    """Bad input from the user: unknown names, malformed files or options. Exit code 2."""

    exit_code = 2


class ArgumentError(UsageError, TypeError):
    """A Python API argument of a type it cannot take; says which argument and what it accepts."""


class ConfigError(UsageError):
    """A configuration file or ``--set`` option is malformed or names an unknown key."""


class DataError(UsageError):
    """A data file is missing or malformed. Names the file, the line and what was expected."""

    def __init__(self, message: str, *, path: object = None, line: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f", line {line}"
            where += ": "
        super().__init__(where + message)
        self.path = path
        self.line = line


class OfflineError(UsageError):
    """Something had to be downloaded from a hub, and the hub cannot be reached."""


class PluginError(KdplugError):
    """A plugin is broken: it failed to import, registered a duplicate name, or misbehaved."""


class AmbiguousNameError(UsageError, PluginError):
    """A name that two plugins registered: the user picks one by disabling the other (exit 2)."""


def close_matches(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Names in ``candidates`` close to ``name``, best first.

    Compares against the whole name and against its first dash-separated part, so ``pdk``
    finds ``pkd-skip`` and ``bertt-4`` finds ``bert-4``.
    """
    scored = []
    for candidate in candidates:
        head = candidate.split("-", 1)[0]
        score = max(
            difflib.SequenceMatcher(None, name, candidate).ratio(),
            difflib.SequenceMatcher(None, name, head).ratio() - 0.01,
        )
        if score >= 0.6:
            scored.append((score, candidate))
    scored.sort(key=lambda item: -item[0])  # stable: ties keep the candidates' order
    return [candidate for _, candidate in scored[:n]]


class UnknownComponentError(UsageError):
    """A component name that no plugin registered."""

    def __init__(self, kind: str, name: str, available: Sequence[str], note: str = "") -> None:
        self.kind, self.name, self.available = kind, name, list(available)
        self.suggestions = close_matches(name, available)
        hint = f" Did you mean {' or '.join(repr(s) for s in self.suggestions[:2])}?" if self.suggestions else ""
        listing = ", ".join(sorted(available)) if available else "(none registered)"
        super().__init__(
            f"unknown {kind} {name!r}.{hint} Available {kind}{'es' if kind.endswith('s') else 's'}: {listing}. "
            f"Run 'kdplug plugins' to see every component and the plugin that provides it."
            + (f" {note}" if note else "")
        )

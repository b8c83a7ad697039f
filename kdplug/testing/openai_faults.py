"""Faults the test kit's OpenAI-compatible server (:mod:`kdplug.testing.openai_server`) injects on
request, so a client's retries can be tested against what real servers do: a rate limit, server
errors, an answer too slow for the client's timeout, a body that is not JSON, a dropped connection.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

#: each kind of fault and the parameters it takes, with their defaults
FAULT_KINDS: dict[str, dict[str, Any]] = {
    "429": {"retry_after": 1},  # 429 Too Many Requests with a Retry-After header (seconds)
    "500": {},  # 500 Internal Server Error, an OpenAI error body
    "503": {},  # 503 Service Unavailable, an OpenAI error body
    "timeout": {"seconds": 5.0},  # hold the request that long, then answer it as usual
    "malformed": {},  # 200 with a body that is not JSON
    "drop": {},  # close the connection without a response
}

#: the body of a "malformed" answer: a response cut off in the middle
MALFORMED_BODY = b'{"id": "cmpl-cut", "object": "text_completion", "choices": [{"index": 0, "text": "'


@dataclass(frozen=True)
class Fault:
    """One injected fault: its kind (a key of :data:`FAULT_KINDS`) and its parameters."""

    kind: str
    params: dict = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.params[name]
        except KeyError:
            raise AttributeError(name) from None


class FaultQueue:
    """The faults still to inject, in order, one taken per scoring request."""

    def __init__(self) -> None:
        self._queue: collections.deque[Fault] = collections.deque()
        self._lock = threading.Lock()

    def add(self, kind: str, count: int = 1, **params: Any) -> None:
        """Queue ``count`` faults of ``kind`` with ``params``; a ``ValueError`` names what is wrong."""
        kind = str(kind)
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; the server injects {', '.join(map(repr, FAULT_KINDS))}")
        unknown = sorted(set(params) - set(FAULT_KINDS[kind]))
        if unknown:
            takes = ", ".join(FAULT_KINDS[kind]) or "no parameters"
            raise ValueError(f"fault {kind!r} takes {takes}, not {', '.join(unknown)}")
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a whole number >= 1, not {count!r}")
        fault = Fault(kind, {**FAULT_KINDS[kind], **params})
        with self._lock:
            self._queue.extend([fault] * count)

    def take(self) -> Optional[Fault]:
        """The next fault to inject, or None when none is queued."""
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue)

"""The HTTP side of the served teacher: an OpenAI-compatible endpoint asked many questions at once,
with retries, an optional rate limit, and every answer stored as it arrives.

The API key lives in one attribute of :class:`Endpoint`, read from the environment, and leaves it
only in the ``Authorization`` header: no message, repr, cache key or record holds it (a server's
error text that quotes it is masked).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from kdplug.api import RunInterrupted, stop_requested
from kdplug.errors import KdplugError, UsageError
from kdplug.storage import atomic_directory, open_own_file, write_atomic

log = logging.getLogger(__name__)

#: statuses worth asking again: a rate limit, a server error, a gateway's time-out
RETRIED_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
#: the longest wait between two tries, whatever Retry-After says (seconds)
LONGEST_WAIT = 120.0


class ServedError(KdplugError):
    """The served teacher's endpoint kept failing (exit code 1): what was answered is stored."""


class Unanswerable(Exception):
    """One try failed in a way worth another (the status or the fault, and the server's wait)."""

    def __init__(self, reason: str, status: Optional[int] = None, wait: Optional[float] = None) -> None:
        super().__init__(reason)
        self.reason, self.status, self.wait = reason, status, wait


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to try: ``max_retries`` tries after the first, waiting ``backoff`` x 2^n
    seconds (times a random 0.5 to 1.5, so many clients do not come back together), or the server's
    Retry-After."""

    max_retries: int = 5
    backoff: float = 0.5
    timeout: float = 60.0

    def wait(self, attempt: int, asked: Optional[float]) -> float:
        if asked is not None:
            return min(max(asked, 0.0), LONGEST_WAIT)
        return min(self.backoff * 2**attempt * (0.5 + random.random()), LONGEST_WAIT)


class RateLimit:
    """Paces requests to at most ``per_minute`` requests and ``tokens_per_minute`` tokens (either None:
    no limit), shared by every thread."""

    def __init__(self, per_minute: Optional[int], tokens_per_minute: Optional[int]) -> None:
        self.per_minute, self.tokens_per_minute = per_minute, tokens_per_minute
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def take(self, tokens: int) -> None:
        if self.per_minute is None and self.tokens_per_minute is None:
            return
        spacing = 60.0 / self.per_minute if self.per_minute else 0.0
        if self.tokens_per_minute:
            spacing = max(spacing, 60.0 * tokens / self.tokens_per_minute)
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + spacing
        if start > now:
            time.sleep(start - now)


class Endpoint:
    """An OpenAI-compatible server at ``base_url`` (ending in ``/v1``), one keep-alive connection per
    thread, asked with :meth:`post`."""

    def __init__(
        self,
        base_url: str,
        api_key: Optional[str],
        policy: RetryPolicy,
        limit: RateLimit,
        *,
        key_variable: str = "OPENAI_API_KEY",
    ) -> None:
        parsed = checked_url(base_url.rstrip("/"))
        self.scheme, self.host, self.port, self.path = parsed.scheme, parsed.hostname, parsed.port, parsed.path
        self.base_url = base_url.rstrip("/")
        self._key, self.key_variable = api_key, key_variable
        self.policy, self.limit = policy, limit
        self._local = threading.local()

    def __repr__(self) -> str:  # never the key
        return f"Endpoint({self.base_url!r})"

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path}"

    def post(
        self, path: str, body: dict[str, Any], tokens: int = 0, read: Callable[[dict[str, Any]], Any] = lambda r: r
    ) -> tuple[dict[str, Any], Any]:
        """The server's JSON answer to ``body`` at ``path`` and what ``read`` reads in it, tried up to
        ``max_retries`` more times on a retried status, a time-out, a dropped connection, malformed JSON
        or an answer ``read`` finds unusable; else :class:`ServedError`."""
        last: Optional[Unanswerable] = None
        for attempt in range(self.policy.max_retries + 1):
            if last is not None:
                time.sleep(self.policy.wait(attempt - 1, last.wait))
            self.limit.take(tokens)
            try:
                response = self._once(path, body)
                return response, _usable(response, read)
            except Unanswerable as fault:
                log.debug("%s: %s (try %d)", self.url(path), fault.reason, attempt + 1)
                last = fault
        hint = (
            "; does the server support this scoring (teacher_options.scoring)?"
            if last.reason.startswith(UNUSABLE)
            else ""
        )
        error = ServedError(
            f"the served teacher's endpoint {self.url(path)} failed {self.policy.max_retries + 1} times; the last "
            f"answer: {last.reason}{hint}. The answers already received are stored: once the server answers, run "
            f"the same command again (the failed run's directory is replaced) to ask only for the rest "
            f"(teacher_options.max_retries and timeout allow more tries and a longer wait)."
        )
        error.how_to_continue = "run the same command again"  # the message says it: the run's own advice is left out
        raise error

    def _once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            connection = self._connection()
            connection.request("POST", f"{self.path}/{path}", body=payload, headers=headers)
            response = connection.getresponse()
            status, raw = response.status, response.read()
            asked = _retry_after(response.getheader("Retry-After"))
        except TimeoutError:
            self._drop()
            raise Unanswerable(f"no answer within {self.policy.timeout:g} s (teacher_options.timeout)") from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise Unanswerable(f"the connection failed ({type(exc).__name__}: {self.masked(str(exc))})") from None
        if status != 200:
            reason = f"HTTP {status}: {self.masked(_error_text(raw))}"
            if status in RETRIED_STATUSES:
                raise Unanswerable(reason, status, asked)
            raise self._refused(path, status, reason)
        try:
            return json.loads(raw)
        except ValueError:
            raise Unanswerable(f"HTTP 200 with a body that is not JSON ({raw[:80]!r})") from None

    def _refused(self, path: str, status: int, reason: str) -> KdplugError:
        """A status no retry changes: the request or the key is wrong."""
        advice = {
            401: (
                f"the server refused the key, read from the environment variable {self.key_variable} "
                f"({'set' if self._key else 'not set: no key was sent'}); export the server's key in it, or name "
                f"the variable that holds it with teacher_options.api_key_env"
            ),
            403: "the key may not use this model",
            404: f"check the model's name (GET {self.url('models')} lists the served ones) and base_url",
        }.get(status, "check the teacher's options")
        error = ServedError(f"the served teacher's endpoint {self.url(path)} answered {reason}; {advice}")
        error.status = status
        return error

    def masked(self, text: str) -> str:
        return text.replace(self._key, "[API key]") if self._key else text

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            connection = kind(self.host, self.port, timeout=self.policy.timeout)
            connection.connect()
            # headers and body leave in two writes: without this, Nagle's algorithm holds the body until the
            # server's delayed ACK (40 ms a request on Linux)
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.connection = connection
        return connection

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
        self._local.connection = None


#: how the reason for an answer that lacks what kdplug reads begins
UNUSABLE = "HTTP 200 without what kdplug reads"


def _usable(response: dict[str, Any], read: Callable[[dict[str, Any]], Any]) -> Any:
    """What ``read`` reads in ``response``; an answer it cannot read is a failed try (never stored)."""
    try:
        return read(response)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise Unanswerable(f"{UNUSABLE} ({type(exc).__name__}: {exc})") from None


def checked_url(url: str) -> urllib.parse.SplitResult:
    """``url`` taken apart, or a UsageError: not http(s), no host, a port that is not one, or credentials
    (they would be written to config.yaml and the records, and the key goes in an environment variable)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.username is not None or parsed.password is not None:  # never echoed: the password is in it
        raise UsageError(
            "teacher_options.base_url holds a user name or password (user:secret@host); options are written to "
            "config.yaml and the run's records, so give the address alone, and the key in the environment "
            "variable teacher_options.api_key_env names (OPENAI_API_KEY unless set): export OPENAI_API_KEY=..."
        )
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if parsed.scheme not in ("http", "https") or not parsed.hostname or port == -1:
        raise UsageError(
            f"teacher_options.base_url must be the server's http(s) address ending in /v1, with a port from 1 to "
            f"65535 if any, such as http://127.0.0.1:8000/v1, not {url!r}"
        )
    return parsed


def _retry_after(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _error_text(raw: bytes) -> str:
    """The error body's message, else its first characters."""
    try:
        error = json.loads(raw).get("error")
        return str(error.get("message") if isinstance(error, dict) else error)[:300]
    except (ValueError, AttributeError):
        return raw[:120].decode("utf-8", "replace") or "(no body)"


class AnswerStore:
    """Every answer, appended as it arrives to ``<directory>/answers.jsonl``, one line each with its
    request's key and a CRC-32 of both: a run killed mid-line leaves one line that fails its check,
    which is skipped (and asked again), never read as an answer."""

    FILE = "answers.jsonl"

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / self.FILE
        self.answers: dict[str, Any] = {}
        self.damaged = 0
        self._lock = threading.Lock()
        self._handle = None
        if self.path.is_file():
            self._read()

    def _read(self) -> None:
        intact: list[bytes] = []
        with open(self.path, "rb") as handle:
            for line in handle:
                try:
                    record = json.loads(line.decode("utf-8", "replace"))
                    key, value = record["k"], record["v"]
                    whole = record["c"] == _crc(key, value)
                except (ValueError, KeyError, TypeError):
                    whole = False
                if whole:
                    self.answers[key] = value
                    intact.append(line if line.endswith(b"\n") else line + b"\n")
                else:
                    self.damaged += 1
        if self.damaged:
            self._drop_damaged(intact)

    def _drop_damaged(self, intact: list[bytes]) -> None:
        """The file rewritten (atomically) with its intact lines alone, so a damaged one is skipped once, not on
        every run; an answer another process appends meanwhile may be lost, and is then asked again."""
        try:
            write_atomic(self.path, b"".join(intact))
            log.warning("%s: %d damaged answer line(s) dropped; they are asked again", self.path, self.damaged)
        except OSError as error:
            log.warning("%s: %d damaged answer line(s) skipped (not dropped: %s)", self.path, self.damaged, error)

    def get(self, key: str) -> Any:
        return self.answers.get(key)

    def put(self, key: str, value: Any) -> None:
        line = json.dumps({"k": key, "v": value, "c": _crc(key, value)}) + "\n"
        with self._lock:
            if self._handle is None:
                self._create()
                self._handle = open_own_file(self.path, "served teacher's answer file")
                if self._handle.tell() and not _ends_with_newline(self.path):
                    self._handle.write("\n")  # after a line cut short by a kill
            self._handle.write(line)
            self._handle.flush()  # in the kernel's hands: a killed process loses nothing written
            self.answers[key] = value

    def _create(self) -> None:
        """The store's folder, made as kdplug makes its cache entries (atomically, with a checksum record
        naming its files), so ``kdplug cache`` lists and clears it; its answer file then grows."""
        folder = self.path.parent
        if folder.exists():
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        with atomic_directory(folder, f"the served teacher's answer store {folder}") as staging:
            (staging / self.FILE).touch()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def _crc(key: str, value: Any) -> int:
    return zlib.crc32(json.dumps([key, value], sort_keys=True).encode())


def request_key(path: str, body: dict[str, Any], split: Optional[int] = None) -> str:
    """An answer's key: the endpoint's path, the whole request (model, prompt or messages, options) and
    where the label starts in the prompt (``split``), never the server's address or the key."""
    return hashlib.sha256(json.dumps([path, body, split], sort_keys=True).encode()).hexdigest()


@dataclass
class Question:
    """One request: its path and body, and how to read what the answer means."""

    path: str
    body: dict[str, Any]
    read: Callable[[dict[str, Any]], Any]
    tokens: int = 0
    split: Optional[int] = None  # where the label starts in the prompt (echo scoring)

    @property
    def key(self) -> str:
        return request_key(self.path, self.body, self.split)


def ask_all(
    endpoint: Endpoint,
    store: AnswerStore,
    questions: Sequence[Question],
    *,
    concurrency: int,
    progress: Optional[Callable[[int, int], None]] = None,
) -> list[Any]:
    """Each question's answer (as its ``read`` gives it), from the store or from the server with up to
    ``concurrency`` requests in flight; each answer is stored as it arrives. On a failure the others in
    flight finish (and are stored) before the error is raised."""
    results: list[Any] = [store.get(question.key) for question in questions]
    # an empty answer ([] top-logprobs) stored by an earlier kdplug is asked again
    missing = [i for i, result in enumerate(results) if result is None or result == []]

    def answer(index: int) -> None:
        question = questions[index]
        response, value = endpoint.post(question.path, question.body, question.tokens, question.read)
        store.put(question.key, value)  # only a usable answer: read above
        results[index] = value
        if progress is not None:
            progress(1, _used_tokens(response))

    _run(answer, missing, concurrency)
    return results


def _run(work: Callable[[int], None], items: Iterable[int], concurrency: int) -> None:
    """``work`` on every item, ``concurrency`` at a time. At the first failure, or at SIGINT/SIGTERM
    (the engine's stop request), no item is started any more, those in flight finish (their answers
    stored), and the failure, or :class:`RunInterrupted`, is raised."""
    queue, pending, failure = iter(items), set(), None
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        while True:
            while failure is None and not stop_requested() and len(pending) < concurrency:
                item = next(queue, None)
                if item is None:
                    break
                pending.add(pool.submit(work, item))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            failure = failure or next((future.exception() for future in done if future.exception()), None)
    if failure is not None:
        raise failure
    if stop_requested():
        raise RunInterrupted(
            f"stopped by signal {stop_requested()} during the served teacher's pass; every answer received "
            f"is stored: run the same command again with --overwrite (or another --output) to ask only for the rest",
            stop_requested(),
        )


def _used_tokens(response: dict[str, Any]) -> int:
    usage = response.get("usage") if isinstance(response, dict) else None
    return int(usage.get("total_tokens") or 0) if isinstance(usage, dict) else 0


def api_key(variable: str) -> Optional[str]:
    """The key from the environment variable ``variable`` (None where it is unset or empty: a local
    server needs none)."""
    return os.environ.get(variable) or None

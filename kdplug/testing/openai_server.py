"""A small OpenAI-compatible server for tests: a transformers causal LM from a directory, served on
localhost with the standard library's HTTP server (no new dependency), so the served teacher can be
tested, and tried, without a GPU or a network.

    python -m kdplug.testing.openai_server --model DIR [--port N] [--host H] [--name NAME] [--api-key KEY]

or, in Python, ``with OpenAIServer(DIR) as server: ... server.base_url ...``. Endpoints (see
docs/llm-teachers.md): ``GET /v1/models``, ``POST /v1/completions`` (``echo`` with ``logprobs``
scores the prompt's own tokens exactly; ``max_tokens`` greedy tokens follow), ``POST
/v1/chat/completions`` (the generated tokens' ``logprobs`` and ``top_logprobs``), OpenAI error bodies.
The server counts what it receives and answers (:attr:`OpenAIServer.requests`,
:attr:`OpenAIServer.answered`) and fails on request (:meth:`OpenAIServer.fail_next`).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import select
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from .openai_faults import MALFORMED_BODY, Fault, FaultQueue
from .openai_model import RequestError, ServedLM, load_causal_lm, messages_key

#: the endpoints that score (and take injected faults), by path under /v1
SCORING = ("completions", "chat/completions")


class OpenAIServer:
    """Serves ``model`` (a directory holding a transformers causal LM and its tokenizer) as
    ``name`` (default: the directory's name) at ``http://host:port/v1`` (``port`` 0: a free one),
    from a background thread once started (:meth:`start`, or ``with``). With ``api_key``, only
    requests bearing it are answered (401 otherwise).

    Counters, for tests: :attr:`requests`, every request received, by endpoint (``"models"``,
    ``"completions"``, ``"chat/completions"``, or the path asked for); :attr:`answered`, every
    prompt (a completion's prompt string, a chat's messages as :func:`messages_key` writes them)
    answered with 200.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        name: Optional[str] = None,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: Optional[str] = None,
    ) -> None:
        directory = os.path.abspath(os.fspath(model))
        self.name = name or os.path.basename(directory.rstrip(os.sep))
        self.lm = ServedLM(*load_causal_lm(directory))
        self.api_key = api_key
        self.requests: collections.Counter = collections.Counter()
        self.answered: collections.Counter = collections.Counter()
        self._host, self._port = host, port
        self._counting = threading.Lock()
        self._faults = FaultQueue()
        self._stopping = threading.Event()  # ends the holds of "timeout" faults
        self._http: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> OpenAIServer:
        """Listen and serve from a background thread; returns the server."""
        if self._http is None:
            self._stopping.clear()
            self._http = _HTTPServer((self._host, self._port), _Handler, self)
            self._port = self._http.server_address[1]  # port 0 took a free one: start() again takes it back
            serve = functools.partial(self._http.serve_forever, poll_interval=0.05)  # stop() waits a poll at most
            self._thread = threading.Thread(target=serve, name="openai-server", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection, as a killed server would; the port is
        free again at once (a new server may take it)."""
        http, self._http = self._http, None
        if http is None:
            return
        self._stopping.set()
        http.shutdown()
        http.close_connections()
        http.server_close()
        self._thread.join()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on (after :meth:`stop`, the one it listened on)."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, the base URL an OpenAI client is given."""
        if self._http is None:
            raise RuntimeError("the server is not started: call start() or use it in a with block")
        host = self._http.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/v1"

    # -- faults -----------------------------------------------------------------------------------
    def fail_next(self, kind: str, count: int = 1, **params: Any) -> None:
        """Fail the next ``count`` scoring requests (completions, chat completions), in the order
        queued, one fault per request: ``"429"`` (with ``Retry-After: retry_after``, default 1 s),
        ``"500"``, ``"503"``, ``"timeout"`` (hold the request ``seconds``, default 5, then answer it
        as usual, unless its client gave up meanwhile), ``"malformed"`` (200, a body that is not
        JSON), ``"drop"`` (close the connection without a response)."""
        self._faults.add(kind, count, **params)

    @property
    def faults_pending(self) -> int:
        """How many injected faults are still to come."""
        return len(self._faults)

    # -- counting ---------------------------------------------------------------------------------
    def _received(self, endpoint: str) -> None:
        with self._counting:
            self.requests[endpoint] += 1

    def _answered(self, prompt: str) -> None:
        with self._counting:
            self.answered[prompt] += 1

    # -- answering --------------------------------------------------------------------------------
    def answer(self, endpoint: str, body: Any) -> tuple[dict, str]:
        """The response body for a request to ``endpoint`` with JSON ``body``, and the prompt it
        answers (its key in :attr:`answered`); a :class:`RequestError` for a bad one."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str):
            raise RequestError("'model' must be given, as a string naming the served model")
        if model != self.name:
            raise RequestError(
                f"The model '{model}' does not exist; this server serves '{self.name}'",
                404,
                kind="model_not_found",
            )
        if body.get("stream"):
            raise RequestError("'stream' is not supported by this test server; ask without it (or false)")
        if body.get("n", 1) != 1:
            raise RequestError(f"'n' must be 1 on this test server (one choice per request), not {body['n']!r}")
        if endpoint == "completions":
            return self.lm.complete(body, self.name), body["prompt"]
        response = self.lm.chat(body, self.name)
        return response, messages_key(body["messages"])

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "kdplug-test"}]}


class _HTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that knows its :class:`OpenAIServer` and its open connections."""

    daemon_threads = True
    allow_reuse_address = True  # a server stopped mid-test gives its port to the next at once
    request_queue_size = 128  # clients open up to 32 connections at once

    def __init__(self, address: tuple, handler: type, owner: OpenAIServer) -> None:
        self.owner = owner
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End every kept-alive connection: a stopped server answers nothing more."""
        with self._open_lock:
            sockets = list(self._open)
        for connection in sockets:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the client closed it already


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse their connections
    # headers and body go out in two writes: with Nagle's algorithm each answer waited ~40 ms for the
    # client's delayed ACK (10 examples/s at concurrency 1 against 79 without it)
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a test's output stays quiet; the counters say what came

    @property
    def owner(self) -> OpenAIServer:
        return self.server.owner

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        endpoint = self._endpoint()
        self.owner._received(endpoint)
        if not self._authorised():
            return
        if endpoint == "models":
            self._send_json(200, self.owner.models())
        else:
            self._send_error(404, f"Unknown path: GET {self.path}", "not_found")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        endpoint = self._endpoint()
        self.owner._received(endpoint)
        raw = self._body()
        if raw is None or not self._authorised():
            return
        if endpoint not in SCORING:
            self._send_error(404, f"Unknown path: POST {self.path}", "not_found")
            return
        fault = self.owner._faults.take()
        if fault is not None and not self._injected(fault):
            return
        try:
            body = json.loads(raw)
        except ValueError as error:
            self._send_error(400, f"The request body is not valid JSON ({error})", "invalid_request_error")
            return
        try:
            response, prompt = self.owner.answer(endpoint, body)
        except RequestError as error:
            self._send_error(error.status, str(error), error.kind)
            return
        except Exception as error:  # the model failed: its client gets a 500 saying how, as from a real server
            self._send_error(500, f"The model failed: {type(error).__name__}: {error}", "server_error")
            return
        self.owner._answered(prompt)  # before its client reads it: a test reading the count sees it
        self._send_json(200, response)

    def _body(self) -> Optional[bytes]:
        """The request's body; None (answered with a 400) when it has no readable length."""
        length = self.headers.get("Content-Length")
        if length is None and self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._send_error(
                400, "Send the body with a Content-Length (chunked bodies are not read)", "invalid_request_error"
            )
            return None
        try:
            return self.rfile.read(int(length or 0))
        except ValueError:
            self.close_connection = True
            self._send_error(400, f"Content-Length {length!r} is not a number of bytes", "invalid_request_error")
            return None

    def _injected(self, fault: Fault) -> bool:
        """Inject ``fault``; whether the request is then to be answered as usual."""
        if fault.kind == "429":
            headers = {"Retry-After": str(fault.retry_after)}
            self._send_error(429, "Rate limit reached (injected by the test server)", "rate_limit_exceeded", headers)
        elif fault.kind in ("500", "503"):
            self._send_error(
                int(fault.kind), f"Server error {fault.kind} (injected by the test server)", "server_error"
            )
        elif fault.kind == "malformed":
            self._send_bytes(200, MALFORMED_BODY)
        elif fault.kind == "timeout":
            self.owner._stopping.wait(fault.seconds)
            if not self._client_gone() and not self.owner._stopping.is_set():
                return True
            self._drop()
        else:
            self._drop()
        return False

    def _client_gone(self) -> bool:
        """Whether the client closed the connection (a client whose timeout passed gives up)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _drop(self) -> None:
        """Close the connection with no response."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the client closed it already

    def _endpoint(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/")
        return path[len("/v1/") :] if path.startswith("/v1/") else path

    def _authorised(self) -> bool:
        key = self.owner.api_key
        if key is None or self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._send_error(401, "Incorrect API key provided", "invalid_api_key")
        return False

    def _send_error(self, status: int, message: str, kind: str, headers: Optional[dict] = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "code": status}}, headers)

    def _send_json(self, status: int, body: Any, headers: Optional[dict] = None) -> None:
        self._send_bytes(status, json.dumps(body).encode(), headers)

    def _send_bytes(self, status: int, data: bytes, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for header, value in (headers or {}).items():
            self.send_header(header, value)
        self.end_headers()
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client went away; nothing to answer


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kdplug.testing.openai_server",
        description="Serve a transformers causal LM from a directory with an OpenAI-compatible API (for tests).",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="a directory holding a causal LM and tokenizer")
    parser.add_argument("--port", type=int, default=8000, help="the port (0: a free one); default 8000")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on; default 127.0.0.1")
    parser.add_argument("--name", help="the model's name in the API; default: the directory's name")
    parser.add_argument("--api-key", help="answer only requests bearing this key (Authorization: Bearer KEY)")
    args = parser.parse_args(argv)
    stopping, serving = threading.Event(), []

    def on_signal(*_: Any) -> None:
        stopping.set()
        if not serving:
            # stopped while the model loads: nothing to close, and an exception raised here, inside
            # torch's C++ import code, would abort the process
            os._exit(0)

    previous = {number: signal.signal(number, on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        server = _started(parser, args, serving)
        print(f"serving {server.name} at {server.base_url}", flush=True)
        while not stopping.wait(0.1):
            pass
        server.stop()
    finally:
        for number, handler in previous.items():  # a caller's own handlers (main() called in a test) come back
            signal.signal(number, handler)
    return 0


def _started(parser: argparse.ArgumentParser, args: argparse.Namespace, serving: list) -> OpenAIServer:
    """The server ``args`` ask for, listening; a bad model directory or a port in use exits 2."""
    if os.path.isdir(args.model):
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the one line it prints is the output
    try:
        server = OpenAIServer(args.model, name=args.name, host=args.host, port=args.port, api_key=args.api_key)
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    try:
        serving.append(server.start())
    except OSError as error:
        parser.exit(
            2,
            f"{parser.prog}: error: cannot listen on {args.host}:{args.port} ({error.strerror}); "
            f"give another --port (0: a free one)\n",
        )
    return server


if __name__ == "__main__":
    code = main()
    # the server is closed and its output flushed: leave without the interpreter's teardown, in which a
    # thread of the model's native libraries still joinable aborted the process (SIGABRT, "terminate called
    # without an active exception") in about half of the stops by SIGTERM
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

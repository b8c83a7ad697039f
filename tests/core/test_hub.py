"""kdplug.hub: the hub is reached, or an OfflineError says so within seconds (real sockets)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from kdplug import hub
from kdplug.errors import OfflineError, UsageError


@pytest.fixture
def no_proxy(monkeypatch):
    for variable in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
    ):
        monkeypatch.delenv(variable, raising=False)


def test_reachable_answers_within_its_timeout(no_proxy):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert hub.reachable(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=2)
        closed_port = server.getsockname()[1]
    start = time.monotonic()
    assert not hub.reachable(f"http://127.0.0.1:{closed_port}", timeout=1)
    assert not hub.reachable("https://no-such-host.invalid", timeout=1)
    assert time.monotonic() - start < 3


def test_require_names_the_purpose_the_reason_and_the_fix(no_proxy, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match=r"cannot push x: the Hugging Face hub is switched off .*; do y"):
        hub.require("push x", "do y")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(OfflineError, match=r"\(http://127.0.0.1:9\) cannot be reached"):
        hub.require("push x", "do y")
    assert time.monotonic() - start < 5
    with socket.socket() as server:  # a listening endpoint is usable
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        hub.require("push x", "do y")


@pytest.mark.parametrize("config", [None, {"foo": 1}])
def test_a_folder_without_a_model_is_a_usage_error_naming_it(tmp_path, config):
    """An empty folder (or a config.json without model_type) given as a source: exit 2 naming the
    folder and what a checkpoint holds, not transformers' ValueError traceback."""
    from transformers import AutoConfig

    from kdplug.hub import load_pretrained

    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=r"teacher directory .*model is not a complete Hugging Face checkpoint"):
        load_pretrained(AutoConfig, str(folder), "teacher")

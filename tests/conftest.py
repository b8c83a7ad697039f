"""Shared fixtures: offline, an isolated cache, tiny random checkpoints and task files."""

from __future__ import annotations

import pytest

from kdplug.testing.tiny import make_tiny_bert


@pytest.fixture(autouse=True)
def _offline_and_isolated(monkeypatch, tmp_path_factory):
    """No test reaches a hub, and none reads or writes the user's cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("kdplug-cache")))
    monkeypatch.delenv("KDPLUG_DISABLE_PLUGINS", raising=False)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert") / "bert", num_layers=4, hidden=32)


SST2_TRAIN = [
    ("the movie was very good .", 1), ("i loved this film , it is great .", 1), ("the acting was fun", 1),
    ("we enjoyed the story and the music", 1), ("a nice film", 1), ("the ending was great !", 1),
    ("the film was really bad !", 0), ("we hated the plot", 0), ("the music was dull", 0),
    ("the acting was awful and boring", 0), ("a poor story", 0), ("it was not fun", 0),
]
SST2_DEV = [("the story was good", 1), ("the plot was boring", 0), ("i loved the music", 1), ("a bad film", 0)]


def write_sst2(directory, train=SST2_TRAIN, dev=SST2_DEV):
    """A directory in the GLUE SST-2 layout (``sentence<TAB>label`` with a header)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
        lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in rows]
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.fixture
def sst2_dir(tmp_path):
    return write_sst2(tmp_path / "SST-2")

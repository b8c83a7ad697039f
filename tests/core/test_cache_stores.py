"""``kdplug cache`` lists and clears the folders the engine keeps and those registered components
declare (``stores``), by the plugins' own titles, and touches no other folder."""

from __future__ import annotations

import argparse

import pytest

import kdplug
from kdplug.commands import cache
from kdplug.plugins import PluginManager


class KeepsLinks:
    stores = {"links": "trained links (a third-party recipe)"}

    def run(self, ctx):
        raise AssertionError("never run here")


class Plugin:
    @kdplug.hookimpl
    def kdplug_register_recipes(self, register):
        register("keeps-links", KeepsLinks, description="keeps what it trained under <cache>/links")


def cache_command(manager, root, action, **options):
    options = {"kind": None, "key": None, "stale": False, **options}
    args = argparse.Namespace(cache_dir=str(root), action=action, **options)
    return cache.handle(args, manager)


@pytest.fixture
def manager():
    manager = PluginManager()
    manager.register(Plugin(), "keeps-links")
    return manager


def test_a_declared_store_is_listed_and_cleared_and_an_undeclared_folder_is_left_alone(manager, tmp_path, capsys):
    (tmp_path / "links" / "3f9a2c11").mkdir(parents=True)
    (tmp_path / "links" / "3f9a2c11" / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "photos" / "holiday").mkdir(parents=True)  # not kdplug's: a --cache-dir pointed astray
    assert cache_command(manager, tmp_path, "list") == 0
    out = capsys.readouterr().out
    assert "trained links (a third-party recipe) (links):\n  3f9a2c11" in out and "photos" not in out
    assert "SentencePiece student tokenizers" not in out  # a folder that is not there is not listed

    assert cache_command(manager, tmp_path, "clear", kind="links") == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert not (tmp_path / "links").exists() and (tmp_path / "photos" / "holiday").is_dir()


def test_the_first_party_stores_come_from_their_plugins(manager):
    known = cache.sections(manager.registry)
    assert list(known)[:4] == ["teachers", "teacher-cache", "heads", "transfer"]  # the engine's own
    assert known["takd"] == "trained teacher assistants (TAKD)" and "sentencepiece" in known
    assert "takd" not in cache.SECTIONS and "sentencepiece" not in cache.SECTIONS


def test_an_unknown_kind_is_a_usage_error_naming_the_kinds(manager, tmp_path):
    with pytest.raises(kdplug.UsageError, match="--kind 'linkz' is not a kind of cache entry; the kinds: .*links"):
        cache_command(manager, tmp_path, "clear", kind="linkz")

"""``kdplug cache`` lists and clears the folders the engine keeps and those registered components
declare (``stores``), by the plugins' own titles, and touches no other folder."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

import kdplug
from kdplug.cli import main
from kdplug.commands import cache
from kdplug.engine import stores
from kdplug.plugins import PluginManager
from kdplug.storage import atomic_directory

from .test_cache import build


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
    with atomic_directory(tmp_path / "links" / "3f9a2c11", "a link") as staging:
        (staging / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "photos" / "holiday").mkdir(parents=True)  # not kdplug's: a --cache-dir pointed astray
    assert cache_command(manager, tmp_path, "list") == 0
    out = capsys.readouterr().out
    assert "trained links (a third-party recipe) (links):\n  3f9a2c11" in out and "photos" not in out
    assert "SentencePiece student tokenizers" not in out  # a folder that is not there is not listed

    assert cache_command(manager, tmp_path, "clear", kind="links") == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert not (tmp_path / "links").exists() and (tmp_path / "photos" / "holiday").is_dir()


def test_the_first_party_stores_come_from_their_plugins(manager):
    known = stores.sections(manager.registry)
    assert list(known)[:4] == ["teachers", "teacher-cache", "heads", "transfer"]  # the engine's own
    assert known["takd"] == "trained teacher assistants (TAKD)" and "sentencepiece" in known
    assert "takd" not in stores.SECTIONS and "sentencepiece" not in stores.SECTIONS


def test_an_unknown_kind_is_a_usage_error_naming_the_kinds(manager, tmp_path):
    with pytest.raises(kdplug.UsageError, match="--kind 'linkz' is not a kind of cache entry; the kinds: .*links"):
        cache_command(manager, tmp_path, "clear", kind="linkz")


def test_what_only_looks_like_kdplugs_is_left_alone(capsys, tmp_path):
    """Found by trying: a student package a user keeps under teachers/ (its checksum file is kdplug's), a
    forged or empty checksum record, a file and a JSON note of one name, a folder named like a staging or
    damaged copy, an empty .lock of the user's: none of them is an entry, so none is removed."""
    import os
    import time

    from kdplug.storage import write_checksums

    root = tmp_path / "cache"
    for kind in ("teachers", "heads"):  # a package kdplug wrote elsewhere, copied here by its user
        package = root / kind / "my-kept-model"
        package.mkdir(parents=True)
        (package / "config.json").write_text("{}")
        write_checksums(package)
    forged = root / "transfer" / ("d" * 32)
    forged.mkdir(parents=True)
    (forged / "kdplug_checksums.json").write_text("{}")
    (forged / "data.txt").write_text("mine")
    (root / "teachers" / "mydata.csv").write_text("my,data\n")
    (root / "teachers" / "mydata.json").write_text('{"note": "mine"}')
    for name in (".staging-backup.20261127", "photos.damaged-20250101-120000"):
        (root / "transfer" / name).mkdir()
        (root / "transfer" / name / "thesis.tex").write_text("mine")
        old = time.time() - 2 * 86400
        os.utime(root / "transfer" / name, (old, old))
    (root / "transfer" / "empty-user.lock").write_text("")
    users = files_below(root)

    assert kdplug_cache(capsys, "clear", "--stale", "--cache-dir", root)[0] == 0
    code, out, _ = kdplug_cache(capsys, "clear", "--cache-dir", root)
    assert code == 0 and "removed" not in out.replace("removed 0", "")
    assert files_below(root) == users


def kdplug_cache(capsys, *argv):
    code = main(["cache", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def files_below(root):
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_cache_clear_lists_and_removes_only_what_kdplug_wrote(capsys, tmp_path, tiny_bert_dir):
    root = tmp_path / "cache"
    # a user's own files in kdplug's folders: a model kept under teachers/, texts under transfer/
    shutil.copytree(tiny_bert_dir, root / "teachers" / "my-bert")
    (root / "transfer" / "crawl-2024").mkdir(parents=True)
    (root / "transfer" / "crawl-2024" / "part-0.txt").write_text("a sentence of mine\n")
    (root / "transfer" / "unlabelled.txt").write_text("another sentence\n")
    (root / "transfer" / "crawl-2023.previous").mkdir()  # kdplug's suffix, not kdplug's folder
    (root / "transfer" / "crawl-2023.previous" / "part-0.txt").write_text("last year's\n")
    (root / "heads" / "notes.lock").parent.mkdir()
    (root / "heads" / "notes.lock").write_text("my lock notes")
    users = files_below(root)
    # and what kdplug wrote: a fine-tuned teacher, teacher outputs, teacher heads
    with atomic_directory(root / "teachers" / ("a" * 32), "a teacher") as staging:
        (staging / "config.json").write_text("{}")
    build(root / "teacher-cache", key="b" * 32, layers=False)
    (root / "heads" / f"{'c' * 32}.safetensors").write_bytes(b"heads")
    (root / "heads" / f"{'c' * 32}.json").write_text(json.dumps({"epochs": 1}))

    code, out, _ = kdplug_cache(capsys, "list", "--cache-dir", root)
    assert code == 0
    for name in ("my-bert", "crawl-2024", "unlabelled.txt", "crawl-2023.previous"):
        assert f"  {name}  left alone: not written by kdplug" in out
    assert "a" * 32 in out and "b" * 32 in out and "c" * 32 in out

    assert kdplug_cache(capsys, "clear", "--stale", "--cache-dir", root)[0] == 0
    code, out, _ = kdplug_cache(capsys, "clear", "--cache-dir", root)
    assert code == 0 and "removed 3 entries" in out
    for name in ("teachers/my-bert", "transfer/crawl-2024", "transfer/unlabelled.txt"):
        assert f"left alone: not written by kdplug: {root / name}" in out
    assert files_below(root) == users  # every file of the user's, byte for byte, and nothing of kdplug's


def test_clear_stale_in_a_plugins_store_removes_only_staging_folders_and_locks_kdplug_marked(capsys, tmp_path):
    import os
    import time

    from kdplug.storage import file_lock, staging_directory

    root, old = tmp_path / "cache", time.time() - 2 * 86400
    store = root / "takd"  # a first-party plugin's store (the TAKD recipe's assistants)
    (store / ".staging-backup.20261127").mkdir(parents=True)  # a user's, named like a staging folder
    (store / ".staging-backup.20261127" / "photo.txt").write_text("mine")
    (store / "notes.lock").write_text("")  # a user's empty file named like a lock
    (store / "photos.damaged-20250101-120000").mkdir()  # and like a damaged copy set aside
    (store / "photos.damaged-20250101-120000" / "thesis.tex").write_text("mine")
    for path in (store / ".staging-backup.20261127", store / "notes.lock", store / "photos.damaged-20250101-120000"):
        os.utime(path, (old, old))
    users = files_below(root)
    killed = staging_directory(store, "e" * 32)  # what a killed kdplug left: its marked staging folder and lock
    (killed / "model.safetensors").write_bytes(b"half")
    os.utime(killed, (old, old))
    with file_lock(store / f"{'e' * 32}.lock"):
        pass

    code, out, _ = kdplug_cache(capsys, "clear", "--stale", "--cache-dir", root)
    assert code == 0 and "removed 1 stale entries" in out, out
    assert files_below(root) == users

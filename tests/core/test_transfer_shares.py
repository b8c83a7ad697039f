"""A transfer set's augmentation shared by the processes of a launch: each prepares the augmenter on
a share of the distinct training sentences and makes its share of the copies, rank 0 writes the set
a single process writes; a process that fails or dies is named, and nothing is stored."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest

import kdplug
from kdplug.config import RunConfig
from kdplug.engine import transfer as transfer_module
from kdplug.engine.augmenting import TrainingSentences
from kdplug.engine.shares import Processes, ShareFailed
from kdplug.types import Example

from .test_shares import ThreadBroadcast, free_port  # noqa: F401 - free_port is a fixture

WORDS = "the film was good bad dull moving plot acting a really clever ending story cast".split()


def training_examples() -> list[Example]:
    rng = random.Random(0)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(3, 10))) for _ in range(40)]
    return [Example(s, i % 2) for i, s in enumerate(sentences + sentences[:8])]  # repeats across shares


def setting(tmp_path) -> RunConfig:
    extra = tmp_path / "extra.txt"
    extra.write_text("a clever cast\nthe plot was dull\na clever cast\n", encoding="utf-8")
    return RunConfig(
        task="sst2", augment="tang", augment_factor=5, augment_options={"p_pos": 0.3}, transfer=[str(extra)]
    )


@pytest.fixture
def parts(tmp_path, tiny_bert_dir, sst2_dir):
    pytest.importorskip("spacy")
    task = kdplug.get_plugin_manager().registry.create("task", "sst2", data_dir=str(sst2_dir))
    teacher = kdplug.create_teacher("hf", task, source=tiny_bert_dir)
    return setting(tmp_path), task, teacher, training_examples(), {"dev": task.load_split("dev")}


def build_together(root, count, parts, teachers=None):
    """``build_or_load`` on ``count`` threads standing for the processes of a launch (each with its
    own teacher, when ``teachers`` are given)."""
    config, task, teacher, train, dev = parts
    said = []

    def rank_main(rank: int, processes: Processes):
        return transfer_module.build_or_load(
            config, kdplug.get_plugin_manager().registry, task, teachers[rank] if teachers else teacher, train,
            dev, root=root, seed=3, echo=said.append, processes=processes,
        )  # fmt: skip

    results, errors = on_threads(count, rank_main)
    return results, errors, said


def on_threads(count, rank_main):
    """``rank_main(rank, processes)`` on ``count`` threads standing for the processes of a launch:
    what each returned, and what each raised."""
    broadcast, results, errors = ThreadBroadcast(count), {}, {}

    def run(rank: int) -> None:
        try:
            results[rank] = rank_main(rank, broadcast.processes(rank, count))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results, errors


def test_processes_sharing_the_augmentation_write_the_set_one_process_writes(
    tmp_path, parts, monkeypatch, tiny_bert_dir
):
    from kdplug_augment.tang import TangAugmenter

    alone, errors, _ = build_together(tmp_path / "one", 1, parts)
    assert not errors, errors
    expected = (alone[0].directory / transfer_module.TEXTS_FILE).read_bytes()
    counted = {k: v for k, v in alone[0].meta.items() if k not in ("seconds", "computed_by")}
    assert counted["from_files"] == 2 and counted["augmented"] > 50 and counted["dropped_repeats"] > 0

    prepared = []
    share = TangAugmenter.prepare_share

    def recorded(self, sentences):
        prepared.append(list(sentences))
        return share(self, prepared[-1])

    monkeypatch.setattr(TangAugmenter, "prepare_share", recorded)
    for count in (2, 3):
        prepared.clear()
        # each process loads the teacher: its untrained head is drawn anew, so its fingerprint (and
        # the set's key) differs from process to process; rank 0's key is the one used
        teachers = [kdplug.create_teacher("hf", parts[1], source=tiny_bert_dir) for _ in range(count)]
        results, errors, said = build_together(tmp_path / f"shared-{count}", count, parts, teachers)
        assert not errors, errors
        for rank in range(count):  # every process holds the same set, written once
            assert results[rank].directory == results[0].directory
            assert (results[rank].directory / transfer_module.TEXTS_FILE).read_bytes() == expected
        meta = results[0].meta
        assert {k: v for k, v in meta.items() if k not in ("seconds", "computed_by")} == counted
        assert [record["rank"] for record in meta["computed_by"]] == list(range(count))
        shares = [record["examples"] for record in meta["computed_by"]]
        assert sum(shares) == 48 and min(shares) > 0
        assert f"{count} processes augmented {' + '.join(map(str, shares))} training examples" in said[-1]
        # the tagging was shared: each distinct training sentence tagged once, by one process
        assert len(prepared) == count and sorted(s for part in prepared for s in part) == sorted(
            {e.text_a for e in training_examples()}
        )
        assert [p.name for p in (tmp_path / f"shared-{count}" / "transfer").iterdir() if p.is_dir()] == [
            results[0].directory.name
        ]  # no share folder left behind


def test_a_process_that_fails_while_augmenting_is_named_and_nothing_is_stored(tmp_path, parts, monkeypatch):
    from kdplug_augment.tang import TangAugmenter

    broken = training_examples()[30].text_a  # in rank 1's share (of 48) alone
    call = TangAugmenter.__call__

    def failing(self, text, rng):
        if text == broken:
            raise RuntimeError("the augmenter broke")
        return call(self, text, rng)

    monkeypatch.setattr(TangAugmenter, "__call__", failing)
    results, errors, _ = build_together(tmp_path / "cache", 2, parts)
    assert not results
    assert isinstance(errors[0], ShareFailed) and errors[0].rank == 1
    assert "process rank 1 failed (RuntimeError: the augmenter broke)" in str(errors[0])
    assert "nothing of it was stored" in str(errors[0])
    assert str(errors[1]) == "the augmenter broke"
    assert all(p.name.endswith(".lock") for p in (tmp_path / "cache" / "transfer").iterdir())


RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch.distributed as dist

    import kdplug
    from kdplug.engine import transfer
    from kdplug.engine.shares import Processes
    from tests.core.test_transfer_shares import setting, training_examples

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def broadcast(value):
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    registry = kdplug.get_plugin_manager().registry
    task = registry.create("task", "sst2", data_dir=sys.argv[3])
    teacher = kdplug.create_teacher("hf", task, source=sys.argv[2])
    try:
        transfer.build_or_load(
            setting(Path(sys.argv[4])), registry, task, teacher, training_examples(), {"dev": task.load_split("dev")},
            root=Path(sys.argv[1]), seed=3, echo=print, processes=Processes(rank, 2, broadcast),
        )
    except RuntimeError as exc:
        print(f"rank {rank}: {exc}", flush=True)
        sys.exit(1)
    """
)


def test_a_process_killed_while_augmenting_is_named_and_the_next_run_builds_the_set(
    tmp_path,
    parts,
    tiny_bert_dir,
    sst2_dir,
    free_port,  # noqa: F811 - the fixture
):
    root = tmp_path / "cache"
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "KDPLUG_FAULT_AT": "augment-share-rank1:3",  # rank 1 is SIGKILLed at its third copy
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(root), tiny_bert_dir, str(sst2_dir), str(tmp_path)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    assert ranks[1].wait(timeout=180) == -9  # reaped at once, as a launcher does
    out, _ = ranks[0].communicate(timeout=180)
    assert ranks[0].returncode == 1, out
    assert "rank 0: process rank 1 (pid" in out and "died: it was killed or crashed" in out, out
    assert "during the augmentation of the training set; nothing of it was stored" in out, out
    assert all(p.name.endswith(".lock") for p in (root / "transfer").iterdir())  # no set, no share folder

    results, errors, _ = build_together(root, 2, parts)  # the next run builds it
    assert not errors, errors
    assert results[0].meta["examples"] == results[1].meta["examples"] > 0


def test_the_training_sentences_of_pairs_are_both_sides_in_order():
    examples = [Example("a b", 0, "c d"), Example("e", 1, "f g")]
    sentences = TrainingSentences(examples)
    assert list(sentences) == ["a b", "c d", "e", "f g"] == [sentences[i] for i in range(len(sentences))]
    assert sentences[-1] == "f g" and sentences[1:3] == ["c d", "e"]
    with pytest.raises(IndexError):
        sentences[4]


def encode_together(transfer_set, tokenizer, count):
    results, errors = on_threads(
        count, lambda rank, processes: transfer_set.encode(tokenizer, 12, is_regression=False, processes=processes)
    )
    assert not errors, errors
    return results


@pytest.mark.parametrize("pairs", [False, True])
def test_processes_sharing_the_tokenising_store_the_encoding_one_process_stores(tmp_path, pairs):
    """Each process tokenises a share of the set's texts (a share may be empty), rank 0 joins the
    shares: the stored files are byte for byte those of one process, and every process reads them."""
    import json
    import shutil

    from kdplug.testing.tiny import wordpiece_tokenizer

    tokenizer = wordpiece_tokenizer()
    rng = random.Random(1)
    texts = [[" ".join(rng.choices(WORDS, k=rng.randint(1, 20)))] for _ in range(37)]
    if pairs:
        texts = [text + [" ".join(rng.choices(WORDS, k=rng.randint(1, 8)))] for text in texts]
    for name, rows in (("many", texts), ("few", texts[:2])):
        alone = tmp_path / name / "one" / "set"
        alone.mkdir(parents=True)
        (alone / transfer_module.TEXTS_FILE).write_text("".join(json.dumps(t) + "\n" for t in rows), encoding="utf-8")
        single = transfer_module.TransferSet(alone, {"examples": len(rows)}).encode(tokenizer, 12, is_regression=False)
        expected = {p.name: p.read_bytes() for p in next(alone.glob("encoded-*")).iterdir() if p.is_file()}
        assert "ids.i32" in expected and ("types.i8" in expected or not pairs)  # a pair's token types too
        for count in (2, 3):
            copy = tmp_path / name / str(count) / "set"
            shutil.copytree(alone, copy, ignore=shutil.ignore_patterns("encoded-*"))
            results = encode_together(transfer_module.TransferSet(copy, {"examples": len(rows)}), tokenizer, count)
            stored = next(copy.glob("encoded-*"))
            assert {p.name: p.read_bytes() for p in stored.iterdir() if p.is_file()} == expected
            for rank in range(count):
                assert [results[rank].input_ids[i] for i in range(len(rows))] == [
                    single.input_ids[i] for i in range(len(rows))
                ]
            assert all(p.name == "set" or p.suffix == ".lock" for p in copy.parent.iterdir())  # no share folder


def test_the_other_processes_never_wait_on_rank_0s_lock(tmp_path, parts):
    """Rank 0 takes a set's lock again for the next piece of work (the student's encoding after the
    teacher's) while another rank may still be waiting for it, then waits for that rank in a
    collective: a deadlock, seen under torchrun. So the other ranks wait through the share folder,
    never on the lock: here the lock is held throughout, and rank 1 still gets the set and its
    encoding that rank 0 stored."""
    from kdplug.storage import file_lock

    config, task, teacher, train, dev = parts
    registry = kdplug.get_plugin_manager().registry
    built = transfer_module.build_or_load(
        config, registry, task, teacher, train, dev, root=tmp_path, seed=3, echo=print
    )
    built.encode(teacher.tokenizer, 12, is_regression=False)
    key = built.directory.name
    orders = iter([{"key": key, "folder": None, "augment": True}, {"folder": None}])  # rank 0 found both stored
    rank_1 = Processes(1, 2, lambda _: next(orders))
    got = {}

    def rank_main() -> None:
        found = transfer_module.build_or_load(
            config, registry, task, teacher, train, dev, root=tmp_path, seed=3, echo=print, processes=rank_1
        )
        got["ids"] = found.encode(teacher.tokenizer, 12, is_regression=False, processes=rank_1).input_ids[0]

    locks = [tmp_path / "transfer" / f"{key}.lock", *(tmp_path / "transfer").glob(f"{key}.*.lock")]
    assert len(locks) == 2
    with file_lock(locks[0]), file_lock(locks[1]):
        thread = threading.Thread(target=rank_main, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "rank 1 waited on rank 0's lock"
    assert got["ids"] == built.encode(teacher.tokenizer, 12, is_regression=False).input_ids[0]

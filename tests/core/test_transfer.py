"""Transfer sets: built once and reused, dev sentences kept out, CE only where a gold label exists,
sampled per epoch without holding the set in memory."""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path

import numpy as np
import pytest
import torch

import kdplug
from kdplug.config import RunConfig
from kdplug.engine import trainer as trainer_module
from kdplug.engine import transfer as transfer_module
from kdplug.engine.cache import ConcatCache, TeacherCache
from kdplug.engine.data import Collator, LengthGroupedBatchSampler, WithTransfer, encode
from kdplug.engine.pipeline import run
from kdplug.engine.trainer import inference_autocast, inference_precision, native_bf16, x86_flags
from kdplug.testing import tiny_run_settings
from kdplug.testing.tiny import wordpiece_tokenizer
from kdplug.types import Example

from ..conftest import SST2_DEV, SST2_TRAIN


def config(tmp_path, tiny_bert_dir, sst2_dir, name="run", **settings):
    tiny = tiny_run_settings(task="sst2", batch_size=8, measure_speed=False)
    return RunConfig(
        **{
            **tiny,
            "teacher": tiny_bert_dir,
            "data_dir": str(sst2_dir),
            "cache_dir": str(tmp_path / "cache"),
            "output": str(tmp_path / name),
            **settings,
        }
    ).validate()


def registry():
    return kdplug.get_plugin_manager().registry


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# -- building ------------------------------------------------------------------------------------


def test_dev_sentences_never_enter_the_transfer_set(tmp_path, tiny_bert_dir, sst2_dir):
    dev_sentence = SST2_DEV[0][0]
    unlabelled = write_lines(
        tmp_path / "extra.txt",
        ["the cat sat .", dev_sentence.upper(), "  " + dev_sentence.replace(" ", "   ") + " ", "the dog ran ."],
    )
    result = run(config(tmp_path, tiny_bert_dir, sst2_dir, transfer=[str(unlabelled)]), registry(), echo=lambda _: None)
    meta = result.metrics["transfer"]
    assert meta["dropped_dev_duplicates"] == 2 and meta["examples"] == 2
    stored = transfer_module.TransferSet(transfer_module.Path(meta["directory"]), meta)
    texts = [a for a, _ in stored.texts()]
    assert texts == ["the cat sat .", "the dog ran ."]
    dev_keys = {" ".join(s.lower().split()) for s, _ in SST2_DEV}
    assert not dev_keys & {" ".join(t.lower().split()) for t in texts}


def test_repeats_training_sentences_and_degenerate_copies_never_enter_the_transfer_set(
    tmp_path, tiny_bert_dir, sst2_dir
):
    # a version-1 set kept all of these but the dev sentences: only copies of one source were compared
    lines = [
        "the cat sat .",
        "The   cat sat .",  # a repeat, case and spacing aside
        SST2_TRAIN[1][0].upper(),  # a training sentence
        "[MASK] [MASK] .",  # mask tokens only
        "the , of it",  # stop words and punctuation only
        "a fine dog",
        "the cat sat .",
    ]
    unlabelled = write_lines(tmp_path / "extra.txt", lines)
    result = run(config(tmp_path, tiny_bert_dir, sst2_dir, transfer=[str(unlabelled)]), registry(), echo=lambda _: None)
    meta = result.metrics["transfer"]
    assert (meta["examples"], meta["dropped_repeats"], meta["dropped_train_duplicates"]) == (2, 2, 1)
    assert meta["dropped_degenerate"] == 2 and meta["dropped_dev_duplicates"] == 0
    stored = transfer_module.TransferSet(transfer_module.Path(meta["directory"]), meta)
    assert [a for a, _ in stored.texts()] == ["the cat sat .", "a fine dog"]


def test_an_empty_transfer_set_is_refused_when_built_and_when_found_stored(tmp_path, tiny_bert_dir, sst2_dir):
    """Every text repeats a training sentence: the run stops with what to check, and so does the
    next run, which finds the empty set stored (it went on to train without one)."""
    unlabelled = write_lines(tmp_path / "extra.txt", [SST2_TRAIN[0][0], SST2_TRAIN[1][0].upper()])
    for _ in range(2):
        with pytest.raises(kdplug.errors.UsageError, match="the transfer set is empty"):
            run(config(tmp_path, tiny_bert_dir, sst2_dir, transfer=[str(unlabelled)]), registry(), echo=lambda _: None)


def test_a_stored_set_of_files_is_rebuilt_for_another_training_set(tmp_path, tiny_bert_dir, sst2_dir):
    # the set drops training sentences, so another training set is another set
    unlabelled = write_lines(tmp_path / "extra.txt", ["the cat sat .", SST2_TRAIN[0][0]])
    settings = config(tmp_path, tiny_bert_dir, sst2_dir, transfer=[str(unlabelled)])
    task = registry().create("task", "sst2", data_dir=str(sst2_dir))
    teacher = kdplug.create_teacher("hf", task, source=tiny_bert_dir)
    train = task.load_split("train")
    keys = {transfer_module.transfer_key(settings, task, part, set(), 42, teacher) for part in (train, train[1:])}
    assert len(keys) == 2


def test_augmented_copies_are_unique_across_the_whole_set(tmp_path, tiny_bert_dir, sst2_dir):
    # every copy is one word of its sentence: the same word comes from many sentences ("the", "was")
    settings = {"augment": "tang", "augment_factor": 6}
    options = {"p_mask": 0.0, "p_pos": 0.0, "p_ng": 1.0, "max_ngram": 1}
    result = run(
        config(tmp_path, tiny_bert_dir, sst2_dir, augment_options=options, **settings), registry(), echo=lambda _: None
    )
    meta = result.metrics["transfer"]
    texts = [a for a, _ in transfer_module.TransferSet(transfer_module.Path(meta["directory"]), meta).texts()]
    keys = [transfer_module.normalised((t, None)) for t in texts]
    assert len(keys) == len(set(keys)) == meta["examples"] > 0
    assert meta["dropped_repeats"] > 0 and meta["dropped_degenerate"] > 0  # "the", "." from several sentences
    assert not set(keys) & {transfer_module.normalised((s, None)) for s, _ in SST2_TRAIN}
    assert not {"the", ".", "was"} & set(keys)


def test_a_student_without_a_mask_token_reads_the_masked_word_as_unknown(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "good": 2, "film": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()  # "[MASK]" would be three unknown pieces
    student = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    stored = stored_set(tmp_path, ["good [MASK] film", "[MASK]"])
    stored.meta["mask_token"] = "[MASK]"
    assert stored.mask_for(wordpiece_tokenizer()) is None  # the teacher's own tokenizer reads it as is
    encoded = stored.encode(student, 8, is_regression=False)
    assert [encoded.input_ids[i] for i in range(2)] == [[2, 1, 3], [1]]


def test_a_transfer_set_is_built_once_and_its_teacher_outputs_reused(tmp_path, tiny_bert_dir, sst2_dir, caplog):
    settings = {"augment": "tang", "augment_factor": 4, "augment_options": {"p_pos": 0.0}}
    first = run(config(tmp_path, tiny_bert_dir, sst2_dir, "first", **settings), registry(), echo=lambda _: None)
    assert first.metrics["transfer"]["teacher_cache"]["reused"] is False
    caplog.clear()
    lines = []
    with caplog.at_level(logging.INFO, logger="kdplug"):
        second = run(
            config(tmp_path, tiny_bert_dir, sst2_dir, "second", seed=43, teacher_seed=42, **settings),
            registry(),
            echo=lines.append,
        )
    assert any(line.startswith("transfer set: reusing") for line in lines)
    assert second.metrics["transfer"]["teacher_cache"]["reused"] is True
    assert not [r for r in caplog.records if "building the teacher cache" in r.getMessage()]  # no teacher forward
    assert second.metrics["transfer"]["directory"] == first.metrics["transfer"]["directory"]


@pytest.mark.parametrize(
    "flags, native",
    [
        ({"avx2": True}, False),  # the AVX2 EPYC where emulated bf16 made the cache 6x slower
        ({"avx512_f": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True}, False),  # oneDNN says yes
        ({"avx512_f": True, "avx512_bf16": True}, True),  # Zen 4, Cooper Lake
        ({"avx512_f": True, "amx_bf16": True}, True),  # Sapphire Rapids
    ],
)
def test_native_bf16_on_x86_needs_bf16_instructions_not_just_avx512(monkeypatch, flags, native):
    monkeypatch.setattr(trainer_module, "x86_flags", lambda: {"architecture": "x86_64", **flags})
    assert native_bf16(torch.device("cpu")) is native
    assert inference_precision("auto", torch.device("cpu")) == ("bf16" if native else "fp32")
    assert inference_precision("bf16", torch.device("cpu")) == "bf16"  # asked for: kept
    assert inference_precision("fp16", torch.device("cpu")) == "fp32"  # fp16 autocast is a GPU feature


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not Path("/proc/cpuinfo").is_file(), reason="x86 Linux only"
)
def test_the_x86_flags_are_the_kernels():
    flags = next(line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    seen = x86_flags()
    for flag in ("avx2", "avx512_bf16", "amx_bf16"):
        assert bool(seen.get(flag)) == (flag in flags), flag


def test_auto_precision_runs_the_teacher_in_fp32_on_a_cpu_that_would_emulate_bf16(
    monkeypatch, tmp_path, tiny_bert_dir, sst2_dir, caplog
):
    """Emulated bf16 made the demo's transfer-set cache 6x slower than fp32: under auto the teacher's
    outputs are fp32 there, the very cache ``--precision fp32`` builds, and no autocast is entered."""
    monkeypatch.setattr(trainer_module, "x86_flags", lambda: {"architecture": "x86_64", "avx2": True})
    with inference_autocast("auto", torch.device("cpu")):
        assert not torch.is_autocast_enabled("cpu")
    with inference_autocast("bf16", torch.device("cpu")):  # asked for: kept
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with caplog.at_level(logging.INFO, logger="kdplug"):
        fp32 = run(config(tmp_path, tiny_bert_dir, sst2_dir, "fp32", precision="fp32"), registry(), echo=lambda _: None)
    assert [r for r in caplog.records if "building the teacher cache" in r.getMessage()]  # the log reaches caplog
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kdplug"):
        auto = run(config(tmp_path, tiny_bert_dir, sst2_dir, "auto"), registry(), echo=lambda _: None)
    assert not [r for r in caplog.records if "building the teacher cache" in r.getMessage()]
    assert auto.metrics["teacher"]["dev"] == fp32.metrics["teacher"]["dev"]
    assert auto.metrics["teacher"]["precision"] == "fp32"  # what auto resolved to, recorded


def test_augmented_copies_are_deterministic_and_augment_each_side_of_a_pair_on_its_own():
    class Suffix:
        pair_schedule = "cycle"

        def __call__(self, text, rng):
            return f"{text} {rng.randint(0, 2)}"

    examples = [Example("a b", 0, "c d"), Example("e f", 1, "g h")]
    first = list(transfer_module.augmented(Suffix(), examples, 9, seed=5))
    assert first == list(transfer_module.augmented(Suffix(), examples, 9, seed=5))
    assert first != list(transfer_module.augmented(Suffix(), examples, 9, seed=6))
    for index, (a, b) in first:
        source = examples[index]
        changed = (a != source.text_a, b != source.text_b)
        assert changed in ((True, False), (False, True), (True, True))
        if changed == (True, True):  # each side drew its own suffix, not one text's
            assert a.startswith(source.text_a) and b.startswith(source.text_b)
    assert len(first) == 2 * 9


def test_tangs_factor_is_20_for_sentences_and_10_for_pairs(tmp_path, tiny_bert_dir, sst2_dir):
    sentences = registry().create("task", "sst2", data_dir=str(sst2_dir))
    pairs = registry().create("task", "mrpc", data_dir=str(sst2_dir))
    assert (sentences.is_pair, pairs.is_pair) == (False, True)
    settings = config(tmp_path, tiny_bert_dir, sst2_dir, augment="tang")
    assert transfer_module.augment_factor(settings, sentences) == 20
    assert transfer_module.augment_factor(settings, pairs) == 10
    explicit = config(tmp_path, tiny_bert_dir, sst2_dir, augment="tang", augment_factor=3)
    assert transfer_module.augment_factor(explicit, pairs) == 3


def test_transfer_files_of_every_format_read_the_tasks_text_columns(tmp_path, sst2_dir):
    task = registry().create("task", "sst2", data_dir=str(sst2_dir))
    (tmp_path / "a.tsv").write_text("id\tsentence\n1\tthe cat sat .\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text('sentence,other\n"the dog, it ran",x\n', encoding="utf-8")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "a nice film"}) + "\n", encoding="utf-8")
    write_lines(tmp_path / "d.txt", ["the plot was dull", ""])
    texts = [
        t
        for name in ("a.tsv", "b.csv", "c.jsonl", "d.txt")
        for t in transfer_module.read_transfer_file(str(tmp_path / name), task)
    ]
    assert texts == [
        ("the cat sat .", None),
        ("the dog, it ran", None),
        ("a nice film", None),
        ("the plot was dull", None),
    ]
    (tmp_path / "e.tsv").write_text("id\treview\n1\tthe cat sat .\n", encoding="utf-8")
    with pytest.raises(kdplug.errors.DataError, match="a transfer set for task 'sst2' reads 'sentence'"):
        list(transfer_module.read_transfer_file(str(tmp_path / "e.tsv"), task))


def test_a_transfer_file_is_read_as_a_stream_not_held_whole(tmp_path, sst2_dir):
    """A 4 MB CSV or JSONL file of texts is read row by row: the traced peak while every text is
    read stays a small fraction of the file (reading it whole held its bytes and its text, twice the
    file). A JSONL file's rows may each hold other keys: the first pass reads them all."""
    import tracemalloc

    task = registry().create("task", "sst2", data_dir=str(sst2_dir))
    rows = [f"the film number {i} was a rather moving and clever story of its kind" for i in range(60_000)]
    with open(tmp_path / "big.csv", "w", encoding="utf-8") as handle:
        handle.write("sentence\n" + "\n".join(rows) + "\n")
    with open(tmp_path / "big.jsonl", "w", encoding="utf-8") as handle:
        for i, row in enumerate(rows):
            handle.write(json.dumps({"sentence": row, **({"id": i} if i % 2 else {})}) + "\n")
    for name in ("big.csv", "big.jsonl"):
        size = (tmp_path / name).stat().st_size
        assert size > 4_000_000
        tracemalloc.start()
        try:
            count = sum(1 for _ in transfer_module.read_transfer_file(str(tmp_path / name), task))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert count == len(rows)
        assert peak < size / 10, (name, peak, size)


def test_a_missing_transfer_file_and_an_unknown_augmenter_fail_before_any_work(tmp_path, tiny_bert_dir, sst2_dir):
    for settings, message in (
        ({"transfer": [str(tmp_path / "nope.txt")]}, "no such file"),
        ({"augment": "nope"}, "unknown augmenter"),
        ({"augment": "tang", "augment_options": {"p_ng": 2}}, "p_ng"),
        ({"augment": "tang", "projector": "nkd"}, "nkd learns from gold labels alone"),
    ):
        with pytest.raises(kdplug.errors.KdplugError, match=message):
            run(config(tmp_path, tiny_bert_dir, sst2_dir, **settings), registry(), echo=lambda _: None)
        assert not (tmp_path / "cache" / "teachers").exists()  # nothing was fine-tuned


# -- storage and sampling -------------------------------------------------------------------------


def stored_set(tmp_path, texts):
    directory = tmp_path / "set"
    directory.mkdir()
    with open(directory / transfer_module.TEXTS_FILE, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps([text]) + "\n")
    return transfer_module.TransferSet(directory, {"examples": len(texts)})


def test_the_stored_encoding_equals_the_tokenizers_own(tmp_path, monkeypatch):
    monkeypatch.setattr(transfer_module, "ENCODE_CHUNK", 3)  # several chunks through the writer
    tokenizer = wordpiece_tokenizer()
    texts = ["the movie was very good .", "bad", "i loved this book , it is great .", "the cat sat", "a dog"] * 2
    encoded = stored_set(tmp_path, texts).encode(tokenizer, 6, is_regression=False)
    expected = tokenizer(texts, truncation=True, max_length=6)
    assert [encoded.input_ids[i] for i in range(len(texts))] == [list(ids) for ids in expected["input_ids"]]
    assert list(encoded.lengths) == [len(ids) for ids in expected["input_ids"]]
    assert isinstance(encoded.input_ids.ids, np.memmap)  # read from disk, not held as lists


def test_an_epoch_visits_every_labelled_example_and_the_next_share_of_the_transfer_set():
    tokenizer = wordpiece_tokenizer()
    labelled = encode([Example("the movie", 1), Example("bad", 0)] * 5, tokenizer, 16, is_regression=False)
    transfer = encode(
        [Example(f"the {w}", 0) for w in ("cat", "dog", "plot", "film", "book", "story", "music")] * 3,
        tokenizer,
        16,
        is_regression=False,
    )
    mixed = WithTransfer(labelled, transfer, per_epoch=5)  # 21 transfer examples, 5 per epoch
    seen = []
    for epoch in range(1, 5):
        sampler = LengthGroupedBatchSampler(
            mixed.lengths, 4, seed=3, pool=mixed.epoch_pool, epoch_size=mixed.epoch_size
        )
        sampler.set_epoch(epoch)
        indices = [i for batch in sampler for i in batch]
        assert len(sampler) == 4 and len(indices) == 15
        assert sorted(i for i in indices if i < 10) == list(range(10))
        seen += [i for i in indices if i >= 10]
    assert len(seen) == 20 and len(set(seen)) == 20  # no transfer example twice before all are seen


def test_batches_mark_transfer_rows_unlabelled_and_the_cache_serves_both_parts(tmp_path):
    tokenizer = wordpiece_tokenizer()
    labelled = encode([Example("the movie", 1), Example("bad", 0)], tokenizer, 16, is_regression=False)
    transfer = encode(
        [Example("the cat", 0), Example("a dog", 0), Example("the plot", 0)], tokenizer, 16, is_regression=False
    )
    mixed = WithTransfer(labelled, transfer)
    batch = Collator(mixed.pad_id, False)([mixed[i] for i in (4, 0, 3, 1)])
    assert batch["labelled"].tolist() == [False, True, False, True]
    assert batch["index"].tolist() == [4, 0, 3, 1]

    from kdplug.engine import cache as cache_module
    from kdplug.types import LayerSpec

    def cache(name, n, offset):
        def compute(with_layers, rows):
            index = torch.arange(n)
            yield (
                index,
                (index.float()[:, None] + offset).repeat(1, 2),
                [(index.float()[:, None] + offset).repeat(1, 3)],
            )

        return cache_module.open_or_build(
            tmp_path,
            name,
            layers_key=f"{name}-layers",
            num_examples=n,
            num_outputs=2,
            specs=[LayerSpec(1, 3, "transformer")],
            compute=compute,
            description={},
        )

    both = ConcatCache(cache("train", 2, 0.0), cache("transfer", 3, 100.0))
    logits, layers = both.fetch(batch["index"])
    assert logits[:, 0].tolist() == [102.0, 0.0, 101.0, 1.0]
    assert layers[0][:, 0].tolist() == [102.0, 0.0, 101.0, 1.0]
    assert isinstance(both.labelled, TeacherCache)


def test_an_unlabelled_batch_trains_on_the_teachers_outputs_alone():
    """The objective's CE has no term for transfer rows: a batch of them moves the student through KD only."""
    from kdplug.engine.objective import WeightedObjective
    from kdplug.types import StepState

    logits = torch.randn(4, 2, requires_grad=True)
    teacher = torch.randn(4, 2)
    objective = WeightedObjective(
        eta=0.5,
        lam=0.0,
        task_loss=torch.nn.functional.cross_entropy,
        kd_loss=lambda s, t: ((s - t) ** 2).mean(),
        ild_loss=None,
    )
    terms = objective(
        StepState(
            student_logits=logits,
            student_layers=[],
            labels=torch.tensor([1, 0, 0, 0]),
            teacher_logits=teacher,
            teacher_layers=None,
            teacher_head_logits=None,
            pairs=None,
            labelled=torch.tensor([True, False, False, False]),
        )
    )
    expected_ce = torch.nn.functional.cross_entropy(logits[:1], torch.tensor([1]))
    assert torch.allclose(terms["ce"], expected_ce)
    terms["ce"].backward()
    assert logits.grad[1:].abs().sum() == 0  # unlabelled rows get no CE gradient


def test_agreement_is_the_share_of_examples_where_student_and_teacher_classes_match(tmp_path):
    from kdplug.engine import cache as cache_module
    from kdplug.engine.results import agreement

    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5], [-1.0, 1.0]])  # teacher classes 0, 1, 0, 1

    def compute(with_layers, rows):
        yield torch.arange(4), logits, []

    cache = cache_module.open_or_build(
        tmp_path,
        "dev",
        num_examples=4,
        num_outputs=2,
        specs=[],
        compute=compute,
        description={},
    )
    assert agreement([0, 1, 1, 0], cache) == 0.5
    assert agreement([0, 1, 0, 1], cache) == 1.0


def test_the_dry_run_says_an_unbuilt_transfer_sets_size_is_an_upper_bound(tmp_path, tiny_bert_dir, sst2_dir, capsys):
    from kdplug.engine.plan import dry_run

    texts = write_lines(tmp_path / "more.txt", ["a fine film", "a fine film", "a dull plot", "good acting"])
    plan = dry_run(config(tmp_path, tiny_bert_dir, sst2_dir, transfer=[str(texts)]), registry())
    stage = plan["stages"]["distill"]
    assert plan["transfer"]["examples"] == "up to 4" and stage["examples_per_epoch"] == 12 + 4
    assert "its size here is an upper bound, since duplicates are dropped" in stage["plan"]
    assert "upper bound" in capsys.readouterr().out

"""Students with a SentencePiece vocabulary trained on the task's text (kdplug_models.sentencepiece_tokenizer)."""

from __future__ import annotations

import json
import logging
import random

import pytest
import sentencepiece
import torch

import kdplug
from kdplug import fingerprint
from kdplug.engine.data import encode
from kdplug.testing import tiny_run_args
from kdplug.testing.tiny import TINY_SENTENCES, TinyTask
from kdplug_models import sentencepiece_tokenizer as spt

PAIR_TASK = TinyTask(is_pair=True)
#: made-up words, so that a 300-piece vocabulary is neither the whole text's nor more than it supports
_rng = random.Random(0)
WORDS = ["".join(_rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_rng.randint(2, 9))) for _ in range(400)]
CORPUS = [
    " ".join(_rng.choice(WORDS) for _ in range(_rng.randint(3, 12))) + _rng.choice([" .", " !", ","])
    for _ in range(600)
]


@pytest.fixture(scope="module")
def spm_root(tmp_path_factory):
    return tmp_path_factory.mktemp("spm")


@pytest.fixture(scope="module")
def tokenizers(spm_root):
    return {
        model_type: spt.sentencepiece_tokenizer(CORPUS, vocab_size=300, model_type=model_type, cache_root=spm_root)
        for model_type in spt.MODEL_TYPES
    }


@pytest.fixture
def teacher(tiny_bert_dir):
    return kdplug.create_teacher("hf", PAIR_TASK, source=tiny_bert_dir)


def small(name, task, teacher, **options):
    return kdplug.create_student(
        name, task, teacher, embedding_dim=12, hidden_size=16, attention_dim=8, tokenizer="sentencepiece", **options
    ).eval()


def body(ids):
    """Token ids without the closing </s>."""
    assert ids[-1] == 3
    return ids[:-1]


# -- the tokenizer ----------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", spt.MODEL_TYPES)
def test_fast_tokenizer_segments_exactly_as_sentencepiece(tokenizers, spm_root, model_type):
    tokenizer = tokenizers[model_type]
    path = spt.trained_model(CORPUS, vocab_size=300, model_type=model_type, cache_root=spm_root)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    assert len(tokenizer) == processor.get_piece_size() == 300
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.eos_token_id) == (0, 1, 3)
    unseen = ["the  ending was\tquite gorgeous !", "Ｆｕｌｌ width café 😀", ""]
    for text in [*CORPUS[:50], *unseen]:
        assert body(tokenizer(text)["input_ids"]) == processor.encode(spt.normalize_text(text))
    assert tokenizer.unk_token_id in tokenizer("😀")["input_ids"]  # a character the text never had


def test_pairs_are_one_sequence_with_a_separator(tokenizers):
    tokenizer = tokenizers["unigram"]
    first, second = ["the movie was good", "a dull plot"], ["it was fun", "we loved it"]
    encoded = tokenizer(first, second, truncation=True, max_length=64)
    assert set(encoded) == {"input_ids", "attention_mask"}  # no segment ids: the students read one sequence
    for a, b, ids in zip(first, second, encoded["input_ids"]):
        assert ids == tokenizer(a)["input_ids"] + tokenizer(b)["input_ids"]  # A </s> B </s>


@pytest.mark.parametrize("max_length", [2, 3, 5, 8])
def test_truncation_keeps_the_special_tokens_within_max_length(tokenizers, max_length):
    tokenizer = tokenizers["bpe"]
    long = "the movie was really quite good but the ending was boring and the music was dull"
    single = tokenizer([long], None, truncation=True, max_length=max_length)["input_ids"][0]
    assert len(single) == max_length and single[-1] == tokenizer.eos_token_id
    assert body(single) == body(tokenizer(long)["input_ids"])[: max_length - 1]
    pair = tokenizer([long], [long], truncation=True, max_length=max_length + 2)["input_ids"][0]
    assert len(pair) == max_length + 2 and pair.count(tokenizer.eos_token_id) == 2


def test_engine_encodes_a_task_with_it(tokenizers):
    tokenizer = tokenizers["unigram"]
    split = encode(PAIR_TASK.load_split("train"), tokenizer, 16, is_regression=False)
    assert split.pad_id == 0 and split.token_type_ids is None
    assert all(2 <= len(ids) <= 16 and ids.count(3) == 2 for ids in split.input_ids)


# -- training and reuse ---------------------------------------------------------------------------


def test_training_is_deterministic_and_quiet(tmp_path, capfd):
    first = spt.trained_model(CORPUS, vocab_size=120, cache_root=tmp_path / "a")
    second = spt.trained_model(CORPUS, vocab_size=120, cache_root=tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""  # SentencePiece logs to stderr unless told not to


def test_the_stored_model_is_reused_and_settings_or_text_train_a_new_one(tmp_path, monkeypatch):
    calls = []
    train = spt._train
    monkeypatch.setattr(spt, "_train", lambda texts, **kw: calls.append(kw) or train(texts, **kw))
    path = spt.trained_model(CORPUS, vocab_size=100, cache_root=tmp_path)
    assert path.parent.parent == tmp_path / "sentencepiece" and path.name == "sentencepiece.model"
    stamp = path.stat().st_mtime_ns
    again = spt.sentencepiece_tokenizer(CORPUS, vocab_size=100, cache_root=tmp_path)
    assert len(calls) == 1 and path.stat().st_mtime_ns == stamp and len(again) == 100
    assert spt.trained_model(CORPUS, vocab_size=110, cache_root=tmp_path) != path
    assert spt.trained_model(CORPUS, vocab_size=100, model_type="bpe", cache_root=tmp_path) != path
    assert spt.trained_model(CORPUS[1:], vocab_size=100, cache_root=tmp_path) != path
    assert len(calls) == 4
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # written atomically


def test_a_corrupted_stored_model_is_trained_again(tmp_path, caplog):
    path = spt.trained_model(CORPUS, vocab_size=100, cache_root=tmp_path)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 3])
    with caplog.at_level(logging.WARNING):
        assert spt.trained_model(CORPUS, vocab_size=100, cache_root=tmp_path).read_bytes() == good
    assert "unreadable" in caplog.text


def test_vocab_size_is_capped_by_what_the_text_supports(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="kdplug"):
        tokenizer = spt.sentencepiece_tokenizer(list(TINY_SENTENCES), vocab_size=8000, cache_root=tmp_path)
    assert 30 < len(tokenizer) < 8000
    assert f"supports {len(tokenizer)} pieces, fewer than sentencepiece_vocab_size=8000" in caplog.text


@pytest.mark.parametrize(
    "options, message",
    [
        ({"vocab_size": 8}, "Raise sentencepiece_vocab_size"),
        ({"model_type": "word"}, "sentencepiece_model_type='word' is not supported"),
        ({"vocab_size": 0}, "must be a positive integer"),
    ],
)
def test_bad_settings_are_usage_errors(tmp_path, options, message):
    with pytest.raises(kdplug.UsageError, match=message):
        spt.trained_model(CORPUS, cache_root=tmp_path, **options)


# -- students -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_student_reads_with_its_own_vocabulary(teacher, name):
    student = small(name, PAIR_TASK, teacher, sentencepiece_vocab_size=8000, sentencepiece_model_type="bpe")
    tokenizer = student.tokenizer
    assert tokenizer is not teacher.tokenizer and len(tokenizer) != len(teacher.tokenizer)
    assert student.embeddings.num_embeddings == len(tokenizer)
    assert student.embeddings.padding_idx == tokenizer.pad_token_id
    assert student.config.vocab_size == len(tokenizer)
    texts = [example.text_a for example in PAIR_TASK.load_split("train")]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert batch["input_ids"].max() < len(tokenizer)
    outputs = student(**batch)
    assert outputs.logits.shape == (len(texts), 2) and torch.isfinite(outputs.logits).all()


def test_default_is_the_teachers_tokenizer(teacher):
    for options in ({}, {"tokenizer": "teacher"}):
        student = kdplug.create_student("bilstm", PAIR_TASK, teacher, embedding_dim=8, hidden_size=8, **options)
        assert student.tokenizer is teacher.tokenizer
        assert student.embeddings.num_embeddings == len(teacher.tokenizer)


def test_init_embeddings_from_teacher_needs_the_teachers_vocabulary(teacher):
    with pytest.raises(kdplug.UsageError, match="teacher's tokenizer"):
        small("gated-cnn", PAIR_TASK, teacher, init_embeddings_from_teacher=True)


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_saved_student_reloads_with_the_same_tokenizer(teacher, tmp_path, name):
    student = small(name, PAIR_TASK, teacher)
    student.save_pretrained(tmp_path / "student")
    assert (tmp_path / "student" / "tokenizer.json").is_file()
    reloaded = kdplug.create_student(name, PAIR_TASK, teacher, source=str(tmp_path / "student")).eval()
    assert fingerprint.of_tokenizer(reloaded.tokenizer) == fingerprint.of_tokenizer(student.tokenizer)
    examples = PAIR_TASK.load_split("dev")
    texts, pairs = [e.text_a for e in examples], [e.text_b for e in examples]
    ids = student.tokenizer(texts, pairs, truncation=True, max_length=12)["input_ids"]
    assert reloaded.tokenizer(texts, pairs, truncation=True, max_length=12)["input_ids"] == ids
    batch = reloaded.tokenizer(texts, pairs, padding=True, return_tensors="pt")
    with torch.no_grad():  # the same weights in other memory: kernels may round the last bit differently
        torch.testing.assert_close(reloaded(**batch).logits, student(**batch).logits, rtol=0, atol=1e-6)


def sentencepiece_run(tmp_path, teacher, data, *extra) -> list[str]:
    options = {"tokenizer": "sentencepiece", "embedding_dim": 16, "hidden_size": 16}
    tiny = tiny_run_args(teacher=teacher, task="sst2", data_dir=str(data), projector="universal-ca",
                         student_options=options, output=str(tmp_path / "run"))  # fmt: skip
    return ["run", *tiny, *extra]


def test_cli_run_distils_into_a_sentencepiece_student(tmp_path, tiny_bert_dir, sst2_dir, capsys, monkeypatch):
    """... and keeps its SentencePiece model under --cache-dir, where 'kdplug cache' sees it: the default
    cache directory (a path no one can create, under a file) is never written."""
    from kdplug.cli import main

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KDPLUG_CACHE", str(tmp_path / "a-file" / "cache"))
    cache = tmp_path / "cache"
    code = main(sentencepiece_run(tmp_path, tiny_bert_dir, sst2_dir, "--cache-dir", str(cache)))
    out = capsys.readouterr().out
    assert code == 0, out
    [model] = (cache / "sentencepiece").glob("*/sentencepiece.model")
    assert main(["cache", "list", "--cache-dir", str(cache)]) == 0
    assert f"SentencePiece student tokenizers (sentencepiece):\n  {model.parent.name}" in capsys.readouterr().out
    student_dir = tmp_path / "run" / "student"
    teacher_vocab = len(kdplug.create_teacher("hf", TinyTask(), source=tiny_bert_dir).tokenizer)
    vocab_size = json.loads((student_dir / "config.json").read_text())["vocab_size"]
    assert (student_dir / "tokenizer.json").is_file() and vocab_size != teacher_vocab
    reloaded = kdplug.create_student("bilstm", TinyTask(), None, source=str(student_dir))
    assert len(reloaded.tokenizer) == vocab_size == reloaded.embeddings.num_embeddings
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["stages"]["stage1"]["weights"]["lam"] > 0  # universal-ca's ILD term was on (two-stage default)
    assert 0.0 <= metrics["student"]["dev"]["dev"]["accuracy"] <= 1.0


def test_a_cache_folder_that_cannot_take_the_model_stops_the_run_before_any_work(tmp_path, tiny_bert_dir, sst2_dir,
                                                                                 capsys):  # fmt: skip
    from kdplug.cli import main

    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "sentencepiece").write_text("not a folder")
    code = main(sentencepiece_run(tmp_path, tiny_bert_dir, sst2_dir, "--cache-dir", str(tmp_path / "cache")))
    captured = capsys.readouterr()
    assert code == 2, captured
    assert f"{tmp_path / 'cache' / 'sentencepiece'} is not a directory" in captured.err
    assert not (tmp_path / "run").exists() and "teacher" not in captured.out  # nothing loaded, nothing written

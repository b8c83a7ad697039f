"""A student of its own vocabulary: a BiLSTM or Gated-CNN student of a teacher with an LLM's vocabulary
reads one trained on the task's text by default, and BERT-k of a decoder teacher starts from a named
pre-trained encoder; nothing of the teacher reaches the student package."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kdplug
from kdplug.cli import main
from kdplug.testing.decoders import make_tiny_decoder
from kdplug.testing.tiny import TinyTask
from kdplug.types import ModelShape
from kdplug_models.hf_loading import checkpoint_shape
from kdplug_models.hf_students import bert_k_shape
from kdplug_models.sentencepiece_tokenizer import normalize_text
from kdplug_models.student_vocabulary import LARGE_TEACHER_VOCABULARY, default_tokenizer

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

#: an LLM-sized vocabulary (Llama 3 has 128,256 entries), above LARGE_TEACHER_VOCABULARY
LLM_VOCABULARY = 100_000


@pytest.fixture(scope="module")
def large_vocabulary_teacher(tmp_path_factory) -> str:
    """A tiny Llama classifier with a 100,000-entry vocabulary whose files name code of their own, as
    a hub repository with custom code does (transformers' Llama classes load it without that code)."""
    path = Path(make_tiny_decoder(tmp_path_factory.mktemp("llm") / "llama", "llama", vocab_size=LLM_VOCABULARY))
    for name, names in (
        ("config.json", {"tokenizer_class": "TeacherTokenizer"}),
        ("config.json", {"auto_map": {"AutoConfig": "configuration_teacher.TeacherConfig"}}),
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["tokenization_teacher.TeacherTokenizer", None]}}),
    ):
        data = json.loads((path / name).read_text())
        data.update(names)
        (path / name).write_text(json.dumps(data))
    return str(path)


def vocabulary_rows(student) -> int:
    return student.get_input_embeddings().num_embeddings


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_a_student_of_a_teacher_with_an_llms_vocabulary_reads_one_of_the_tasks_own(
    caplog, large_vocabulary_teacher, name
):
    task = TinyTask()
    teacher = kdplug.create_teacher("hf", task, source=large_vocabulary_teacher)
    assert len(teacher.tokenizer) == LLM_VOCABULARY
    with caplog.at_level(logging.INFO, logger="kdplug.models.vocabulary"):
        student = kdplug.create_student(name, task, teacher, hidden_size=16)
    own = student.tokenizer
    assert own is not teacher.tokenizer and vocabulary_rows(student) == len(own) < 1000
    # the pieces are the task's: each one (its word-start mark read as a space) is in its training text
    text = " " + " ".join(normalize_text(example.text_a) for example in task.load_split("train"))
    pieces = [piece.replace("\u2581", " ") for piece in own.get_vocab() if piece not in own.all_special_tokens]
    assert pieces and all(piece in text for piece in pieces)
    said = f"student vocabulary: {len(own):,} sentencepiece pieces trained on the task's text, since the teacher's "
    said += f"has {LLM_VOCABULARY:,} entries"
    assert said in caplog.text and said in student.kdplug_init["tokenizer"]
    assert "student_options.tokenizer=teacher keeps the teacher's" in caplog.text


def test_an_explicit_tokenizer_choice_wins(large_vocabulary_teacher):
    task = TinyTask()
    teacher = kdplug.create_teacher("hf", task, source=large_vocabulary_teacher)
    kept = kdplug.create_student("bilstm", task, teacher, tokenizer="teacher", hidden_size=16)
    assert kept.tokenizer is teacher.tokenizer and vocabulary_rows(kept) == LLM_VOCABULARY
    assert "tokenizer" not in kept.kdplug_init and kept.kdplug_init["init"] == "embeddings from the teacher"
    # asking for the teacher's embedding table asks for the vocabulary it fits
    table = kdplug.create_student("bilstm", task, teacher, init_embeddings_from_teacher=True, hidden_size=16)
    assert vocabulary_rows(table) == LLM_VOCABULARY


def test_a_teacher_with_a_small_vocabulary_keeps_it_for_its_student(tmp_path, tiny_bert_dir):
    task = TinyTask()
    for source in (make_tiny_decoder(tmp_path / "llama", "llama"), tiny_bert_dir):
        teacher = kdplug.create_teacher("hf", task, source=source)
        student = kdplug.create_student("bilstm", task, teacher, hidden_size=16)
        assert student.tokenizer is teacher.tokenizer and vocabulary_rows(student) == len(teacher.tokenizer)
        assert "tokenizer" not in student.kdplug_init


def test_the_threshold_is_over_64k_entries():
    def teacher(entries: int) -> SimpleNamespace:
        return SimpleNamespace(tokenizer=range(entries))  # all the choice reads is len(tokenizer)

    assert LARGE_TEACHER_VOCABULARY == 65_536
    assert default_tokenizer(teacher(30_522), init_embeddings_from_teacher=None) == "teacher"  # BERT
    assert default_tokenizer(teacher(65_536), init_embeddings_from_teacher=None) == "teacher"
    assert default_tokenizer(teacher(65_537), init_embeddings_from_teacher=None) == "sentencepiece"
    assert default_tokenizer(teacher(128_256), init_embeddings_from_teacher=True) == "teacher"
    assert default_tokenizer(SimpleNamespace(tokenizer=None), init_embeddings_from_teacher=None) == "teacher"


# -- BERT-k of a decoder teacher ---------------------------------------------------------------------


def test_bert_k_of_a_decoder_teacher_without_source_is_refused_before_any_work(capsys, tmp_path):
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["run", "--teacher", make_tiny_decoder(tmp_path / "gpt2", "gpt2"), "--student", "bert-2", "--task", "sst2"]
    argv += ["--data-dir", str(data), "--set", "allow_weak_teacher=true", "--output", str(tmp_path / "run")]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "a decoder's layers cannot initialise an encoder" in error
    assert "--set student_options.source=DIR_OR_HUB_ID" in error
    assert not (Path(os.environ["KDPLUG_CACHE"]) / "teacher-cache").exists()  # refused before the teacher ran


def test_bert_k_of_a_decoder_teacher_starts_from_the_encoder_source_names(tmp_path, tiny_bert_dir):
    from transformers import AutoTokenizer, BertModel

    task = TinyTask()
    teacher = kdplug.create_teacher("hf", task, source=make_tiny_decoder(tmp_path / "qwen2", "qwen2"))
    student = kdplug.create_student("bert-2", task, teacher, source=tiny_bert_dir)
    assert type(student).__name__ == "BertForSequenceClassification" and student.config.num_hidden_layers == 2
    encoder = BertModel.from_pretrained(tiny_bert_dir).state_dict()
    mine = student.bert.state_dict()
    kept = [name for name in encoder if not name.startswith(("encoder.layer.2.", "encoder.layer.3."))]
    assert sorted(mine) == sorted(kept)
    for name in kept:
        torch.testing.assert_close(mine[name], encoder[name], rtol=0, atol=0)
    assert student.tokenizer.get_vocab() == AutoTokenizer.from_pretrained(tiny_bert_dir).get_vocab()
    assert student.kdplug_init["from"] == tiny_bert_dir and student.kdplug_init["layers"] == [1, 2]
    with pytest.raises(kdplug.UsageError, match="drop init=teacher"):
        kdplug.create_student("bert-2", task, teacher, init="teacher", source=tiny_bert_dir)
    with pytest.raises(kdplug.UsageError, match="is a qwen2 model, not an encoder"):
        kdplug.create_student("bert-2", task, teacher, source=str(tmp_path / "qwen2"))
    with pytest.raises(kdplug.UsageError, match="drop from_teacher: the student is then the pre-trained encoder"):
        kdplug.create_student("distilroberta", task, teacher, from_teacher=True)
    with pytest.raises(kdplug.UsageError, match="takes the first 5 layers of the encoder .*, which has 4"):
        kdplug.create_student("bert-5", task, teacher, source=tiny_bert_dir)
    # what the projectors are checked against before the teacher loads: the encoder's shape, not the decoder's
    decoder = checkpoint_shape(str(tmp_path / "qwen2"), "teacher", {})
    assert bert_k_shape(task, decoder, 2, source=tiny_bert_dir) == ModelShape.transformer(2, 32, heads=2)
    assert bert_k_shape(task, decoder, 2) is None  # unknown: the student is refused once the teacher loads


def test_an_encoder_student_with_fewer_positions_than_the_run_reads_is_refused(capsys, tmp_path, tiny_bert_dir):
    """The run's max_length is bounded by the teacher's 128 positions; the encoder the student is cut
    from holds 64, and reads with its own tokenizer: a usage error, not an index error mid-run."""
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["run", "--teacher", make_tiny_decoder(tmp_path / "llama", "llama"), "--student", "bert-2", "--task", "sst2"]
    argv += [
        "--data-dir",
        str(data),
        "--set",
        "allow_weak_teacher=true",
        "--set",
        f"student_options.source={tiny_bert_dir}",
    ]
    assert main([*argv, "--set", "max_length=100", "--dry-run"]) == 2
    assert "holds 64 positions, but the run reads up to 100 tokens an example; pass --set max_length=64" in (
        capsys.readouterr().err
    )


# -- the student package -----------------------------------------------------------------------------


def test_nothing_of_a_decoder_teacher_reaches_its_students_package(capsys, tmp_path, large_vocabulary_teacher):
    """An end-to-end run: the teacher's layer vectors (pooled at its last real token) are distilled
    into a student that reads its own vocabulary; its package holds that vocabulary and names none
    of the teacher's code."""
    from transformers import AutoTokenizer

    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["run", "--teacher", large_vocabulary_teacher, "--student", "bilstm", "--projector", "alp"]
    argv += ["--task", "sst2", "--data-dir", str(data), "--epochs", "1", "--set", "allow_weak_teacher=true"]
    argv += ["--set", "student_options.hidden_size=16", "--output", str(tmp_path / "run")]
    assert main([*argv, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "reads text with its own tokenizer\n            student vocabulary: " in plan
    assert main(argv) == 0
    package = tmp_path / "run" / "student"
    tokenizer = AutoTokenizer.from_pretrained(package)
    weights = kdplug.load_student(tmp_path / "run").model.get_input_embeddings().num_embeddings
    assert len(tokenizer) == weights < 1000  # the student's vocabulary, not the teacher's 100,000 entries
    assert not any(token.startswith("<|reserved_") for token in tokenizer.get_vocab())
    for name in ("config.json", "tokenizer_config.json"):
        data = json.loads((package / name).read_text())
        assert (
            "teacher" not in json.dumps(data.get("auto_map", {})) and data.get("tokenizer_class") != "TeacherTokenizer"
        )
    assert not list(package.glob("*teacher*"))

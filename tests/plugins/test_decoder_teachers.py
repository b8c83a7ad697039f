"""Decoder classifiers (Llama, Qwen2, Mistral, Gemma, GPT-2) as teachers: their layer vectors are read
at the last real token, where their own classifier reads, and so vary with the sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import kdplug
from kdplug.cli import main
from kdplug.errors import UsageError
from kdplug.testing.decoders import FAMILIES, make_tiny_decoder, make_tiny_t5_config
from kdplug.testing.tiny import TinyTask
from kdplug_models.decoders import HFDecoderExtractor, last_real_token
from kdplug_models.hf_loading import checkpoint_shape

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

TEXTS = ["the story was good", "a bad film", "i loved the music and the plot", "the plot was boring"]


@pytest.mark.parametrize("family", FAMILIES)
def test_layers_are_read_where_the_classifier_reads(tmp_path, family):
    path = make_tiny_decoder(tmp_path / family, family)
    shape = checkpoint_shape(path, "teacher", {})  # read before the teacher loads: 2 blocks, no token signals,
    assert [spec.width for spec in shape.layers] == [32, 32] and shape.tokens is None  # so TinyBERT is refused
    teacher = kdplug.create_teacher("hf", TinyTask(), source=path)
    model, tokenizer = teacher.model.eval(), teacher.tokenizer
    # the checkpoint has no padding token: it gets its end-of-sequence token (Qwen2's tokenizer class
    # has one of its own), in the tokenizer and in the config its classifier pools by
    assert tokenizer.pad_token == ("<|endoftext|>" if family == "qwen2" else "</s>")
    assert model.config.get_text_config().pad_token_id == tokenizer.pad_token_id
    extractor = kdplug.find_layer_extractor(model)
    assert isinstance(extractor, HFDecoderExtractor)
    assert [spec.index for spec in extractor.layer_specs(model)] == [0, 1, 2]

    for side in ("right", "left"):
        tokenizer.padding_side = side
        inputs = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
        with torch.no_grad():
            outputs = model(**inputs, output_hidden_states=True)
            vectors = extractor(model, outputs, inputs)
            # the model's own classifier, applied to the vector read from its last hidden state,
            # gives the model's logits: the position read is the one it pools
            torch.testing.assert_close(model.score(vectors[-1]), outputs.logits, rtol=1e-5, atol=1e-6)
        for vector in vectors:
            assert vector.shape == (len(TEXTS), model.config.hidden_size)
            assert float(vector.std(dim=0).min()) > 0  # every dimension varies across the sentences


def test_last_real_token_with_left_and_right_padding():
    pad = 9
    right = torch.tensor([[5, 6, 7, pad], [5, pad, pad, pad], [5, 6, 7, 8]])
    left = torch.tensor([[pad, 5, 6, 7], [pad, pad, pad, 5], [5, 6, 7, 8]])
    mask = (right != pad).long()
    assert last_real_token(right, mask, pad).tolist() == [2, 0, 3]
    assert last_real_token(left, (left != pad).long(), pad).tolist() == [3, 3, 3]
    assert last_real_token(right, mask, None).tolist() == [2, 0, 3]  # no padding token: the mask


def test_encoders_keep_the_first_token(tiny_bert_dir):
    teacher = kdplug.create_teacher("hf", TinyTask(), source=tiny_bert_dir)
    assert not isinstance(kdplug.find_layer_extractor(teacher.model), HFDecoderExtractor)


def test_a_decoder_teachers_cached_layers_vary_across_examples(tmp_path):
    """The reported fault: alp with a Llama teacher ran with exit 0 on layer vectors that were the
    same for every example (the first position, which has seen only the first token)."""
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN * 2, dev=SST2_DEV)
    argv = [sys.executable, "-m", "kdplug.cli", "run", "--teacher", make_tiny_decoder(tmp_path / "llama", "llama")]
    argv += ["--student", "bilstm", "--projector", "alp", "--task", "sst2", "--data-dir", str(data), "--epochs", "1"]
    argv += [
        "--set",
        "allow_weak_teacher=true",
        "--set",
        "student_options.hidden_size=16",
        "--output",
        str(tmp_path / "run"),
    ]
    env = {**os.environ, "KDPLUG_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    layers = [
        meta_file.parent
        for meta_file in (tmp_path / "cache" / "teacher-cache").glob("*/meta.json")
        if json.loads(meta_file.read_text())["kind"] == "layers"
        and json.loads(meta_file.read_text())["description"]["split"] == "train"
    ]
    assert len(layers) == 1
    meta = json.loads((layers[0] / "meta.json").read_text())
    width = sum(layer["width"] for layer in meta["layers"])
    stored = np.fromfile(layers[0] / "layers.f16", dtype=np.float16).reshape(meta["num_examples"], width)
    assert stored.astype(np.float64).std(axis=0).min() > 0


def test_the_dry_run_says_how_a_decoder_teachers_layers_are_read(capsys, tmp_path):
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    teacher = make_tiny_decoder(tmp_path / "gpt2", "gpt2")
    argv = ["run", "--teacher", teacher, "--student", "bilstm", "--projector", "alp", "--task", "sst2"]
    argv += ["--data-dir", str(data), "--set", "allow_weak_teacher=true", "--output", str(tmp_path / "run")]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "kind: a decoder classifier (GPT2ForSequenceClassification)" in out
    assert "layers read by hf-decoder (last-real-token state of" in out


def test_an_encoder_decoder_teacher_is_refused_before_its_weights_load(tmp_path):
    t5 = make_tiny_t5_config(tmp_path / "t5")  # a config alone: the refusal must come before any weights are read
    with pytest.raises(UsageError, match=r"encoder-decoder model \(model type 't5'\).*decoder-only classifier"):
        kdplug.create_teacher("hf", TinyTask(), source=t5)


def test_tangs_mask_is_never_a_token_that_ends_or_pads_the_sequence(tmp_path):
    """GPT-2, Pythia and Phi-2 tokenizers have no mask token, and their unknown token is
    <|endoftext|>, which kdplug also makes their padding token: Tang's masked word became a
    document boundary, and a text ending in a masked word was pooled one token early. They read
    the augmenter's "[MASK]" as its text instead."""
    import random

    from kdplug.engine.transfer import TEXTS_FILE, TransferSet
    from kdplug_augment.tang import TangAugmenter

    teacher = kdplug.create_teacher(
        "hf", TinyTask(), source=make_tiny_decoder(tmp_path / "gpt2", "gpt2", gpt2_specials=True)
    )
    tokenizer = teacher.tokenizer
    boundaries = {tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id}
    assert tokenizer.unk_token == tokenizer.pad_token == "<|endoftext|>" and tokenizer.mask_token is None
    augmenter = TangAugmenter(teacher, p_mask=0.4, p_pos=0.0, p_ng=0.0)
    rng = random.Random(0)
    texts = [augmenter(text, rng) for text in TEXTS * 5]
    texts.append(TEXTS[0] + " " + augmenter.mask_token)  # the last word masked
    assert sum(augmenter.mask_token in text for text in texts) > 5
    directory = tmp_path / "set"
    directory.mkdir()
    (directory / TEXTS_FILE).write_text("".join(json.dumps([text]) + "\n" for text in texts), encoding="utf-8")
    stored = TransferSet(directory, {"examples": len(texts), "mask_token": augmenter.mask_token})
    encoded = stored.encode(tokenizer, 64, is_regression=False)
    rows = [list(encoded.input_ids[i]) for i in range(len(texts))]
    assert not boundaries & {token for row in rows for token in row}
    assert rows[-1] == tokenizer(texts[-1])["input_ids"]  # "[MASK]" as the tokenizer writes that text
    # the classifier pools each row's last token, the masked one included
    width = max(map(len, rows))
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    assert last_real_token(ids, mask, tokenizer.pad_token_id).tolist() == [len(row) - 1 for row in rows]


def test_a_decoder_teachers_padding_token_is_in_its_cache_key(tmp_path):
    """The padding token's id is no weight, but it moves the position a decoder is read at: the
    same weights with another padding token give other outputs, and so another cache key."""
    from kdplug.engine.data import encode
    from kdplug.engine.teacher import logits_key, teacher_fingerprint

    teacher = kdplug.create_teacher("hf", TinyTask(), source=make_tiny_decoder(tmp_path / "gpt2", "gpt2"))
    model, tokenizer = teacher.model.eval(), teacher.tokenizer
    inputs = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    extractor = kdplug.find_layer_extractor(model)
    split = encode([kdplug.types.Example(text, 0) for text in TEXTS], tokenizer, 16, is_regression=False)

    def read():
        with torch.no_grad():
            outputs = model(**inputs, output_hidden_states=True)
        key = logits_key(teacher_fingerprint(model), kdplug.fingerprint.of_tokenizer(tokenizer), split, "fp32")
        return outputs.logits, extractor(model, outputs, inputs)[-1], key

    weights = kdplug.fingerprint.of_module(model)
    logits, vectors, key = read()
    model.config.pad_token_id = inputs["input_ids"][1, 2].item()  # "a bad film": the id of " film"
    moved_logits, moved_vectors, moved_key = read()
    assert kdplug.fingerprint.of_module(model) == weights  # the weights alone do not tell the two apart
    assert not torch.allclose(logits[1], moved_logits[1]) and not torch.allclose(vectors[1], moved_vectors[1])
    assert moved_key != key


def test_distilroberta_copied_from_a_decoder_teacher_is_refused_for_what_it_is(capsys, tmp_path):
    """It was told to "ask for 1 to 2 layers" (the decoder's count), which would then be refused too:
    a decoder's layers cannot initialise an encoder, whatever their number."""
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["run", "--teacher", make_tiny_decoder(tmp_path / "llama"), "--student", "distilroberta", "--task", "sst2"]
    argv += ["--data-dir", str(data), "--set", "student_options.from_teacher=true", "--set", "allow_weak_teacher=true"]
    assert main([*argv, "--output", str(tmp_path / "run"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "copies a RoBERTa teacher, but the teacher is a llama model; drop from_teacher" in err
    assert "layers" not in err.split("drop from_teacher")[0] and "ask for" not in err

"""Tiny random decoder classifiers (Llama, Qwen2, Mistral, Gemma, GPT-2) and causal language
models, saved as plain transformers saves them, for testing decoder and prompted teachers offline
(and a T5's config, which both must refuse).

Each comes with a byte-level BPE tokenizer trained on :data:`~kdplug.testing.tiny.TINY_WORDS`
that, like Llama's and GPT-2's, has an end-of-sequence token and no padding token (transformers'
Qwen2 tokenizer class gives itself ``<|endoftext|>``, as Qwen checkpoints have). A vocabulary
larger than the tiny text supports (``vocab_size=100_000``, an LLM's size) is filled with
reserved tokens, as Llama 3 reserves 256 of its own: the tokenizer and the embedding table have
an LLM's number of rows while the model stays 32 wide.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from .tiny import TINY_WORDS

#: the decoder families the tests build, each with its config class and options
FAMILIES = ("llama", "qwen2", "mistral", "gemma", "gpt2")


def bpe_tokenizer(vocab_size: int = 300, *, pad: bool = False, gpt2_specials: bool = False):
    """A byte-level BPE tokenizer (GPT-2 style) over the tiny vocabulary: ``<s>``, ``</s>``, no
    padding token unless ``pad``; ``vocab_size`` entries, those the text does not support being
    reserved tokens ``<|reserved_N|>`` that no text produces. ``gpt2_specials``: its beginning,
    end and unknown tokens are all ``<|endoftext|>``, as GPT-2's, Pythia's and Phi-2's are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    # <|endoftext|>: Qwen2's tokenizer class pads with it by default, and expects it in the vocabulary
    special = ["<s>", "</s>", "<|endoftext|>", *(["<pad>"] if pad else [])]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([" ".join(TINY_WORDS)] * 4, trainer)
    if tokenizer.get_vocab_size() < vocab_size:
        tokenizer = _with_reserved_tokens(tokenizer, vocab_size)
    specials = (
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
        if gpt2_specials
        else {"bos_token": "<s>", "eos_token": "</s>"}
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials, **({"pad_token": "<pad>"} if pad else {}))


def _with_reserved_tokens(tokenizer: Any, vocab_size: int) -> Any:
    """``tokenizer`` with its BPE vocabulary filled up to ``vocab_size`` by pieces no merge reaches."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.to_str())
    vocab = state["model"]["vocab"]
    for number in range(vocab_size - len(vocab)):
        vocab[f"<|reserved_{number}|>"] = len(vocab)
    return Tokenizer.from_str(json.dumps(state))


def decoder_config(family: str, vocab_size: int, num_labels: int = 2, **overrides: Any):
    """A 2-layer, 32-wide config of ``family`` with a classification head of ``num_labels``."""
    import transformers

    common = {"vocab_size": vocab_size, "num_labels": num_labels, "bos_token_id": 0, "eos_token_id": 1}
    if family == "gpt2":
        options = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128}
        return transformers.GPT2Config(**common, **{**options, **overrides})
    options = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "head_dim": 8,
    }
    config_class = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
        "gemma": transformers.GemmaConfig,
    }[family]
    return config_class(**common, **{**options, **overrides})


def make_tiny_decoder(
    path: str | os.PathLike,
    family: str = "llama",
    *,
    seed: int = 0,
    pad: bool = False,
    vocab_size: Optional[int] = None,
    gpt2_specials: bool = False,
) -> str:
    """Save a random ``family`` sequence classifier and its tokenizer to ``path``; no padding
    token in either unless ``pad`` (as many decoder checkpoints ship). ``vocab_size``: the
    tokenizer's and the embedding table's entries (default 300; 100_000 for an LLM-sized
    vocabulary, see the module docstring). ``gpt2_specials``: see :func:`bpe_tokenizer`."""
    import torch
    from transformers import AutoModelForSequenceClassification

    sizes = {"vocab_size": vocab_size} if vocab_size else {}
    tokenizer = bpe_tokenizer(**sizes, pad=pad, gpt2_specials=gpt2_specials)
    config = decoder_config(family, len(tokenizer), pad_token_id=tokenizer.pad_token_id if pad else None)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    path = os.fspath(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_causal_lm(
    path: str | os.PathLike,
    family: str = "llama",
    *,
    seed: int = 0,
    layers: int = 2,
    width: int = 32,
    vocab_size: int | None = None,
    chat_template: str | None = None,
) -> str:
    """Save a random ``family`` causal language model (an LM head, no classifier) and its BPE
    tokenizer to ``path``, for prompted teachers: ``layers`` x ``width`` (attention heads 8 wide),
    ``vocab_size`` rows of embeddings and of the LM head (at least the tokenizer's 300; the rows
    beyond it are never read, but cost what a large vocabulary costs), and the tokenizer's
    ``chat_template`` if given."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = bpe_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    heads = max(width // 8, 1)
    sizes = (
        {"n_embd": width, "n_layer": layers, "n_head": heads, "n_positions": 512}
        if family == "gpt2"
        else {
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(heads // 2, 1),
            "head_dim": width // heads,
            "max_position_embeddings": 512,
        }
    )
    config = decoder_config(family, max(vocab_size or 0, len(tokenizer)), **sizes)
    config.architectures = None  # from_config names the causal LM when it is saved
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    path = os.fspath(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_t5_config(path: str | os.PathLike) -> str:
    """Save a tiny T5's config and tokenizer to ``path``, no weights: an encoder-decoder, which
    kdplug takes neither as a classifier nor prompted, and must refuse before any weights load."""
    import transformers

    tokenizer = bpe_tokenizer(pad=True)
    config = transformers.T5Config(
        vocab_size=len(tokenizer), d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, num_labels=2,
        pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    path = os.fspath(path)
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

"""Decoder-only Hugging Face models (Llama, Qwen2, Mistral, Gemma, GPT-2...) as teachers: their
layer extractor, and the padding token many of their checkpoints lack.

An encoder's first position ([CLS]) has seen the whole sentence; a causal model's first position
has seen only the first token, so reading it there gives the same vector for every sentence that
starts alike. A decoder's ``*ForSequenceClassification`` reads its last real token instead, and so
does this extractor, at exactly the position the classifier reads.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from kdplug.errors import UsageError
from kdplug.types import LayerSpec, TokenSpec


def is_decoder_only(config: Any) -> bool:
    """Whether ``config`` is a causal language model's with no masked-LM form (Llama, GPT-2...; not
    BERT or RoBERTa, which transformers can also run causally) and no encoder-decoder."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    return (
        not getattr(config, "is_encoder_decoder", False)
        and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def last_real_token(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: Optional[int]) -> torch.Tensor:
    """Each row's position that a decoder's sequence classifier pools: the rightmost token that is
    not padding (so left and right padding alike), as transformers computes it from the padding
    token's id; from the attention mask where the model has no padding token."""
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    real = (input_ids != pad_token_id) if pad_token_id is not None else attention_mask.bool()
    return (positions * real.to(positions.dtype)).argmax(-1)


class HFDecoderExtractor:
    """The last-real-token state of every hidden state of a decoder-only Hugging Face model (layer 0:
    the embedding output, 1..L the blocks), read where its sequence classifier reads."""

    #: reads each example's last real token: needs the batch's input ids and attention mask
    reads_inputs = True

    def supports(self, model: nn.Module) -> bool:
        from transformers import PreTrainedModel

        config = getattr(model, "config", None)
        return isinstance(model, PreTrainedModel) and is_decoder_only(config) and hasattr(config, "hidden_size")

    def layer_specs(self, model: nn.Module) -> list[LayerSpec]:
        width, layers = model.config.hidden_size, model.config.num_hidden_layers
        return [LayerSpec(0, width, "embedding")] + [LayerSpec(i, width, "transformer") for i in range(1, layers + 1)]

    def __call__(self, model: nn.Module, outputs: Any, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        hidden_states = getattr(outputs, "hidden_states", None)
        if hidden_states is None:
            raise UsageError(
                f"the {type(model).__name__} returned no hidden_states: set "
                f"model.config.output_hidden_states = True (kdplug's factories do)"
            )
        pad = model.config.get_text_config().pad_token_id
        rows = torch.arange(inputs["input_ids"].shape[0], device=hidden_states[0].device)
        last = last_real_token(inputs["input_ids"], inputs["attention_mask"], pad).to(rows.device)
        return [state[rows, last] for state in hidden_states]  # (batch, seq, width) -> (batch, width)

    def token_spec(self, model: nn.Module) -> Optional[TokenSpec]:
        return None  # the token-level methods' signals are an encoder's (bidirectional attention)


def give_padding_token(model: nn.Module, tokenizer: Any) -> Optional[str]:
    """Give a decoder checkpoint without a padding token the one transformers' recipes give it, its
    end-of-sequence token, in the tokenizer and the model's config (its classifier pools by it);
    the token given, or None where it had one. A checkpoint with neither is refused."""
    config = model.config.get_text_config()
    if tokenizer.pad_token is not None:
        if config.pad_token_id is None:
            config.pad_token_id = tokenizer.pad_token_id
        return None
    if tokenizer.eos_token is None:
        raise UsageError(
            f"the {type(model).__name__} checkpoint's tokenizer has neither a padding nor an "
            f"end-of-sequence token, so its examples cannot be batched; add a pad_token to its tokenizer"
        )
    tokenizer.pad_token = tokenizer.eos_token
    config.pad_token_id = tokenizer.pad_token_id
    return tokenizer.eos_token

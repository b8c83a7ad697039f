"""Per-token signals of a Hugging Face encoder: every hidden state, and each block's queries, keys
and values, for the token-level methods (TinyBERT, MiniLMv2).

Q, K and V are read by forward hooks on each block's query, key and value projections, the
Linear layers every attention implementation (eager, SDPA, flash) calls before it splits heads,
so the values are the ones the model computed, with their gradient, and no attention matrix is
materialised unless a method asks for one (:meth:`kdplug.types.TokenSignals.attention_scores`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch
from torch import nn

from kdplug.errors import UsageError
from kdplug.types import TokenSignals, TokenSpec

#: the names of a block's query, key and value projections in the encoders transformers ships:
#: BERT, RoBERTa, ELECTRA, MiniLM (query/key/value); DistilBERT (q_lin/...); others (q_proj/...)
PROJECTION_NAMES = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"), ("q_proj", "k_proj", "v_proj"))


def projections(model: nn.Module) -> Optional[list[tuple[nn.Module, nn.Module, nn.Module]]]:
    """Each block's (query, key, value) Linear modules in order, or None when the model's blocks do
    not name them as any of :data:`PROJECTION_NAMES` (or count differently from its config)."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for names in PROJECTION_NAMES:
        found = [
            tuple(getattr(module, name) for name in names)
            for module in model.modules()
            if all(isinstance(getattr(module, name, None), nn.Linear) for name in names)
        ]
        if found and len(found) == layers:
            return found
    return None


def token_spec(model: nn.Module) -> Optional[TokenSpec]:
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    if heads is None or projections(model) is None:
        return None
    return TokenSpec(layers=config.num_hidden_layers, width=config.hidden_size, heads=heads)


@contextlib.contextmanager
def _captured(modules: list[nn.Module]) -> Iterator[list[torch.Tensor]]:
    outputs: list[torch.Tensor] = [None] * len(modules)  # type: ignore[list-item]
    handles = []
    for i, module in enumerate(modules):

        def keep(_module: nn.Module, _inputs: Any, output: torch.Tensor, i: int = i) -> None:
            outputs[i] = output

        handles.append(module.register_forward_hook(keep))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def forward_with_tokens(model: nn.Module, forward: Callable[[], Any], mask: torch.Tensor) -> tuple[Any, TokenSignals]:
    """Run ``forward()`` (``model``'s forward on one batch) and return its outputs with the model's
    :class:`~kdplug.types.TokenSignals` for that batch."""
    spec, blocks = token_spec(model), projections(model)
    if spec is None or blocks is None:
        raise UsageError(
            f"{type(model).__name__} has no per-token signals kdplug can read (blocks with query/key/value "
            f"projections and num_attention_heads in the config); token-level methods need a BERT-like encoder"
        )
    with _captured([linear for block in blocks for linear in block]) as captured:
        outputs = forward()
    hidden = getattr(outputs, "hidden_states", None)
    if hidden is None:
        raise UsageError(
            f"the {type(model).__name__} returned no hidden_states: set model.config.output_hidden_states = True "
            f"(kdplug's factories do)"
        )
    return outputs, TokenSignals(
        mask=mask.bool(),
        hidden=list(hidden),
        queries=captured[0::3],
        keys=captured[1::3],
        values=captured[2::3],
        heads=spec.heads,
    )

"""A prompted teacher with verbalizers of several tokens reads each prompt once: the labels' further
tokens are scored from the prompts' key/value cache. Its scores and states equal those of the pass it
replaced, every prompt run again once per label with the label's head appended."""

from __future__ import annotations

import pytest
import torch

from kdplug.testing.decoders import make_tiny_causal_lm
from kdplug_models.prompted import PromptedLM

#: three labels of 1, 2 and 3 tokens
VERBALIZERS = [[17], [40, 41], [60, 61, 62]]
PAD = 2


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_causal_lm(tmp_path_factory.mktemp(request.param) / "lm", request.param)
    lm = AutoModelForCausalLM.from_pretrained(path).eval()
    return PromptedLM(lm, VERBALIZERS, PAD).eval()


def prompts_batch(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    lengths = [5, 12, 9, 3]
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(width - length, width) if side == "left" else slice(0, length)
        ids[row, span] = torch.randint(5, 250, (length,), generator=generator)
        mask[row, span] = 1
    return ids, mask


def repeated_prompts(model: PromptedLM, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """The scoring this replaced: each prompt followed by each label's head, in one batch, right-aligned."""
    lengths = model.verbalizer_lengths.tolist()
    labels, longest = len(lengths), max(lengths)
    prompts = [row[mask.bool()] for row, mask in zip(input_ids, attention_mask)]
    heads = [model.verbalizer_ids[j, : lengths[j] - 1] for j in range(labels)]
    ids, mask = model._left_padded([torch.cat([prompt, heads[j]]) for prompt in prompts for j in range(labels)])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    outputs = model.lm(
        input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True, use_cache=False
    )
    log_probs = outputs.logits[:, -longest:].float().log_softmax(-1)
    pairs = [
        (j, longest - lengths[j] + t, int(model.verbalizer_ids[j, t])) for j in range(labels) for t in range(lengths[j])
    ]
    label, kept, token = (torch.tensor(column) for column in zip(*pairs))
    per_token = log_probs.view(len(prompts), labels, longest, -1)[:, label, kept, token]
    scores = torch.zeros(len(prompts), labels).index_add_(1, label, per_token)
    rows = torch.arange(len(prompts)) * labels
    last = ids.shape[1] - lengths[0]
    return scores, tuple(state[rows, last].unsqueeze(1) for state in outputs.hidden_states)


@pytest.mark.parametrize("side", ["left", "right"])
def test_scores_from_the_prompts_cache_equal_the_prompts_run_once_per_label(model, side):
    ids, mask = prompts_batch(side)
    calls = []
    hook = model.lm.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        with torch.no_grad():
            scores, hidden = model.label_log_probs(ids, mask)
    finally:
        hook.remove()
    # the prompts once (4 rows of the longest prompt), then the 3 labels' heads of at most 2 tokens
    assert calls == [torch.Size([4, 12]), torch.Size([12, 2])]
    with torch.no_grad():
        expected_scores, expected_hidden = repeated_prompts(model, ids, mask)
    torch.testing.assert_close(scores, expected_scores, rtol=0, atol=1e-5)
    assert len(hidden) == len(expected_hidden) == 3
    for state, expected in zip(hidden, expected_hidden):
        assert state.shape == expected.shape == (4, 1, 32)
        torch.testing.assert_close(state, expected, rtol=0, atol=1e-5)

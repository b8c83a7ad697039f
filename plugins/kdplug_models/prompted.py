"""A causal language model as a teacher through a prompt and a verbalizer, never fine-tuned.

The model reads each example in its prompt (:mod:`.prompting`'s encoder, which the engine runs
for the teacher only) and scores every label by the log-probability of its verbalizer's tokens
after the prompt, teacher-forced and summed. Those scores, renormalised over the labels, are the
teacher's logits (the KD target; its prediction is their argmax), optionally calibrated as Zhao et
al. (2021) do; its layer vectors are the hidden states at the prompt's last token, the position
that predicts the label's first token, so every hidden-space method reads a vector that has seen
the whole prompt.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Sequence
from typing import Annotated, Any, Optional

import torch
from torch import nn

from kdplug.api import Range
from kdplug.errors import UsageError
from kdplug.types import LayerSpec, ModelShape, Task, Teacher, TokenSpec

from .decoders import give_padding_token, is_decoder_only
from .hf_loading import bound_options, checkpoint_shape, load_pretrained
from .placement import (
    PLACEMENT_OPTIONS,
    DeviceMapOption,
    MaxMemoryOption,
    Placement,
    PlacementOptions,
    load_placed,
    placement_options,
    plan_placement,
)
from .prompting import PromptEncoder, PromptSpec, draw_shots, prompt_spec, uses_chat_template

log = logging.getLogger(__name__)


class PromptedLM(nn.Module):
    """A causal LM whose forward, on prompts (``input_ids``, left or right padded), returns the
    labels' verbalizer log-probabilities renormalised over the labels (calibrated where it is) as
    ``logits`` ``(batch, labels)`` and, as
    ``hidden_states``, each layer's state at the prompt's last token ``(batch, 1, width)``.

    The verbalizers' token ids and the calibration are buffers, so the teacher's fingerprint (and
    with it the cache key) changes with them.
    """

    def __init__(self, lm: nn.Module, verbalizer_ids: Sequence[Sequence[int]], pad_token_id: Optional[int]) -> None:
        super().__init__()
        self.lm = lm
        lengths = [len(ids) for ids in verbalizer_ids]
        table = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for row, ids in enumerate(verbalizer_ids):
            table[row, : len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        self.register_buffer("verbalizer_ids", table)  # (labels, longest verbalizer), 0 past each one's end
        self.register_buffer("verbalizer_lengths", torch.tensor(lengths, dtype=torch.long))
        #: p_cf, the normalised label probabilities on content-free inputs (empty: not calibrated)
        self.register_buffer("calibration", torch.zeros(0))  # float32: a device without float64 (MPS) takes it
        self.pad_token_id = 0 if pad_token_id is None else pad_token_id
        parameters = inspect.signature(lm.forward).parameters
        self._keeps_logits = "logits_to_keep" in parameters
        #: what the model calls its key/value cache: ``cache`` from transformers 5.24, ``past_key_values`` before
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        scores, hidden_states = self.label_log_probs(input_ids, attention_mask)
        return SequenceClassifierOutput(logits=self.calibrated(scores), hidden_states=hidden_states)

    def get_input_embeddings(self) -> nn.Module:
        """The language model's token embeddings: a student reading the plain text with the same
        tokenizer may start from them (``init_embeddings_from_teacher``), as under any teacher."""
        return self.lm.get_input_embeddings()

    def calibrated(self, scores: torch.Tensor) -> torch.Tensor:
        """The logits: the label log-probabilities renormalised over the labels, ``log p`` (so the KD
        target and an MSE on logits read a distribution, not scores offset by the probability the
        model puts outside the labels). Calibrated, contextual calibration (Zhao et al. 2021, their
        code's ``diagonal_W``, b = 0): ``q = W p`` with ``W = diag(p_cf)^-1``, renormalised, so the
        logits are ``log_softmax(log p - log p_cf)``; an unbiased model (p_cf uniform) keeps ``p``."""
        return calibrated(scores, self.calibration)

    def label_log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Each label's summed token log-probability after each prompt ``(batch, labels)``, and the
        states at each prompt's last token. One pass over the prompts, whose last position scores
        every label's first token; where a verbalizer has more tokens, the rest are scored by one
        more pass over the labels' heads alone, reading the prompts' keys and values from that
        first pass (:meth:`_continuations`) instead of running each prompt again once per label."""
        lengths = self.verbalizer_lengths.tolist()
        prompts = [row[mask.bool()] for row, mask in zip(input_ids, attention_mask)]  # either padding side
        ids, mask = self._left_padded(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each sequence's own positions from 0, padding aside
        several = max(lengths) > 1
        outputs = self.lm(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            output_hidden_states=True,
            use_cache=several,
            **({"logits_to_keep": 1} if self._keeps_logits else {}),
        )
        first = outputs.logits[:, -1].float().log_softmax(-1)  # (batch, vocab): what follows each prompt
        scores = first[:, self.verbalizer_ids[:, 0]]  # (batch, labels): each label's first token
        if several:
            cache = outputs["cache"] if "cache" in outputs else outputs["past_key_values"]
            scores = scores + self._continuations(cache, mask, lengths)
        hidden = tuple(state[:, -1:] for state in outputs.hidden_states)  # (batch, 1, width): the prompt's last
        return scores, hidden

    def _continuations(self, cache: Any, prompt_mask: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Each label's tokens after its first, summed ``(batch, labels)``: the labels' heads (all
        but their last token), right-padded, after each prompt's keys and values (``cache``, repeated
        once per label in place), where a head's position t predicts its label's token t + 1."""
        batch, labels, width = prompt_mask.shape[0], len(lengths), max(lengths) - 1
        device = prompt_mask.device
        heads = self.verbalizer_ids[:, :width]  # (labels, width); 0 past each head's end, masked
        head_lengths = self.verbalizer_lengths.to(device) - 1
        head_mask = (torch.arange(width, device=device) < head_lengths[:, None]).long()
        cache = _repeated(cache, labels)  # row b * labels + j: prompt b before label j's head
        start = prompt_mask.sum(-1).repeat_interleave(labels)[:, None]  # each prompt's length
        outputs = self.lm(
            input_ids=heads.repeat(batch, 1),
            attention_mask=torch.cat([prompt_mask.repeat_interleave(labels, 0), head_mask.repeat(batch, 1)], 1),
            position_ids=start + torch.arange(width, device=device),
            use_cache=True,
            **{self._cache_name: cache},
        )
        log_probs = outputs.logits.float().log_softmax(-1).view(batch, labels, width, -1)
        pairs = [(j, t - 1, int(self.verbalizer_ids[j, t])) for j in range(labels) for t in range(1, lengths[j])]
        label, position, token = (torch.tensor(column, device=device) for column in zip(*pairs))
        per_token = log_probs[:, label, position, token]  # (batch, pairs)
        return torch.zeros(batch, labels, device=device).index_add_(1, label, per_token)

    def _left_padded(self, sequences: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequences right-aligned in one batch: every label is predicted at the same positions."""
        width = max(len(sequence) for sequence in sequences)
        device = sequences[0].device
        ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
        for row, sequence in enumerate(sequences):
            ids[row, width - len(sequence) :] = sequence
            mask[row, width - len(sequence) :] = 1
        return ids, mask

    @torch.no_grad()
    def calibrate(self, encoder: PromptEncoder, content_free: Sequence[str], pair: bool) -> torch.Tensor:
        """Set ``p_cf``: the labels' probabilities on each content-free input (in the prompt with
        its few-shot examples, in both texts of a pair), averaged over the inputs, then normalised
        to sum to one (as Zhao et al.'s ``get_p_content_free``)."""
        prompts = [torch.tensor(encoder.prompt_ids(text, text if pair else None)) for text in content_free]
        device = self.verbalizer_ids.device  # where the model's inputs go (a sharded model's hooks move them on)
        ids, mask = self._left_padded([prompt.to(device) for prompt in prompts])
        scores, _ = self.label_log_probs(ids, mask)
        self.calibration = content_free_probabilities(scores)
        return self.calibration


def calibrated(scores: torch.Tensor, calibration: torch.Tensor) -> torch.Tensor:
    """``scores`` (label log-probabilities) as logits: renormalised over the labels and, where
    ``calibration`` (``p_cf``) is not empty, divided by it (see :meth:`PromptedLM.calibrated`)."""
    log_p = scores.float().log_softmax(-1)
    if calibration.numel() == 0:
        return log_p
    return (log_p - calibration.to(log_p.device).log()).log_softmax(-1)


def content_free_probabilities(scores: torch.Tensor) -> torch.Tensor:
    """``p_cf`` from the label log-probabilities on the content-free inputs ``(inputs, labels)``: each
    input's probabilities averaged, normalised to sum to one (Zhao et al.'s ``get_p_content_free``)."""
    scores = scores.double()
    probabilities = (scores - scores.max()).exp().mean(0)  # a common factor, gone when normalised
    return (probabilities / probabilities.sum()).float()


def _repeated(cache: Any, times: int) -> Any:
    """Each row of a key/value cache ``times`` times in a row: a ``Cache`` in place, a legacy tuple copied."""
    if hasattr(cache, "batch_repeat_interleave"):
        cache.batch_repeat_interleave(times)
        return cache
    return tuple(tuple(tensor.repeat_interleave(times, 0) for tensor in layer) for layer in cache)


class PromptedLMExtractor:
    """The states a :class:`PromptedLM` returns, at its prompts' last token: layer 0 the embedding
    output, 1..L the blocks."""

    def supports(self, model: nn.Module) -> bool:
        return isinstance(model, PromptedLM)

    def layer_specs(self, model: nn.Module) -> list[LayerSpec]:
        config = model.lm.config.get_text_config()
        width, layers = config.hidden_size, config.num_hidden_layers
        return [LayerSpec(0, width, "embedding")] + [LayerSpec(i, width, "transformer") for i in range(1, layers + 1)]

    def __call__(self, model: nn.Module, outputs: Any) -> list[torch.Tensor]:
        return [state[:, -1] for state in outputs.hidden_states]  # (batch, 1, width) -> (batch, width)

    def token_spec(self, model: nn.Module) -> Optional[TokenSpec]:
        return None  # one position per example: the token-level methods have nothing to match


def prompted_teacher(
    task: Task,
    source: str,
    *,
    prompt: Any,
    verbalizer: Any = None,
    shots: Any = 0,
    chat_template: Any = "auto",
    calibrate: Any = False,
    shots_seed: Optional[Annotated[int, Range(0)]] = None,
    trust_remote_code: bool = False,
    revision: Optional[str] = None,
    device_map: DeviceMapOption = None,
    max_memory: MaxMemoryOption = None,
    offload_folder: Optional[str] = None,
) -> Teacher:
    """The ``prompted-lm`` teacher: ``source`` (a hub id or a directory), a causal language model,
    labelling ``task`` through ``prompt`` and ``verbalizer`` (see docs/llm-teachers.md). ``shots``
    training examples, drawn by ``shots_seed`` (None: the run's teacher seed, which kdplug sets
    before it builds the teacher), are put before each prompt. The prompt's options are ``Any``:
    :func:`.prompting.prompt_spec` checks them against the task, with messages that say how to
    write each (YAML's quoting of a prompt, a verbalizer's labels), before any weights load.
    ``device_map``, ``max_memory``, ``offload_folder``: the model sharded over this machine's devices
    with CPU or disk offload (:mod:`.placement`)."""
    source = os.path.expanduser(str(source))
    spec = prompt_spec(task, prompt, verbalizer, shots, chat_template, calibrate)  # before any weights load
    placement = placement_options(device_map, max_memory, offload_folder)
    load_options = {"trust_remote_code": trust_remote_code, **({"revision": revision} if revision else {})}
    lm, tokenizer, placed = _load_language_model(source, placement, **load_options)
    chat = uses_chat_template(tokenizer, spec.chat_template, source)
    train = task.load_split("train") if spec.shots else []
    chosen = draw_shots(train, spec.shots, torch.initial_seed() if shots_seed is None else shots_seed)
    encoder = PromptEncoder(tokenizer, spec, [train[i] for i in chosen], chat=chat)
    model = PromptedLM(lm, _verbalizer_ids(encoder, spec, task.is_pair), tokenizer.pad_token_id).eval()
    if placed is not None:  # the engine never moves a sharded teacher: its own buffers go where its inputs do
        for name, buffer in model.named_buffers(recurse=False):
            setattr(model, name, buffer.to(placed.first_device))
    encoder.positions = getattr(lm.config, "max_position_embeddings", None) or getattr(lm.config, "n_positions", None)
    encoder.longest_label = int(model.verbalizer_lengths.max())
    encoder.check_fits(len(encoder.prompt_ids("", "" if task.is_pair else None)))  # the template and shots alone
    if spec.content_free:
        model.calibrate(encoder, spec.content_free, task.is_pair)
    record = {
        **spec.as_dict(),
        "chat_template": chat,
        "shot_examples": chosen,
        "verbalizer_tokens": {label: int(n) for label, n in zip(spec.labels, model.verbalizer_lengths.tolist())},
    }
    if spec.content_free:
        record["calibrate"] = {"content_free": list(spec.content_free), "p_cf": model.calibration.tolist()}
    teacher = Teacher(
        model=model,
        tokenizer=tokenizer,
        source=source,
        finetuned=True,  # a prompted model is used as it is
        extra={"prompted": record, "kind": f"a prompted causal LM ({type(lm).__name__}), not fine-tuned"},
        notes=[describe(spec, chat, model)],
        encoder=encoder,
    )
    if placed is not None:  # sharded: the engine never moves it, and its inputs go to its first layer's device
        teacher.placed_on = placed.first_device
        teacher.notes.append(placed.line)
        teacher.extra["device_map"] = {name: str(device) for name, device in placed.device_map.items()}
    return teacher


def prompted_teacher_shape(task: Task, **options: Any) -> Optional[ModelShape]:
    """The language model's layers, from its config alone (no weights); ``options`` read as the factory binds them."""
    given = bound_options(prompted_teacher, task, **options)
    if not given.get("source"):
        return None
    return checkpoint_shape(
        given["source"], "teacher", {}, trust_remote_code=given["trust_remote_code"], revision=given["revision"]
    )


prompted_teacher.shape = prompted_teacher_shape

#: the options only a prompted teacher takes (the ``hf`` teacher, given one, says to name ``prompted-lm``)
PROMPT_OPTIONS = tuple(
    name
    for name, parameter in inspect.signature(prompted_teacher).parameters.items()
    if parameter.kind is parameter.KEYWORD_ONLY and name not in ("trust_remote_code", "revision", *PLACEMENT_OPTIONS)
)


def describe(spec: PromptSpec, chat: bool, model: PromptedLM) -> str:
    """What the dry run and the run say of a prompted teacher."""
    verbalizer = ", ".join(f"{label} -> {text!r}" for label, text in zip(spec.labels, spec.verbalizer))
    how = [f"{spec.shots} shot{'s' * (spec.shots != 1)}", "in its chat template" if chat else "as plain text"]
    if spec.content_free:
        p_cf = ", ".join(f"{p:.3g}" for p in model.calibration.tolist())
        how.append(f"calibrated on content-free inputs {list(spec.content_free)} (p_cf {p_cf})")
    return (
        f"teacher: a prompted causal LM: prompt {spec.template!r}, verbalizer {verbalizer}, {', '.join(how)}; "
        f"not fine-tuned; its logits are the verbalizers' log-probabilities and its layer vectors the states "
        f"at the prompt's last token; students read the plain text"
    )


def _load_language_model(
    source: str, placement: Optional[PlacementOptions], **load_options: Any
) -> tuple[nn.Module, Any, Optional[Placement]]:
    """``source`` as a causal LM with its tokenizer, and where its modules went when ``placement``
    shards it; anything else is refused with the reason."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = load_pretrained(AutoConfig, source, "teacher", **load_options)
    if not is_decoder_only(config):
        kind = getattr(config, "model_type", "?")
        if getattr(config, "is_encoder_decoder", False):
            instead = (
                f"{source} is a {kind} model, an encoder-decoder, which kdplug takes neither prompted nor as a "
                f"classifier; point teacher_options.source at a causal language model to prompt it, or name an "
                f"encoder (BERT, RoBERTa) or a decoder-only classifier as --teacher DIR_OR_HUB_ID (the hf teacher)"
            )
        else:
            instead = (
                f"{source} is a {kind} model; to fine-tune it as a classifier, name it as --teacher {source} (the hf "
                f"teacher), without the prompt options"
            )
        raise UsageError(
            f"teacher_options.prompt needs a causal (decoder-only) language model, such as a Llama, Qwen, Mistral, "
            f"Gemma or GPT-2 checkpoint; {instead}"
        )
    classifiers = [name for name in config.architectures or () if name.endswith("ForSequenceClassification")]
    if classifiers:
        raise UsageError(
            f"teacher_options.prompt reads a language model's next-token probabilities, but {source} is a "
            f"{classifiers[0]} (its language-model head is gone); to use its classifier as the teacher, name it as "
            f"--teacher {source} (the hf teacher) without the prompt options, or point teacher_options.source at the "
            f"language model it was trained from"
        )
    placed = None
    if placement is not None:
        build = functools.partial(
            AutoModelForCausalLM.from_config, trust_remote_code=load_options.get("trust_remote_code", False)
        )
        placed = plan_placement(placement, build, config, None)
    lm = load_placed(
        placed, lambda **placing: load_pretrained(AutoModelForCausalLM, source, "teacher", **placing, **load_options)
    )
    tokenizer = load_pretrained(AutoTokenizer, source, "teacher", **load_options)
    given = give_padding_token(lm, tokenizer)  # the students read the plain text in padded batches
    if given is not None:
        log.info("teacher %s has no padding token: using its end-of-sequence token %r", source, given)
    return lm, tokenizer, placed


#: the text standing for an example's where the verbalizers are tokenised after a prompt
PLACEHOLDER = "text"


def _verbalizer_ids(encoder: PromptEncoder, spec: PromptSpec, pair: bool) -> list[list[int]]:
    """Each label's verbalizer as the tokenizer writes it after the prompt: the ids of a prompt
    followed by the verbalizer, past the prompt's own ids. Tokenised alone, a verbalizer would
    start a text, where SentencePiece (and a byte-level BPE that adds a prefix space) writes a word
    start: ``positive`` would be scored as `` positive``. Refused: a verbalizer whose first token
    merges with the prompt's last, and one whose tokens begin with another label's (see
    :func:`_refuse_prefixes`)."""
    tokenizer = encoder.tokenizer
    prompt = encoder.render(PLACEHOLDER, PLACEHOLDER if pair else None)

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    head, verbalizer_ids = ids(prompt), []
    for label, text in zip(spec.labels, spec.verbalizer):
        whole = ids(prompt + text)
        if whole[: len(head)] != head:
            raise UsageError(
                f"teacher_options.verbalizer: the text of {label!r} ({text!r}) joins the prompt's last token "
                f"({tokenizer.decode(head[-1:])!r}) into another token, so the prompt the model reads does not end "
                f"where the label begins; end the prompt with a whole word or punctuation and start each verbalizer "
                f"with what separates it (a prompt ending 'Sentiment: ' with 'positive' becomes 'Sentiment:' with "
                f"' positive')"
            )
        verbalizer_ids.append(whole[len(head) :])
    empty = [label for label, tokens in zip(spec.labels, verbalizer_ids) if not tokens]
    if empty:
        raise UsageError(
            f"teacher_options.verbalizer: the text of {', '.join(map(repr, empty))} gives no tokens; give each "
            f"label text the model can write"
        )
    _refuse_prefixes(spec, verbalizer_ids)
    return verbalizer_ids


def _refuse_prefixes(spec: PromptSpec, verbalizer_ids: list[list[int]]) -> None:
    """A label's score is the joint log-probability of its tokens: a label whose tokens begin with
    another's (`` good film`` after `` good``) scores that label's plus the log-probability of the
    rest, never more, so uncalibrated it could never be predicted (calibrated, only by the favour of
    ``p_cf``). Refused."""
    for short, short_ids in zip(spec.labels, verbalizer_ids):
        for long, long_ids in zip(spec.labels, verbalizer_ids):
            if long != short and long_ids[: len(short_ids)] == short_ids:
                texts = dict(zip(spec.labels, spec.verbalizer))
                raise UsageError(
                    f"teacher_options.verbalizer: the tokens of {long!r} ({texts[long]!r}) begin with those of "
                    f"{short!r} ({texts[short]!r}); a label's score is the joint probability of its tokens, so "
                    f"{long!r} scores {short!r}'s times the probability of what follows, never more, and could "
                    f"never be predicted (uncalibrated; calibrated, only by p_cf's favour). Give each label a "
                    f"text whose tokens do not begin with another label's (e.g. ' great' for one of them)"
                )

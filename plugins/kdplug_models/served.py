"""A causal language model served over HTTP (vLLM, SGLang, TGI, llama.cpp's server, a hosted API)
as a prompted teacher: ``--teacher served:MODEL --set teacher_options.base_url=http://host:8000/v1``.

It reads each example in the prompt the in-process ``prompted-lm`` teacher would (the same
:class:`~.prompting.PromptSpec`, shots and text) and scores the labels by asking the server:

- ``echo``: a completions request per (example, label) whose prompt is the prompt followed by the
  label's verbalizer, with ``echo`` and ``logprobs``: the label's joint log-probability is the sum of
  the log-probabilities of the tokens after the prompt, as the in-process teacher computes it;
- ``top-logprobs`` (chat-only servers): one chat request per example, its first generated token's
  ``top_logprobs``: each label's first token's log-probability, a label outside the top k the
  lowest one returned (an upper bound on its own).

The scores are renormalised and calibrated by :func:`.prompted.calibrated`, as in process.

The engine hands a teacher token ids: the served teacher's encoder gives each example's prompt
text as its Unicode code points, so the engine batches and caches them unchanged, and its
forward turns them back into text and asks the server for the whole batch at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import torch
from torch import nn

from kdplug.api import Range
from kdplug.errors import UsageError
from kdplug.storage import cache_root
from kdplug.types import LayerSpec, Task, Teacher, TokenSpec

from .hf_loading import load_pretrained
from .prompted import calibrated, content_free_probabilities
from .prompting import PromptEncoder, PromptSpec, draw_shots, prompt_spec, uses_chat_template
from .served_client import (
    AnswerStore,
    Endpoint,
    Question,
    RateLimit,
    RetryPolicy,
    ServedError,
    api_key,
    ask_all,
    checked_url,
    request_key,
)

#: the folder of the served teachers' answers under kdplug's cache directory
STORE = "served-answers"
#: how many alternatives a chat request asks for (the most the OpenAI API gives)
TOP_K = 20
#: the environment variable the API key is read from unless teacher_options.api_key_env names another
DEFAULT_KEY_VARIABLE = "OPENAI_API_KEY"
#: the longest teacher_options.timeout (seconds, a day): beyond it the socket's deadline overflows
MAX_TIMEOUT = 86400
#: the characters a token is taken to hold where the tokens are estimated, not counted
CHARS_PER_TOKEN = 4


class ServedEncoder(PromptEncoder):
    """The prompt of each example, as text (the same as the in-process teacher renders it, cut to
    ``max_length`` tokens of its own by the local tokenizer), given to the engine as the text's Unicode
    code points: :class:`ServedLM` turns them back into text."""

    def __init__(self, tokenizer: Any, spec: PromptSpec, shots: Sequence[Any] = (), *, chat: bool) -> None:
        super().__init__(tokenizer, spec, shots, chat=chat)
        self.pad_token_id = 0
        self.kdplug_fingerprint = hashlib.sha256(f"served code points {self.kdplug_fingerprint}".encode()).hexdigest()

    def prompt_ids(self, text: str, text_b: Optional[str] = None) -> list[int]:
        return [ord(character) for character in self.render(text, text_b)]


def prompt_text(ids: torch.Tensor, mask: torch.Tensor) -> str:
    return "".join(map(chr, ids[mask.bool()].tolist()))


class ServedLM(nn.Module):
    """The served model as the engine's teacher module: forward on a batch of prompts (code points)
    returns the labels' calibrated log-probabilities as ``logits`` ``(batch, labels)`` and no layers.

    ``identity``, a buffer, is the hash of the served model's id, the scoring and the prompt
    (template, verbalizer, shots, calibration): the teacher's fingerprint, and with it the engine's
    cache key, changes with them and with nothing else (not the server's address, not the key)."""

    #: the dry run does not time it (a timed forward would send requests): its plan counts them instead
    kdplug_remote = True

    def __init__(self, scorer: Scorer, identity: str, content_free: Sequence[str], pair: bool) -> None:
        super().__init__()
        self.scorer = scorer
        self.register_buffer("identity", torch.tensor(list(bytes.fromhex(identity)), dtype=torch.uint8))
        self.content_free, self.pair = tuple(content_free), pair
        self.calibration: Optional[torch.Tensor] = None  # p_cf, asked for on the first batch

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        prompts = [prompt_text(ids.cpu(), mask.cpu()) for ids, mask in zip(input_ids, attention_mask)]
        scores = self.scorer.scores(prompts)
        logits = calibrated(scores, self.calibrate()).to(input_ids.device)
        return SequenceClassifierOutput(logits=logits)

    def calibrate(self) -> torch.Tensor:
        """``p_cf`` (empty: not calibrated), from the content-free inputs' scores, once."""
        if self.calibration is None:
            if not self.content_free:
                self.calibration = torch.zeros(0)
            else:
                render = self.scorer.encoder.render
                prompts = [render(text, text if self.pair else None) for text in self.content_free]
                self.calibration = content_free_probabilities(self.scorer.scores(prompts))
                self.scorer.record["calibrate"] = {
                    "content_free": list(self.content_free),
                    "p_cf": self.calibration.tolist(),
                }
        return self.calibration


class ServedExtractor:
    """A served model has no layers kdplug can read: none (layer methods are refused before it is built)."""

    def supports(self, model: nn.Module) -> bool:
        return isinstance(model, ServedLM)

    def layer_specs(self, model: nn.Module) -> list[LayerSpec]:
        return []

    def __call__(self, model: nn.Module, outputs: Any) -> list[torch.Tensor]:
        return []

    def token_spec(self, model: nn.Module) -> Optional[TokenSpec]:
        return None


class Scorer:
    """The questions a batch of prompts asks the server, answered (from the store, else the server),
    read as label scores ``(prompts, labels)``."""

    def __init__(
        self,
        *,
        model: str,
        endpoint: Endpoint,
        store: AnswerStore,
        encoder: ServedEncoder,
        scoring: str,
        concurrency: int,
        record: dict[str, Any],
        first_tokens: Sequence[str] = (),
        identity: str = "",
    ) -> None:
        self.model, self.endpoint, self.store, self.encoder = model, endpoint, store, encoder
        self.scoring, self.concurrency, self.record = scoring, concurrency, record
        self.first_tokens = tuple(first_tokens)
        self.bar: Any = None
        self.tokens = 0
        self.expected = 0  # the requests the plan counted: the progress bar's total, for its time left
        # what ``auto`` chose when this teacher's outputs were last computed: recorded even when they all
        # come from the cache (no request, so no choice, is made then), and counted on by the dry run
        self.chosen_key = f"auto scoring of {identity}"
        self.chosen = store.get(self.chosen_key) if scoring == "auto" else None
        if self.chosen is not None:
            record.update(scoring=self.chosen, scoring_chosen="auto")

    @property
    def verbalizer(self) -> tuple[str, ...]:
        return self.encoder.spec.verbalizer

    def questions(self, prompts: Sequence[str], scoring: Optional[str] = None) -> list[Question]:
        scoring = scoring or self.scoring
        if scoring == "echo":
            return [echo_question(self.model, prompt, text) for prompt in prompts for text in self.verbalizer]
        return [chat_question(self.model, prompt) for prompt in prompts]

    def scores(self, prompts: Sequence[str]) -> torch.Tensor:
        if self.scoring == "auto":
            self._choose_scoring(prompts[0])
        answers = ask_all(
            self.endpoint, self.store, self.questions(prompts), concurrency=self.concurrency, progress=self._advance
        )
        if self.scoring == "echo":
            return torch.tensor(answers, dtype=torch.float64).view(len(prompts), len(self.verbalizer))
        return torch.tensor([self._label_scores(top) for top in answers], dtype=torch.float64)

    def _choose_scoring(self, prompt: str) -> None:
        """``auto``: echo where the server scores given text (its first answer says), else top-logprobs."""
        try:
            ask_all(self.endpoint, self.store, self.questions([prompt], "echo")[:1], concurrency=1)
            self.scoring = "echo"
        except ServedError as error:
            if getattr(error, "status", None) not in (400, 404, 405, 422, 501):
                raise
            if self.encoder.chat:
                raise UsageError(
                    f"{self.endpoint.url('completions')} does not score given text ({error}), and the prompts were "
                    f"written in the chat template for echo scoring; set teacher_options.scoring=top-logprobs (the "
                    f"server then applies its own chat template)"
                ) from None
            self.scoring = "top-logprobs"
            self.first_tokens = self.first_tokens or tuple(self.verbalizer)
        self.record["scoring"] = self.scoring
        self.record["scoring_chosen"] = "auto"
        if self.chosen != self.scoring:
            self.store.put(self.chosen_key, self.scoring)
            self.chosen = self.scoring

    def _label_scores(self, top: list[list[Any]]) -> list[float]:
        """Each label's first token's log-probability among the ``top`` alternatives (with or without
        a leading space); a label outside them gets the lowest one returned, its upper bound."""
        floor = min(logprob for _, logprob in top)
        scores = []
        for first in self.first_tokens:
            found = [logprob for token, logprob in top if token.strip() == first.strip()]
            scores.append(math.log(sum(math.exp(p) for p in found)) if found else floor)
        return scores

    def _advance(self, requests: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is None:
            from kdplug.api import progress

            self.bar = progress(total=self.expected or None, desc="served teacher", unit="req")
        if self.bar.total is not None and self.bar.n + requests > self.bar.total:  # a transfer set's, beyond the plan
            self.bar.total = self.bar.n + requests
        self.bar.update(requests)
        self.bar.set_postfix_str(f"{self.tokens} tokens", refresh=False)


def echo_question(model: str, prompt: str, label: str) -> Question:
    """A completions request that scores ``prompt + label`` and reads the label's joint log-probability."""
    # max_tokens 1, not 0: vLLM refuses 0 (vllm-project/vllm#9336); the one token it generates is not read
    body = {"model": model, "prompt": prompt + label, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    start, end = len(prompt), len(prompt + label)

    def read(response: dict[str, Any]) -> float:
        scored = response["choices"][0]["logprobs"]
        tokens, logprobs, offsets = scored["tokens"], scored["token_logprobs"], scored["text_offset"]
        for token, offset in zip(tokens, offsets):
            if offset < start < offset + len(token):
                raise UsageError(
                    f"teacher_options.verbalizer: the server's tokenizer joins the prompt's last characters and "
                    f"the label {label!r} into one token ({token!r}), so the prompt does not end where the label "
                    f"begins; end the prompt with a whole word or punctuation and start each verbalizer with what "
                    f"separates it (' positive' after 'Sentiment:')"
                )
        after = [logprob for offset, logprob in zip(offsets, logprobs) if start <= offset < end]
        if not after or any(logprob is None for logprob in after):
            raise ValueError(f"no scored tokens after the prompt (text_offset {offsets[-3:]})")
        return float(sum(after))

    return Question("completions", body, read, tokens=len(prompt + label) // CHARS_PER_TOKEN + 1, split=start)


def chat_question(model: str, prompt: str) -> Question:
    """A chat request whose first generated token's ``top_logprobs`` are read."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": TOP_K,
        "temperature": 0,
    }

    def read(response: dict[str, Any]) -> list[list[Any]]:
        first = response["choices"][0]["logprobs"]["content"][0]
        top = [[entry["token"], float(entry["logprob"])] for entry in first["top_logprobs"]]
        if not top or not all(isinstance(token, str) and not math.isnan(logprob) for token, logprob in top):
            raise ValueError(f"top_logprobs {str(first['top_logprobs'])[:80]} holds no token and log-probability")
        return top

    return Question("chat/completions", body, read, tokens=len(prompt) // CHARS_PER_TOKEN + 1)


def served_teacher(
    task: Task,
    model: str,
    *,
    prompt: Any,
    verbalizer: Any = None,
    base_url: Optional[str] = None,
    shots: Any = 0,
    chat_template: Any = "auto",
    calibrate: Any = False,
    shots_seed: Optional[Annotated[int, Range(0)]] = None,
    scoring: Literal["auto", "echo", "top-logprobs"] = "auto",
    tokenizer: Optional[str] = None,
    api_key_env: str = DEFAULT_KEY_VARIABLE,
    concurrency: Annotated[int, Range(1)] = 8,
    timeout: Annotated[float, Range(0, MAX_TIMEOUT, low_open=True)] = 60.0,
    max_retries: Annotated[int, Range(0)] = 5,
    backoff: Annotated[float, Range(0)] = 0.5,
    requests_per_minute: Optional[Annotated[int, Range(1)]] = None,
    tokens_per_minute: Optional[Annotated[int, Range(1)]] = None,
    price_per_million_tokens: Optional[Annotated[float, Range(0)]] = None,
) -> Teacher:
    """The ``served:MODEL`` teacher: ``model`` as the server at ``base_url`` names it, labelling
    ``task`` through ``prompt`` and ``verbalizer`` as ``prompted-lm`` does (see docs/llm-teachers.md,
    "A served teacher"). ``tokenizer`` (default: ``model``, where that is a hub id or a directory) is
    what the students read the plain text with and what cuts the texts to ``max_length``. Nothing is
    sent to the server here: the first batch of the teacher pass sends the first request."""
    if not base_url:
        raise UsageError(
            f"teacher served:{model} needs the server's address: --set teacher_options.base_url=http://HOST:PORT/v1 "
            f"(the OpenAI-compatible base URL of vLLM, SGLang, TGI, llama.cpp's server or a hosted API)"
        )
    spec = prompt_spec(task, prompt, verbalizer, shots, chat_template, calibrate)
    check_served_options(task, base_url=base_url, api_key_env=api_key_env)
    retry, limit = RetryPolicy(max_retries, backoff, timeout), RateLimit(requests_per_minute, tokens_per_minute)
    endpoint = Endpoint(base_url, api_key(api_key_env), retry, limit, key_variable=api_key_env)
    local = _local_tokenizer(tokenizer or model, given=tokenizer is not None)
    chat = scoring != "top-logprobs" and uses_chat_template(local, spec.chat_template, tokenizer or model)
    train = task.load_split("train") if spec.shots else []
    chosen = draw_shots(train, spec.shots, torch.initial_seed() if shots_seed is None else shots_seed)
    encoder = ServedEncoder(local, spec, [train[i] for i in chosen], chat=chat)
    first_tokens = _first_tokens(local, spec) if scoring == "top-logprobs" else ()
    identity = hashlib.sha256(
        json.dumps(["served", model, scoring, spec.as_dict(), encoder.context, chat], sort_keys=True).encode()
    ).hexdigest()
    record = {**spec.as_dict(), "model": model, "scoring": scoring, "chat_template": chat, "shot_examples": chosen}
    store = AnswerStore(cache_root() / STORE / hashlib.sha256(model.encode()).hexdigest()[:32])
    scorer = Scorer(
        model=model,
        endpoint=endpoint,
        store=store,
        encoder=encoder,
        scoring=scoring,
        concurrency=concurrency,
        record=record,
        first_tokens=first_tokens,
        identity=identity,
    )
    served = ServedLM(scorer, identity, spec.content_free, task.is_pair).eval()
    notes: list[str] = []

    def plan_for(max_length: Optional[int], transfer_examples: int = 0) -> None:
        """The requests the pass sends (texts cut to ``max_length``), and the dry run's transfer set's."""
        plan = request_plan(task, scorer, price_per_million_tokens, max_length, transfer_examples)
        record["plan"], scorer.expected = plan, plan["requests"]
        notes[:] = [describe(spec, model, endpoint, scoring, plan)]

    plan_for(None)  # counted again once the run's max_length is known
    served.kdplug_plan_for = plan_for
    kind = f"a served causal LM ({model} at {endpoint.base_url}), not fine-tuned"  # used as it is
    return Teacher(
        model=served,
        tokenizer=local,
        source=f"served:{model}",
        finetuned=True,
        # "prompted" too: it reads the task through a prompt as prompted-lm does (weak-teacher advice, report line)
        extra={"served": record, "prompted": record, "kind": kind},
        notes=notes,
        encoder=encoder,
    )


def check_served_options(
    task: Any, *, base_url: Optional[str] = None, api_key_env: str = DEFAULT_KEY_VARIABLE, **_: Any
) -> None:
    """The address and the key's variable, checked before the run directory is made: a key or a password
    given in them is refused before config.yaml is written, and never echoed."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):  # never echoed: it may be a key given by mistake
        raise UsageError(
            "teacher_options.api_key_env names the environment variable that holds the API key (e.g. "
            "OPENAI_API_KEY), and what it was given is not a variable's name; never put the key itself in the "
            "options (they are written to config.yaml): export it and name the variable"
        )
    if api_key_env != DEFAULT_KEY_VARIABLE and api_key(api_key_env) is None:  # the default may be unset: no key
        raise UsageError(
            "the environment variable teacher_options.api_key_env names is not set (or is empty); export it holding "
            "the API key before the run, or leave api_key_env out for a server that needs no key"
        )
    if base_url:
        checked_url(base_url.rstrip("/"))


check_served_options.placeholders = True  # it reads the options alone
served_teacher.check_options = check_served_options
served_teacher.has_layers = False
served_teacher.stores = {STORE: "served teachers' answers (one file per served model)"}


def _local_tokenizer(source: str, *, given: bool) -> Any:
    """The tokenizer the students read the text with (and the prompts are cut by)."""
    from transformers import AutoTokenizer

    try:
        return load_pretrained(AutoTokenizer, str(Path(source).expanduser()) if given else source, "teacher")
    except UsageError as error:
        if given:
            raise
        raise UsageError(
            f"the served teacher needs a tokenizer for the students (and to cut texts to max_length), and {source!r} "
            f"does not name one ({error}); set teacher_options.tokenizer to the served model's hub id or a "
            f"directory holding its tokenizer"
        ) from None


def _first_tokens(tokenizer: Any, spec: PromptSpec) -> tuple[str, ...]:
    """Each label's first token's text; top-logprobs scoring needs them to differ."""
    firsts = tuple(
        tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"][:1]) for text in spec.verbalizer
    )
    if len({first.strip() for first in firsts}) < len(firsts):
        raise UsageError(
            f"teacher_options.scoring=top-logprobs scores each label by its first token, but the verbalizer's first "
            f"tokens {dict(zip(spec.labels, firsts))} are not all different; give each label a text that starts "
            f"with its own word, or use scoring=echo on a server with completions"
        )
    return firsts


def request_plan(
    task: Task, scorer: Scorer, price: Optional[float], max_length: Optional[int], transfer_examples: int = 0
) -> dict[str, Any]:
    """How many requests and tokens the teacher pass over train and the dev splits sends (answers
    already stored aside): its prompts made as the run makes them (the encoder, texts cut to
    ``max_length``), tokens estimated at 4 characters each. A transfer set of ``transfer_examples``
    (not built yet) is counted as at most that many examples of the training prompts' mean length."""
    encoder = scorer.encoder
    examples = [example for split in ("train", *task.dev_splits) for example in task.load_split(split)]
    encoded = encoder(
        [example.text_a for example in examples],
        [example.text_b for example in examples],
        truncation=max_length is not None,
        max_length=max_length,
    )
    prompts = ["".join(map(chr, ids)) for ids in encoded["input_ids"]]
    prompts += [encoder.render(text, text if task.is_pair else None) for text in encoder.spec.content_free]
    scoring = (scorer.chosen or "echo") if scorer.scoring == "auto" else scorer.scoring
    questions = scorer.questions(prompts, scoring)
    missing = [q for q in questions if scorer.store.get(request_key(q.path, q.body, q.split)) is None]
    tokens = sum(q.tokens for q in missing)
    plan = {"requests": len(missing), "stored": len(questions) - len(missing), "tokens": tokens, "scoring": scoring}
    if transfer_examples:
        per_example = len(scorer.verbalizer) if scoring == "echo" else 1
        plan["transfer_requests"] = transfer_examples * per_example
        plan["transfer_tokens"] = round(plan["transfer_requests"] * sum(q.tokens for q in questions) / len(questions))
    if price is not None:
        plan["cost"] = round((tokens + plan.get("transfer_tokens", 0)) / 1e6 * price, 6)
    return plan


def describe(spec: PromptSpec, model: str, endpoint: Endpoint, scoring: str, plan: dict[str, Any]) -> str:
    """What the dry run and the run say of a served teacher."""
    how = {
        "echo": "each label's exact joint log-probability (completions with echo and logprobs)",
        "top-logprobs": (
            f"each label's first token's log-probability among the chat answer's top {TOP_K} (a label outside "
            f"them: the lowest returned)"
        ),
        "auto": "echo scoring where the server has completions with echo and logprobs, else top-logprobs (the run "
        "records which)",
    }[scoring]
    cost = f", about {plan['cost']:g} at the given price in all" if "cost" in plan else ""
    transfer = (
        f"; its transfer set at most {plan['transfer_requests']} requests and about {plan['transfer_tokens']} "
        f"tokens more (its prompts estimated at the training prompts' mean length; answers stored already not "
        f"counted out)"
        if "transfer_requests" in plan
        else "; a transfer set adds its own"
    )
    return (
        f"teacher: {model} served at {endpoint.base_url}: prompt {spec.template!r}, {how}; the teacher pass over "
        f"train and dev sends {plan['requests']} requests ({plan['stored']} already answered in the cache) and about "
        f"{plan['tokens']} tokens (estimated at {CHARS_PER_TOKEN} characters a token){transfer}{cost}; no layers "
        f"(logit methods only)"
    )

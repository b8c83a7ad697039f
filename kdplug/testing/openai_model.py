"""The model behind the test kit's OpenAI-compatible server (:mod:`kdplug.testing.openai_server`):
a transformers causal LM read from a directory, float32 on the CPU, that scores a prompt's own
tokens and generates greedily, answering in the OpenAI completions and chat completions shapes.

One forward pass at a time (a lock): the server's threads share one model.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

#: the most ``logprobs`` / ``top_logprobs`` a request may ask for (OpenAI's chat limit)
MOST_TOP_LOGPROBS = 20
#: ``max_tokens`` when a request gives none (OpenAI's completions default)
DEFAULT_MAX_TOKENS = 16


class RequestError(ValueError):
    """A request the server answers with an OpenAI error body: ``status`` and the message."""

    def __init__(self, message: str, status: int = 400, *, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass
class Scored:
    """One token: its id, its text, its bytes, its log-probability after the tokens before it (None
    for the first) and the most probable tokens at its position (most probable first)."""

    token_id: int
    text: str
    bytes: list[int]
    logprob: Optional[float]
    top: list[Scored]


def load_causal_lm(directory: str | os.PathLike) -> tuple[Any, Any]:
    """The causal LM and tokenizer saved in ``directory``, float32, in evaluation mode; a
    ``ValueError`` saying what is wrong when ``directory`` holds none."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(
            f"the model directory {directory} does not exist; give a directory a transformers causal LM was saved to"
        )
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ValueError(
            f"the model directory {directory} has no config.json; give a directory a transformers causal LM was "
            f"saved to (model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR))"
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"a {config.model_type} model is an encoder-decoder")
        classifiers = [name for name in config.architectures or () if name.endswith("ForSequenceClassification")]
        if classifiers:
            raise ValueError(f"a {classifiers[0]} has no language-model head")
        model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(
            f"cannot serve {directory} as a causal language model ({error}); give a directory a transformers "
            f"causal LM (a GPT-2, Llama, Qwen...) was saved to"
        ) from None
    return model.eval(), tokenizer


class ServedLM:
    """``model`` and ``tokenizer`` (a transformers causal LM), answering completions and chat
    completions requests (their parsed JSON bodies) with response bodies."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        config = model.config
        self.max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self._ids = 0
        self._byte_decoder = _byte_decoder(tokenizer)

    # -- the requests ---------------------------------------------------------------------------
    def complete(self, body: dict, name: str) -> dict:
        """A ``/v1/completions`` answer: the prompt's tokens scored (``echo``) and up to
        ``max_tokens`` greedy tokens after it."""
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError(f"'prompt' must be one string, not {type(prompt).__name__}")
        max_tokens = _max_tokens(body, "max_tokens")
        top_k = _optional_count(body, "logprobs")
        echo = body.get("echo", False)
        if not isinstance(echo, bool):
            raise RequestError(f"'echo' must be true or false, not {echo!r}")
        encoded = self.tokenizer(prompt, return_offsets_mapping=True)
        ids, offsets = list(encoded["input_ids"]), [start for start, _ in encoded["offset_mapping"]]
        prompt_tokens, generated = self._run(ids, max_tokens, top_k or 0, score_prompt=echo)
        text = "".join(token.text for token in generated)
        tokens, token_offsets = (prompt_tokens, offsets) if echo else ([], [])
        start = len(prompt) if echo else 0
        for token in generated:
            token_offsets.append(start)
            start += len(token.text)
        choice = {
            "index": 0,
            "text": (prompt if echo else "") + text,
            "finish_reason": self._finish_reason(generated, max_tokens),
            "logprobs": None if top_k is None else _completion_logprobs(tokens + generated, token_offsets),
        }
        return self._response("cmpl", "text_completion", name, choice, len(ids), len(generated))

    def chat(self, body: dict, name: str) -> dict:
        """A ``/v1/chat/completions`` answer: up to ``max_tokens`` greedy tokens after the
        messages, with each one's log-probability and ``top_logprobs`` alternatives."""
        prompt = self.chat_prompt(_messages(body))
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        max_tokens = _max_tokens(body, field)
        if max_tokens == 0:
            raise RequestError(f"'{field}' must be at least 1 in a chat completion")
        wants = body.get("logprobs", False)
        if not isinstance(wants, bool):
            raise RequestError(f"'logprobs' must be true or false in a chat completion, not {wants!r}")
        top_k = _optional_count(body, "top_logprobs")
        if top_k is not None and not wants:
            raise RequestError("'top_logprobs' needs 'logprobs': true")
        ids = list(self.tokenizer(prompt, add_special_tokens=not self.tokenizer.chat_template)["input_ids"])
        _, generated = self._run(ids, max_tokens, top_k or 0, score_prompt=False)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(token.text for token in generated)},
            "finish_reason": self._finish_reason(generated, max_tokens),
            "logprobs": {"content": [_chat_logprob(token) for token in generated]} if wants else None,
        }
        return self._response("chatcmpl", "chat.completion", name, choice, len(ids), len(generated))

    def chat_prompt(self, messages: list[dict]) -> str:
        """The text the model reads for ``messages``: its tokenizer's chat template with the
        assistant's turn opened, or (a tokenizer without one) the contents joined by newlines."""
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return "\n".join(message["content"] for message in messages)

    # -- the model --------------------------------------------------------------------------------
    def _run(self, ids: list[int], max_tokens: int, top_k: int, *, score_prompt: bool) -> tuple[list, list]:
        """The prompt's tokens scored (when ``score_prompt``) and ``max_tokens`` greedy tokens
        after it (fewer where the model writes its end-of-sequence token)."""
        import torch

        if not ids and (max_tokens or score_prompt):
            raise RequestError("'prompt' gives no tokens (and the tokenizer adds no beginning token) to read")
        if self.max_positions and len(ids) + max_tokens > self.max_positions:
            raise RequestError(
                f"the prompt's {len(ids)} tokens and max_tokens {max_tokens} exceed the model's "
                f"{self.max_positions} positions; shorten the prompt or ask for fewer tokens"
            )
        prompt_tokens, generated = [], []
        with self._lock, torch.no_grad():
            if score_prompt:
                log_probs = self.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
                prompt_tokens = [self._scored(ids[0], None, top_k)]
                prompt_tokens += [self._scored(ids[i], log_probs[i - 1], top_k) for i in range(1, len(ids))]
            sequence = list(ids)
            for _ in range(max_tokens):
                last = self.model(torch.tensor([sequence])).logits[0, -1].float().log_softmax(-1)
                token = int(last.argmax())
                generated.append(self._scored(token, last, top_k))
                sequence.append(token)
                if token == self.tokenizer.eos_token_id:
                    break
        return prompt_tokens, generated

    def _scored(self, token: int, log_probs: Any, top_k: int) -> Scored:
        """``token`` with its log-probability in ``log_probs`` (None: the first token) and the
        ``top_k`` most probable tokens there."""
        if log_probs is None:
            return self._token(token, None)
        top = []
        if top_k:
            values, indices = log_probs.topk(top_k)
            top = [self._token(int(i), float(v)) for v, i in zip(values, indices)]
        return self._token(token, float(log_probs[token]), top)

    def _token(self, token: int, logprob: Optional[float], top: Optional[list] = None) -> Scored:
        text = self.tokenizer.decode([token])
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if self._byte_decoder and piece and all(char in self._byte_decoder for char in piece):
            raw = [self._byte_decoder[char] for char in piece]  # a byte-level token's own bytes, whole or not
        else:
            raw = list(text.encode())
        return Scored(token, text, raw, logprob, top or [])

    def _finish_reason(self, generated: list[Scored], max_tokens: int) -> str:
        ended = generated and generated[-1].token_id == self.tokenizer.eos_token_id
        return "stop" if ended and len(generated) <= max_tokens else "length"

    def _response(self, prefix: str, kind: str, name: str, choice: dict, prompt: int, completion: int) -> dict:
        with self._lock:
            self._ids += 1
            number = self._ids
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return {"id": f"{prefix}-{number}", "object": kind, "model": name, "choices": [choice], "usage": usage}


def messages_key(messages: list[dict]) -> str:
    """``messages`` as one stable string (the server's count of answered chats is keyed by it)."""
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


def _completion_logprobs(tokens: list[Scored], offsets: list[int]) -> dict:
    """The completions API's ``logprobs``: each token's text, log-probability, alternatives (the
    token itself among them, as vLLM answers) and character offset in the choice's text."""
    top = [None if t.logprob is None else {**{a.text: a.logprob for a in t.top}, t.text: t.logprob} for t in tokens]
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _chat_logprob(token: Scored) -> dict:
    alternatives = [{"token": a.text, "logprob": a.logprob, "bytes": a.bytes} for a in token.top]
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": token.bytes,
        "top_logprobs": alternatives,
    }


def _byte_decoder(tokenizer: Any) -> dict[str, int]:
    """A byte-level BPE tokenizer's (GPT-2's, Llama 3's) map from its pieces' characters to the
    bytes they stand for; empty for any other tokenizer (its tokens' bytes are their text's)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return {}
    # GPT-2's table: printable bytes stand for themselves, the others for the characters from 256 on
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    table = {chr(byte): byte for byte in printable}
    table.update({chr(256 + number): byte for number, byte in enumerate(others)})
    return table


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {'role': ..., 'content': ...} objects")
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise RequestError(f"'messages[{number}]' must have a 'role' of 'system', 'user' or 'assistant'")
        if not isinstance(message.get("content"), str):
            raise RequestError(f"'messages[{number}].content' must be a string")
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def _max_tokens(body: dict, field: str) -> int:
    value = body.get(field, DEFAULT_MAX_TOKENS)
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RequestError(f"'{field}' must be a whole number >= 0, not {value!r}")
    return value


def _optional_count(body: dict, field: str) -> Optional[int]:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MOST_TOP_LOGPROBS:
        raise RequestError(f"'{field}' must be a whole number from 0 to {MOST_TOP_LOGPROBS} or null, not {value!r}")
    return value

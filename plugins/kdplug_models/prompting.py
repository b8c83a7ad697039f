"""A prompt for a causal language model that labels text: its options checked, its few-shot
examples drawn, and the encoder that turns an example into the token ids the model reads.

The student never reads these ids: the engine encodes the plain text for the students and gives
the teacher its own encoding (``Teacher.encoder``), so the prompt stays the teacher's business.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from kdplug.errors import UsageError
from kdplug.types import Example, Task

from .labels import _written_word

#: the content-free inputs whose label probabilities contextual calibration divides out: the
#: three of Zhao et al. (2021)'s code (run_classification.py), averaged
CONTENT_FREE = ("N/A", "", "[MASK]")
#: between the few-shot examples, and between the last of them and the query (as Zhao et al.'s prompts)
SHOT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class PromptSpec:
    """A checked prompt: the template, each task label's verbalizer text (in the task's label order),
    the few-shot count, whether the chat template is wanted (``"auto"``, True, False) and the
    content-free inputs of calibration (empty: no calibration)."""

    template: str
    verbalizer: tuple[str, ...]
    labels: tuple[str, ...]
    shots: int = 0
    chat_template: Any = "auto"
    content_free: tuple[str, ...] = ()

    def fill(self, text: str, text_b: Optional[str] = None) -> str:
        """The template with the example's text(s) in place."""
        return self.template.format_map({"text": text, "text_b": "" if text_b is None else text_b})

    def shot(self, example: Example) -> str:
        """A few-shot example: the template filled, followed by its label's verbalizer."""
        return self.fill(example.text_a, example.text_b) + self.verbalizer[int(example.label)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "verbalizer": dict(zip(self.labels, self.verbalizer)),
            "shots": self.shots,
            "chat_template": self.chat_template,
            "calibrate": list(self.content_free) if self.content_free else False,
        }


def prompt_spec(
    task: Task,
    prompt: Any,
    verbalizer: Any,
    shots: Any = 0,
    chat_template: Any = "auto",
    calibrate: Any = False,
) -> PromptSpec:
    """The options checked against ``task``, with a message saying what to fix for each mistake."""
    if task.is_regression or not task.labels:
        raise UsageError(
            f"teacher_options.prompt: a prompted language model labels text through a verbalizer, but task "
            f"{task.name!r} is a regression; use a teacher with a regression head"
        )
    template = _checked_template(prompt, task)
    return PromptSpec(
        template=template,
        verbalizer=_checked_verbalizer(verbalizer, task),
        labels=tuple(str(label) for label in task.labels),
        shots=_checked_shots(shots),
        chat_template=_checked_chat_template(chat_template),
        content_free=_content_free(calibrate),
    )


def _checked_template(prompt: Any, task: Task) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise UsageError(
            f"teacher_options.prompt must be a template with {{text}}, not {prompt!r}. On the command line, put it "
            f"in double quotes inside single ones (YAML reads an unquoted 'Review: ...' as a mapping, and makes \\n "
            f"a line break only in double quotes): --set 'teacher_options.prompt=\"Review: {{text}}\\nSentiment:\"'"
        )
    try:
        parsed = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(prompt)]
    except ValueError as error:
        raise UsageError(
            f"teacher_options.prompt {prompt!r} is not a valid template ({error}); write {{{{ for {{"
        ) from None
    fields = {name for name, _, _ in parsed if name is not None}
    formatted = [
        "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        for name, spec, conversion in parsed
        if name is not None and (spec or conversion)
    ]
    if formatted:
        raise UsageError(
            f"teacher_options.prompt {prompt!r}: {', '.join(formatted)} formats the text, but a field is replaced "
            f"by the example's text as it is: write {{text}} (and {{text_b}}) alone, with no ':' or '!' after the "
            f"name ({{{{ and }}}} for literal braces)"
        )
    wanted = {"text", "text_b"} if task.is_pair else {"text"}
    unknown, missing = fields - wanted, wanted - fields
    if unknown or missing:
        problems = [f"it names {', '.join('{' + f + '}' for f in sorted(unknown))}"] if unknown else []
        problems += [f"it lacks {', '.join('{' + f + '}' for f in sorted(missing))}"] if missing else []
        pair = "a pair task: {text} and {text_b}" if task.is_pair else "a single-text task: {text} only"
        raise UsageError(
            f"teacher_options.prompt {prompt!r}: {'; '.join(problems)}; task {task.name!r} is {pair} "
            f"(write {{{{ and }}}} for literal braces)"
        )
    return prompt


def _checked_verbalizer(verbalizer: Any, task: Task) -> tuple[str, ...]:
    labels = [str(label) for label in task.labels]
    example = ", ".join(f"{label}: ' {label}'" for label in labels)
    if not isinstance(verbalizer, Mapping):
        raise UsageError(
            f"teacher_options.verbalizer must map each of task {task.name!r}'s labels to the text the model "
            f"writes for it, e.g. {{{example}}}"
        )
    given = {_label_key(key, labels, verbalizer): value for key, value in verbalizer.items()}
    missing = [label for label in labels if label not in given]
    unknown = [key for key in given if key not in labels]
    if missing or unknown:
        problems = [f"no text for {', '.join(map(repr, missing))}"] if missing else []
        problems += [f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not a label"] * bool(
            unknown
        )
        raise UsageError(
            f"teacher_options.verbalizer: {'; '.join(problems)}; task {task.name!r}'s labels are "
            f"{', '.join(labels)}: give each one text, e.g. {{{example}}}"
        )
    booleans = [label for label in labels if isinstance(given[label], bool)]
    if booleans:
        raise UsageError(
            f"teacher_options.verbalizer: the text of {', '.join(map(repr, booleans))} is "
            f"{', '.join(str(given[label]).lower() for label in booleans)}: YAML reads an unquoted yes/no, true/false, "
            f"on/off as a boolean; quote each text, with the leading space the model writes, e.g. "
            f"{{{', '.join(f'{label}: {chr(34)} {label}{chr(34)}' for label in labels)}}}"
        )
    empty = [label for label in labels if not isinstance(given[label], str) or not given[label]]
    if empty:
        raise UsageError(
            f"teacher_options.verbalizer: the text of {', '.join(map(repr, empty))} is empty or not a string; "
            f"each label needs the text the model would write for it (with its leading space, e.g. ' positive')"
        )
    texts = [given[label] for label in labels]
    if len(set(texts)) < len(texts):
        raise UsageError(f"teacher_options.verbalizer: two labels have the same text ({texts}); give each its own")
    return tuple(texts)


def _label_key(key: Any, labels: Sequence[str], verbalizer: Mapping[Any, Any]) -> str:
    """A verbalizer key as the task label it names: YAML reads an unquoted ``yes:`` or ``no:`` as a
    boolean, which names the one task label YAML reads so (else a UsageError that says why)."""
    if isinstance(key, bool):
        return _written_word(key, labels, "the task's labels", "teacher_options.verbalizer", verbalizer)
    return str(key)


def _checked_shots(shots: Any) -> int:
    if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
        raise UsageError(
            f"teacher_options.shots must be a whole number of few-shot examples (0 or more), not {shots!r}"
        )
    return shots


def _checked_chat_template(chat_template: Any) -> Any:
    if chat_template in ("auto", True, False):
        return chat_template
    raise UsageError(
        f"teacher_options.chat_template must be auto (the tokenizer's chat template where it has one), true or "
        f"false, not {chat_template!r}"
    )


def _content_free(calibrate: Any) -> tuple[str, ...]:
    """``calibrate``: false, true (Zhao et al.'s three content-free inputs) or a list of them."""
    if calibrate is False or calibrate is None:
        return ()
    if calibrate is True:
        return CONTENT_FREE
    if isinstance(calibrate, str):  # "no" in quotes is text, which Python takes as true: never a content-free input
        raise UsageError(
            f"teacher_options.calibrate must be true or false (written without quotes) or a list of content-free "
            f"inputs, got the text {calibrate!r}; for one content-free input of your own, write it as a list: "
            f"--set 'teacher_options.calibrate=[{calibrate!r}]'"
        )
    if isinstance(calibrate, (list, tuple)) and calibrate and all(isinstance(text, str) for text in calibrate):
        return tuple(calibrate)
    raise UsageError(
        f"teacher_options.calibrate must be true (content-free inputs {list(CONTENT_FREE)}), false, or a list of "
        f"content-free inputs, not {calibrate!r}"
    )


def draw_shots(train: Sequence[Example], k: int, seed: int) -> list[int]:
    """The indices of ``k`` training examples, drawn without replacement by ``seed`` alone."""
    if k > len(train):
        raise UsageError(
            f"teacher_options.shots={k}, but the training split has {len(train)} examples; use at most {len(train)}"
        )
    return random.Random(seed).sample(range(len(train)), k)


class PromptEncoder:
    """Encodes examples as the prompted model reads them, with a tokenizer's call signature (what
    the engine calls a teacher's ``encoder``): the text(s) cut to ``max_length`` tokens of their own
    (the prompt is never cut, so the position that predicts the label is always there), put into the
    template after the few-shot examples, wrapped in the chat template where one is used, and
    tokenised whole, so the model sees the ids the tokenizer gives the prompt's text."""

    def __init__(self, tokenizer: Any, spec: PromptSpec, shots: Sequence[Example] = (), *, chat: bool) -> None:
        self.tokenizer, self.spec, self.chat = tokenizer, spec, chat
        self.context = "".join(spec.shot(example) + SHOT_SEPARATOR for example in shots)
        self.pad_token_id = tokenizer.pad_token_id
        #: the model's positions and its longest label's tokens, once known (prompted_teacher sets them)
        self.positions: Optional[int] = None
        self.longest_label = 0
        #: what changes the ids beyond the tokenizer (the transfer set's stored encodings are keyed by it)
        self.kdplug_fingerprint = hashlib.sha256(
            json.dumps([spec.as_dict(), self.context, chat], sort_keys=True).encode()
        ).hexdigest()

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def render(self, text: str, text_b: Optional[str] = None) -> str:
        """The prompt's text for one example (nothing cut)."""
        prompt = self.context + self.spec.fill(text, text_b)
        if not self.chat:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, text: str, text_b: Optional[str] = None) -> list[int]:
        """The ids of the prompt for one example: a chat template writes its own special tokens."""
        encoded = self.tokenizer(self.render(text, text_b), add_special_tokens=not self.chat)
        return list(encoded["input_ids"])

    def __call__(
        self,
        texts: Sequence[str],
        text_pairs: Optional[Sequence[Optional[str]]] = None,
        *,
        truncation: bool = True,
        max_length: Optional[int] = None,
        **_: Any,
    ) -> dict[str, list[list[int]]]:
        pairs = list(text_pairs) if text_pairs is not None else [None] * len(texts)
        if truncation and max_length is not None:
            texts, pairs = self.truncated(list(texts), pairs, max_length)
        ids = [self.prompt_ids(text, text_b) for text, text_b in zip(texts, pairs)]
        self.check_fits(max(map(len, ids), default=0))
        return {"input_ids": ids}

    def check_fits(self, prompt_tokens: int) -> None:
        """A prompt whose label would fall past the model's positions is refused: a model reads positions it
        was never trained on silently (Llama's rotary ones) or fails deep inside (GPT-2's table)."""
        if self.positions is None or prompt_tokens + self.longest_label <= self.positions:
            return
        raise UsageError(
            f"teacher_options.prompt: a prompt of {prompt_tokens} tokens (the template, {self.spec.shots} shot(s) "
            f"and the example's text) and a label of {self.longest_label} take more than the model's "
            f"{self.positions} positions; shorten the prompt, use fewer shots, or lower max_length"
        )

    def truncated(
        self, texts: list[str], pairs: list[Optional[str]], max_length: int
    ) -> tuple[list[str], list[Optional[str]]]:
        """Each example's text(s) cut to ``max_length`` tokens together (the longer one first, as
        tokenizers' ``longest_first``), at a token boundary of the text itself."""
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        second = [0] * len(texts)
        if any(pair is not None for pair in pairs):
            second = [
                len(ids) for ids in self.tokenizer([p or "" for p in pairs], add_special_tokens=False)["input_ids"]
            ]
        for row, (a, b) in enumerate(zip(lengths, second)):
            while a + b > max_length:
                a, b = (a - 1, b) if a >= b else (a, b - 1)
            if a < lengths[row]:
                texts[row] = self._cut(texts[row], a)
            if pairs[row] is not None and b < second[row]:
                pairs[row] = self._cut(pairs[row], b)
        return texts, pairs

    def _cut(self, text: str, tokens: int) -> str:
        """``text`` up to the end of its ``tokens``-th token."""
        if tokens <= 0:
            return ""
        if getattr(self.tokenizer, "is_fast", False):
            offsets = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            return text[: offsets[tokens - 1][1]]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
        return self.tokenizer.decode(ids)


def uses_chat_template(tokenizer: Any, wanted: Any, source: str) -> bool:
    """Whether to wrap the prompt in ``tokenizer``'s chat template: ``auto`` where it has one."""
    has_one = bool(getattr(tokenizer, "chat_template", None))
    if wanted is True and not has_one:
        raise UsageError(
            f"teacher_options.chat_template=true, but {source}'s tokenizer has no chat template; "
            f"set it to auto or false (the prompt is then given as plain text)"
        )
    return has_one if wanted == "auto" else bool(wanted)

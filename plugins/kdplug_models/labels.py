"""A fine-tuned checkpoint's labels, matched to the task's by name.

A checkpoint fine-tuned elsewhere says what its outputs mean in ``config.id2label``; the task
says what its class indices mean in ``task.labels``. Reading the checkpoint's logits by position
is right only when the two orders agree, and a well-known trap when they do not (an MNLI
checkpoint in another label order, a sentiment model saved as ``{0: positive, 1: negative}``):
the teacher's logits would mean the opposite and the student would learn them without a word.
So the names are matched (case, spaces, hyphens and underscores ignored) and the classifier's
output rows are permuted into the task's order. ``LABEL_0``-style names, and tasks whose labels
are the numbers ``0 .. C-1``, say nothing about meaning: those are matched by position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Optional

import torch
from torch import nn

from kdplug.errors import UsageError
from kdplug.textio import yaml_word

_POSITIONAL = re.compile(r"label_?(\d+)")


def normalise(name: Any) -> str:
    """``"Not Entailment"``, ``"not-entailment"`` and ``"NOT_ENTAILMENT"`` are one name."""
    return re.sub(r"[\s_\-]+", "", str(name)).lower()


def _positional(names: Sequence[Any]) -> bool:
    """Names that only count: ``LABEL_0, LABEL_1 ...`` or ``0, 1 ...`` in order."""
    for index, name in enumerate(names):
        text = normalise(name)
        found = _POSITIONAL.fullmatch(text)
        if not (text == str(index) or (found and int(found.group(1)) == index)):
            return False
    return True


@dataclass(frozen=True)
class LabelMatch:
    """How the checkpoint's outputs map onto the task's classes.

    ``order[i]`` is the checkpoint output that means task class ``i``; ``how`` is ``"positional"``,
    ``"names"`` or ``"label_map"``; ``checkpoint`` lists the checkpoint's own names in its order.
    """

    order: tuple[int, ...]
    how: str
    checkpoint: tuple[str, ...]

    @property
    def reordered(self) -> bool:
        return self.order != tuple(range(len(self.order)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "matched_by": self.how,
            "checkpoint_labels": list(self.checkpoint),
            "reordered": self.reordered,
            "checkpoint_output_of_each_task_label": list(self.order),
        }


def _map_example(checkpoint: Sequence[str], task: Sequence[str]) -> str:
    """A ``label_map`` to show: each checkpoint label with the task label its name is closest to
    (``positive`` -> ``pos``) when that pairs them one to one, else with a placeholder."""

    def closeness(name: str, label: str) -> float:
        a, b = normalise(name), normalise(label)
        return 1.0 + min(len(a), len(b)) if a.startswith(b) or b.startswith(a) else SequenceMatcher(None, a, b).ratio()

    guess = [max(task, key=lambda label: closeness(name, label)) for name in checkpoint]
    if len(set(guess)) != len(task):
        guess = ["TASK_LABEL"] * len(checkpoint)
    return "{" + ", ".join(f"{yaml_word(name)}: {yaml_word(label)}" for name, label in zip(checkpoint, guess)) + "}"


def match_labels(
    id2label: Mapping[Any, Any],
    task_labels: Sequence[str],
    *,
    source: str,
    what: str,
    label_map: Optional[Mapping[Any, Any]] = None,
) -> LabelMatch:
    """Which checkpoint output means each task label (see the module docstring).

    ``label_map`` (``{checkpoint label or index: task label}``) says it explicitly. Names that
    cannot be matched are a :class:`UsageError` listing both sides and the ``label_map`` to set.
    """
    count = len(task_labels)
    checkpoint = tuple(str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(count))
    option = f"{what}_options.label_map"
    if label_map is not None:
        return LabelMatch(_from_label_map(label_map, checkpoint, task_labels, source, option), "label_map", checkpoint)
    if _positional(checkpoint) or _positional(task_labels):
        return LabelMatch(tuple(range(count)), "positional", checkpoint)
    if len(set(checkpoint)) == count and set(checkpoint) == set(task_labels):  # the very names: Pos and pos apart
        return LabelMatch(tuple(checkpoint.index(label) for label in task_labels), "names", checkpoint)
    by_name = {normalise(name): index for index, name in enumerate(checkpoint)}
    if len(by_name) == count and set(by_name) == {normalise(label) for label in task_labels}:
        return LabelMatch(tuple(by_name[normalise(label)] for label in task_labels), "names", checkpoint)
    raise UsageError(
        f"the {what} {source} was fine-tuned with the labels {list(checkpoint)} (in its output order), but the task's "
        f"labels are {list(task_labels)}: kdplug cannot tell which output means which class. If the checkpoint is "
        f"for this task, say how its labels map onto the task's (each checkpoint label, or output index, to a task "
        f"label; check that the pairs are right), e.g. --set '{option}={_map_example(checkpoint, task_labels)}'; if it "
        f"was fine-tuned for another task, fine-tune it on this one with --set {what}_options.finetuned=false"
    )


#: the words YAML (and so ``--set`` and config files) reads as the booleans true and false
YAML_TRUE, YAML_FALSE = ("yes", "true", "on"), ("no", "false", "off")


def _from_label_map(
    label_map: Mapping[Any, Any], checkpoint: Sequence[str], task_labels: Sequence[str], source: str, option: str
) -> tuple[int, ...]:
    """The checkpoint output of each task class, from a ``label_map`` that must pair the outputs
    and the task's labels one to one: every key is resolved to an output (by its label, or its
    index) before anything is paired, so two spellings of one output are caught."""
    example = f"--set '{option}={_map_example(checkpoint, task_labels)}'"
    if not isinstance(label_map, Mapping):
        raise UsageError(
            f"{option} must be a mapping of checkpoint labels to task labels, e.g. {example}, got {label_map!r}"
        )
    outputs: dict[int, Any] = {}  # checkpoint output -> the key that named it
    order: dict[int, int] = {}  # task class -> checkpoint output
    for key, value in label_map.items():
        output = _output(key, checkpoint, source, option, label_map)
        target = _task_class(value, task_labels, option, label_map)
        if output in outputs:
            raise UsageError(
                f"{option}: {outputs[output]!r} and {key!r} both name output {output} ({checkpoint[output]!r}) of "
                f"{source}, so two task labels would read one logit; name each of its outputs {list(checkpoint)} "
                f"once, e.g. {example}"
            )
        if target in order:
            raise UsageError(
                f"{option}: {outputs[order[target]]!r} and {key!r} both map to the task label "
                f"{task_labels[target]!r}; each task label needs exactly one checkpoint label, e.g. {example}"
            )
        outputs[output], order[target] = key, output
    if len(order) != len(task_labels):
        missing = [label for index, label in enumerate(task_labels) if index not in order]
        raise UsageError(
            f"{option} leaves the task label(s) {missing} without a checkpoint label; map all "
            f"{len(task_labels)} of them, e.g. {example}"
        )
    return tuple(order[i] for i in range(len(task_labels)))


def _output(key: Any, checkpoint: Sequence[str], source: str, option: str, label_map: Mapping[Any, Any]) -> int:
    """The checkpoint output a ``label_map`` key names: its label, or its index."""
    if isinstance(key, bool):
        key = _written_word(key, checkpoint, f"{source}'s labels", option, label_map)
    if isinstance(key, int):
        if not 0 <= key < len(checkpoint):
            raise UsageError(
                f"{option}: output index {key} is out of range: {source} has {len(checkpoint)} outputs, "
                f"0..{len(checkpoint) - 1} ({list(checkpoint)})"
            )
        return key
    found = {normalise(name): index for index, name in enumerate(checkpoint)}.get(normalise(key))
    if found is None:
        raise UsageError(
            f"{option}: {key!r} is not a label (or output index) of {source}; its labels are {list(checkpoint)}"
        )
    return found


def _task_class(value: Any, task_labels: Sequence[str], option: str, label_map: Mapping[Any, Any]) -> int:
    """The task class a ``label_map`` value names."""
    if isinstance(value, bool):
        value = _written_word(value, task_labels, "the task's labels", option, label_map)
    found = {normalise(label): index for index, label in enumerate(task_labels)}.get(normalise(value))
    if found is None:
        raise UsageError(f"{option}: {value!r} is not a label of the task; its labels are {list(task_labels)}")
    return found


def _written_word(value: bool, names: Sequence[str], whose: str, option: str, label_map: Mapping[Any, Any]) -> str:
    """The word YAML read as ``value`` (``yes: positive`` arrives as ``True: 'positive'``): the one
    name among ``names`` that YAML reads so; where none is, or several are, a UsageError."""
    words = YAML_TRUE if value else YAML_FALSE
    written = [name for name in names if normalise(name) in words]
    if len(written) == 1:
        return written[0]
    read = f"YAML reads {'/'.join(words)} as {str(value).lower()}"
    if not written:
        raise UsageError(
            f"{option}: {read}, and none of {whose} {list(names)} is such a word; name one of those labels instead"
        )

    def spelled(item: Any) -> str:  # an output index stays a number
        if isinstance(item, bool):
            item = (YAML_TRUE if item else YAML_FALSE)[0]
        return yaml_word(item) if isinstance(item, str) else str(item)

    quoted = "{" + ", ".join(f"{spelled(k)}: {spelled(v)}" for k, v in label_map.items()) + "}"
    raise UsageError(
        f"{option}: {read}, and {len(written)} of {whose} {list(names)} are such words: kdplug cannot tell which "
        f"you wrote; quote it, e.g. --set '{option}={quoted}' with the words you meant"
    )


def classifier_output_layer(model: nn.Module, num_labels: int) -> nn.Linear:
    """The linear layer that produces a sequence classifier's logits (BERT's ``classifier``,
    RoBERTa's ``classifier.out_proj``, ...): the one ``Linear`` outside the encoder with
    ``num_labels`` outputs."""
    prefix = getattr(model, "base_model_prefix", "")
    found = [
        module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and module.out_features == num_labels
        and not (prefix and name.startswith(prefix + "."))
    ]
    if len(found) != 1:
        raise UsageError(
            f"kdplug cannot find the one output layer of this {type(model).__name__}'s classification "
            f"head ({len(found)} candidates) to put its labels in the task's order; use a checkpoint "
            f"whose labels are already in the task's order"
        )
    return found[0]


@torch.no_grad()
def reorder_outputs(model: nn.Module, order: Sequence[int], task_labels: Sequence[str]) -> None:
    """Permute the classifier's output rows so that logit ``i`` means ``task_labels[i]``, and say so
    in the config (saved copies of the model then carry the task's order)."""
    layer = classifier_output_layer(model, len(order))
    index = torch.tensor(list(order), device=layer.weight.device)
    layer.weight.copy_(layer.weight.index_select(0, index))  # (C, width): row i <- row order[i]
    if layer.bias is not None:
        layer.bias.copy_(layer.bias.index_select(0, index))
    model.config.id2label = dict(enumerate(task_labels))
    model.config.label2id = {label: i for i, label in enumerate(task_labels)}

"""Loading a Hugging Face checkpoint as a sequence classifier for a task: through :mod:`kdplug.hub`
(a hub id is looked up in the local cache first, and an offline machine gets an
:class:`~kdplug.errors.OfflineError` at once rather than ``transformers``' retries), its own head
kept where it fits the task with the outputs in the task's label order (:mod:`.labels`), and
where a fine-tuned checkpoint says its pre-trained weights came from."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

import torch

from kdplug import hub
from kdplug.errors import UsageError
from kdplug.types import ModelShape, Task, num_outputs

from .decoders import give_padding_token, is_decoder_only
from .labels import LabelMatch, match_labels, reorder_outputs
from .lora import Adapter, apply_adapter
from .placement import PLACEMENT_OPTIONS, Placement, PlacementOptions, load_placed, plan_placement

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Loading: local directory, cache, or hub (kdplug.hub fails fast offline)
# --------------------------------------------------------------------------------------------


def load_pretrained(loader: Any, source: str, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` through :func:`kdplug.hub.load_pretrained`; a teacher is passed as
    ``--teacher DIR``."""
    local = "--teacher /path/to/dir or --set teacher_options.source=/path/to/dir" if what == "teacher" else None
    return hub.load_pretrained(loader, source, what, local_option=local, **kwargs)


@dataclass
class Loaded:
    """A checkpoint loaded as a sequence classifier for a task."""

    model: Any
    tokenizer: Any
    #: the checkpoint is a sequence classifier (fine-tuned for some task)
    is_classifier: bool
    #: ... and its head has the task's number of outputs
    head_fits: bool
    #: how its outputs were matched to the task's labels (None: a new head, or regression)
    labels: Optional[LabelMatch] = None
    #: where its modules went, when it was loaded with a device map (None: one device, the engine's)
    placement: Optional[Placement] = None


CHECKPOINT_OPTIONS = ("source", "finetuned", "label_map", "num_labels", "trust_remote_code", "revision")
#: a teacher's further options (see :func:`kdplug_models.hf.hf_teacher`)
TEACHER_OPTIONS = ("dtype", "lora", "base", *PLACEMENT_OPTIONS)


def _config_for_task(
    source: str, task: Task, num_labels: Optional[int], what: str, overrides: dict[str, Any], **load_options: Any
):
    """The checkpoint's config sized for ``task``, whether it is a sequence classifier, and whether
    that head already fits the task (then its own ``id2label`` is kept, to be matched by name)."""
    from transformers import AutoConfig

    config = load_pretrained(AutoConfig, source, what, **load_options)
    if getattr(config, "is_encoder_decoder", False):
        raise UsageError(
            f"{source} is an encoder-decoder model (model type {config.model_type!r}), which kdplug does not take as a "
            f"{what}: it reads an encoder at its first token and a decoder-only model at its last real token, "
            f"and an encoder-decoder classifier pools its decoder's end-of-sequence token after cross-attention, "
            f"which no layer extractor here reads. Use an encoder (BERT, RoBERTa, DeBERTa) or a decoder-only "
            f"classifier (Llama, Qwen2, Mistral, Gemma, GPT-2), or register a layer extractor for it in a "
            f"plugin (docs/writing-a-plugin.md)"
        )
    unknown = sorted(key for key in overrides if not hasattr(config, key))
    if unknown:
        raise UsageError(
            f"unknown {what} option(s) {', '.join(unknown)} for {source!r}: options are "
            f"{', '.join(CHECKPOINT_OPTIONS + (TEACHER_OPTIONS if what == 'teacher' else ()))}, or attributes of "
            f"its {type(config).__name__}"
        )
    wanted = num_labels if num_labels is not None else num_outputs(task)
    is_classifier = any(name.endswith("ForSequenceClassification") for name in config.architectures or ())
    head_fits = is_classifier and config.num_labels == wanted
    _update(config, overrides, what)
    if not head_fits:
        config.num_labels = wanted
        if not task.is_regression and len(task.labels) == wanted:
            config.id2label = dict(enumerate(task.labels))
            config.label2id = {label: index for index, label in enumerate(task.labels)}
    config.output_hidden_states = True
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    return config, is_classifier, head_fits


_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _update(config: Any, overrides: dict[str, Any], what: str) -> None:
    """Set ``overrides`` on ``config``, each of the type of the attribute it replaces (a config's own
    attributes declare no types kdplug's option check can read: 2.5 layers failed deep in transformers)."""
    for key, value in overrides.items():
        current = getattr(config, key, None)
        kind = type(current)
        if current is None or value is None or kind not in _WORDS:
            continue
        fits = (
            isinstance(value, bool)
            if kind is bool
            else isinstance(value, kind) and not isinstance(value, bool)
            if kind in (int, str)
            else isinstance(value, (int, float)) and not isinstance(value, bool)
        )
        if not fits:
            raise UsageError(
                f"{what}_options.{key} must be {_WORDS[kind]}, as the checkpoint's {type(config).__name__} has it "
                f"({current!r}), got {value!r} ({type(value).__name__})"
            )
    try:
        config.update(overrides)
    except (TypeError, ValueError) as exc:  # a value the config itself refuses
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{what}_options: {type(config).__name__} refuses {overrides}: {reason}") from None


def bound_options(factory: Any, *args: Any, **options: Any) -> dict[str, Any]:
    """``factory``'s parameters as a call with ``args`` and ``options`` binds them, defaults filled in (a
    ``**`` parameter as a dict; a required one not given is absent): a factory's ``shape`` reads its
    options so, not from a copy of its signature that could drift from it."""
    bound = inspect.signature(factory).bind_partial(*args, **options)
    bound.apply_defaults()
    return bound.arguments


def checkpoint_shape(
    source: str,
    what: str,
    overrides: dict[str, Any],
    *,
    trust_remote_code: bool = False,
    revision: Optional[str] = None,
) -> Optional[ModelShape]:
    """The layers and attention heads ``source`` will have as the {what}, from its config alone (no
    weights are read) with the options that override its attributes; None for a model that is not
    a Transformer encoder (the layer extractor then tells when it is built)."""
    from transformers import AutoConfig

    load_options = {"trust_remote_code": trust_remote_code, **({"revision": revision} if revision else {})}
    config = load_pretrained(AutoConfig, os.path.expanduser(str(source)), what, **load_options)
    _update(config, {key: value for key, value in overrides.items() if hasattr(config, key)}, what)
    layers, width = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if getattr(config, "is_encoder_decoder", False) or not _positive(layers) or not _positive(width):
        return None
    heads = getattr(config, "num_attention_heads", None)
    if is_decoder_only(config):  # the token-level methods' signals are an encoder's: a decoder gives none
        heads = None
    return ModelShape.transformer(layers, width, heads if _positive(heads) else None)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _load_classifier(
    source: str,
    task: Task,
    *,
    what: str,
    num_labels: Optional[int] = None,
    label_map: Optional[dict] = None,
    trust_remote_code: bool = False,
    revision: Optional[str] = None,
    dtype: Optional[torch.dtype] = None,
    adapter: Optional[Adapter] = None,
    in_task_order: bool = False,
    placement: Optional[PlacementOptions] = None,
    **overrides: Any,
) -> Loaded:
    """``source`` as a sequence classifier for ``task``: its own head where it fits the task, with
    the outputs put in the task's label order (:mod:`kdplug_models.labels`), else a new head.

    With ``adapter``, ``source`` is a PEFT adapter directory: its base is loaded so, the adapter
    applied and merged, its head (where it carries one) read as the classifier's. ``dtype``: the
    weights' dtype (None: the checkpoint's default, fp32). ``in_task_order``: the outputs are the
    task's already (a teacher kdplug fine-tuned on it), no label matching. ``placement``: shard it
    by a device map (:mod:`.placement`), refused for a checkpoint that would need fine-tuning."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = adapter.base if adapter is not None else source
    load_options = {"trust_remote_code": trust_remote_code, **({"revision": revision} if revision else {})}
    config, is_classifier, head_fits = _config_for_task(base, task, num_labels, what, overrides, **load_options)
    base_labels = dict(config.id2label or {}) if head_fits else {}
    if adapter is not None and adapter.has_head:  # the adapter's head is the classifier (peft checks its size)
        is_classifier, head_fits = True, True
    if label_map is not None and not (head_fits and task.labels):
        raise UsageError(
            f"{what}_options.label_map maps a fine-tuned head's labels onto the task's, but {source} "
            f"has no classification head with the task's {len(task.labels) or 1} output(s); drop it"
        )
    placed = _placed(placement, config, dtype, source, task, head_fits, **load_options)
    model = load_placed(
        placed,
        lambda **placing: load_pretrained(
            AutoModelForSequenceClassification,
            base,
            what,
            config=config,
            ignore_mismatched_sizes=not head_fits or adapter is not None,
            **({"dtype": dtype} if dtype is not None else {}),
            **placing,
            **load_options,
        ),
    )
    if adapter is not None:
        model = apply_adapter(model, adapter)
    own_tokenizer = adapter is None or os.path.isfile(os.path.join(source, "tokenizer_config.json"))
    tokenizer = load_pretrained(AutoTokenizer, source if own_tokenizer else base, what, **load_options)
    if is_decoder_only(model.config):
        given = give_padding_token(model, tokenizer)
        if given is not None:
            log.info(
                "%s %s has no padding token: using its end-of-sequence token %r, as transformers does",
                what,
                source,
                given,
            )
    match = None
    if head_fits and task.labels and not in_task_order:
        match = match_labels(base_labels, task.labels, source=source, what=what, label_map=label_map)
        reorder_outputs(model, match.order, task.labels)
    return Loaded(model, tokenizer, is_classifier, head_fits, match, placed)


def _placed(
    placement: Optional[PlacementOptions],
    config: Any,
    dtype: Optional[torch.dtype],
    source: str,
    task: Task,
    head_fits: bool,
    **load_options: Any,
) -> Optional[Placement]:
    """Where a sharded teacher's modules go, from its config (no weights read); a checkpoint whose
    head does not fit the task would be fine-tuned, which a sharded teacher is not: refused."""
    if placement is None:
        return None
    if not head_fits:
        refuse_sharded_finetuning(
            source, f"it has no classification head with the task {task.name}'s {num_outputs(task)} output(s)"
        )
    from transformers import AutoModelForSequenceClassification

    build = functools.partial(
        AutoModelForSequenceClassification.from_config, trust_remote_code=load_options.get("trust_remote_code", False)
    )
    return plan_placement(placement, build, config, dtype, keep_head=True)


def refuse_sharded_finetuning(source: str, why: str) -> None:
    """A teacher sharded by a device map is run, never trained: one that would be fine-tuned is refused."""
    raise UsageError(
        f"teacher_options.device_map shards a teacher to run it, not to train it, and the teacher {source} would be "
        f"fine-tuned first ({why}). Fine-tune it first (a run without device_map, on a machine where it fits, stores "
        f"it; or any trainer), then pass the fine-tuned checkpoint: --teacher DIR --set teacher_options.device_map=auto"
    )


def declared_base_model(source: str) -> Optional[str]:
    """The pre-trained checkpoint a fine-tuned ``source`` says it came from: its model card's
    ``base_model``, else the ``_name_or_path`` its config.json was saved with (when that names
    another checkpoint). None when it says nothing."""

    def read(filename: str) -> Optional[str]:
        if os.path.isdir(source):
            path = os.path.join(source, filename)
            return path if os.path.isfile(path) else None
        return hub.cached_file(source, filename)

    card = read("README.md")
    if card:
        with open(card, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        found = re.search(r"^base_model:\s*\n?\s*-?\s*['\"]?([^\s'\"]+)", text.split("\n---", 1)[0], re.MULTILINE)
        if text.startswith("---") and found:
            return found.group(1)
    config = read("config.json")
    if config:
        with open(config, encoding="utf-8") as handle:
            named = json.load(handle).get("_name_or_path") or None
        if named and os.path.abspath(os.path.expanduser(named)) != os.path.abspath(source) and named != source:
            return named
    return None


def available(checkpoint: str) -> bool:
    """``checkpoint`` can be loaded now: an existing directory, a cached hub id, or the hub is up."""
    if os.path.isdir(os.path.expanduser(checkpoint)):
        return True
    if not hub.HUB_ID.fullmatch(checkpoint) or checkpoint.startswith((".", "/", "~")):
        return False
    return hub.cached_file(checkpoint, "config.json") is not None or hub.unreachable_reason() is None

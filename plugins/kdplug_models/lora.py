"""LoRA for teachers, through the ``peft`` library (kdplug's ``llm`` extra): the settings of
``teacher_options.lora``, a LoRA adapter added to a teacher for kdplug to fine-tune, and a PEFT
adapter directory applied to its base and merged into it.

A teacher fine-tuned with LoRA trains a few low-rank matrices beside the frozen attention weights
(Hu et al., 2021) and its classification head in full; what is stored is that adapter and head,
a few megabytes however large the base. For its outputs the adapter is merged into the base's
weights, so the teacher pass, the layer extractors and the cache see a plain transformers model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from kdplug.errors import UsageError

#: the file that makes a directory a PEFT adapter
ADAPTER_CONFIG = "adapter_config.json"
#: how a user gets peft
INSTALL = 'pip install "kdplug[llm]"'
#: teacher_lr where the run leaves it unset: LoRA trains a few small matrices from zero (B = 0) and
#: wants larger steps than a full fine-tuning (5e-5). 5e-4 is the LoRA paper's rate for RoBERTa-base
#: on GLUE (4e-4 to 5e-4), and was measured on nothing else: its scripts use 4e-4 for RoBERTa-large
#: and 1e-4 for DeBERTa-v2-XXL, and no rate is known here for a decoder (see :func:`lr_note`)
DEFAULT_LR = 5e-4


def lr_note(model: nn.Module) -> Optional[str]:
    """What the run says of :data:`DEFAULT_LR` for ``model``: where it was measured, where that is
    not this model (None for a RoBERTa-base, the model it was measured on)."""
    config = getattr(model, "config", None)
    shape = (getattr(config, "model_type", None), getattr(config, "num_hidden_layers", None))
    if shape == ("roberta", 12) and getattr(config, "hidden_size", None) == 768:
        return None
    return (
        f"teacher: with teacher_lr unset, LoRA fine-tunes at {DEFAULT_LR:g}, the LoRA paper's rate for RoBERTa-base "
        f"on GLUE (4e-4 to 5e-4), not measured on a {type(model).__name__} (the paper's scripts use 4e-4 for "
        f"RoBERTa-large and 1e-4 for DeBERTa-v2-XXL); check the teacher's dev score, and set --set teacher_lr=... "
        f"where it is low"
    )


def require_peft(what: str) -> Any:
    """The ``peft`` module, or a :class:`UsageError` saying how to install it."""
    try:
        import peft
    except ImportError:
        raise UsageError(f"{what} needs the peft library, which is not installed: {INSTALL}") from None
    return peft


# --------------------------------------------------------------------------------------------
# teacher_options.lora
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraSettings:
    """``teacher_options.lora``: ``true`` for these defaults, or a mapping of some of them."""

    r: int = 8
    alpha: float = 16
    dropout: float = 0.05
    #: module names to adapt; None: peft's defaults for the architecture (q_proj, v_proj for Llama)
    target_modules: Optional[tuple[str, ...]] = field(default=None)

    @classmethod
    def parse(cls, value: Any) -> Optional[LoraSettings]:
        """The settings ``value`` asks for; None for false or unset."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise UsageError(
                f"teacher_options.lora must be true or a mapping of r, alpha, dropout, target_modules, "
                f"e.g. --set 'teacher_options.lora={{r: 16, alpha: 32}}'; got {value!r}"
            )
        unknown = sorted(set(value) - {"r", "alpha", "dropout", "target_modules"})
        if unknown:
            raise UsageError(
                f"unknown teacher_options.lora key(s) {', '.join(unknown)}: "
                f"the keys are r, alpha, dropout, target_modules"
            )
        settings = cls(
            r=value.get("r", cls.r),
            alpha=value.get("alpha", cls.alpha),
            dropout=value.get("dropout", cls.dropout),
            target_modules=_module_names(value.get("target_modules")),
        )
        settings.check()
        return settings

    def check(self) -> None:
        def number(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        if not (isinstance(self.r, int) and not isinstance(self.r, bool) and self.r > 0):
            raise UsageError(
                f"teacher_options.lora.r must be a positive whole number (the rank), e.g. 8; got {self.r!r}"
            )
        if not (number(self.alpha) and self.alpha > 0):
            raise UsageError(f"teacher_options.lora.alpha must be a positive number, e.g. 16; got {self.alpha!r}")
        if not (number(self.dropout) and 0 <= self.dropout < 1):
            raise UsageError(f"teacher_options.lora.dropout must be in [0, 1), e.g. 0.05; got {self.dropout!r}")

    def describe(self, targets: Any) -> str:
        """``LoRA r=8, alpha 16, dropout 0.05 on q_proj, v_proj; the head trained in full``."""
        return (
            f"LoRA r={self.r}, alpha {self.alpha:g}, dropout {self.dropout:g} on {', '.join(sorted(targets))}"
            f"{'' if self.target_modules else ' (peft defaults for the architecture)'}; the head trained in full"
        )


def _module_names(value: Any) -> Optional[tuple[str, ...]]:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not (isinstance(names, (list, tuple)) and names and all(isinstance(n, str) and n for n in names)):
        raise UsageError(
            f"teacher_options.lora.target_modules must be a module name or a list of them, e.g. [q_proj, v_proj]; "
            f"got {value!r}"
        )
    return tuple(names)


# --------------------------------------------------------------------------------------------
# Fine-tuning with an adapter
# --------------------------------------------------------------------------------------------


def add_lora(model: nn.Module, settings: LoraSettings) -> Any:
    """Add a LoRA adapter to ``model`` in place (its base weights frozen, the classification head
    trainable in full through peft's ``modules_to_save``); the ``PeftModel`` around it, which
    saves the adapter. ``model`` stays the transformers model the layer extractors read."""
    peft = require_peft("teacher_options.lora")
    config = peft.LoraConfig(
        task_type=peft.TaskType.SEQ_CLS,
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules) if settings.target_modules else None,
    )
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:  # no default target modules for the architecture, or a name that is not there
        raise UsageError(
            f"LoRA cannot adapt this {type(model).__name__}: {exc}. Name the layers to adapt, e.g. "
            f"--set 'teacher_options.lora={{target_modules: [q_proj, v_proj]}}'"
        ) from None
    return wrapped


def lora_targets(wrapped: Any) -> list[str]:
    """The module names a ``PeftModel``'s adapter adapts (peft resolves its defaults)."""
    return sorted(wrapped.peft_config["default"].target_modules)


def save_adapter(wrapped: Any, directory: str, base: str) -> None:
    """The adapter and head of ``wrapped``, saved by peft, naming ``base`` (made absolute when it
    is a local directory, so the stored adapter loads from any working directory)."""
    wrapped.save_pretrained(directory)
    path = os.path.join(directory, ADAPTER_CONFIG)
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    config["base_model_name_or_path"] = os.path.abspath(base) if os.path.isdir(base) else base
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)


def merge(wrapped: Any) -> nn.Module:
    """Fold the adapter into the base weights: the plain model, the same object, LoRA layers gone."""
    return wrapped.merge_and_unload()


# --------------------------------------------------------------------------------------------
# An adapter directory as the teacher
# --------------------------------------------------------------------------------------------


def is_adapter(source: str) -> bool:
    return os.path.isfile(os.path.join(source, ADAPTER_CONFIG))


@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter directory, from its ``adapter_config.json``."""

    directory: str
    base: str
    kind: str  # peft_type: LORA ...
    r: Optional[int]
    #: it carries a trained classification head (peft's ``modules_to_save``)
    has_head: bool

    def describe(self) -> str:
        rank = f" (r={self.r})" if self.r else ""
        return f"a {'LoRA' if self.kind == 'LORA' else self.kind} adapter over {self.base}{rank}"


def read_adapter(directory: str, base: Optional[str] = None) -> Adapter:
    """The adapter in ``directory``; ``base`` (``teacher_options.base``) overrides the base it names."""
    path = os.path.join(directory, ADAPTER_CONFIG)
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the PEFT adapter's {path}: {exc}") from None
    named = base or config.get("base_model_name_or_path")
    if not named:
        raise UsageError(
            f"the adapter {directory} does not name its base model ({ADAPTER_CONFIG} has no base_model_name_or_path): "
            f"say where it is with --set teacher_options.base=DIR_OR_HUB_ID"
        )
    named = os.path.expanduser(str(named))
    if named.startswith((".", "/", "~")) and not os.path.isdir(named):
        raise UsageError(
            f"the adapter {directory} names its base model {named}, which is not a directory here: "
            f"point to the base with --set teacher_options.base=DIR_OR_HUB_ID"
        )
    task_type = config.get("task_type")
    if task_type not in (None, "SEQ_CLS"):
        raise UsageError(
            f"the adapter {directory} was trained for {task_type}, not sequence classification (SEQ_CLS): as a "
            f"classifier teacher it would have no trained head. Use an adapter trained with task_type SEQ_CLS, or "
            f"fine-tune a classifier on the task: --teacher {named} --set teacher_options.lora=true"
        )
    _refuse_pickled_weights(directory)
    kind = str(config.get("peft_type", "LORA"))
    return Adapter(directory, named, kind, config.get("r"), _saves_head(directory, config.get("modules_to_save") or ()))


def _refuse_pickled_weights(directory: str) -> None:
    """An adapter whose weights are ``adapter_model.bin`` (a pickle: loading it may run code from
    the file) is refused; kdplug reads an adapter's weights from safetensors only."""
    if os.path.isfile(os.path.join(directory, "adapter_model.safetensors")):
        return
    if os.path.isfile(os.path.join(directory, "adapter_model.bin")):
        raise UsageError(
            f"the adapter {directory} holds its weights as adapter_model.bin, a Python pickle, which can run code "
            f"when it is loaded; kdplug loads safetensors adapters only. Convert it on a machine where you trust the "
            f"file: load it with peft (PeftModel.from_pretrained(base_model, '{directory}')), then "
            f"save_pretrained(NEW_DIR), which writes adapter_model.safetensors, and pass NEW_DIR as --teacher"
        )


def _saves_head(directory: str, modules: Any) -> bool:
    """The adapter's weights include a module of ``modules_to_save`` (the head, for SEQ_CLS)."""
    weights = os.path.join(directory, "adapter_model.safetensors")
    if not modules or not os.path.isfile(weights):
        return bool(modules)
    from safetensors import safe_open

    with safe_open(weights, "pt") as handle:
        names = [set(key.split(".")) for key in handle.keys()]
    return any(set(modules) & parts for parts in names)


def apply_adapter(model: nn.Module, adapter: Adapter) -> nn.Module:
    """``model`` (the base, loaded as a classifier for the task) with the adapter applied by peft and
    merged into its weights: the plain model."""
    peft = require_peft(f"the adapter teacher {adapter.directory}")
    try:
        wrapped = peft.PeftModel.from_pretrained(model, adapter.directory, is_trainable=False)
    except RuntimeError as exc:  # size mismatch: the adapter's head has another number of outputs
        raise UsageError(
            f"the adapter {adapter.directory} does not fit {adapter.base} loaded for this task: {str(exc)[:400]}"
        ) from None
    if not hasattr(wrapped, "merge_and_unload"):
        raise UsageError(
            f"a {adapter.kind} adapter cannot be merged into its base: kdplug reads adapters that merge, such as LoRA"
        )
    return merge(wrapped)

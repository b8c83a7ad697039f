"""Run configuration: one dataclass, loaded from YAML and ``--set key=value`` overrides.

Precedence, lowest first: the dataclass defaults, the YAML file, the command-line flags, then
``--set`` overrides. Unknown keys and values of the wrong type are errors that name the key and
list the valid ones, so a typo never silently runs the wrong experiment.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .errors import ConfigError, close_matches
from .members import (  # noqa: F401 (the engine reads TeacherMember and MEMBER_KEYS from here)
    MEMBER_KEYS,
    PLACEMENT_OPTIONS,
    TeacherMember,
    check_ensemble,
    ensemble_flags,
    member_entries,
    set_member,
)
from .options import advice, expected, fits

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CHECKPOINT_POLICIES = ("best", "last")
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # --report-to name -> package


def tracker_names(report_to: Optional[str]) -> list[str]:
    """``report_to`` (``"tensorboard,wandb"``, ``all``, ``none``) as its names: [] for none, ["all"]
    kept as is; a name kdplug does not know is a ConfigError."""
    names = [part.strip() for part in str(report_to or "none").split(",") if part.strip()]
    if names in ([], ["none"]):
        return []
    if names != ["all"] and not all(name in TRACKERS for name in names):
        raise ConfigError(f"report_to must be none, all, or a comma list of {', '.join(TRACKERS)}, got {report_to!r}")
    return names


#: settings that are unset or a positive whole number, and what an error says they may be
BUDGET = "a positive number of padded tokens per batch, e.g. 2048 (or unset: twice batch_size examples)"
OPTIONAL_POSITIVE = {
    "threads": "at least 1 (or unset: the usable cores that other processes leave free)",
    "max_length": "a positive number of tokens (or unset: 64 for single sentences, 128 for pairs)",
    "teacher_tokens_per_batch": BUDGET,
    "eval_tokens_per_batch": BUDGET,
}


@dataclass
class RunConfig:
    """Everything that defines a run. Each field is documented in ``kdplug run --help``."""

    # components
    teacher: str = "minilm"
    student: str = "bilstm"
    projector: str = "rkd"
    task: str = "demo"
    recipe: Optional[str] = None  # None: the projector's default recipe (two-stage for Universal-KD), else standard
    data_dir: Optional[str] = None
    # component options, passed as keyword arguments to each factory
    teacher_options: dict = field(default_factory=dict)
    # an ensemble: two or more entries {teacher: NAME, teacher_options: {...}, weight: W}; the target is the weighted
    # mean of their probabilities (docs/llm-teachers.md). Empty: the one teacher above
    teachers: list = field(default_factory=list)
    layer_teacher: Optional[int] = None  # the ensemble member (0, 1, ...) whose layers layer methods read
    student_options: dict = field(default_factory=dict)
    projector_options: dict = field(default_factory=dict)
    task_options: dict = field(default_factory=dict)
    recipe_options: dict = field(default_factory=dict)
    # the objective  L = ce_weight * CE + eta * KD + lam * ILD ; None = the projector's default
    eta: Optional[float] = None
    lam: Optional[float] = None
    ce_weight: Optional[float] = (
        None  # None: 1 - eta - lam (ALP-KD's convex form); set it for PKD's (1-a)CE + a KD + b PT
    )
    temperature: Optional[float] = None
    ild_loss: Optional[str] = None  # the loss comparing the projector's pairs; None: the projector's own (ild_loss)
    ild_loss_options: dict = field(default_factory=dict)  # options of ild_loss, when it is set
    kd_loss: Optional[str] = None  # the loss on the logits (η's term); None: "kd" (MSE for regression)
    kd_loss_options: dict = field(default_factory=dict)  # e.g. {standardize: true} (logit standardisation)
    # student training
    epochs: Optional[int] = None  # None: the student family's default (see docs/models.md)
    batch_size: int = 32
    lr: Optional[float] = None  # None: the student family's default (see docs/models.md)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_length: Optional[int] = None  # None = 64 for single sentences, 128 for pairs
    trim_vocab: bool = False  # the student keeps only the vocabulary of the training texts (kdplug/vocab.py) ...
    trim_vocab_corpus: Optional[str] = None  # ... and of this text file (one text per line): what it will serve
    trim_vocab_min_count: int = 1  # a token of trim_vocab_corpus is kept if it occurs at least this often
    best_checkpoint: str = "best"  # "best": the best dev epoch (as the papers report); "last"
    # early stopping: end a stage after this many epochs without a dev improvement; None: 3 where
    # kdplug chose the epoch count (epochs / teacher_epochs unset), off where you set it; 0: off
    patience: Optional[int] = None
    # ... but never before this epoch; None: a quarter of the stage's epochs (a student from scratch can sit at
    # the majority class for its first epochs, and a lucky epoch there must not end its training)
    min_epochs: Optional[int] = None
    seed: int = 42
    teacher_seed: Optional[int] = None  # seeds the teacher's fine-tuning; None = seed (kdplug run --seeds fixes it)
    # transfer set: inputs without gold labels that the student learns the teacher's outputs on
    transfer: list = field(default_factory=list)  # files of unlabelled text (TSV/CSV/JSONL/lines) or datasets dirs
    augment: Optional[str] = None  # an augmenter (kdplug plugins --kind augmenter) applied to the training set
    augment_factor: Optional[int] = None  # augmented copies per example; None: Tang et al.'s 20, 10 for pairs
    augment_options: dict = field(default_factory=dict)  # options of the augmenter, e.g. p_mask
    transfer_ratio: Optional[float] = None  # transfer examples per labelled example in an epoch; None: all of them
    # teacher fine-tuning (when the teacher is not fine-tuned yet)
    teacher_epochs: Optional[int] = None  # None: 3, or more to reach 300 optimizer steps on small data (at most 30)
    teacher_lr: Optional[float] = None  # None: 5e-5, or the teacher's own default (LoRA: 5e-4)
    teacher_batch_size: int = 32
    allow_weak_teacher: bool = False  # distil from a teacher that does not beat the majority class on dev
    # teacher heads warm-up (Universal-KD, DIH)
    head_epochs: int = 10
    head_lr: float = 1e-3
    # runtime
    # auto: teacher inference in bf16 autocast where the device runs bf16 natively (fp16 on CUDA without it),
    # fp32 on a CPU that would emulate it; training fp32 on CPU, bf16/fp16 mixed precision on CUDA
    precision: str = "auto"
    baseline: Optional[str] = None  # also train the student with this projector (e.g. "nkd") to compare
    cache_dir: Optional[str] = None  # default: $KDPLUG_CACHE or ~/.cache/kdplug
    output: Optional[str] = None  # default: runs/<time>-<task>-<student>-<projector>
    num_workers: int = 0
    # batches of the teacher pass and of evaluation by a budget of padded tokens (examples x the longest), sorted by
    # length; None: twice batch_size examples in the data's order, bit for bit as before (docs/performance.md)
    teacher_tokens_per_batch: Optional[int] = None
    eval_tokens_per_batch: Optional[int] = None
    threads: Optional[int] = None  # PyTorch intra-op threads; None: the usable cores other processes leave free
    checkpoint_every: int = 0  # also checkpoint every N steps (0: at epoch ends and stage ends only)
    keep_checkpoints: bool = False  # keep checkpoints/ after the run completes
    measure_speed: bool = True  # time teacher and student at batch 1 and 32 on dev inputs (a few seconds)
    report_to: str = "none"  # experiment tracking: none, all, or a comma list of TRACKERS
    # provenance
    zoo: Optional[str] = None  # the zoo entry this run reproduces (set by 'kdplug zoo run')

    def validate(self) -> RunConfig:
        """Check every value against its valid range (exit 2 naming the key, the value and the range)."""

        def require(ok: bool, key: str, valid: str) -> None:
            if not ok:
                raise ConfigError(f"{key} must be {valid}, got {getattr(self, key)!r}")

        def finite(value: Any) -> bool:
            return isinstance(value, (int, float)) and math.isfinite(value)

        require(self.precision in PRECISIONS, "precision", f"one of {', '.join(PRECISIONS)}")
        require(
            self.best_checkpoint in CHECKPOINT_POLICIES, "best_checkpoint", f"one of {', '.join(CHECKPOINT_POLICIES)}"
        )
        for key in ("batch_size", "teacher_batch_size"):
            require(getattr(self, key) >= 1, key, "at least 1")
        require(self.epochs is None or self.epochs >= 1, "epochs", "at least 1 (or unset for the student's default)")
        require(self.teacher_epochs is None or self.teacher_epochs >= 0, "teacher_epochs", "0 or more (or unset)")
        for key in ("head_epochs", "num_workers"):
            require(getattr(self, key) >= 0, key, "0 or more")
        for key in ("seed", "teacher_seed"):  # numpy's seeds are 32-bit
            value = getattr(self, key)
            require(value is None or 0 <= value < 2**32, key, "0 or more and below 2**32 (4294967296)")
        for key, valid in OPTIONAL_POSITIVE.items():
            require(getattr(self, key) is None or getattr(self, key) >= 1, key, valid)
        require(
            self.patience is None or self.patience >= 0,
            "patience",
            "0 (no early stopping) or a number of epochs without a dev improvement (or unset: 3 where kdplug "
            "chooses the epochs)",
        )
        require(
            self.min_epochs is None or self.min_epochs >= 0,
            "min_epochs",
            "0 or more epochs before early stopping may end a stage (or unset: a quarter of the stage's epochs)",
        )
        require(self.checkpoint_every >= 0, "checkpoint_every", "0 (epoch ends only) or a positive step count")
        for key in ("lr", "teacher_lr", "head_lr"):
            value = getattr(self, key)
            require(value is None or (finite(value) and value > 0), key, "a positive finite number, e.g. 5e-5")
        require(finite(self.weight_decay) and self.weight_decay >= 0, "weight_decay", "0 or a positive finite number")
        require(finite(self.warmup_ratio) and 0 <= self.warmup_ratio <= 1, "warmup_ratio", "between 0 and 1")
        for key in ("eta", "lam", "ce_weight"):
            value = getattr(self, key)
            require(value is None or (finite(value) and value >= 0), key, "0 or a positive finite number")
        if self.ce_weight is None and (self.eta or 0.0) + (self.lam or 0.0) > 1.0 + 1e-9:
            raise ConfigError(
                f"eta + lam = {(self.eta or 0.0) + (self.lam or 0.0):g} exceeds 1, so the CE weight 1 - eta - lam "
                f"would be negative; lower them, or set the CE weight yourself with ce_weight (PKD's objective "
                f"(1-a)CE + a KD + b PT: --set ce_weight=0.8 --set eta=0.2 --set lam=100)"
            )
        require(
            self.temperature is None or (finite(self.temperature) and self.temperature > 0),
            "temperature",
            "a positive finite number",
        )
        tracker_names(self.report_to)
        check_ensemble(self)
        require(
            self.augment_factor is None or self.augment_factor >= 1,
            "augment_factor",
            "at least 1 (augmented copies per training example)",
        )
        require(
            self.transfer_ratio is None or (finite(self.transfer_ratio) and self.transfer_ratio > 0),
            "transfer_ratio",
            "a positive number of transfer examples per labelled one (or unset: all)",
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def is_ensemble(self) -> bool:
        return bool(self.teachers)

    def members(self) -> list[TeacherMember]:
        """The run's teachers: the ensemble's members in order, or the one teacher (weight 1)."""
        if not self.teachers:
            return [TeacherMember(index=0, name=self.teacher, options=dict(self.teacher_options), weight=1.0)]
        scaled = [float(entry.get("weight", 1.0)) for entry in self.teachers]
        if not math.isfinite(sum(scaled)):  # weights near 1e308: their sum overflows, their ratios do not
            scaled = [weight / max(scaled) for weight in scaled]
        return [
            TeacherMember(
                index=index,
                name=entry["teacher"],
                options=dict(entry.get("teacher_options") or {}),
                weight=scaled[index] / sum(scaled),
            )
            for index, entry in enumerate(self.teachers)
        ]

    def member_config(self, member: TeacherMember) -> RunConfig:
        """This configuration with ``member`` as its one teacher: what every single-teacher step (its
        checks, fine-tuning, outputs) reads."""
        return dataclasses.replace(
            self, teacher=member.name, teacher_options=dict(member.options), teachers=[], layer_teacher=None
        )


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
_HINTS = typing.get_type_hints(RunConfig)


def _unknown_key(key: str, valid: list[str]) -> ConfigError:
    close = close_matches(key, valid)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown configuration key {key!r}.{hint} Valid keys: {', '.join(valid)}")


def _coerce(key: str, value: Any) -> Any:
    """Check ``value`` against the field type of ``key`` (kdplug/options.py, as every component option
    is checked); a whole number given for a float becomes one, a single path a list of one."""
    hint = _HINTS[key]
    if isinstance(value, str) and list in (hint, *typing.get_args(hint)):  # a single path is a list of one
        value = [value]
    shown = (f"{value!r}" if len(repr(value)) <= 60 else f"{repr(value)[:57]}...") if value is not None else "empty"
    if not fits(value, hint):
        raise ConfigError(f"{key} must be {expected(hint)}, got {shown} ({type(value).__name__}){advice(value, hint)}")
    if isinstance(value, int) and not isinstance(value, bool) and float in (hint, *typing.get_args(hint)):
        if abs(value) > sys.float_info.max:  # float() would raise OverflowError
            raise ConfigError(f"{key} must be a number at most {sys.float_info.max:g}, got {shown} (int)")
        return float(value)
    return list(value) if isinstance(value, (list, tuple)) else dict(value) if isinstance(value, dict) else value


def parse_value(text: str) -> Any:
    """A ``--set`` value, read as YAML: ``3`` -> 3, ``1e-5`` -> 1e-05, ``[1,5,9]`` -> list; text in quotes
    stays text (``"010"``)."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError:
        return text


def apply(config: RunConfig, values: dict[str, Any], *, source: str) -> RunConfig:
    """Set ``values`` (possibly dotted, ``student_options.hidden_size``) on ``config``."""
    valid = sorted(FIELDS)
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if head not in FIELDS:
            raise ConfigError(f"{source}: " + str(_unknown_key(head, valid)))
        try:
            if head == "teachers":
                value = set_member(config.teachers, rest, value) if rest else member_entries(value)
                config.teachers = _coerce(head, value)
            elif rest:
                if _HINTS[head] is not dict:
                    raise ConfigError(f"{head} has no sub-keys; use {head}=VALUE")
                options = dict(getattr(config, head))
                options[rest] = value
                setattr(config, head, options)
            else:
                setattr(config, head, _coerce(head, value))
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return config


class UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """kdplug's one YAML loader (configs, zoo entries, sweep files, ``--set`` values): safe, in C
    where PyYAML has it, and refusing a mapping with the same key twice (PyYAML keeps the last
    one, so a typo'd duplicate would silently run another experiment)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} appears twice (first at line {seen[key].line + 1}); keep one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads a number with an exponent but no point (1e-5) as text; YAML 1.2, JSON and Python read a number
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, where: str) -> Any:
    """``text`` read with :class:`UniqueKeyLoader`; malformed YAML is a ConfigError naming ``where``
    and the line."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {path} does not exist")
    data = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of configuration keys, got {type(data).__name__}")
    return data


def parse_overrides(items: list[str], flag: str = "--set") -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` from a repeatable command-line ``flag``, values read as YAML."""
    overrides = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} expects KEY=VALUE (e.g. {flag} lr=2e-5), got {item!r}")
        overrides[key.strip()] = parse_value(text)
    return overrides


def build_config(
    *,
    file: Optional[str] = None,
    flags: Optional[dict[str, Any]] = None,
    overrides: Optional[list[str]] = None,
    base: Optional[dict[str, Any]] = None,
) -> RunConfig:
    config = RunConfig()
    if base:
        apply(config, base, source="defaults")
    if file:
        apply(config, load_yaml(file), source=str(file))
    if flags:
        apply(config, {k: v for k, v in flags.items() if v is not None}, source="command line")
    if overrides:
        apply(config, parse_overrides(overrides), source="--set")
    _absolute_offload_folder(config)
    return config.validate()


def _absolute_offload_folder(config: RunConfig) -> None:
    """``teacher_options.offload_folder`` (each member's, in an ensemble) from where it was given: config.yaml
    keeps it absolute, so a ``--resume`` from another directory offloads into the same folder."""
    members = [entry for entry in config.teachers if isinstance(entry, dict)]
    for options in [config.teacher_options] + [entry.get("teacher_options") for entry in members]:
        folder = options.get("offload_folder") if isinstance(options, dict) else None
        if isinstance(folder, str) and folder:
            options["offload_folder"] = os.path.abspath(os.path.expanduser(folder))


def set_values(values: Optional[dict]) -> dict:
    """A configuration's keys that are set: a key an earlier version did not write is the same
    configuration as one a later version writes as null."""
    return {key: value for key, value in (values or {}).items() if value is not None}


def dump_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


#: keys a command line never needs to reproduce a run's results
LOCAL_KEYS = ("output", "cache_dir", "num_workers", "threads", "zoo", "report_to")
_FLAGS = ("teacher", "student", "projector", "task", "recipe", "data_dir", "seed", "epochs", "precision", "baseline")


def command_line(config: RunConfig) -> str:
    """A ``kdplug run`` command that reproduces ``config`` (paths and cache locations aside)."""
    import shlex

    defaults = RunConfig()
    parts = ["kdplug", "run"]
    for key in _FLAGS:
        value = getattr(config, key)
        if key == "teacher" and config.teachers:
            parts += ensemble_flags(config.teachers, _yaml_value)
        elif value is not None and (
            key in ("teacher", "student", "projector", "task", "recipe", "seed") or value != getattr(defaults, key)
        ):
            parts += [f"--{key.replace('_', '-')}", str(value)]
    for key in FIELDS:
        if key in _FLAGS or key in LOCAL_KEYS or (key == "teachers" and config.teachers):
            continue
        value = getattr(config, key)
        if isinstance(value, dict):
            parts += [f"--set {key}.{name}={_yaml_value(item)}" for name, item in sorted(value.items())]
        elif value != getattr(defaults, key):
            parts.append(f"--set {key}={_yaml_value(value)}")
    return " ".join(part if part.startswith("--set ") else shlex.quote(part) for part in parts)


def _yaml_value(value: Any) -> str:
    import shlex

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("\n...").strip()
    return shlex.quote(text) if any(c in text for c in " []{}'\",*") else text


def renamed_prompted_teacher(settings: dict[str, Any]) -> Optional[dict[str, Any]]:
    """``settings`` (a run's config, as a dict) with a prompted language model spelt as before it had
    a name of its own (``teacher: DIR`` or ``hf`` with ``teacher_options.prompt``) spelt as today
    (``teacher: prompted-lm``, ``teacher_options.source: DIR``); None when they are spelt as today.
    Kept so that a run saved before the rename resumes, and its checkpoints' settings still match."""
    teacher, options = settings.get("teacher"), dict(settings.get("teacher_options") or {})
    if "prompt" not in options or teacher is None or teacher == "prompted-lm":
        return None
    if teacher != "hf" and "/" not in teacher and not os.path.isdir(os.path.expanduser(teacher)):
        return None  # a teacher plugin of its own that takes a prompt
    source = options.pop("source", None) if teacher == "hf" else teacher
    if teacher != "hf" and options.get("source", source) != source:
        raise ConfigError(
            f"the configuration names the prompted teacher twice, teacher: {teacher} and teacher_options.source: "
            f"{options['source']}; keep one (today's spelling: teacher: prompted-lm, teacher_options.source: DIR)"
        )
    return {**settings, "teacher": "prompted-lm", "teacher_options": {"source": source, **options}}

"""Run configuration: one dataclass, loaded from YAML and ``--set key=value`` overrides.

Precedence, lowest first: the dataclass defaults, the YAML file, the command-line flags, then
``--set`` overrides. Unknown keys and values of the wrong type are errors that name the key and
list the valid ones, so a typo never silently runs the wrong experiment.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from .errors import ConfigError, close_matches

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CHECKPOINT_POLICIES = ("best", "last")


@dataclass
class RunConfig:
    """Everything that defines a run. Each field is documented in ``kdplug run --help``."""

    # components
    teacher: str = "minilm"
    student: str = "bilstm"
    projector: str = "rkd"
    task: str = "demo"
    recipe: str = "standard"
    data_dir: Optional[str] = None
    # component options, passed as keyword arguments to each factory
    teacher_options: dict = field(default_factory=dict)
    student_options: dict = field(default_factory=dict)
    projector_options: dict = field(default_factory=dict)
    task_options: dict = field(default_factory=dict)
    recipe_options: dict = field(default_factory=dict)
    # the objective  L = (1 - eta - lam) * CE + eta * KD + lam * ILD ; None = the projector's default
    eta: Optional[float] = None
    lam: Optional[float] = None
    temperature: Optional[float] = None
    # student training
    epochs: int = 3
    batch_size: int = 32
    lr: Optional[float] = None  # None = the student's default_lr attribute, else 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_length: Optional[int] = None  # None = 64 for single sentences, 128 for pairs
    best_checkpoint: str = "best"  # "best": the best dev epoch (as the papers report); "last"
    seed: int = 42
    teacher_seed: Optional[int] = None  # seeds the teacher's fine-tuning; None = seed (kdplug run --seeds fixes it)
    # teacher fine-tuning (when the teacher is not fine-tuned yet)
    teacher_epochs: int = 3
    teacher_lr: float = 5e-5
    teacher_batch_size: int = 32
    # teacher heads warm-up (Universal-KD, DIH)
    head_epochs: int = 10
    head_lr: float = 1e-3
    # runtime
    precision: str = "auto"  # auto: bf16 teacher inference where supported, fp32 training on CPU
    baseline: Optional[str] = None  # also train the student with this projector (e.g. "nkd") to compare
    cache_dir: Optional[str] = None  # default: $KDPLUG_CACHE or ~/.cache/kdplug
    output: Optional[str] = None  # default: runs/<time>-<task>-<student>-<projector>
    num_workers: int = 0
    checkpoint_every: int = 0  # also checkpoint every N steps (0: at epoch ends and stage ends only)
    keep_checkpoints: bool = False  # keep checkpoints/ after the run completes
    # provenance
    zoo: Optional[str] = None  # the zoo entry this run reproduces (set by 'kdplug zoo run')

    def validate(self) -> "RunConfig":
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.best_checkpoint not in CHECKPOINT_POLICIES:
            raise ConfigError(
                f"best_checkpoint must be one of {', '.join(CHECKPOINT_POLICIES)}, got {self.best_checkpoint!r}")
        for name in ("epochs", "batch_size", "teacher_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be 0 (epoch ends only) or a positive step count, got {self.checkpoint_every}")
        if self.teacher_epochs < 0 or self.head_epochs < 0:
            raise ConfigError("teacher_epochs and head_epochs must be at least 0")
        for name in ("eta", "lam"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {value}")
        if (self.eta or 0.0) + (self.lam or 0.0) > 1.0 + 1e-9:
            raise ConfigError(f"eta + lam must not exceed 1 (the CE weight is 1 - eta - lam); got {self.eta} + {self.lam}")
        if self.temperature is not None and self.temperature <= 0:
            raise ConfigError(f"temperature must be positive, got {self.temperature}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
_HINTS = typing.get_type_hints(RunConfig)


def _unknown_key(key: str, valid: list[str]) -> ConfigError:
    close = close_matches(key, valid)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown configuration key {key!r}.{hint} Valid keys: {', '.join(valid)}")


def _coerce(key: str, value: Any) -> Any:
    """Check ``value`` against the field type of ``key``; YAML scalars are converted."""
    hint = _HINTS[key]
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} may not be empty")
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if base is bool and isinstance(value, bool):
        return value
    if base is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if base is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if base is dict and isinstance(value, dict):
        return dict(value)
    raise ConfigError(f"{key} must be {getattr(base, '__name__', base)}, got {value!r} ({type(value).__name__})")


def parse_value(text: str) -> Any:
    """A ``--set`` value, read as YAML: ``3`` -> 3, ``1e-5`` -> 1e-05, ``[1,5,9]`` -> list."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # YAML 1.1 reads 1e-5 as a string
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply(config: RunConfig, values: dict[str, Any], *, source: str) -> RunConfig:
    """Set ``values`` (possibly dotted, ``student_options.hidden_size``) on ``config``."""
    valid = sorted(FIELDS)
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if head not in FIELDS:
            raise ConfigError(f"{source}: " + str(_unknown_key(head, valid)))
        try:
            if rest:
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


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
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


def build_config(*, file: Optional[str] = None, flags: Optional[dict[str, Any]] = None,
                 overrides: Optional[list[str]] = None, base: Optional[dict[str, Any]] = None) -> RunConfig:
    config = RunConfig()
    if base:
        apply(config, base, source="defaults")
    if file:
        apply(config, load_yaml(file), source=str(file))
    if flags:
        apply(config, {k: v for k, v in flags.items() if v is not None}, source="command line")
    if overrides:
        apply(config, parse_overrides(overrides), source="--set")
    return config.validate()


def dump_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)

"""An ensemble of teachers in a run's configuration: the ``teachers`` entries, how ``--set teachers.N...``
sets them, their checks, and the command line that gives them again (kdplug/config.py holds the rest)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

MEMBER_KEYS = ("teacher", "teacher_options", "weight")
#: teacher options that say where the teacher's modules go, not what it computes (the cache key ignores them)
PLACEMENT_OPTIONS = ("device_map", "max_memory", "offload_folder")


def check_ensemble(config: Any) -> None:  # a RunConfig (kdplug/config.py imports this module)
    """The ``teachers`` entries and ``layer_teacher`` (a ConfigError naming the entry and the fix); with an
    ensemble, ``teacher`` becomes its first member's name (what a run shows as its teacher)."""
    if not config.teachers:
        if config.layer_teacher not in (None, 0):
            raise ConfigError(f"layer_teacher must be 0 or unset with one teacher, got {config.layer_teacher!r}")
        return
    for index, entry in enumerate(config.teachers):
        check_member(index, entry)
    if len(config.teachers) < 2:
        raise ConfigError(
            "teachers lists an ensemble: give two or more entries, or the one teacher with teacher: NAME "
            "(--teacher NAME)"
        )
    first = config.teachers[0]["teacher"]
    if config.teacher not in ({f.name: f for f in dataclasses.fields(config)}["teacher"].default, first):
        raise ConfigError(
            f"teacher {config.teacher!r} and teachers ({names(e['teacher'] for e in config.teachers)}) both name "
            f"the run's teacher; give one: teachers for an ensemble (--teacher A --teacher B), teacher for one"
        )
    if config.teacher_options:
        raise ConfigError(
            f"teacher_options ({', '.join(map(str, config.teacher_options))}) are one teacher's options, and this run "
            f"has {len(config.teachers)} teachers: set a member's with --set teachers.N.teacher_options.KEY=VALUE "
            f"(N from 0 to {len(config.teachers) - 1}), or under that member's teacher_options in the file"
        )
    check_duplicate_members(config.teachers)
    for member in config.members():
        if member.weight == 0.0:  # its share of the sum underflows (1e-308 beside 1e308)
            raise ConfigError(
                f"teachers[{member.index}].weight {config.teachers[member.index]['weight']!r} is too small a share "
                f"of the weights' sum to be a number: the member would count for nothing, its outputs computed all "
                f"the same. Drop it, or give it a larger weight"
            )
    if config.layer_teacher is not None and not (
        isinstance(config.layer_teacher, int) and 0 <= config.layer_teacher < len(config.teachers)
    ):
        raise ConfigError(
            f"layer_teacher must be the position of an ensemble member, 0 to {len(config.teachers) - 1}, "
            f"got {config.layer_teacher!r}"
        )
    config.teacher = first


def check_member(index: int, entry: Any) -> None:
    """One ``teachers`` entry: a mapping of MEMBER_KEYS with a teacher's name and a positive weight."""
    where = f"teachers[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(
            f"{where} must be a mapping {{teacher: NAME, teacher_options: {{...}}, weight: W}} or a teacher's "
            f"name, got {_shown(entry)}"
        )
    unknown = sorted(map(str, set(entry) - set(MEMBER_KEYS)))
    if unknown:
        raise ConfigError(f"{where} has unknown keys {', '.join(unknown)}; valid: {', '.join(MEMBER_KEYS)}")
    if not isinstance(entry.get("teacher"), str) or not entry["teacher"].strip():
        raise ConfigError(
            f"{where}.teacher must name a teacher (a name from 'kdplug plugins', a checkpoint directory or a hub "
            f"id), got {_shown(entry.get('teacher'))}"
        )
    if not isinstance(entry.get("teacher_options", {}), dict):
        raise ConfigError(f"{where}.teacher_options must be a mapping, got {_shown(entry['teacher_options'])}")
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not _finite(weight) or not weight > 0:
        raise ConfigError(
            f"{where}.weight must be a positive finite number (weights need not sum to 1), got {_shown(weight)}"
            + (" (text: write the number without quotes)" if isinstance(weight, str) else "")
        )


def _finite(value: float) -> bool:
    return abs(value) <= sys.float_info.max and math.isfinite(value)  # a whole number past 1e308 is no float


def names(items: Iterable[str], most: int = 4) -> str:
    """``a, b, c, d and 96 more``: a list for a message, however long."""
    items = list(items)
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def check_duplicate_members(teachers: list) -> None:
    """Two members that compute the same thing (same name, same options but where the model goes) would
    count one teacher twice: a weight says that. A directory is the same by any path to it (a symlink, ``dir/``)."""
    seen: dict[str, int] = {}
    for index, entry in enumerate(teachers):
        options = {k: v for k, v in (entry.get("teacher_options") or {}).items() if k not in PLACEMENT_OPTIONS}
        key = repr((_same_directory(entry["teacher"]), sorted(options.items(), key=lambda item: str(item[0]))))
        if key in seen:
            raise ConfigError(
                f"teachers[{seen[key]}] and teachers[{index}] are the same teacher ({entry['teacher']}, the same "
                f"options): the ensemble would count it twice. List it once and give it a larger weight "
                f"(teachers.{seen[key]}.weight=2), or give the two different options"
            )
        seen[key] = index


def _same_directory(name: str) -> str:
    """A teacher's directory as its real path (so two paths to it compare equal); any other name as given."""
    path = os.path.expanduser(name)
    return os.path.realpath(path) if os.path.isdir(path) else name


def set_member(teachers: list, path: str, value: Any) -> list:
    """``teachers`` with ``path`` (``N``, ``N.teacher``, ``N.weight``, ``N.teacher_options[.KEY]``: a
    ``--set teachers.PATH=VALUE``) set to ``value``; N is a member's position, and N = the count adds one."""
    number, _, key = path.partition(".")
    if not number.isdigit():
        raise ConfigError(
            f"teachers.{path}: after teachers. comes a member's position (teachers.0.weight=2, "
            f"teachers.1.teacher_options.KEY=VALUE), got {number!r}"
        )
    index, entries = int(number), [dict(e) if isinstance(e, dict) else e for e in teachers]
    if index > len(entries):
        have = f"teachers.0 to teachers.{len(entries) - 1}, or " if entries else ""
        raise ConfigError(
            f"teachers.{path}: the run has {len(entries)} teachers in its teachers list; use {have}teachers."
            f"{len(entries)} to add one"
        )
    if index == len(entries):
        entries.append({})
    if not key:
        entries[index] = {"teacher": value} if isinstance(value, str) else value
        return entries
    field_name, _, option = key.partition(".")
    if (
        not isinstance(entries[index], dict)
        or field_name not in MEMBER_KEYS
        or (option and field_name != "teacher_options")
    ):
        raise ConfigError(
            f"teachers.{path}: a member's keys are {', '.join(MEMBER_KEYS)} "
            f"(e.g. teachers.{index}.teacher_options.KEY=VALUE)"
        )
    if option:
        options = entries[index].get("teacher_options")
        entries[index]["teacher_options"] = {**(options if isinstance(options, dict) else {}), option: value}
    else:
        entries[index][field_name] = value
    return entries


def member_entries(value: Any) -> Any:
    """A ``teachers`` list as given, a name alone standing for ``{teacher: NAME}``; text is refused (one name is
    the ``teacher`` key, several are a list)."""
    if isinstance(value, str):
        raise ConfigError(
            f"teachers is a list of teachers ({{teacher: NAME, teacher_options: ..., weight: W}} or names), got "
            f"the text {_shown(value)}; several teachers: --teacher A --teacher B (teachers: [A, B]); one: teacher"
        )
    if isinstance(value, dict):
        raise ConfigError(
            f"teachers is a list of two or more teachers, got one mapping {_shown(value)}: write it as a list "
            f"(teachers: [{{teacher: A}}, {{teacher: B}}]), or give one teacher with teacher and teacher_options"
        )
    if not isinstance(value, (list, tuple)):
        return value  # _coerce names the type
    return [{"teacher": entry} if isinstance(entry, str) else entry for entry in value]


@dataclass(frozen=True, kw_only=True)
class TeacherMember:
    """One teacher of a run: its position in the ensemble, its name, options and normalised weight."""

    index: int
    name: str
    options: dict
    weight: float


def ensemble_flags(teachers: list, quoted: Callable[[Any], str]) -> list[str]:
    """An ensemble's command line: ``--teacher`` per member, ``--teacher-weights`` where a weight is given,
    ``--set teachers.N.teacher_options.KEY=VALUE`` per option."""
    parts = [item for entry in teachers for item in ("--teacher", entry["teacher"])]
    weights = [entry.get("weight", 1.0) for entry in teachers]
    if any(weight != 1.0 for weight in weights):
        parts += ["--teacher-weights", *(f"{weight!r}" for weight in weights)]
    for index, entry in enumerate(teachers):
        options = sorted((entry.get("teacher_options") or {}).items())
        parts += [f"--set teachers.{index}.teacher_options.{name}={quoted(item)}" for name, item in options]
    return parts

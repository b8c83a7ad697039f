"""A tiny run for tests: a complete ``kdplug run`` that finishes in seconds on a CPU.

The defaults distil into a 16-wide BiLSTM with RKD, one epoch each for the teacher's fine-tuning
and the student, and accept the teacher however little it learned (a dozen dev sentences cannot
judge it). Add a tiny teacher and data, e.g. the pytest fixtures ``kdplug_tiny_bert`` and
``kdplug_sst2_dir``::

    from kdplug.cli import main
    from kdplug.testing import tiny_run_args

    main(["run", *tiny_run_args(teacher=kdplug_tiny_bert, task="sst2", data_dir=kdplug_sst2_dir)])
    main(["run", *tiny_run_args(teacher=..., projector="mean-combine", batch_size=4, output=run_dir)])

``tiny_run_settings`` is the same run as configuration keys, for ``kdplug.distill(**settings)``;
``set_args(tiny_run_settings(...))`` gives them all as ``--set KEY=VALUE`` (for ``kdplug sweep``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Union

#: what a tiny run sets, in the order its command line gives it
TINY_RUN_SETTINGS: Mapping[str, Any] = {
    "student": "bilstm",
    "projector": "rkd",
    "epochs": 1,
    "teacher_epochs": 1,
    "allow_weak_teacher": True,
    "student_options": {"embedding_dim": 16, "hidden_size": 16},
}

#: settings given by their own flag of ``kdplug run`` (the others by ``--set KEY=VALUE``)
FLAGS = {
    "teacher": "--teacher",
    "student": "--student",
    "projector": "--projector",
    "task": "--task",
    "data_dir": "--data-dir",
    "epochs": "--epochs",
}
#: the order the flags come in: the components, the task, then the training length
FLAG_ORDER = ("teacher", "student", "projector", "task", "data_dir", "epochs")

Setting = Union[str, int, float, bool, os.PathLike, Mapping[str, Any], None]


def tiny_run_settings(**overrides: Setting) -> dict[str, Any]:
    """The tiny run's configuration keys, with ``overrides`` (a key set to None is left out).

    ``tiny_run_settings(projector="alp", batch_size=4)`` changes the projector and adds
    ``batch_size``; ``student_options`` replaces the student's options as a whole.
    """
    settings = {**TINY_RUN_SETTINGS, **overrides}
    return {key: value for key, value in settings.items() if value is not None}


def tiny_run_args(**overrides: Setting) -> list[str]:
    """The tiny run's arguments to ``kdplug run`` (without ``run`` itself): ``--teacher``,
    ``--student``, ``--projector``, ``--task``, ``--data-dir`` and ``--epochs`` for the keys they
    set, ``--set KEY=VALUE`` for the others (nested options as ``student_options.hidden_size=16``,
    booleans as ``true``/``false``), ``--output`` last. ``overrides`` as for :func:`tiny_run_settings`.
    """
    settings = tiny_run_settings(**overrides)
    output = settings.pop("output", None)
    args = [part for key in FLAG_ORDER if key in settings for part in (FLAGS[key], _text(settings.pop(key)))]
    return args + set_args(settings) + (["--output", _text(output)] if output is not None else [])


def set_args(settings: Mapping[str, Any]) -> list[str]:
    """``--set KEY=VALUE`` for every setting, nested options as ``student_options.hidden_size=16``:
    what commands without a flag per key take (``kdplug sweep``, ``kdplug zoo run``)."""
    return [
        part
        for key, value in settings.items()
        for assignment in _assignments(key, value)
        for part in ("--set", assignment)
    ]


def _assignments(key: str, value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [assignment for name, item in value.items() for assignment in _assignments(f"{key}.{name}", item)]
    return [f"{key}={_text(value)}"]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)

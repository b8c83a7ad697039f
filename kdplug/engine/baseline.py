"""``--baseline``: the run's student trained a second time by another projector's own method, for
the comparison table. It shares the run's teacher, data and caches, and trains as that method
defines it (its own recipe, weights, temperature and losses), its stages recorded as
``baseline-<projector>-<stage>``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config import RunConfig
from ..types import ProjectorCapabilities
from . import preflight
from .recipe import EngineContext, run_recipe
from .results import Row
from .trainer import count_parameters

#: the settings a ``--baseline`` student takes from its own method, not from the run
BASELINE_OWN_SETTINGS = {
    "eta": None,
    "lam": None,
    "ce_weight": None,
    "temperature": None,
    "kd_loss": None,
    "kd_loss_options": {},
    "ild_loss": None,
    "ild_loss_options": {},
}


def settings_left_out(config: RunConfig) -> str:
    """The run's objective settings a ``--baseline`` student does not use, for its stages' lines."""
    kept = {key: getattr(config, key) for key in BASELINE_OWN_SETTINGS if getattr(config, key) not in (None, {})}
    if not kept:
        return ""
    listed = ", ".join(
        f"{key} {value:g}" if isinstance(value, (int, float)) else f"{key} {value!r}" for key, value in kept.items()
    )
    return f"; trained as its method defines it, not with the run's {listed}"


@dataclass
class Baseline:
    """The trained baseline, measured: metrics.json's ``baseline``, its table row, and its dev
    predictions (for paired comparisons with the run's student)."""

    record: dict[str, Any]
    row: Row
    predictions: dict[str, dict[str, list]]


def run_baseline(context: EngineContext, echo: Callable[[str], None]) -> Baseline:
    """Train the ``--baseline`` student (see :func:`baseline_context`) and score it on dev."""
    config = context.config
    echo(f"baseline: {config.student} with {config.baseline}")
    student, recipe = train_baseline(context)
    dev = context.splits_for(student)[1]
    predictions: dict[str, list] = {}
    scores = context.trainer.evaluate(student, dev, predictions)
    return Baseline(
        record={
            "projector": config.baseline,
            "recipe": recipe,
            "dev": scores,
            "parameters": count_parameters(student),
        },
        row=Row(f"{config.student} + {config.baseline}", count_parameters(student), scores),
        predictions={name: {"predictions": predictions[name], "labels": split.labels} for name, split in dev.items()},
    )


def train_baseline(context: EngineContext) -> tuple[nn.Module, str]:
    """The ``--baseline`` student and its recipe: the run's student trained by the baseline
    projector's own schedule and weights (see :func:`baseline_context`), two stages for
    universal-*."""
    baseline = baseline_context(context)
    student = run_recipe(baseline, {}, "the trained student")
    context.adopt(baseline)
    return student, baseline.config.recipe


def baseline_context(context: EngineContext) -> EngineContext:
    """The context of the ``--baseline`` student: the run with the baseline as its projector, trained
    as that method defines it: its own schedule (its ``default_recipe``, else the default recipe),
    default weights and temperature, and losses (the run's eta, lam, ce_weight, temperature,
    kd_loss, ild_loss and their options are meant for its projector; Universal-KD's paper, e.g.,
    trains at τ = 1 with the KD loss of its eq. 1). Data, teacher and caches are shared; the stages
    are recorded as ``baseline-<projector>-<stage>``, and their lines name the settings left out."""
    config = context.config
    recipe = preflight.declared(context.registry, ProjectorCapabilities, config.baseline).default_recipe
    settings = dataclasses.replace(
        config,
        projector=config.baseline,
        projector_options={},
        recipe=recipe or preflight.default_recipe(context.registry),
        recipe_options={},
        **BASELINE_OWN_SETTINGS,
    )
    return dataclasses.replace(
        context,
        config=settings,
        stage_prefix=f"baseline-{config.baseline}-",
        stage_note=settings_left_out(config),
        last_distillation=None,
    )

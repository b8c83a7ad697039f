"""After the recipe: the trained student measured on dev beside its teacher (and the ``--baseline``),
what it learned of the teacher (agreement, the attention and layer analysis), the teacher outputs
the run cached, and the inference speed of both models: metrics.json's records and the table's rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn

from ..capabilities import StudentCapabilities, capabilities
from ..hub import display_name
from ..layout import ATTENTION_PLOT
from ..types import RecipeCapabilities, matchable_layers
from . import analysis, preflight
from . import speed as speed_module
from .baseline import Baseline
from .data import EncodedSplit
from .ensemble import EnsembleOutputs
from .inputs import RunEnvironment, RunInputs
from .recipe import EngineContext
from .results import Row, agreement
from .trainer import count_parameters


@dataclass
class Evaluation:
    """The trained student, measured: its dev splits (as it reads them) and predictions on them,
    the closing table's rows, and the record of the teacher outputs the run cached."""

    student: nn.Module
    dev: dict[str, EncodedSplit]
    predictions: dict[str, list]
    rows: list[Row]
    cached: dict[str, Any]


def evaluate(
    context: EngineContext,
    inputs: RunInputs,
    student: nn.Module,
    baseline: Optional[Baseline],
    env: RunEnvironment,
    run_dir: Path,
    record: Callable[[dict[str, Any]], None],
) -> Evaluation:
    """Measure ``student``; each of metrics.json's records goes to ``record`` as soon as it is
    known, so that a run that fails later keeps it."""
    config, task = context.config, inputs.task
    dev = context.splits_for(student)[1]
    predictions: dict[str, list] = {}
    scores = inputs.trainer.evaluate(student, dev, predictions)
    if context.last_distillation is not None and env.main_process:
        record({"analysis": analyse(context, student, env, run_dir)})
    record({"stages": context.stages})
    cached = teacher_records(context, inputs)
    if inputs.transfer is not None:
        record(
            {
                "transfer": {
                    **inputs.transfer.meta,
                    "directory": str(inputs.transfer.directory),
                    "teacher_cache": context.source.transfer_info,
                }
            }
        )
    if inputs.dev_caches is not None and not task.is_regression:
        # how often the student predicts what the teacher predicts: what distillation optimises
        record({"agreement": {name: agreement(predictions[name], inputs.dev_caches[name]) for name in dev}})
    record({"student": student_record(context, student, scores)})
    teachers = teacher_rows(config.teacher, inputs.teacher_info)
    rows = [
        *teachers,
        *([baseline.row] if baseline is not None else []),
        Row(student_label(context), count_parameters(student), scores),
    ]
    if config.measure_speed:
        env.echo("measuring inference speed: teacher and student, batch 1 and 32, on dev inputs")
        record({"speed": measure_speed(inputs, student, dev, rows, env, teachers=len(teachers))})
    return Evaluation(student, dev, predictions, rows, cached)


def teacher_rows(name: str, teacher: dict[str, Any]) -> list[Row]:
    """The table's teacher rows: the teacher's; or each ensemble member's (with its weight) and the ensemble's."""
    members = teacher.get("members")
    if not members:
        return [Row(f"teacher ({display_name(name)})", shown_parameters(teacher), teacher.get("dev", {}))]
    return [
        *(
            Row(
                f"teacher {member['index']} ({display_name(member['name'])}, weight {member['weight']:.3g})",
                shown_parameters(member),
                member.get("dev", {}),
            )
            for member in members
        ),
        Row(f"ensemble of {len(members)} teachers", ensemble_parameters(teacher), teacher.get("dev", {})),
    ]


def ensemble_parameters(teacher: dict[str, Any]) -> Optional[int]:
    """An ensemble's parameter count for the table; None with a served member (the others' sum is not its size)."""
    return None if any(member.get("served_remotely") for member in teacher["members"]) else teacher["parameters"]


def shown_parameters(teacher: dict[str, Any]) -> Optional[int]:
    """A teacher's parameter count for the table; None for a served one (its weights are the server's)."""
    return None if teacher.get("served_remotely") else teacher["parameters"]


def analyse(context: EngineContext, student: nn.Module, env: RunEnvironment, run_dir: Path) -> dict[str, Any]:
    """The attention and layer records of the last stage that distilled, on the first dev split."""
    stage, module = context.last_distillation
    first = context.task.dev_splits[0]
    written = analysis.write(
        run_dir,
        stage,
        module,
        first,
        context.splits_for(student)[1][first],
        context.teacher_cache()[1][first],
        list(matchable_layers(context.registry.find_layer_extractor(student).layer_specs(student))),
        batch_size=context.config.batch_size * 2,
        device=env.accelerator.device,
    )
    if env.tracker is not None:
        env.tracker.log_image(f"{stage}/attention", run_dir / ATTENTION_PLOT)
    return written


def teacher_records(context: EngineContext, inputs: RunInputs) -> dict[str, Any]:
    """Adds to metrics.json's ``teacher`` the outputs the run cached (per split: the bytes of logits
    and of layer vectors, and whether each was reused) and the variation of the layers it matched;
    returns the first."""
    source = context.source  # the run's: engine/live.py
    cached = {
        **inputs.caches.record(),
        **({"transfer": source.transfer_info["cache"]} if "cache" in source.transfer_info else {}),
    }
    if cached:
        inputs.teacher_info["cache"] = cached
    if hasattr(inputs.caches, "record_members"):  # an ensemble: each member's own record too
        inputs.caches.record_members()
    if source.layer_variation:  # measured where a layer method matched the teacher's layers
        inputs.teacher_info["layer_variation"] = {str(layer): share for layer, share in source.layer_variation.items()}
    return cached


def student_record(context: EngineContext, student: nn.Module, scores: dict[str, Any]) -> dict[str, Any]:
    """metrics.json's ``student``: what it is, how it was trained and how it scores on dev."""
    config = context.config
    return {
        "name": config.student,
        "projector": config.projector,
        "recipe": config.recipe,
        "default_recipe": preflight.default_recipe(context.registry),
        "dev": scores,
        "parameters": count_parameters(student),
        "init": capabilities(StudentCapabilities, student).kdplug_init or {"init": "random"},
    }


def student_label(context: EngineContext) -> str:
    """The student's row in the table: its name and projector, and its recipe where not the default."""
    config = context.config
    label = f"{config.student} + {config.projector}"
    if not preflight.declared(context.registry, RecipeCapabilities, config.recipe).is_default:
        label += f" ({config.recipe})"
    return label


def measure_speed(
    inputs: RunInputs,
    student: nn.Module,
    dev: dict[str, EncodedSplit],
    rows: list[Row],
    env: RunEnvironment,
    *,
    teachers: int = 1,
) -> dict[str, Any]:
    """The teacher's and the student's inference speed on the first dev split, set on the table's
    ``rows`` (the ``teachers`` rows first: an ensemble's members, then the ensemble, whose speed is its
    members' run one after the other); metrics.json's ``speed``."""
    first = inputs.task.dev_splits[0]
    if isinstance(inputs.caches, EnsembleOutputs):
        timed = [(member.teacher, member.outputs.dev[first]) for member in inputs.caches.members]
    else:  # as the teacher reads the split: its prompt, its tokenizer
        timed = [(inputs.teacher, inputs.caches.dev[first] if inputs.caches is not None else inputs.dev[first])]
    speeds = [
        None
        if speed_module.served_remotely(teacher.model)  # its time is the server's and the network's
        else speed_module.measure(  # a sharded teacher is timed where it is
            teacher.model, split, teacher.placed_on or env.accelerator.device, move=teacher.placed_on is None
        )
        for teacher, split in timed
    ]
    teacher_speed = None if None in speeds else speed_module.in_sequence(speeds)
    student_speed = speed_module.measure(student, dev[first], env.accelerator.device)
    ratio = speed_module.speedup(teacher_speed, student_speed)
    teacher_row_speeds = [*speeds, teacher_speed] if len(speeds) > 1 else speeds  # members, then the ensemble
    for row, speed in zip(rows[:teachers], teacher_row_speeds):
        row.speed, row.speedup = speed, speed_module.speedup(teacher_speed, speed)
    for row in rows[teachers:]:  # the baseline has the student's architecture, so its speed
        row.speed, row.speedup = student_speed, ratio
    doubts = [speed.unreliable for speed in [*speeds, student_speed] if speed is not None and speed.unreliable]
    return {
        "teacher": teacher_speed.as_dict() if teacher_speed is not None else None,
        **({"members": [speed.as_dict() if speed else None for speed in speeds]} if len(speeds) > 1 else {}),
        "student": student_speed.as_dict(),
        "speedup": round(ratio, 3) if ratio else None,
        "unreliable": doubts[0] if doubts else None,
    }

"""A dry run's ensemble: each member planned as a run with it alone plans its teacher (what it is, its
fine-tuning, which of its outputs the cache holds, their size on disk, the seconds they would take, a
served member's requests), and the layer teacher chosen as the run chooses it (:mod:`.ensemble`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..config import RunConfig
from ..registry import Registry
from ..types import Task, Teacher
from . import preflight
from .ensemble import layer_index, member_label
from .estimate import teacher_seconds
from .inputs import load_task_and_teacher


def plan_members(
    config: RunConfig, registry: Registry, cache_root: Any, task: Task, reads_teacher: bool, transfer_examples: int
) -> tuple[list[dict[str, Any]], Optional[Teacher]]:
    """The members' plans, in order, and the layer teacher (None where the run reads no layers). Each
    member's ``seconds`` are its parts of the run's time, ``teacher_cache`` its outputs' bytes (layer
    vectors only for the layer teacher, as the run stores them) and ``notes`` its notes, named by it."""
    from .plan import cache_size, cached_outputs, count_transfer_requests, planned_inputs

    examples = {name: task.load_split(name) for name in ("train", *task.dev_splits)}
    planned = []
    for entry in config.members():
        member_config, member_plan = config.member_config(entry), {}
        base = load_task_and_teacher(member_config, registry, (task, examples), run=config)
        inputs = planned_inputs(member_config, registry, base, cache_root, member_plan)
        planned.append((entry, member_config, base, inputs, member_plan["teacher"]))
    labelled = [
        (member_label(entry.index, entry.name), inputs.teacher, registry.find_layer_extractor(inputs.teacher.model))
        for entry, _, _, inputs, _ in planned
    ]
    layers_from = layer_index(config, labelled, preflight.reads_teacher_layers(config, registry))
    members = []
    for entry, member_config, base, inputs, teacher in planned:
        # only the layer teacher's outputs hold layer vectors: its cache keys and size say so
        caches = dataclasses.replace(inputs.caches, layers=entry.index == layers_from)
        inputs = dataclasses.replace(inputs, caches=caches)
        outputs = cached_outputs(member_config, registry, inputs) if reads_teacher else "not needed"
        label = member_label(entry.index, entry.name)
        size = cache_size(registry, base.teacher, inputs, transfer_examples) if reads_teacher else None
        if transfer_examples and reads_teacher:
            count_transfer_requests(base.teacher, base.max_length, transfer_examples)
        members.append(
            {
                "index": entry.index,
                "weight": entry.weight,
                "layer_teacher": entry.index == layers_from,
                **teacher,
                "cached": outputs,
                "teacher_cache": size,
                "seconds": teacher_seconds(teacher["finetune"], outputs, member_config, inputs, label),
                "notes": [f"{label}: {note}" for note in base.teacher.notes],
            }
        )
    return members, None if layers_from is None else planned[layers_from][3].teacher


def summed_cache_size(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """The members' teacher outputs on disk together (:func:`~kdplug.engine.plan.cache_size`'s shape)."""
    splits: dict[str, dict[str, int]] = {}
    for size in sizes:
        for name, split in size["splits"].items():
            total = splits.setdefault(name, {"examples": split["examples"], "logits": 0, "layers": 0})
            total["logits"] += split["logits"]
            total["layers"] += split["layers"]
    return {
        "bytes": sum(size["bytes"] for size in sizes),
        "layers": any(size["layers"] for size in sizes),
        "splits": splits,
    }

"""The plugin contracts: what every teacher, student, projector, loss, task, recipe and augmenter
must do.

Each ``check_<kind>(name, ...)`` builds the component through the registry, exactly as
``kdplug run`` does, runs it on tiny offline inputs and returns a :class:`ContractReport`: one
:class:`CheckResult` per check and case (a projector is checked on a grid of teacher and student
layer shapes), each passed, failed with the reason, or skipped with the reason. Nothing here needs
pytest: ``kdplug check-plugin`` prints these reports, and :mod:`kdplug.testing.pytest_plugin`
turns each check into a test.

    from kdplug.testing.contracts import check_projector
    report = check_projector("cosine")
    print(report.format())          # one line per check, and the verdict
    assert report.ok, report.failure_message()

One module per kind (``projectors``, ``models`` for students and teachers, ``losses``, ``tasks``,
``recipes``, ``augmenters``) on a shared ``harness``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional

from ...errors import UsageError
from ...registry import Registry
from .augmenters import AUGMENTER_CHECKS, AUGMENTER_SENTENCE, AUGMENTER_SENTENCES, check_augmenter
from .harness import (
    BATCH,
    CONTRACT_KINDS,
    FAILED,
    PASSED,
    SKIPPED,
    TINY_SST2_DEV,
    TINY_SST2_TRAIN,
    CheckResult,
    ContractFailure,
    ContractReport,
    Workspace,
    concrete_name,
    devices,
    isolated_manager,
    one_thread,
    require,
    write_tiny_sst2,
)
from .losses import LOSS_CHECKS, check_loss
from .models import (
    MODEL_CASES,
    SENTENCES,
    STUDENT_CHECKS,
    TEACHER_CHECKS,
    TaskShape,
    check_student,
    check_teacher,
    find_extractor,
    tiny_batch,
)
from .projectors import PROJECTOR_CHECKS, PROJECTOR_GRID, LayerShapes, check_projector, make_distill_inputs
from .recipes import RECIPE_CHECKS, TINY_RUN, check_recipe
from .tasks import TASK_CHECKS, check_task

CHECKS: dict[str, tuple[str, ...]] = {
    "teacher": TEACHER_CHECKS,
    "student": STUDENT_CHECKS,
    "projector": PROJECTOR_CHECKS,
    "loss": LOSS_CHECKS,
    "task": TASK_CHECKS,
    "recipe": RECIPE_CHECKS,
    "augmenter": AUGMENTER_CHECKS,
}

#: kind -> how ``check_component`` calls its contract with default settings
_CONTRACTS: dict[str, Callable[..., ContractReport]] = {
    "projector": lambda name, options, registry, workspace, data_dir: check_projector(
        name, options=options, registry=registry
    ),
    "student": lambda name, options, registry, workspace, data_dir: check_student(
        name, options=options, registry=registry, workspace=workspace
    ),
    "teacher": lambda name, options, registry, workspace, data_dir: check_teacher(
        name, options=options, registry=registry, workspace=workspace
    ),
    "loss": lambda name, options, registry, workspace, data_dir: check_loss(name, options=options, registry=registry),
    "task": lambda name, options, registry, workspace, data_dir: check_task(
        name, data_dir=data_dir, options=options, registry=registry
    ),
    "recipe": lambda name, options, registry, workspace, data_dir: check_recipe(
        name, options=options, registry=registry, workspace=workspace
    ),
    "augmenter": lambda name, options, registry, workspace, data_dir: check_augmenter(
        name, options=options, registry=registry, workspace=workspace
    ),
}


def check_component(
    kind: str,
    name: str,
    *,
    options: Optional[Mapping[str, Any]] = None,
    registry: Optional[Registry] = None,
    workspace: Optional[Workspace] = None,
    data_dir: Optional[str] = None,
) -> ContractReport:
    """Run the contract of ``kind`` on component ``name`` with default settings."""
    if kind not in _CONTRACTS:
        raise UsageError(
            f"no contract for kind {kind!r}; kinds with a contract: {', '.join(CONTRACT_KINDS)} "
            f"(layer extractors are checked through the student contract)"
        )
    return _CONTRACTS[kind](name, options, registry, workspace, data_dir)


__all__ = [
    "AUGMENTER_CHECKS",
    "AUGMENTER_SENTENCE",
    "AUGMENTER_SENTENCES",
    "BATCH",
    "CHECKS",
    "CONTRACT_KINDS",
    "FAILED",
    "LOSS_CHECKS",
    "MODEL_CASES",
    "PASSED",
    "PROJECTOR_CHECKS",
    "PROJECTOR_GRID",
    "RECIPE_CHECKS",
    "SENTENCES",
    "SKIPPED",
    "STUDENT_CHECKS",
    "TASK_CHECKS",
    "TEACHER_CHECKS",
    "TINY_RUN",
    "TINY_SST2_DEV",
    "TINY_SST2_TRAIN",
    "CheckResult",
    "ContractFailure",
    "ContractReport",
    "LayerShapes",
    "TaskShape",
    "Workspace",
    "check_augmenter",
    "check_component",
    "check_loss",
    "check_projector",
    "check_recipe",
    "check_student",
    "check_task",
    "check_teacher",
    "concrete_name",
    "devices",
    "find_extractor",
    "isolated_manager",
    "make_distill_inputs",
    "one_thread",
    "require",
    "tiny_batch",
    "write_tiny_sst2",
]

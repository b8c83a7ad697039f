"""A plugin that breaks its contract gets a message naming the failed check and saying why."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import kdplug
from kdplug.testing import contracts
from kdplug.types import ProjectedPairs

_calls = itertools.count()


class Good(nn.Module):
    """Last student layer -> Linear -> MSE to the last teacher layer."""

    ild_loss, needs_teacher_heads, default_weights = "mse", False, {"eta": 0.5, "lam": 0.3}

    def __init__(self, request):
        super().__init__()
        self.map = nn.Linear(request.student_layers[-1].width, request.teacher_layers[-1].width)

    def target(self, inputs):
        return inputs.teacher_layers[-1].detach()

    def forward(self, inputs):
        student = self.map(inputs.student_layers[-1]).unsqueeze(1)  # (B, 1, D)
        return ProjectedPairs(student=student, teacher=self.target(inputs).unsqueeze(1))


class UnusedParameter(Good):
    def __init__(self, request):
        super().__init__(request)
        self.forgotten = nn.Linear(4, 4)


class LeaksIntoTheTeacher(Good):
    def target(self, inputs):
        return inputs.teacher_layers[-1]  # no detach()


class MakesNaN(Good):
    def forward(self, inputs):
        pairs = super().forward(inputs)
        return ProjectedPairs(student=pairs.student * float("nan"), teacher=pairs.teacher)


class WrongShape(Good):
    def forward(self, inputs):
        pairs = super().forward(inputs)
        return ProjectedPairs(student=pairs.student, teacher=torch.cat([pairs.teacher, pairs.teacher], dim=-1))


class NotDeterministic(Good):
    def forward(self, inputs):
        pairs = super().forward(inputs)
        return ProjectedPairs(student=pairs.student + next(_calls), teacher=pairs.teacher)


class UnknownLoss(Good):
    ild_loss = "no-such-loss"


class BadWeights(Good):
    default_weights = {"eta": 0.8, "lam": 0.5}


class RaisesOnWideTeachers(Good):
    def __init__(self, request):
        if request.teacher_layers[-1].width > 500:
            raise RuntimeError("cannot handle wide teachers")
        super().__init__(request)


BROKEN = {
    "good": Good,
    "unused-parameter": UnusedParameter,
    "leaks-into-the-teacher": LeaksIntoTheTeacher,
    "makes-nan": MakesNaN,
    "wrong-shape": WrongShape,
    "not-deterministic": NotDeterministic,
    "unknown-loss": UnknownLoss,
    "bad-weights": BadWeights,
    "raises-on-wide-teachers": RaisesOnWideTeachers,
}


class BrokenPlugin:
    @kdplug.hookimpl
    def kdplug_register_projectors(self, register):
        for name, factory in BROKEN.items():
            register(name, factory)


@pytest.fixture(scope="module")
def registry():
    return contracts.isolated_manager(BrokenPlugin()).registry


def test_a_correct_projector_passes(registry):
    report = contracts.check_projector("good", registry=registry)
    assert report.ok, report.failure_message()
    assert "verdict: PASSED" in report.format()


@pytest.mark.parametrize(
    "name, check, reason",
    [
        ("unused-parameter", "gradients reach every parameter", "forgotten.weight (no gradient)"),
        ("leaks-into-the-teacher", "teacher tensors get no gradient", "gradient reached teacher_layers["),
        ("makes-nan", "no NaN", "non-finite values in pairs.student"),
        ("wrong-shape", "outputs fit the loss", "must be (batch, P, D) of one shape"),
        ("not-deterministic", "deterministic under a seed", "pairs.student differs"),
        (
            "unknown-loss",
            "declares ild_loss, needs_teacher_heads, default_weights",
            "'no-such-loss' is not a registered loss",
        ),
        ("bad-weights", "declares ild_loss, needs_teacher_heads, default_weights", "eta + lam <= 1"),
        ("raises-on-wide-teachers", "builds for the layer shapes", "RuntimeError: cannot handle wide teachers"),
    ],
)
def test_a_broken_projector_fails_naming_the_check_and_why(registry, name, check, reason):
    report = contracts.check_projector(name, registry=registry)
    assert not report.ok
    failed = {r.check for r in report.failures}
    assert check in failed
    message = report.failure_message()
    assert f"projector '{name}'" in message and f"failed the check '{check}'" in message and reason in message
    verdict = report.format().splitlines()[-1]
    assert verdict.startswith("verdict: FAILED") and check in verdict


def test_checks_after_a_fatal_failure_are_skipped_with_a_pointer(registry):
    report = contracts.check_projector("wrong-shape", registry=registry, cases=["4x32-2x32"])
    assert report.result("no NaN", "4x32-2x32").detail == "not run: 'outputs fit the loss' failed"


def test_the_failing_shapes_are_named(registry):
    report = contracts.check_projector("raises-on-wide-teachers", registry=registry)
    failing = {r.case for r in report.failures}
    assert failing == {"12x768-6x768", "12x768-4x384"}
    assert report.result("outputs fit the loss", "4x32-2x32").passed


def test_an_unknown_name_fails_name_resolves_with_suggestions(registry):
    report = contracts.check_projector("god", registry=registry)
    assert [r.check for r in report.failures] == ["name resolves"]
    assert "Did you mean 'good'" in report.failures[0].detail

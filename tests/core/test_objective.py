"""The weighted objective L = ce·CE + eta·KD + lam·ILD, and how a stage's weights are resolved.

Reference values are written out here from the definitions (CE, Hinton's KD, PKD's normalised
MSE) with plain ``math``; the objective is never compared with itself.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import kdplug
from kdplug.config import RunConfig
from kdplug.engine.objective import WeightedObjective
from kdplug.engine.recipe import stage_weights
from kdplug.errors import ConfigError, UsageError
from kdplug.types import ProjectedPairs, StepState

STUDENT, TEACHER, LABELS = [[1.0, -1.0], [0.2, 0.4]], [[2.0, 0.0], [-1.0, 1.0]], [0, 1]
PAIR_S, PAIR_T = [[[1.0, 0.0]], [[0.0, 2.0]]], [[[1.0, 1.0]], [[3.0, -1.0]]]


def softmax(values, tau=1.0):
    exps = [math.exp(v / tau) for v in values]
    return [e / sum(exps) for e in exps]


def ce_reference(rows=(0, 1)):
    return sum(-math.log(softmax(STUDENT[b])[LABELS[b]]) for b in rows) / len(rows)


def kd_reference(tau):
    total = 0.0
    for s, t in zip(STUDENT, TEACHER):
        p_t, p_s = softmax(t, tau), softmax(s, tau)
        total += sum(a * math.log(a / b) for a, b in zip(p_t, p_s))
    return tau**2 * total / len(STUDENT)


def pkd_reference():
    total = 0.0
    for s, t in zip(PAIR_S, PAIR_T):
        ns, nt = math.hypot(*s[0]), math.hypot(*t[0])
        total += sum((a / ns - b / nt) ** 2 for a, b in zip(s[0], t[0]))
    return total / len(PAIR_S)


def state(labelled=None):
    return StepState(
        student_logits=torch.tensor(STUDENT, dtype=torch.float64),
        student_layers=[],
        labels=torch.tensor(LABELS),
        teacher_logits=torch.tensor(TEACHER, dtype=torch.float64),
        teacher_layers=None,
        teacher_head_logits=None,
        pairs=ProjectedPairs(torch.tensor(PAIR_S, dtype=torch.float64), torch.tensor(PAIR_T, dtype=torch.float64)),
        labelled=labelled,
    )


def objective(eta, lam, ce=None, tau=2.0):
    return WeightedObjective(
        eta=eta,
        lam=lam,
        ce=ce,
        task_loss=kdplug.create_loss("ce"),
        kd_loss=kdplug.create_loss("kd", temperature=tau),
        ild_loss=kdplug.create_loss("normalized-mse"),
    )


def test_ce_weight_is_one_minus_eta_minus_lam_unless_set():
    terms = objective(0.2, 0.5)(state())
    expected = 0.3 * ce_reference() + 0.2 * kd_reference(2.0) + 0.5 * pkd_reference()
    assert terms["loss"].item() == pytest.approx(expected, rel=1e-9)


def test_pkds_three_independent_weights():
    # PKD eq. 8: (1 - alpha) CE + alpha L_DS + beta L_PT with alpha = 0.2 and beta = 100
    terms = objective(0.2, 100.0, ce=0.8)(state())
    expected = 0.8 * ce_reference() + 0.2 * kd_reference(2.0) + 100.0 * pkd_reference()
    assert terms["loss"].item() == pytest.approx(expected, rel=1e-9)


def test_a_zero_ce_weight_is_not_computed():
    terms = objective(0.5, 0.5)(state())
    assert "ce" not in terms
    assert terms["loss"].item() == pytest.approx(0.5 * kd_reference(2.0) + 0.5 * pkd_reference(), rel=1e-9)


def test_ce_counts_only_labelled_rows():
    only_first = objective(0.0, 0.0)(state(labelled=torch.tensor([True, False])))
    assert only_first["ce"].item() == pytest.approx(ce_reference(rows=(0,)), rel=1e-9)
    none = objective(0.5, 0.0)(state(labelled=torch.tensor([False, False])))
    assert "ce" not in none and none["loss"].item() == pytest.approx(0.5 * kd_reference(2.0), rel=1e-9)


class context:
    """The weights a stage of a run with ``settings`` resolves (engine/recipe.py's stage_weights)."""

    def __init__(self, **settings):
        self.config = RunConfig(**settings)

    def weights(self, projector, **given):
        return stage_weights(self.config, projector, **given)


def projector(**weights):
    return SimpleNamespace(default_weights=weights)


def test_stage_weights_come_from_the_run_then_the_projector():
    pkd = projector(eta=0.2, lam=0.7, temperature=5.0)
    assert context().weights(pkd).as_dict() == {"ce": 0.1, "eta": 0.2, "lam": 0.7, "temperature": 5.0}
    assert context(lam=0.2).weights(pkd).ce == pytest.approx(0.6)
    independent = context(eta=0.2, lam=100.0, ce_weight=0.8).weights(pkd)
    assert (independent.ce, independent.eta, independent.lam) == (0.8, 0.2, 100.0)


def test_weights_a_recipe_passes_define_the_stage():
    # two-stage's stage 1 has no CE even when the run sets ce_weight: beta KD + (1 - beta) Universal-KD
    stage1 = context(ce_weight=0.5).weights(projector(eta=0.5, lam=0.5), eta=0.7, lam=0.3)
    assert (stage1.ce, stage1.eta, stage1.lam) == (0.0, 0.7, 0.3)
    stage2 = context().weights(None, eta=0.0, lam=0.0)
    assert (stage2.ce, stage2.eta, stage2.lam) == (1.0, 0.0, 0.0)


def test_weights_without_a_ce_weight_must_not_exceed_one():
    with pytest.raises(ConfigError, match="ce_weight"):
        RunConfig(eta=0.5, lam=0.7).validate()
    RunConfig(eta=0.2, lam=500.0, ce_weight=0.8).validate()  # PKD's beta = 500 is fine with its own CE weight
    with pytest.raises(UsageError, match="negative"):
        context().weights(projector(eta=0.6, lam=0.6))

"""CKA, logit standardisation and DIST against references computed from the papers' formulas
with numpy and scipy (not with kdplug's code), and in runs."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr

import kdplug
from kdplug.cli import main
from kdplug.types import DistillInputs, LayerSpec, ProjectionRequest

from ..conftest import write_sst2


def hsic(k: np.ndarray, lg: np.ndarray) -> float:
    """Kornblith et al. 2019: HSIC(K, L) = tr(K H L H) / (n − 1)² with H = I − 11ᵀ/n."""
    n = k.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    return float(np.trace(k @ h @ lg @ h)) / (n - 1) ** 2


def cka_reference(x: np.ndarray, y: np.ndarray) -> float:
    k, lg = x @ x.T, y @ y.T  # linear kernels of the raw (uncentred) representations
    return hsic(k, lg) / np.sqrt(hsic(k, k) * hsic(lg, lg))


def request(n, m, *, teacher_width=7, student_width=5, outputs=3):
    return ProjectionRequest(
        teacher_layers=tuple(LayerSpec(i, teacher_width, "transformer") for i in range(1, n + 1)),
        student_layers=tuple(LayerSpec(i, student_width, "lstm") for i in range(1, m + 1)),
        num_outputs=outputs,
    )


def cka_term(student_vectors, teacher_vectors, n=4, m=3):
    """The cka projector and loss on one batch: student layer j's vectors, teacher layers' vectors."""
    projector = kdplug.create_projector("cka", request(n, m))
    logits = torch.zeros(student_vectors[0].shape[0], 3)
    pairs = projector(DistillInputs(teacher_vectors, student_vectors, logits, logits))
    return kdplug.create_loss("cka")(pairs.student, pairs.teacher), projector


def test_cka_equals_the_hsic_formula_across_widths():
    gen = np.random.default_rng(0)
    batch = 9
    teacher = [torch.tensor(gen.normal(size=(batch, 7))) for _ in range(4)]
    student = [torch.tensor(gen.normal(size=(batch, 5))) for _ in range(3)]
    loss, projector = cka_term(student, teacher)
    pairs = [(j + 1, group[0]) for j, group in enumerate(projector.pairs)]
    assert pairs == [(1, 2), (2, 3)]  # ⌈j·4/3⌉, the student's output layer left to the logit KD
    expected = sum(1 - cka_reference(student[j - 1].numpy(), teacher[t - 1].numpy()) for j, t in pairs)
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_cka_is_zero_for_an_orthogonal_rotation_and_rescaling_and_not_for_noise():
    gen = np.random.default_rng(1)
    x = gen.normal(size=(12, 5))
    q, _ = np.linalg.qr(gen.normal(size=(5, 5)))
    rotated = torch.tensor(np.hstack([x @ q * 3.0, np.zeros((12, 2))]))  # a rotated, scaled copy, 7 wide
    noise = torch.tensor(gen.normal(size=(12, 7)))
    student = [torch.tensor(x), torch.tensor(x), torch.zeros(12, 5)]
    loss, _ = cka_term(student, [rotated, noise, rotated, noise])  # pairs: S1-T2 (noise), S2-T3 (rotated)
    assert float(loss) == pytest.approx(1 - cka_reference(x, noise.numpy()), rel=1e-5)  # pair 2 aligns exactly
    assert 1 - cka_reference(x, noise.numpy()) > 0.05


def test_cka_needs_three_examples_and_carries_gradient_to_the_student_only():
    gen = np.random.default_rng(4)
    x, y = gen.normal(size=(2, 5)), gen.normal(size=(2, 7))
    assert cka_reference(x, y) == pytest.approx(1.0)  # two centred points: CKA is 1 whatever they are
    for batch in (1, 2):
        loss, _ = cka_term([torch.randn(batch, 5) for _ in range(3)], [torch.randn(batch, 7) for _ in range(4)])
        assert float(loss) == 0.0
    student = [torch.randn(6, 5, requires_grad=True) for _ in range(3)]
    teacher = [torch.randn(6, 7, requires_grad=True) for _ in range(4)]
    loss, _ = cka_term(student, teacher)
    loss.backward()
    assert student[0].grad is not None and student[0].grad.abs().sum() > 0
    assert all(t.grad is None for t in teacher)


def zscore(z: np.ndarray) -> np.ndarray:
    """Sun et al. 2024 (their code): (z − mean) / (1e-7 + std), the std unbiased."""
    return (z - z.mean(axis=-1, keepdims=True)) / (1e-7 + z.std(axis=-1, ddof=1, keepdims=True))


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_logit_standardisation_equals_the_papers_loss():
    gen = np.random.default_rng(2)
    student, teacher = gen.normal(size=(5, 4)) * 3, gen.normal(size=(5, 4)) * 7 + 2
    tau = 2.0
    log_p_t, log_p_s = log_softmax(zscore(teacher) / tau), log_softmax(zscore(student) / tau)
    expected = tau**2 * (np.exp(log_p_t) * (log_p_t - log_p_s)).sum(axis=-1).mean()
    loss = kdplug.create_loss("kd", temperature=tau, standardize=True)(torch.tensor(student), torch.tensor(teacher))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    plain = kdplug.create_loss("kd", temperature=tau)(torch.tensor(student), torch.tensor(teacher))
    assert float(plain) != pytest.approx(expected, rel=1e-3)  # standardising changed it


def test_logit_standardisation_is_invariant_to_shifting_and_scaling_the_teacher():
    teacher, student = torch.randn(4, 5), torch.randn(4, 5)
    loss = kdplug.create_loss("kd", temperature=1.0, standardize=True)
    assert float(loss(student, teacher)) == pytest.approx(float(loss(student, 10 * teacher + 3)), rel=1e-4)


def test_logit_standardisation_says_it_has_nothing_to_learn_from_two_classes(caplog):
    torch.manual_seed(0)  # logits of one example within float error of each other have a gradient: not by chance here
    student = torch.randn(6, 2, requires_grad=True)
    with caplog.at_level(logging.WARNING):
        kdplug.create_loss("kd", temperature=1.0, standardize=True)(student, torch.randn(6, 2)).backward()
    assert "2 classes" in caplog.text
    assert float(student.grad.abs().max()) < 1e-5  # the sign alone: no gradient


def test_dist_equals_pearson_correlations_of_the_probabilities():
    gen = np.random.default_rng(3)
    student, teacher = gen.normal(size=(6, 4)), gen.normal(size=(6, 4)) * 2
    tau = 4.0

    def softmax(z):
        return np.exp(log_softmax(z / tau))

    p_s, p_t = softmax(student), softmax(teacher)
    inter = np.mean([1 - pearsonr(p_s[i], p_t[i])[0] for i in range(6)])
    intra = np.mean([1 - pearsonr(p_s[:, c], p_t[:, c])[0] for c in range(4)])
    for beta, gamma in ((1.0, 1.0), (2.0, 0.5)):
        loss = kdplug.create_loss("dist", temperature=tau, inter_weight=beta, intra_weight=gamma)
        expected = tau**2 * (beta * inter + gamma * intra)
        assert float(loss(torch.tensor(student), torch.tensor(teacher))) == pytest.approx(expected, rel=1e-5)


def test_universal_kd_standardises_its_output_space_terms_on_request():
    projector = kdplug.create_projector("universal-ca", request(4, 3, outputs=3), standardize=True)
    logits = torch.randn(5, 3) * 4
    z = logits.numpy()
    expected = np.exp(log_softmax(zscore(z)))
    np.testing.assert_allclose(projector.outputs_of(logits).numpy(), expected, rtol=1e-5)


def test_a_run_takes_the_kd_loss_and_cka_and_checks_their_names_and_options(tmp_path, tiny_bert_dir, capsys):
    data = write_sst2(tmp_path / "SST-2")
    argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(data), "--student", "bilstm"]
    argv += ["--epochs", "1", "--set", "teacher_epochs=1", "--set", "allow_weak_teacher=true"]
    argv += ["--set", "student_options.hidden_size=16"]
    output = tmp_path / "run"
    assert main([*argv, "--projector", "cka", "--set", "kd_loss=dist", "--output", str(output)]) == 0
    metrics = json.loads((output / "metrics.json").read_text())
    stage = metrics["stages"]["distill"]
    assert stage["matching"]["layer_map"] == "forward" and stage["weights"]["lam"] == 0.3
    assert main([*argv, "--projector", "rkd", "--set", "kd_loss=nope", "--output", str(tmp_path / "bad")]) == 2
    assert "unknown loss 'nope'" in capsys.readouterr().err
    assert main([*argv, "--set", "kd_loss_options.standardise=true", "--output", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert "standardize" in err and "--set kd_loss_options.NAME" in err  # the valid options, under their key
    for setting, message in (
        ("kd_loss_options.temperature=2", "--set temperature"),
        ("kd_loss=mse", "takes no temperature"),
    ):
        assert main([*argv, "--set", setting, "--output", str(tmp_path / "refused")]) == 2
        assert message in capsys.readouterr().err
    assert main([*argv, "--recipe", "annealing", "--set", "kd_loss=dist", "--output", str(tmp_path / "ann")]) == 2
    assert "does not use kd_loss" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists() and not (tmp_path / "ann").exists()  # before any work

"""The METHODS plugin: losses and projectors against their equations, and every projector's contract.

Reference values are computed here from the papers' equations with numpy and plain loops (never
by calling the plugin), on small hand-made tensors; the contract tests run over every registered
projector (``kdplug.list_projectors()``), so a new projector plugin is checked automatically.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kdplug
from kdplug.errors import PluginError, UsageError
from kdplug.types import DistillInputs, LayerSpec, ProjectionRequest

METHODS = (
    "nkd",
    "rkd",
    "pkd-skip",
    "pkd-last",
    "ckd-no",
    "ckd-po",
    "alp",
    "alp-no",
    "alp-po",
    "alp-kqv1",
    "alp-kqv4",
    "universal-il",
    "universal-cg",
    "universal-ca",
    "universal-loss-att",
)


def request_for(n, teacher_width, m, student_width, *, outputs=3, regression=False, student_kind="transformer"):
    return ProjectionRequest(
        teacher_layers=tuple(LayerSpec(i, teacher_width, "transformer") for i in range(1, n + 1)),
        student_layers=tuple(LayerSpec(i, student_width, student_kind) for i in range(1, m + 1)),
        num_outputs=outputs,
        is_regression=regression,
    )


def make_inputs(request, batch=3, *, seed=0, dtype=torch.float32):
    """Random inputs; every tensor requires grad so that leaks to the teacher side are visible."""
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()

    n, c = len(request.teacher_layers), request.num_outputs
    return DistillInputs(
        teacher_layers=[leaf(batch, spec.width) for spec in request.teacher_layers],
        student_layers=[leaf(batch, spec.width) for spec in request.student_layers],
        teacher_logits=leaf(batch, c),
        student_logits=leaf(batch, c),
        teacher_head_logits=leaf(batch, n, c),
    )


def ild_value(projector, inputs):
    pairs = projector(inputs)
    return kdplug.create_loss(projector.ild_loss)(pairs.student, pairs.teacher, pairs.weights)


def as_np(tensor):
    return tensor.detach().double().numpy()


def np_softmax(x):
    e = np.exp(np.asarray(x, dtype=float) - np.max(x))
    return e / e.sum()


def literal_inputs(teacher, student, teacher_heads=None, student_logits=None):
    """DistillInputs from nested lists: teacher[i][b] is h_t^(i+1) of example b."""

    def layers(values):
        return [torch.tensor(layer, dtype=torch.float64, requires_grad=True) for layer in values]

    batch = len(teacher[0])
    return DistillInputs(
        teacher_layers=layers(teacher),
        student_layers=layers(student),
        teacher_logits=torch.zeros(batch, 2, dtype=torch.float64),
        student_logits=(
            torch.zeros(batch, 2, dtype=torch.float64)
            if student_logits is None
            else torch.tensor(student_logits, dtype=torch.float64, requires_grad=True)
        ),
        teacher_head_logits=None if teacher_heads is None else torch.tensor(teacher_heads, dtype=torch.float64),
    )


# Three teacher layers and three student layers of width 2, batch of two (teacher[i][b]).
TEACHER = [[[1.0, 2.0], [0.5, -1.0]], [[-1.0, 0.5], [2.0, 1.0]], [[0.3, 0.3], [-0.5, 1.5]]]
STUDENT = [[[0.2, -0.4], [1.0, 0.1]], [[0.7, 0.9], [-0.3, 0.8]], [[5.0, 5.0], [5.0, 5.0]]]
# Teacher pseudo-classifier logits (B=2, n=3, C=2) and student logits (B=2, C=2).
HEADS = [[[2.0, -1.0], [0.0, 0.5], [1.5, 1.5]], [[-0.5, 0.5], [3.0, -2.0], [0.2, 0.1]]]
LOGITS = [[0.4, -0.4], [1.0, 2.0]]


# --------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------


def test_every_method_and_loss_is_registered():
    assert set(METHODS) <= set(kdplug.list_projectors())
    assert {"ce", "kd", "mse", "normalized-mse", "kl"} <= set(kdplug.list_losses())


# --------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------


def test_ce_matches_its_formula():
    logits = [[2.0, 0.5, -1.0], [0.1, 0.2, 0.3]]
    labels = [0, 2]
    expected = np.mean([-math.log(np_softmax(row)[y]) for row, y in zip(logits, labels)])
    got = kdplug.create_loss("ce")(torch.tensor(logits, dtype=torch.float64), torch.tensor(labels))
    assert got.item() == pytest.approx(expected, rel=1e-12)


def kd_reference(student, teacher, tau):
    total = 0.0
    for s, t in zip(student, teacher):
        p_t, p_s = np_softmax(np.array(t) / tau), np_softmax(np.array(s) / tau)
        total += sum(pt * math.log(pt / ps) for pt, ps in zip(p_t, p_s))
    return tau**2 * total / len(student)


@pytest.mark.parametrize("tau", [1.0, 2.0, 5.0])
def test_kd_matches_its_formula(tau):
    student = [[1.0, -0.5, 0.3], [0.0, 2.0, -1.0]]
    teacher = [[2.0, 0.1, -0.7], [-1.0, 1.5, 0.5]]
    got = kdplug.create_loss("kd", temperature=tau)(
        torch.tensor(student, dtype=torch.float64), torch.tensor(teacher, dtype=torch.float64)
    )
    assert got.item() == pytest.approx(kd_reference(student, teacher, tau), rel=1e-12)


def test_kd_averages_over_the_batch_not_over_classes():
    # Splitting every class in two halves each probability: the KL (summed over classes) is
    # unchanged, so a batchmean loss is too; a mean over batch×classes would halve.
    student = torch.tensor([[1.0, -0.5], [0.2, 0.9]], dtype=torch.float64)
    teacher = torch.tensor([[2.0, 0.1], [-1.0, 1.5]], dtype=torch.float64)
    kd = kdplug.create_loss("kd", temperature=2.0)
    doubled = kd(student.repeat_interleave(2, dim=1), teacher.repeat_interleave(2, dim=1))
    assert doubled.item() == pytest.approx(kd(student, teacher).item(), rel=1e-12)
    assert kd(student, teacher).item() > 0


def test_kd_carries_tau_squared():
    # one example at tau = 4: tau^2 * KL(softmax(t/4) || softmax(s/4)), written out by hand
    student, teacher, tau = [1.0, -0.5, 0.3], [2.0, 0.1, -0.7], 4.0
    p_t = [math.exp(v / tau) for v in teacher]
    p_t = [v / sum(p_t) for v in p_t]
    p_s = [math.exp(v / tau) for v in student]
    p_s = [v / sum(p_s) for v in p_s]
    expected = 16.0 * sum(a * math.log(a / b) for a, b in zip(p_t, p_s))
    got = kdplug.create_loss("kd", temperature=tau)(
        torch.tensor([student], dtype=torch.float64), torch.tensor([teacher], dtype=torch.float64)
    )
    assert got.item() == pytest.approx(expected, rel=1e-12)
    # without the tau^2 factor the value would be 16 times smaller
    assert got.item() > 10 * sum(a * math.log(a / b) for a, b in zip(p_t, p_s))


@pytest.mark.parametrize("temperature", [0, -1.0, "hot"])
def test_kd_rejects_a_bad_temperature(temperature):
    with pytest.raises(UsageError, match="temperature"):
        kdplug.create_loss("kd", temperature=temperature)


# pairs (B=2, P=2, D=3) and per-pair weights
PAIR_S = [[[1.0, 2.0, 0.0], [0.5, -1.0, 2.0]], [[0.0, 1.0, 1.0], [3.0, 0.0, -1.0]]]
PAIR_T = [[[0.5, 2.5, 1.0], [1.0, 1.0, 1.0]], [[-1.0, 0.0, 2.0], [2.0, 0.5, 0.5]]]
PAIR_W = [[0.3, 0.7], [1.0, 0.2]]


def pair_reference(term, weights=None):
    """Σ_p mean_b w[b][p]·term(s, t)."""
    total = 0.0
    for p in range(2):
        total += np.mean(
            [
                (1.0 if weights is None else weights[b][p]) * term(np.array(PAIR_S[b][p]), np.array(PAIR_T[b][p]))
                for b in range(2)
            ]
        )
    return total


def tensor(values):
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("weights", [None, PAIR_W])
def test_mse_matches_its_formula(weights):
    expected = pair_reference(lambda s, t: sum((a - b) ** 2 for a, b in zip(s, t)) / len(s), weights)
    got = kdplug.create_loss("mse")(tensor(PAIR_S), tensor(PAIR_T), None if weights is None else tensor(weights))
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_mse_on_regression_scores_is_the_plain_mean_squared_error():
    # the task loss of STS-B: predicted scores (B,) against gold scores (B,)
    predicted, gold = [1.5, 3.0, 4.0], [2.0, 3.0, 1.0]
    expected = sum((p - g) ** 2 for p, g in zip(predicted, gold)) / 3
    assert kdplug.create_loss("mse")(tensor(predicted), tensor(gold)).item() == pytest.approx(expected, rel=1e-12)


def test_mse_on_logits_is_the_plain_mean_squared_error():
    s, t = [[1.0, 2.0], [0.0, -1.0]], [[0.5, 2.0], [1.0, 1.0]]
    expected = np.mean([(a - b) ** 2 for row_s, row_t in zip(s, t) for a, b in zip(row_s, row_t)])
    assert kdplug.create_loss("mse")(tensor(s), tensor(t)).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("weights", [None, PAIR_W])
def test_normalized_mse_matches_pkd_eq7(weights):
    def term(s, t):
        ns, nt = math.sqrt(sum(x * x for x in s)), math.sqrt(sum(x * x for x in t))
        return sum((a / ns - b / nt) ** 2 for a, b in zip(s, t))

    got = kdplug.create_loss("normalized-mse")(
        tensor(PAIR_S), tensor(PAIR_T), None if weights is None else tensor(weights)
    )
    assert got.item() == pytest.approx(pair_reference(term, weights), rel=1e-12)


@pytest.mark.parametrize("weights", [None, PAIR_W])
def test_normalized_mse_mean_reduction_is_pkds_code(weights):
    # PKD's patience_loss: F.mse_loss of the normalised states, a mean over batch, layers and D
    def term(s, t):
        ns, nt = math.sqrt(sum(x * x for x in s)), math.sqrt(sum(x * x for x in t))
        return sum((a / ns - b / nt) ** 2 for a, b in zip(s, t)) / len(s)

    got = kdplug.create_loss("normalized-mse", reduction="mean")(
        tensor(PAIR_S), tensor(PAIR_T), None if weights is None else tensor(weights)
    )
    assert got.item() == pytest.approx(pair_reference(term, weights) / 2, rel=1e-12)  # 2 pairs averaged
    with pytest.raises(UsageError, match="reduction"):
        kdplug.create_loss("normalized-mse", reduction="max")


def test_pkd_loss_reduction_option_reaches_its_loss():
    request = request_for(3, 2, 3, 2)
    assert kdplug.create_projector("pkd-skip", request).ild_loss_options == {"reduction": "sum"}
    assert kdplug.create_projector("pkd-skip", request, loss_reduction="mean").ild_loss_options == {"reduction": "mean"}
    with pytest.raises(UsageError, match="loss_reduction"):
        kdplug.create_projector("pkd-skip", request, loss_reduction="avg")


def test_normalized_mse_ignores_the_scale_of_either_side():
    loss = kdplug.create_loss("normalized-mse")
    assert loss(tensor(PAIR_S) * 7.0, tensor(PAIR_T) * 0.1).item() == pytest.approx(
        loss(tensor(PAIR_S), tensor(PAIR_T)).item(), rel=1e-12
    )


@pytest.mark.parametrize("weights", [None, PAIR_W])
def test_kl_matches_its_formula(weights):
    student = [[np_softmax(p).tolist() for p in example] for example in PAIR_S]
    target = [[np_softmax(p).tolist() for p in example] for example in PAIR_T]
    expected = 0.0
    for p in range(2):
        expected += np.mean(
            [
                (1.0 if weights is None else weights[b][p])
                * sum(q * math.log(q / s) for q, s in zip(target[b][p], student[b][p]))
                for b in range(2)
            ]
        )
    got = kdplug.create_loss("kl")(tensor(student), tensor(target), None if weights is None else tensor(weights))
    assert got.item() == pytest.approx(expected, rel=1e-12)


def test_kl_is_finite_with_zero_probabilities():
    student = torch.tensor([[[0.0, 1.0]]], requires_grad=True)
    target = torch.tensor([[[0.0, 1.0]]])
    loss = kdplug.create_loss("kl")
    assert loss(student, target).item() == 0.0  # 0·log 0 = 0
    value = loss(student, torch.tensor([[[0.5, 0.5]]]))
    value.backward()
    assert torch.isfinite(value) and value.item() > 10 and torch.isfinite(student.grad).all()


def test_pair_losses_reject_mismatched_shapes():
    with pytest.raises(PluginError, match="matching student and teacher shapes"):
        kdplug.create_loss("mse")(torch.zeros(2, 3, 4), torch.zeros(2, 3, 5))
    with pytest.raises(PluginError, match="weights"):
        kdplug.create_loss("kl")(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.ones(2, 4))


# --------------------------------------------------------------------------------------------
# layer maps
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, n, m, expected",
    [
        ("pkd-skip", 12, 6, (2, 4, 6, 8, 10)),  # PKD §3.2
        ("pkd-last", 12, 6, (7, 8, 9, 10, 11)),  # PKD §3.2
        ("pkd-skip", 12, 3, (4, 8)),
        ("pkd-last", 12, 3, (10, 11)),
        ("pkd-skip", 24, 6, (4, 8, 12, 16, 20)),
        ("pkd-skip", 4, 2, (2,)),
    ],
)
def test_pkd_layer_maps(name, n, m, expected):
    assert kdplug.create_projector(name, request_for(n, 8, m, 8)).layer_map == expected


@pytest.mark.parametrize("layer_map, m", [([1, 5, 9], 4), ([1], 2), ([6], 2), ([12], 2)])  # ALP-KD Tables 1, 3
def test_pkd_layer_map_is_settable(layer_map, m):
    projector = kdplug.create_projector("pkd-skip", request_for(12, 8, m, 8), layer_map=layer_map)
    assert projector.layer_map == tuple(layer_map)
    pairs = projector(make_inputs(request_for(12, 8, m, 8)))
    chosen = pairs.attention[0].argmax(dim=-1) + 1
    assert chosen.tolist() == layer_map


@pytest.mark.parametrize("layer_map", [[0, 5, 9], [1, 5, 13], [1, 5], [1, 5, 9, 12], "1,5,9", [1.0, 5, 9]])
def test_pkd_rejects_a_bad_layer_map(layer_map):
    with pytest.raises(UsageError, match="layer_map"):
        kdplug.create_projector("pkd-last", request_for(12, 8, 4, 8), layer_map=layer_map)


@pytest.mark.parametrize("method", ["ckd", "alp"])
@pytest.mark.parametrize(
    "n, m, no, po",
    [
        (
            12,
            4,
            [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]],
            [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9], [9, 10, 11, 12]],
        ),  # ALP-KD
        (12, 2, [list(range(1, 13))], [list(range(1, 13))]),  # ALP-KD Table 3: all layers into h_s^1
        (
            12,
            6,
            [[1, 2], [3, 4], [5, 6, 7], [8, 9], [10, 11, 12]],
            [[1, 2, 3], [3, 4, 5], [5, 6, 7, 8], [8, 9, 10], [10, 11, 12]],
        ),
        (6, 3, [[1, 2, 3], [4, 5, 6]], [[1, 2, 3, 4], [4, 5, 6]]),
    ],
)
def test_bucket_rules(method, n, m, no, po):
    request = request_for(n, 8, m, 8)
    assert [list(b) for b in kdplug.create_projector(f"{method}-no", request).buckets] == no
    assert [list(b) for b in kdplug.create_projector(f"{method}-po", request).buckets] == po


@pytest.mark.parametrize("name", ["ckd-no", "alp-po", "alp-kqv4"])
def test_buckets_are_settable(name):
    buckets = [[1, 2], [2, 3, 4], [12]]
    projector = kdplug.create_projector(name, request_for(12, 8, 4, 8), buckets=buckets)
    assert [list(b) for b in projector.buckets] == buckets


@pytest.mark.parametrize("buckets", [[[1, 2], [3]], [[1], [], [2]], [[0], [1], [2]], [[1], [2], [13]], "odd", 3])
def test_bad_buckets_are_usage_errors(buckets):
    with pytest.raises(UsageError, match="buckets"):
        kdplug.create_projector("ckd-po", request_for(12, 8, 4, 8), buckets=buckets)


def test_bucketed_attention_is_zero_outside_the_bucket():
    request = request_for(12, 16, 4, 16)
    pairs = kdplug.create_projector("alp-po", request)(make_inputs(request))
    inside = torch.zeros(3, 12, dtype=torch.bool)
    for j, bucket in enumerate([range(1, 6), range(5, 10), range(9, 13)]):
        inside[j, [k - 1 for k in bucket]] = True
    assert (pairs.attention[:, ~inside] == 0).all()
    assert torch.allclose(pairs.attention.sum(dim=-1), torch.ones(3, 3))


# --------------------------------------------------------------------------------------------
# each method against its equation
# --------------------------------------------------------------------------------------------


def test_pkd_loss_matches_eq7():
    request = request_for(3, 2, 3, 2)
    projector = kdplug.create_projector("pkd-skip", request)  # A = (⌈1·3/3⌉, ⌈2·3/3⌉) = (1, 2)
    expected = 0.0
    for b in range(2):
        for j, a in enumerate((1, 2)):
            s, t = np.array(STUDENT[j][b]), np.array(TEACHER[a - 1][b])
            expected += np.sum((s / np.linalg.norm(s) - t / np.linalg.norm(t)) ** 2) / 2
    assert ild_value(projector, literal_inputs(TEACHER, STUDENT)).item() == pytest.approx(expected, rel=1e-12)


def test_pkd_maps_a_narrower_student_to_the_teacher_width():
    request = request_for(3, 2, 3, 1)
    projector = kdplug.create_projector("pkd-last", request, layer_map=[3, 2]).double()
    student = [[[0.5], [-2.0]], [[1.5], [0.25]], [[0.0], [0.0]]]
    expected = 0.0
    for b in range(2):
        for j, a in enumerate((3, 2)):
            linear = projector.adapters[j]
            s = as_np(linear.weight) @ np.array(student[j][b]) + as_np(linear.bias)
            t = np.array(TEACHER[a - 1][b])
            expected += np.sum((s / np.linalg.norm(s) - t / np.linalg.norm(t)) ** 2) / 2
    assert ild_value(projector, literal_inputs(TEACHER, student)).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name, buckets", [("ckd-no", [[1], [2, 3]]), ("ckd-po", [[1, 2], [2, 3]])])
def test_ckd_loss_matches_eq4(name, buckets):
    request = request_for(3, 2, 3, 2)
    torch.manual_seed(0)
    projector = kdplug.create_projector(name, request).double()
    assert [list(b) for b in projector.buckets] == buckets
    expected = 0.0
    for b in range(2):
        for j, bucket in enumerate(buckets):
            concat = np.concatenate([TEACHER[k - 1][b] for k in bucket])
            c = as_np(projector.projections[j].weight) @ concat + as_np(projector.projections[j].bias)
            expected += np.mean((np.array(STUDENT[j][b]) - c) ** 2) / 2
    assert ild_value(projector, literal_inputs(TEACHER, STUDENT)).item() == pytest.approx(expected, rel=1e-12)


def alp_reference(buckets, divisor=1.0):
    total = 0.0
    for b in range(2):
        for j, bucket in enumerate(buckets):
            s = np.array(STUDENT[j][b])
            keys = [np.array(TEACHER[k - 1][b]) for k in bucket]
            alpha = np_softmax([s @ key / divisor for key in keys])
            c = sum(a * key for a, key in zip(alpha, keys))
            total += np.mean((s - c) ** 2) / 2
    return total


@pytest.mark.parametrize(
    "name, buckets", [("alp", [[1, 2, 3], [1, 2, 3]]), ("alp-no", [[1], [2, 3]]), ("alp-po", [[1, 2], [2, 3]])]
)
def test_alp_loss_matches_eq5_to_7(name, buckets):
    projector = kdplug.create_projector(name, request_for(3, 2, 3, 2))
    value = ild_value(projector, literal_inputs(TEACHER, STUDENT))
    assert value.item() == pytest.approx(alp_reference(buckets), rel=1e-12)


@pytest.mark.parametrize("temperature, divisor", [(2.5, 2.5), ("sqrt-d", math.sqrt(2))])
def test_alp_attention_temperature_divides_the_scores(temperature, divisor):
    projector = kdplug.create_projector("alp", request_for(3, 2, 3, 2), attention_temperature=temperature)
    value = ild_value(projector, literal_inputs(TEACHER, STUDENT))
    assert value.item() == pytest.approx(alp_reference([[1, 2, 3], [1, 2, 3]], divisor), rel=1e-12)


@pytest.mark.parametrize("temperature", [0, -1, "sqrt", True])
def test_alp_rejects_a_bad_attention_temperature(temperature):
    with pytest.raises(UsageError, match="attention_temperature"):
        kdplug.create_projector("alp", request_for(3, 2, 3, 2), attention_temperature=temperature)


@pytest.mark.parametrize("name", ["alp", "alp-po", "alp-kqv1", "universal-il", "universal-cg", "universal-loss-att"])
def test_attention_is_computed_from_the_student_and_not_detached(name):
    # The target (or the weights) depends on the student through the attention, so the student's
    # gradient differs from the one the same target gives once frozen; the teacher still gets none.
    torch.manual_seed(0)
    projector = kdplug.create_projector(name, request_for(3, 2, 3, 2, outputs=2)).double()
    loss = kdplug.create_loss(projector.ild_loss)

    def student_gradients(freeze):
        inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=HEADS, student_logits=LOGITS)
        pairs = projector(inputs)
        target, weights = pairs.teacher, pairs.weights
        if freeze:
            target, weights = target.detach(), None if weights is None else weights.detach()
        loss(pairs.student, target, weights).backward()
        assert all(h.grad is None for h in inputs.teacher_layers)
        return [h.grad for h in [*inputs.student_layers, inputs.student_logits]]

    live, frozen = student_gradients(freeze=False), student_gradients(freeze=True)
    assert any(a is not None for a in live)
    assert any(a is not None and not torch.allclose(a, b) for a, b in zip(live, frozen))


def test_alp_key_query_value_with_identity_maps_is_scaled_dot_product_attention():
    # W^Q = W^K = W^V = W^O = I: C^j = sum_k softmax_k(h_s . h_t^k / sqrt(d)) h_t^k, from the equations alone
    request = request_for(3, 2, 3, 2)
    projector = kdplug.create_projector("alp-kqv1", request).double()
    with torch.no_grad():
        for layer in (projector.query, projector.key, projector.value, projector.output):
            layer.weight.copy_(torch.eye(2, dtype=torch.float64))
    expected = 0.0
    for b in range(2):
        keys = [np.array(TEACHER[k][b]) for k in range(3)]
        for j in range(2):
            s = np.array(STUDENT[j][b])
            alpha = np_softmax([s @ key / math.sqrt(2) for key in keys])
            c = sum(a * key for a, key in zip(alpha, keys))
            expected += np.mean((s - c) ** 2) / 2
    assert ild_value(projector, literal_inputs(TEACHER, STUDENT)).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name, heads", [("alp-kqv1", 1), ("alp-kqv4", 4), ("alp-kqv1", 2)])
def test_alp_key_query_value_matches_pytorchs_multi_head_attention(name, heads):
    # the reference is PyTorch's own multi-head attention (Vaswani et al.) given the same four maps
    width, n = 4, 3
    request = request_for(n, width, 3, width)
    torch.manual_seed(1)
    projector = kdplug.create_projector(name, request, heads=heads).double()
    inputs = make_inputs(request, batch=2, dtype=torch.float64)
    keys = torch.stack([h.detach() for h in inputs.teacher_layers], dim=0)  # (n, B, D): (source, batch, width)
    queries = torch.stack([h.detach() for h in inputs.student_layers[:-1]], dim=0)  # (m-1, B, D)
    in_proj = torch.cat([projector.query.weight, projector.key.weight, projector.value.weight]).detach()
    combined, _ = torch.nn.functional.multi_head_attention_forward(
        queries,
        keys,
        keys,
        width,
        heads,
        in_proj,
        None,
        None,
        None,
        False,
        0.0,
        projector.output.weight.detach(),
        None,
        training=False,
        need_weights=False,
    )
    expected = ((queries - combined) ** 2).mean(dim=-1).mean(dim=1).sum()  # MSE per pair, batch mean, pair sum
    assert ild_value(projector, inputs).item() == pytest.approx(expected.item(), rel=1e-10)


def test_alp_key_query_value_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(UsageError, match="heads"):
        kdplug.create_projector("alp-kqv4", request_for(3, 6, 3, 6))


def universal_terms(student_out, b):
    """Teacher distributions f_i^t, λ_i over i and the aggregated F^t for one student output."""
    teacher = [np_softmax(HEADS[b][i]) for i in range(3)]
    lam = np_softmax([t @ student_out for t in teacher])
    return teacher, lam, sum(weight * t for weight, t in zip(lam, teacher))


def kl(p, q):
    return sum(a * math.log(a / c) for a, c in zip(p, q))


@pytest.mark.parametrize("name", ["universal-il", "universal-ca"])
def test_universal_il_matches_eq3_to_7(name):
    request = request_for(3, 2, 3, 2, outputs=2)
    torch.manual_seed(2)
    projector = kdplug.create_projector(name, request).double()
    expected = 0.0
    for b in range(2):
        for j in range(2):  # the intermediate layers j = 1..m-1
            classifier = projector.classifiers[j]
            f_s = np_softmax(as_np(classifier.weight) @ np.array(STUDENT[j][b]) + as_np(classifier.bias))
            _, _, aggregated = universal_terms(f_s, b)
            expected += kl(aggregated, f_s) / 2
    inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=HEADS, student_logits=LOGITS)
    assert ild_value(projector, inputs).item() == pytest.approx(expected, rel=1e-12)


def test_universal_cg_matches_eq8():
    projector = kdplug.create_projector("universal-cg", request_for(3, 2, 3, 2, outputs=2))
    expected = 0.0
    for b in range(2):
        f_s = np_softmax(LOGITS[b])
        _, _, aggregated = universal_terms(f_s, b)
        expected += kl(aggregated, f_s) / 2
    inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=HEADS, student_logits=LOGITS)
    assert ild_value(projector, inputs).item() == pytest.approx(expected, rel=1e-12)
    assert list(projector.parameters()) == []


def test_universal_loss_attention_matches_table6_variant():
    projector = kdplug.create_projector("universal-loss-att", request_for(3, 2, 3, 2, outputs=2))
    expected = 0.0
    for b in range(2):
        f_s = np_softmax(LOGITS[b])
        teacher, lam, _ = universal_terms(f_s, b)
        expected += sum(weight * kl(t, f_s) for weight, t in zip(lam, teacher)) / 2
    inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=HEADS, student_logits=LOGITS)
    pairs = projector(inputs)
    assert ild_value(projector, inputs).item() == pytest.approx(expected, rel=1e-12)
    assert torch.allclose(pairs.attention.sum(dim=(1, 2)), torch.ones(2, dtype=torch.float64))


def test_universal_attention_temperature_divides_the_scores():
    plain = kdplug.create_projector("universal-cg", request_for(3, 2, 3, 2, outputs=2))
    sharp = kdplug.create_projector("universal-cg", request_for(3, 2, 3, 2, outputs=2), attention_temperature=0.1)
    inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=HEADS, student_logits=LOGITS)
    f_s = np_softmax(LOGITS[0])
    teacher = [np_softmax(HEADS[0][i]) for i in range(3)]
    assert as_np(sharp(inputs).attention[0, 0]) == pytest.approx(
        np_softmax([t @ f_s / 0.1 for t in teacher]), rel=1e-12
    )
    assert not torch.allclose(plain(inputs).attention, sharp(inputs).attention)
    with pytest.raises(UsageError, match="attention_temperature"):
        kdplug.create_projector("universal-cg", request_for(3, 2, 3, 2), attention_temperature="sqrt-d")


def test_universal_regression_attends_to_the_nearest_teacher_head():
    # METHODS.md: lambda_i = softmax_i(-(f_i^t - f^s)^2 / tau_att); heads 2.0, 3.0, 4.5, student 3.0
    projector = kdplug.create_projector("universal-cg", request_for(3, 2, 3, 2, outputs=1, regression=True))
    inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=[[[2.0], [3.0], [4.5]]] * 2, student_logits=[[3.0], [3.0]])
    scores = [-((2.0 - 3.0) ** 2), 0.0, -((4.5 - 3.0) ** 2)]
    expected = [math.exp(v) / sum(math.exp(w) for w in scores) for v in scores]  # .2497, .6788, .0715
    attention = projector(inputs).attention[0, 0]
    assert as_np(attention) == pytest.approx(expected, rel=1e-12)
    assert attention.argmax().item() == 1  # the head that agrees with the student, not the largest (4.5)


def test_universal_regression_uses_raw_predictions_and_mse():
    request = request_for(3, 2, 3, 2, outputs=1, regression=True)
    torch.manual_seed(3)
    projector = kdplug.create_projector("universal-il", request).double()
    assert projector.ild_loss == "mse"
    heads = [[[0.5], [2.0], [-1.0]], [[1.5], [0.0], [3.0]]]
    expected = 0.0
    for b in range(2):
        for j in range(2):
            classifier = projector.classifiers[j]
            f_s = (as_np(classifier.weight) @ np.array(STUDENT[j][b]) + as_np(classifier.bias)).item()
            f_t = [heads[b][i][0] for i in range(3)]
            lam = np_softmax([-((t - f_s) ** 2) for t in f_t])
            expected += (f_s - sum(weight * t for weight, t in zip(lam, f_t))) ** 2 / 2
    inputs = literal_inputs(TEACHER, STUDENT, teacher_heads=heads, student_logits=[[0.3], [0.1]])
    assert ild_value(projector, inputs).item() == pytest.approx(expected, rel=1e-12)


def test_universal_projectors_train_in_two_stages_by_default():
    for name in ("universal-il", "universal-cg", "universal-ca", "universal-loss-att"):
        assert kdplug.create_projector(name, request_for(3, 2, 3, 2)).default_recipe == "two-stage"


def test_universal_without_teacher_heads_is_a_clear_error():
    projector = kdplug.create_projector("universal-il", request_for(3, 2, 3, 2, outputs=2))
    with pytest.raises(UsageError, match="teacher_head_logits"):
        projector(literal_inputs(TEACHER, STUDENT))


@pytest.mark.parametrize("name", ["nkd", "rkd"])
def test_logit_methods_return_no_pairs(name):
    projector = kdplug.create_projector(name, request_for(4, 8, 2, 8))
    assert projector(make_inputs(request_for(4, 8, 2, 8))) is None
    assert list(projector.parameters()) == []
    assert projector.default_weights["lam"] == 0


def test_nkd_is_cross_entropy_only():
    assert kdplug.create_projector("nkd", request_for(4, 8, 2, 8)).default_weights["eta"] == 0


@pytest.mark.parametrize("name", ["pkd-skip", "ckd-no", "alp", "alp-kqv1", "universal-il"])
def test_hidden_layer_methods_need_an_intermediate_student_layer(name):
    with pytest.raises(UsageError, match="at least 2 layers"):
        kdplug.create_projector(name, request_for(12, 8, 1, 8))


# The contract every registered projector meets on a grid of layer shapes (shapes fit the loss,
# gradients reach every parameter and no teacher tensor, no NaN, deterministic, state round-trips)
# lives in the plugin kit and runs for every built-in: tests/plugin_kit/test_builtin_contracts.py.


STUDENT_INPUTS_READ = {  # which student tensors each method distils into
    "pkd-skip": "intermediate",
    "pkd-last": "intermediate",
    "ckd-no": "intermediate",
    "ckd-po": "intermediate",
    "alp": "intermediate",
    "alp-no": "intermediate",
    "alp-po": "intermediate",
    "alp-kqv1": "intermediate",
    "alp-kqv4": "intermediate",
    "universal-il": "intermediate",
    "universal-ca": "intermediate",
    "universal-cg": "logits",
    "universal-loss-att": "logits",
}


@pytest.mark.parametrize("name", sorted(STUDENT_INPUTS_READ))
@pytest.mark.parametrize("regression", [False, True])
def test_gradient_reaches_exactly_the_matched_student_tensors(name, regression):
    request = request_for(6, 16, 3, 16, outputs=1 if regression else 3, regression=regression)
    inputs = make_inputs(request)
    ild_value(kdplug.create_projector(name, request), inputs).backward()
    reached = [
        h.grad is not None and bool(h.grad.abs().sum() > 0) for h in [*inputs.student_layers, inputs.student_logits]
    ]
    expected = (
        [True, True, False, False] if STUDENT_INPUTS_READ[name] == "intermediate" else [False, False, False, True]
    )
    assert reached == expected


@pytest.mark.parametrize("name", ["universal-il", "universal-ca", "universal-cg", "universal-loss-att"])
def test_universal_works_across_architectures_and_regression(name):
    # A BiLSTM-like student (widths unrelated to the teacher's) on a regression task.
    request = ProjectionRequest(
        teacher_layers=tuple(LayerSpec(i, 768, "transformer") for i in range(1, 13)),
        student_layers=(LayerSpec(0, 1536, "lstm"), LayerSpec(1, 1536, "lstm"), LayerSpec(2, 768, "lstm")),
        num_outputs=1,
        is_regression=True,
    )
    projector = kdplug.create_projector(name, request)
    assert projector.ild_loss == "mse" and projector.needs_teacher_heads
    loss = ild_value(projector, make_inputs(request))
    assert torch.isfinite(loss)


@pytest.mark.parametrize("name", ["pkd-skip", "pkd-last", "alp", "alp-no", "alp-kqv4"])
def test_hidden_space_methods_learn_a_map_from_a_student_of_another_architecture(name):
    # (CKD's learned map is its W_j, from the teacher's buckets into the student's space, for any student)
    # BERT to BERT at one width: the papers' identity; a BiLSTM at the same width: a learned Linear
    same = kdplug.create_projector(name, request_for(4, 8, 3, 8))
    assert all(isinstance(a, torch.nn.Identity) for a in same.adapters)
    cross = request_for(4, 8, 3, 8, student_kind="lstm")
    projector = kdplug.create_projector(name, cross)
    assert projector.adapters and all(isinstance(a, torch.nn.Linear) for a in projector.adapters)
    before = [a.weight.detach().clone() for a in projector.adapters]
    optimizer = torch.optim.SGD(projector.parameters(), lr=0.1)
    ild_value(projector, make_inputs(cross)).backward()
    optimizer.step()
    assert all(not torch.equal(b, a.weight) for b, a in zip(before, projector.adapters))  # the loss trains each

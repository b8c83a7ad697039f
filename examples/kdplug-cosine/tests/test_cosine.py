"""kdplug's contracts on the cosine projector and loss, and the method's equation checked by hand."""

import math

import pytest
import torch

from kdplug.errors import UsageError
from kdplug.testing.contracts import LayerShapes, make_distill_inputs
from kdplug.testing.pytest_plugin import LossContract, ProjectorContract


class TestCosineProjector(ProjectorContract):
    name = "cosine"


class TestCosineOnTheTopLayerOnly(ProjectorContract):
    name = "cosine"
    options = {"layers": 1}


class TestCosineDistance(LossContract):
    name = "cosine-distance"


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_loss_is_one_minus_cosine_of_the_top_layers(kdplug_plugin_manager):
    registry = kdplug_plugin_manager.registry
    request = LayerShapes(6, 4, 3, 4).request()  # equal widths: no parameters, DistilBERT's setting
    projector = registry.create("projector", "cosine", request, layers=2)
    assert projector.pairs == ((3, 6), (2, 5)) and list(projector.parameters()) == []
    inputs = make_distill_inputs(request, batch=2)
    pairs = projector(inputs)
    value = registry.create("loss", "cosine-distance")(pairs.student, pairs.teacher)
    expected = 0.0
    for b in range(2):
        for s, t in projector.pairs:
            expected += 1 - cosine(inputs.student_layers[s - 1][b].tolist(), inputs.teacher_layers[t - 1][b].tolist())
    assert value.item() == pytest.approx(expected / 2, rel=1e-5)


def test_a_narrower_student_is_mapped_to_the_teacher_width_without_bias(kdplug_plugin_manager):
    projector = kdplug_plugin_manager.registry.create("projector", "cosine", LayerShapes(12, 32, 4, 16).request())
    assert [tuple(m.weight.shape) for m in projector.maps] == [(32, 16)] * 4
    assert all(m.bias is None for m in projector.maps)


def test_the_loss_ignores_scale(kdplug_plugin_manager):
    loss = kdplug_plugin_manager.registry.create("loss", "cosine-distance")
    x = torch.randn(3, 2, 8)
    assert loss(5.0 * x, x).item() == pytest.approx(0.0, abs=1e-6)
    assert loss(-x, x).item() == pytest.approx(2 * 2, rel=1e-6)  # cos = -1 on each of 2 pairs


@pytest.mark.parametrize(
    "layers, message",
    [
        (0, "layers must be an integer from 1 to 4"),  # the range: this projector's own check
        (5, "layers must be an integer from 1 to 4"),
        ("2", "projector_options.layers of projector 'cosine' must be a whole number"),  # the type: kdplug's
        (True, "projector_options.layers of projector 'cosine' must be a whole number"),
    ],
)
def test_layers_out_of_range_is_a_usage_error(kdplug_plugin_manager, layers, message):
    with pytest.raises(UsageError, match=message):
        kdplug_plugin_manager.registry.create(
            "projector", "cosine", LayerShapes(12, 32, 4, 16).request(), layers=layers
        )

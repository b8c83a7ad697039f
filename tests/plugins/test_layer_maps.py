"""Layer maps (Yu, Wen and Mou 2025) for every layer-matching projector. The reference maps are
written from the paper's reference code (``LAYER_MAP[m]``, reversed, permuted once, or all to
layer n/2), here by hand for 12 -> 4 and 6 -> 2, not from kdplug's code."""

from __future__ import annotations

import json

import pytest
import torch

import kdplug
from kdplug.cli import main
from kdplug.errors import UsageError
from kdplug.types import LayerSpec, ProjectionRequest

from ..conftest import write_sst2


def request(n, m, *, seed=0, width=8):
    return ProjectionRequest(
        teacher_layers=tuple(LayerSpec(i, width, "transformer") for i in range(1, n + 1)),
        student_layers=tuple(LayerSpec(i, width, "transformer") for i in range(1, m + 1)),
        num_outputs=2,
        seed=seed,
    )


def teacher_layers(projector):
    return [pair[1] for pair in projector.matching["pairs"]]


# 12 -> 4: PKD-skip's forward map of h^1..h^3 is ceil(j*12/4) = 3, 6, 9
@pytest.mark.parametrize(
    "layer_map, expected",
    [
        (None, [[3], [6], [9]]),
        ("forward", [[3], [6], [9]]),
        ("reverse", [[9], [6], [3]]),
        ("all-to-one", [[6], [6], [6]]),  # teacher layer n/2 = 6
        ("1:12,2:1,3:7", [[12], [1], [7]]),
        ("3:2, 1:4, 2:4", [[4], [4], [2]]),  # any order, spaces allowed
        ([1, 5, 9], [[1], [5], [9]]),
    ],
)
def test_pkd_layer_maps(layer_map, expected):
    projector = kdplug.create_projector("pkd-skip", request(12, 4), layer_map=layer_map)
    assert teacher_layers(projector) == expected
    assert [[layer] for layer in projector.layer_map] == expected


def test_the_output_layer_joins_the_map_on_request():
    """A 2-layer student under a 6-layer teacher: PKD matches h^1 only; Yu et al. match h^2 too,
    forward 3, 6 (j*n/m), reversed 6, 3."""
    assert teacher_layers(kdplug.create_projector("pkd-skip", request(6, 2))) == [[3]]
    forward = kdplug.create_projector("pkd-skip", request(6, 2), match_output_layer=True)
    reverse = kdplug.create_projector("pkd-skip", request(6, 2), match_output_layer=True, layer_map="reverse")
    assert teacher_layers(forward) == [[3], [6]] and teacher_layers(reverse) == [[6], [3]]
    inputs_t = [torch.full((2, 8), float(i)) for i in range(1, 7)]
    inputs_s = [torch.zeros(2, 8, requires_grad=True) for _ in range(2)]
    pairs = reverse(kdplug.types.DistillInputs(inputs_t, inputs_s, torch.zeros(2, 2), torch.zeros(2, 2)))
    assert pairs.teacher[:, 0].eq(6).all() and pairs.teacher[:, 1].eq(3).all()  # the reversed teacher layers


def test_a_random_map_is_a_permutation_of_the_forward_map_fixed_by_the_seed():
    forward = [[3], [6], [9]]
    drawn = {}
    for seed in range(12):
        maps = [teacher_layers(kdplug.create_projector("pkd-skip", request(12, 4, seed=seed), layer_map="random"))]
        maps.append(teacher_layers(kdplug.create_projector("pkd-skip", request(12, 4, seed=seed), layer_map="random")))
        assert maps[0] == maps[1]  # drawn once from the run's seed: the same on resume
        assert sorted(maps[0]) == forward
        drawn[seed] = maps[0]
    assert len({json.dumps(m) for m in drawn.values()}) > 1  # the seed matters


@pytest.mark.parametrize(
    "name, options", [("ckd-no", {}), ("ckd-po", {}), ("alp-no", {}), ("alp-po", {}), ("alp-kqv1", {"buckets": "no"})]
)
def test_bucketed_methods_rearrange_their_buckets(name, options):
    own = [list(bucket) for bucket in kdplug.create_projector(name, request(12, 4), **options).buckets]
    reverse = kdplug.create_projector(name, request(12, 4), layer_map="reverse", **options)
    assert [list(bucket) for bucket in reverse.buckets] == own[::-1]
    assert [
        list(b) for b in kdplug.create_projector(name, request(12, 4), layer_map="all-to-one", **options).buckets
    ] == [
        [6],
        [6],
        [6],
    ]
    random = kdplug.create_projector(name, request(12, 4, seed=3), layer_map="random", **options)
    assert sorted(map(list, random.buckets)) == sorted(own) and random.matching["layer_map"] == "random"


def test_ckd_uses_the_rearranged_buckets_in_its_computation():
    """CKD's target for student layer 1 under 'reverse' is the projection of the last bucket."""
    projector = kdplug.create_projector("ckd-no", request(4, 3), layer_map="reverse")  # buckets {3,4}, {1,2}
    teacher = [torch.full((2, 8), float(i)) for i in range(1, 5)]
    student = [torch.zeros(2, 8) for _ in range(3)]
    pairs = projector(kdplug.types.DistillInputs(teacher, student, torch.zeros(2, 2), torch.zeros(2, 2)))
    first = projector.projections[0]
    expected = first(torch.cat([teacher[2], teacher[3]], dim=-1))
    torch.testing.assert_close(pairs.teacher[:, 0], expected)


@pytest.mark.parametrize("name", ["pkd-skip", "ckd-no", "alp-no", "cka"])
def test_one_matched_layer_refuses_a_reordering_that_changes_nothing(name):
    with pytest.raises(UsageError, match="only one is matched"):
        kdplug.create_projector(name, request(12, 2), layer_map="reverse")


def test_alp_over_all_layers_refuses_a_reordering_that_changes_nothing():
    with pytest.raises(UsageError, match="alp-no or alp-po"):
        kdplug.create_projector("alp", request(12, 4), layer_map="reverse")


@pytest.mark.parametrize(
    "layer_map, message",
    [
        ("sideways", "must be one of forward, reverse, random, all-to-one"),
        ("1:3,2:6", "each matched student layer 1..3 once"),
        ("1:3,1:6,3:9", "each matched student layer 1..3 once"),
        ("1:3,2:6,3:13", "teacher layers are numbered 1..12"),
        ("1:3,2:6,4:9", "each matched student layer 1..3 once"),
    ],
)
def test_bad_layer_maps_say_what_is_accepted(layer_map, message):
    for name in ("pkd-skip", "ckd-no"):
        with pytest.raises(UsageError, match=message):
            kdplug.create_projector(name, request(12, 4), layer_map=layer_map)


def test_a_run_records_the_drawn_map(tmp_path, tiny_bert_dir):
    """The random map a run drew is in metrics.json with its stage, and a bad map stops the run
    before the teacher is fine-tuned."""
    data = write_sst2(tmp_path / "SST-2")
    argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(data), "--student", "bert-2"]
    argv += ["--projector", "pkd-skip", "--epochs", "1", "--set", "teacher_epochs=1"]
    argv += ["--set", "allow_weak_teacher=true", "--set", "projector_options.match_output_layer=true"]
    assert main([*argv, "--set", "projector_options.layer_map=sideways", "--output", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()
    output = tmp_path / "run"
    assert main([*argv, "--set", "projector_options.layer_map=random", "--output", str(output)]) == 0
    stages = json.loads((output / "metrics.json").read_text())["stages"]
    matching = next(stage["matching"] for stage in stages.values() if "matching" in stage)
    assert matching["layer_map"] == "random" and sorted(pair[1] for pair in matching["pairs"]) == [[2], [4]]

"""The registry: names, templated names, duplicates and suggestions for unknown names."""

from __future__ import annotations

import pytest

import kdplug
from kdplug.errors import PluginError, UnknownComponentError, close_matches
from kdplug.registry import Registry


def factory(*args, **kwargs):
    return args, kwargs


def test_templated_name_passes_its_field_as_an_option():
    registry = Registry()
    registry.add("student", "bert-{layers}", factory)
    args, kwargs = registry.create("student", "bert-4", "task", dropout=0.1)
    assert args == ("task",)
    assert kwargs == {"layers": 4, "dropout": 0.1}
    with pytest.raises(UnknownComponentError):
        registry.create("student", "bert-x")


def test_exact_name_wins_over_a_template():
    registry = Registry()
    registry.add("student", "bert-{layers}", factory)
    registry.add("student", "bert-tiny", lambda: "tiny")
    assert registry.create("student", "bert-tiny") == "tiny"


def test_duplicate_names_name_both_providers():
    registry = Registry()
    registry.add("projector", "alp", factory, plugin="first", distribution="dist-one", version="1.0")
    registry.add("projector", "alp", factory, plugin="second", distribution="dist-two", version="2.0")
    registry.add("projector", "rkd", factory, plugin="third", distribution="dist-one", version="1.0")
    with pytest.raises(PluginError) as error:
        registry.create("projector", "alp")
    assert "dist-one" in str(error.value) and "dist-two" in str(error.value)
    assert registry.create("projector", "rkd") == factory()  # other names are unaffected


def test_a_built_in_keeps_its_name_against_a_third_party_plugin():
    registry = Registry()
    registry.add("projector", "rkd", lambda: "third-party", plugin="x", distribution="kdplug-x", version="1.0")
    registry.add("projector", "rkd", lambda: "built-in", plugin="logit-kd", distribution="kdplug", version="0.1.0")
    assert registry.create("projector", "rkd") == "built-in"
    assert [s.entry.distribution for s in registry.shadowed] == ["kdplug-x"]


def test_unknown_name_lists_the_available_ones_and_the_closest():
    registry = Registry()
    for name in ("pkd-skip", "pkd-last", "alp", "rkd", "nkd"):
        registry.add("projector", name, factory)
    with pytest.raises(UnknownComponentError) as error:
        registry.create("projector", "pdk")
    assert error.value.suggestions[0] in ("pkd-skip", "pkd-last")
    assert "Did you mean 'pkd-" in str(error.value)
    assert all(name in str(error.value) for name in ("alp", "rkd", "nkd"))
    assert error.value.exit_code == 2


def test_close_matches_ignores_unrelated_names():
    assert close_matches("zzzz", ["pkd-skip", "alp"]) == []
    assert close_matches("sst-2", ["sst2", "mrpc", "cola"])[0] == "sst2"


def test_non_callable_factory_is_rejected():
    with pytest.raises(PluginError):
        Registry().add("loss", "broken", 3)


def test_list_helpers_filter_with_globs():
    alp = kdplug.list_projectors("alp*")
    assert "alp" in alp and all(name.startswith("alp") for name in alp)
    assert "pkd-skip" not in alp


def test_first_party_pipeline_components_are_registered():
    expected = {
        "teacher": {"hf", "bert-base", "roberta-large", "distilroberta", "minilm"},
        "student": {"bilstm", "gated-cnn", "bert-{layers}", "distilroberta"},
        "projector": {"nkd", "rkd", "pkd-skip"},
        "loss": {"ce", "kd", "mse"},
        "task": {"sst2", "demo", "local"},
        "recipe": {"standard", "two-stage"},
    }
    for kind, names in expected.items():
        assert names <= set(kdplug.list_components(kind)), kind

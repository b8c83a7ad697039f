"""Options that depend on the models are refused before the teacher is loaded or fine-tuned.

The run's projector is built once in preflight from the models' shapes, which the teacher and
student factories read from configs (no weights): every projector option a 4-layer teacher and a
3-layer student cannot take exits 2 in a fraction of a second, and no teacher is fine-tuned.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

import kdplug
from kdplug.cli import main
from kdplug.engine.recipe import token_spec
from kdplug.plugins import get_plugin_manager
from kdplug.testing.tiny import TinyTask, make_tiny_bert, make_tiny_roberta
from kdplug.types import matchable_layers

from ..conftest import write_sst2

#: for each projector option, a value it refuses under a 4-layer teacher 32 wide (2 heads) and a
#: 3-layer student: a layer the teacher lacks, a count that divides no width, or a wrong type
BAD_VALUES = {
    "layer_map": "[1, 9]",
    "buckets": "[[1], [9]]",
    "teacher_layer": "9",
    "relation_heads": "5",
    "heads": "5",
    "attention_temperature": "-1",
    "standardize": "maybe",
    "attention": "sometimes",
    "embeddings": "2",
    "loss_reduction": "max",
    "match_output_layer": "perhaps",
}


def first_party_projector_options() -> list[tuple[str, str]]:
    """(projector, option) for every option of every projector kdplug ships (the signature is the
    documented list: docs/methods.md names the same)."""
    registry = get_plugin_manager().registry
    found = []
    for entry in registry.entries("projector"):
        factory = getattr(entry.factory, "func", entry.factory)
        if not factory.__module__.startswith("kdplug_methods"):
            continue
        parameters = inspect.signature(factory).parameters.values()
        found += [(entry.name, p.name) for p in parameters if p.kind is p.KEYWORD_ONLY]
    return found


def run(tmp_path: Path, teacher: str, student: str, projector: str, *settings: str) -> tuple[int, str]:
    data = write_sst2(tmp_path / "SST-2")
    argv = ["run", "--teacher", teacher, "--student", student, "--task", "sst2", "--data-dir", str(data)]
    argv += ["--projector", projector, "--set", "teacher_epochs=1", "--set", "allow_weak_teacher=true"]
    for setting in settings:
        argv += ["--set", setting]
    return main([*argv, "--output", str(tmp_path / "run")]), str(tmp_path / "run")


def assert_no_teacher_was_fine_tuned(run_dir: str) -> None:
    cache = Path(os.environ["KDPLUG_CACHE"])
    assert not (cache / "teachers").exists(), "a teacher was fine-tuned and stored"
    log = Path(run_dir, "log.txt")  # absent where the option was refused before the run directory was made
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    assert "teacher epoch" not in text and "fine-tun" not in text.split("the run failed")[0], text


def test_every_projector_option_has_a_bad_value_here():
    assert {option for _, option in first_party_projector_options()} <= set(BAD_VALUES)


@pytest.mark.parametrize("projector, option", first_party_projector_options())
def test_a_bad_projector_option_exits_2_before_the_teacher_is_fine_tuned(
    tmp_path, capsys, tiny_bert_dir, projector, option
):
    code, run_dir = run(
        tmp_path, tiny_bert_dir, "bert-3", projector, f"projector_options.{option}={BAD_VALUES[option]}"
    )
    err = capsys.readouterr().err
    assert code == 2 and f"projector {projector!r}" in err and option in err, err
    assert_no_teacher_was_fine_tuned(run_dir)


@pytest.mark.parametrize(
    "student, projector, setting, message",
    [  # issue 33's three, each refused only after the teacher was fine-tuned
        (
            "bert-2",
            "minilm-v2",
            "relation_heads=5",
            "relation_heads 5 must divide both widths (teacher 32, student 32)",
        ),
        ("bert-2", "alp", "layer_map=[99,0]", "a list of 1 teacher layer number(s) (1..4); got [99, 0]"),
        ("bert-2", "pkd-skip", "layer_map=[0,1,2,3,4,5]", "i.e. 1 number(s); got [0, 1, 2, 3, 4, 5]"),
        # and the student the teacher is too small for, a pooled student's width
        ("bert-9", "pkd-skip", "loss_reduction=sum", "student 'bert-9' takes the teacher's first 9 layers, but the"),
        ("bilstm", "alp-kqv4", "heads=3", "heads must be a positive divisor of the teacher width 32, got 3"),
    ],
)
def test_options_that_depend_on_the_models_are_refused_before_the_teacher(
    tmp_path, capsys, tiny_bert_dir, student, projector, setting, message
):
    code, run_dir = run(tmp_path, tiny_bert_dir, student, projector, f"projector_options.{setting}")
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert_no_teacher_was_fine_tuned(run_dir)


@pytest.mark.parametrize(
    "student, options",
    [
        ("bert-3", {}),
        ("bert-2", {"hidden_dropout_prob": 0.2}),
        ("bilstm", {"hidden_size": 24, "num_layers": 2, "embedding_dim": 8}),
        ("gated-cnn", {"embedding_dim": 8}),
        ("hf", {"source": "TINY"}),
    ],
)
def test_the_declared_shapes_are_the_built_models(tmp_path, student, options):
    """What preflight checks against is what the run builds: a shape that differed would refuse
    good options, or let bad ones through to fail after the fine-tuning."""
    registry = get_plugin_manager().registry
    task = TinyTask()
    source = make_tiny_bert(tmp_path / "teacher", num_layers=4, hidden=32, heads=2)
    options = {k: make_tiny_bert(tmp_path / "student", num_layers=3, hidden=16, heads=4) if v == "TINY" else v
               for k, v in options.items()}  # fmt: skip
    teacher = kdplug.create_teacher("hf", task, source=source)
    teacher_shape = registry.model_shape("teacher", "hf", task, source=source)
    assert_shape(registry, teacher.model, teacher_shape)
    model = registry.create("student", student, task, teacher, **options)
    assert_shape(registry, model, registry.model_shape("student", student, task, teacher_shape, **options))


def test_a_roberta_teacher_and_distilroberta_from_it_declare_their_shapes(tmp_path):
    registry = get_plugin_manager().registry
    task = TinyTask()
    source = make_tiny_roberta(tmp_path / "teacher", num_layers=4, hidden=32, heads=4)
    teacher = kdplug.create_teacher("hf", task, source=source)
    teacher_shape = registry.model_shape("teacher", "hf", task, source=source)
    assert_shape(registry, teacher.model, teacher_shape)
    options = {"from_teacher": True, "layers": 2, "init": "teacher"}
    model = registry.create("student", "distilroberta", task, teacher, **options)
    assert_shape(registry, model, registry.model_shape("student", "distilroberta", task, teacher_shape, **options))


def assert_shape(registry, model, shape) -> None:
    extractor = registry.find_layer_extractor(model)
    assert shape.layers == matchable_layers(extractor.layer_specs(model))
    assert shape.tokens == token_spec(extractor, model)

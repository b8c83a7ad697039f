"""Every option is checked against its declared type and range, in one place, before anything loads:
a string is never a boolean (``trust_remote_code: "no"`` ran a checkpoint's own code), a float with a
fraction is never a whole number, and ``--threads`` never exceeds the cores the process may use."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest

from kdplug.components import process_registry
from kdplug.errors import ConfigError
from kdplug.options import Range, declared_options, fits
from kdplug.registry import KINDS, OPTION_KEYS, Registry

from .test_nothing_lost import run, tiny_argv

#: the positional values each kind's factory is called with before its options (engine/preflight.py)
POSITIONAL = {"teacher": 1, "student": 2, "projector": 1, "loss": 0, "task": 0, "recipe": 0, "augmenter": 1}


def wrong_value(hint: Any) -> Any:
    """A value a user could give by mistake that ``hint`` does not allow, or None where every
    mistake this tries is allowed (``Any``, a plugin's own class)."""
    for candidate in ("no", 2.5, "0.1", 7, [1, 2], {"a": 1}):
        if not fits(candidate, hint):
            return candidate
    return None


def declared(kind: str):
    """(name, option, hint, default) of every declared option of every registered ``kind``."""
    for entry in process_registry().entries(kind):
        hints = declared_options(entry.factory)
        parameters = list(inspect.signature(entry.factory).parameters.values())[POSITIONAL[kind] :]
        for parameter in parameters:
            if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) or parameter.name not in hints:
                continue
            name = re.sub(r"\{\w+\}", "4", entry.name)  # a templated name (bert-{layers}) as a user writes it
            yield name, parameter.name, hints[parameter.name], parameter.default


def required_text(registry, kind: str, name: str) -> dict[str, str]:
    """Text for each option a factory requires (the prompted teacher's source and prompt), so the
    check reaches the option under test."""
    entry, implied = registry.resolve(kind, name)  # bert-4's layers are its name's
    parameters = list(inspect.signature(entry.factory).parameters.values())[POSITIONAL[kind] :]
    return {
        p.name: "text"
        for p in parameters
        if p.default is p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in implied
    }


@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "layer_extractor"])
def test_every_declared_option_refuses_a_value_of_another_type_naming_it(kind):
    registry, checked = process_registry(), 0
    for name, option, hint, default in declared(kind):
        if default is not inspect.Parameter.empty:  # a declaration its own default breaks would refuse every run
            assert fits(default, hint), f"{kind} {name!r}: the default {default!r} of {option} is not {hint}"
        value = wrong_value(hint)
        if value is None:
            continue
        with pytest.raises(ConfigError) as raised:
            options = {**required_text(registry, kind, name), option: value}
            registry.check_options(kind, name, *[None] * POSITIONAL[kind], **options)
        section = OPTION_KEYS.get(kind, f"{kind}_options")
        assert f"{section}.{option} of {kind} {name!r} must be " in str(raised.value), str(raised.value)
        assert repr(value) in str(raised.value)
        checked += 1
    assert checked or kind == "loss", f"no {kind} option was checked"


@pytest.mark.parametrize(
    "value, hint, allowed",
    [
        ("no", bool, False),
        ("false", Optional[bool], False),
        (0, bool, False),  # YAML's 0 is a number, not false
        (True, int, False),
        (3.0, int, False),
        (3, float, True),
        (float("nan"), float, False),
        ("1e-5", float, False),
        (None, Optional[int], True),
        (None, int, False),
        ([1, 2], Optional[list[int]], True),
        ([1, "2"], list[int], False),
        ("0,1", typing.Union[str, list[int], None], True),
        ("mean", Literal["mean", "sum"], True),
        ("max", Literal["mean", "sum"], False),
        (0, Annotated[int, Range(1)], False),
        (1, Annotated[int, Range(1)], True),
        (1.0, Annotated[float, Range(0, 1, high_open=True)], False),
        ("models/teacher", Path, True),
        ({"lr": 1}, dict, True),
        ("x", dict, False),
    ],
)
def test_values_against_declarations(value, hint, allowed):
    assert fits(value, hint) is allowed


def test_a_plugins_range_is_checked_with_the_type():
    def factory(task, *, hidden: Annotated[int, Range(1, 4096)] = 64, dropout: Annotated[float, Range(0, 1)] = 0.1):
        raise AssertionError("a check builds nothing")

    registry = Registry()
    registry.add("student", "ranged", factory, plugin="third-party")
    for option, value, words in [("hidden", 0, "a whole number at least 1 and at most 4096"), ("dropout", 1.5, "")]:
        with pytest.raises(ConfigError, match=f"student_options.{option} .* must be {words}"):
            registry.check_options("student", "ranged", None, **{option: value})
    registry.check_options("student", "ranged", None, hidden=4096, dropout=1)


HOSTILE = 'import pathlib\npathlib.Path({marker!r}).write_text("the checkpoint\'s own code ran")\n'


@pytest.fixture
def teacher_with_own_code(tmp_path, tiny_bert_dir):
    """A BERT checkpoint naming a module of its own (auto_map) that writes ``RAN`` when imported."""
    teacher = Path(shutil.copytree(tiny_bert_dir, tmp_path / "teacher"))
    (teacher / "hostile_code.py").write_text(HOSTILE.format(marker=str(tmp_path / "RAN")))
    config = json.loads((teacher / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "hostile_code.Nope", "AutoModelForSequenceClassification": "hostile_code.Nope"}
    (teacher / "config.json").write_text(json.dumps(config))
    return teacher


@pytest.mark.parametrize("how", ["--set", "file"])
@pytest.mark.parametrize("text", ['"no"', "'false'", '"off"'])
def test_trust_remote_code_given_as_text_is_refused_and_runs_no_code(
    capsys, tmp_path, sst2_dir, teacher_with_own_code, how, text
):
    if how == "--set":
        given = ["--set", f"teacher_options.trust_remote_code={text}"]
    else:
        (tmp_path / "run.yaml").write_text(f"teacher_options:\n  trust_remote_code: {text}\n")
        given = ["--config", str(tmp_path / "run.yaml")]
    code, _, err = run(capsys, *tiny_argv(str(teacher_with_own_code), sst2_dir, tmp_path / "run", *given))
    assert code == 2, err
    word = text.strip("'\"")
    assert f"teacher_options.trust_remote_code of teacher 'hf' must be true or false, got '{word}' (str)" in err
    assert "write true or false without quotes" in err
    assert not (tmp_path / "RAN").exists(), "the checkpoint's code ran"
    assert not (tmp_path / "run").exists()


def test_a_student_option_of_the_wrong_type_stops_before_the_teacher(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    argv = tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run", "--set", "student_options.hidden_size=2.5")
    code, out, err = run(capsys, *argv)
    assert code == 2 and "student_options.hidden_size of student 'bilstm' must be a whole number" in err
    assert "teacher" not in out.lower() and not (tmp_path / "run").exists()


def test_more_threads_than_cores_is_refused_before_any_work(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    from kdplug.threads import usable_cores

    cores = usable_cores()
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run", "--threads", "1000"))
    assert code == 2, err
    assert (
        f"threads=1000 (--threads): this process may use {cores} core" in err
        and f"Use --threads {cores} or less" in err
    )
    assert not (tmp_path / "run").exists()


def test_an_augment_factor_without_augment_is_refused_not_ignored(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    """Before, --augment-factor 5 without --augment ran without a transfer set and said nothing."""
    code, _, err = run(capsys, *tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run", "--augment-factor", "5"))
    assert code == 2 and "--augment-factor 5 sets how many augmented copies" in err and "add --augment tang" in err
    assert not (tmp_path / "run").exists()


# -- found by trying it as an unlucky user would ------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [("1e-5", 1e-5), ("1E5", 1e5), ("-2e3", -2000.0), ('"010"', "010"), ("'1e-5'", "1e-5"), ("1e", "1e")],
)
def test_a_set_value_is_read_as_yaml_12_reads_it_and_text_in_quotes_stays_text(text, value):
    from kdplug.config import parse_value

    assert parse_value(text) == value and type(parse_value(text)) is type(value)


def test_a_configuration_files_exponent_is_a_number_and_text_keys_refuse_numbers(tmp_path):
    from kdplug.config import build_config

    (tmp_path / "run.yaml").write_text("lr: 1e-5\nprojector_options: {attention_temperature: 2e0}\n")
    config = build_config(file=str(tmp_path / "run.yaml"))
    assert config.lr == 1e-5 and config.projector_options == {"attention_temperature": 2.0}
    with pytest.raises(ConfigError, match=r"output must be text, or null, got 8 \(int\) \(YAML read it as a number"):
        build_config(overrides=["output=010"])  # YAML 1.1's octal: it wrote into ./8
    assert build_config(overrides=["output='010'"]).output == "010"
    yaml_boolean = r"got False \(bool\) \(YAML reads an unquoted yes, no, on, off, true or false as a boolean"
    with pytest.raises(ConfigError, match=r"output must be text, or null, " + yaml_boolean):
        build_config(overrides=["output=off"])  # a folder named off
    with pytest.raises(ConfigError, match=r"offload_folder of teacher 'hf' must be text, or null, " + yaml_boolean):
        process_registry().check_options("teacher", "hf", None, offload_folder=False)  # the task: a placeholder
    assert build_config(overrides=["output='off'"]).output == "off"
    with pytest.raises(ConfigError, match=r"epochs must be a whole number, or null, got 2.0 \(float\) \(write 2,"):
        build_config(overrides=["epochs=2.0"])
    with pytest.raises(ConfigError, match=r"seed must be 0 or more and below 2\*\*32"):
        build_config(overrides=["seed=1000000000000000000000"])


@pytest.mark.parametrize(
    "options, words",
    [
        ({"phase2_lr": float("inf")}, "recipe_options.phase2_lr of recipe 'annealing' must be a number above 0"),
        ({"e2": -1}, "recipe_options.e2 of recipe 'annealing' must be a whole number at least 0"),
    ],
)
def test_infinite_and_out_of_range_values_are_refused(options, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        process_registry().check_options("recipe", "annealing", **options)
    process_registry().check_options("recipe", "annealing", e2=0)  # 0 skips phase 2 (docs/recipes.md)


def test_a_huge_size_is_refused_with_a_short_message():
    with pytest.raises(ConfigError) as raised:
        process_registry().check_options("student", "bilstm", None, None, hidden_size=10**30)
    assert "at most 2.14748e+09" in str(raised.value) and len(str(raised.value)) < 200
    with pytest.raises(ConfigError) as raised:
        process_registry().check_options("student", "bilstm", None, None, hidden_size=1e308)
    assert "without the point" not in str(raised.value) and len(str(raised.value)) < 200


@pytest.mark.parametrize("calibrate", ["no", "false", "off"])
def test_calibrate_given_as_text_is_refused_not_used_as_a_content_free_input(calibrate):
    from kdplug.errors import UsageError
    from kdplug_models.prompting import _content_free

    with pytest.raises(UsageError, match=f"calibrate must be true or false .* got the text '{calibrate}'"):
        _content_free(calibrate)
    assert _content_free([calibrate]) == (calibrate,)  # one content-free input of the user's own, as a list


def test_an_attribute_of_a_checkpoints_config_keeps_its_type(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    argv = tiny_argv(tiny_bert_dir, sst2_dir, tmp_path / "run", "--set", "teacher_options.num_hidden_layers=2.5")
    code, _, err = run(capsys, *argv, "--dry-run")
    assert code == 2, err
    assert "teacher_options.num_hidden_layers must be a whole number, as the checkpoint's BertConfig has it" in err
    assert "Traceback" not in err


# -- options forwarded through **kwargs are typed too ---------------------------------------------------------

#: what each open-ended factory's ``**kwargs`` is, where it is not forwarded to a factory it declares
#: (kdplug.options.forwards_options): a checkpoint config's attributes (typed against that config by the
#: factory's check_options), options refused by name (a task's ``unknown``), or nothing (a loss Module
#: without an ``__init__`` of its own, whose signature is torch's)
OPEN_ENDED = {"config_overrides", "unknown", "kwargs"}


def test_every_option_of_every_factory_is_typed_including_those_forwarded_through_kwargs():
    import torch

    registry, untyped = process_registry(), []
    for kind in KINDS:
        if kind == "layer_extractor":
            continue
        for entry in registry.entries(kind):
            hints = declared_options(entry.factory)
            parameters = list(inspect.signature(entry.factory).parameters.values())[POSITIONAL[kind] :]
            for parameter in parameters:
                if parameter.kind is parameter.VAR_KEYWORD:
                    module_without_options = getattr(entry.factory, "__init__", None) is torch.nn.Module.__init__
                    if parameter.name not in OPEN_ENDED or (parameter.name == "kwargs") != module_without_options:
                        untyped.append(f"{kind} {entry.name}: **{parameter.name}")
                elif parameter.kind is not parameter.VAR_POSITIONAL and parameter.name not in hints:
                    untyped.append(f"{kind} {entry.name}: {parameter.name}")
    assert not untyped, f"options no declaration types: {untyped}"


def test_minilm_takes_the_hf_teachers_declared_options():
    with pytest.raises(ConfigError, match=r"teacher_options.trust_remote_code of teacher 'minilm' must be true or"):
        process_registry().check_options("teacher", "minilm", None, trust_remote_code="no")
    with pytest.raises(ConfigError, match=r"teacher_options.revision of teacher 'minilm' must be text"):
        process_registry().check_options("teacher", "minilm", None, revision=3)


def test_minilm_with_trust_remote_code_as_text_runs_no_code(capsys, tmp_path, sst2_dir, teacher_with_own_code):
    given = ["--set", f"teacher_options.source={teacher_with_own_code}"]
    given += ["--set", 'teacher_options.trust_remote_code="no"']
    code, _, err = run(capsys, *tiny_argv("minilm", sst2_dir, tmp_path / "run", *given))  # --teacher minilm
    assert code == 2, err
    assert "teacher_options.trust_remote_code of teacher 'minilm' must be true or false, got 'no' (str)" in err
    assert not (tmp_path / "RAN").exists(), "the checkpoint's code ran"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("given", ["no", "false", 1, None])
def test_the_hub_loader_passes_trust_remote_code_only_when_it_is_true(tmp_path, teacher_with_own_code, given):
    from transformers import AutoConfig

    from kdplug.errors import UsageError
    from kdplug.hub import load_pretrained

    with pytest.raises(UsageError, match="trust_remote_code must be true or false"):
        load_pretrained(AutoConfig, str(teacher_with_own_code), "teacher", trust_remote_code=given)
    assert not (tmp_path / "RAN").exists(), "the checkpoint's code ran"


def test_a_whole_number_too_large_for_a_float_is_out_of_range_not_a_crash():
    from kdplug.config import build_config

    with pytest.raises(ConfigError) as raised:
        process_registry().check_options("student", "bilstm", None, None, hidden_size=10**400)
    assert "student_options.hidden_size of student 'bilstm' must be a whole number at least 1" in str(raised.value)
    with pytest.raises(ConfigError, match=r"lr must be a number at most 1.79769e\+308, got 9999"):
        build_config(overrides=["lr=" + "9" * 400])


def test_a_number_in_quotes_is_told_to_drop_the_quotes_not_that_yaml_reads_exponents_as_text():
    with pytest.raises(ConfigError) as raised:
        process_registry().check_options("recipe", "annealing", phase2_lr="1e-5")
    message = str(raised.value)
    assert "got '1e-5' (str) ('1e-5' is text, in quotes: remove the quotes to give the number)" in message, message
    assert "YAML reads 1e-5 as text" not in message

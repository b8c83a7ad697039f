"""Teacher ensembles as the user gives them: ``--teacher A --teacher B``, ``--teacher-weights``,
``--set teachers.N...``, a ``teachers`` list in the file and in ``kdplug.distill``; every mistake exits 2
naming the member and the fix before any model loads; ``command_line`` and ``--resume`` keep the members."""

from __future__ import annotations

import copy
import json
import shlex
import time

import pytest
import yaml

from kdplug.cli import build_parser, main
from kdplug.commands.run import check_resume_settings, config_from_arguments, resumed_teachers
from kdplug.components import process_manager
from kdplug.config import RunConfig, apply, build_config, command_line, dump_yaml
from kdplug.engine import preflight
from kdplug.errors import ArgumentError, UsageError
from kdplug.python_api import distill
from kdplug.testing.tiny import make_tiny_bert

SERVED = {"base_url": "http://127.0.0.1:9/v1", "prompt": "Review: {text} Sentiment:", "verbalizer": [" bad", " good"]}


def config_of(*argv: str) -> RunConfig:
    """The configuration ``kdplug run ARGV`` runs (its parser and its flags, as the command reads them)."""
    return config_from_arguments(build_parser().parse_args(["run", *argv]))


def refused(capsys, *argv: str) -> str:
    """``kdplug run ARGV --dry-run`` exits 2; its message on one line."""
    assert main(["run", *argv, "--dry-run"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def two_teachers(tmp_path_factory) -> tuple[str, str]:
    """Two tiny checkpoint directories: two in-process teachers that have layers."""
    root = tmp_path_factory.mktemp("teachers")
    return tuple(make_tiny_bert(root / name, num_layers=2, hidden=16) for name in ("a", "b"))


def test_repeated_teacher_flags_make_an_ensemble_in_order_and_one_flag_stays_one_teacher():
    one = config_of("--teacher", "bert-base")
    assert one.teachers == [] and one.to_dict() == build_config(flags={"teacher": "bert-base"}).to_dict()
    ensemble = config_of("--teacher", "bert-base", "--teacher", "roberta-base", "--teacher-weights", "2", "1")
    assert ensemble.teachers == [{"teacher": "bert-base", "weight": 2.0}, {"teacher": "roberta-base", "weight": 1.0}]
    assert ensemble.teacher == "bert-base"  # what a run shows as its teacher: the first member
    assert [(m.name, m.weight) for m in ensemble.members()] == [("bert-base", 2 / 3), ("roberta-base", 1 / 3)]


def test_run_help_shows_ensembles(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--teacher-weights W [W ...]" in out and "repeat it for an ensemble" in out
    assert "--teacher A --teacher B" in out and "--set teachers.1.teacher_options" in out  # an epilog example


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--teacher", "a", "--teacher-weights", "1"], "--teacher-weights weighs an ensemble's members, and this run"),
        (["--teacher", "a", "--teacher", "b", "--teacher-weights", "1"], "gives 1 weight for 2 teachers"),
        (["--teacher", "a", "--teacher", "b", "--teacher-weights", "1", "2", "3"], "gives 3 weights for 2 teachers"),
        (
            ["--teacher", "a", "--teacher", "b", "--teacher-weights", "1", "0"],
            "takes positive numbers (e.g. 2 1), got '0'",
        ),
        (["--teacher", "a", "--teacher", "b", "--teacher-weights", "1", "-1"], "positive numbers (e.g. 2 1), got '-1'"),
        (
            ["--teacher", "a", "--teacher", "b", "--teacher-weights", "nan", "1"],
            "positive numbers (e.g. 2 1), got 'nan'",
        ),
        (
            ["--teacher", "a", "--teacher", "b", "--teacher-weights", "inf", "1"],
            "positive numbers (e.g. 2 1), got 'inf'",
        ),
        (
            ["--teacher", "a", "--teacher", "b", "--teacher-weights", "two", "1"],
            "positive numbers (e.g. 2 1), got 'two'",
        ),
        (["--teacher-weights", "1", "2"], "and this run has one teacher"),
    ],
)
def test_teacher_weights_need_one_positive_number_per_teacher(capsys, argv, message):
    assert message in refused(capsys, *argv)


def test_set_teachers_n_sets_a_members_options_weight_and_adds_one():
    config = config_of(
        *("--teacher", "bert-base", "--teacher", "hf"),
        *("--set", "teachers.1.teacher_options.source=org/model", "--set", "teachers.0.weight=3"),
        *("--set", "teachers.2.teacher=roberta-base", "--set", "teachers.2.weight=0.5"),
    )
    assert config.teachers == [
        {"teacher": "bert-base", "weight": 3},
        {"teacher": "hf", "teacher_options": {"source": "org/model"}},
        {"teacher": "roberta-base", "weight": 0.5},
    ]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "teachers.5.weight=1",
            "teachers.5.weight: the run has 2 teachers in its teachers list; use teachers.0 to "
            "teachers.1, or teachers.2 to add one",
        ),
        ("teachers.one.weight=1", "after teachers. comes a member's position (teachers.0.weight=2"),
        ("teachers.0.wieght=2", "a member's keys are teacher, teacher_options, weight"),
        ("teachers.0.weight.x=2", "a member's keys are teacher, teacher_options, weight"),
        (
            "teacher_options.dtype=bf16",
            "teacher_options (dtype) are one teacher's options, and this run has 2 "
            "teachers: set a member's with --set teachers.N.teacher_options.KEY=VALUE (N from 0 to 1)",
        ),
        ("teacher=roberta-base", "teacher 'roberta-base' and teachers (bert-base, hf) both name the run's teacher"),
        ("layer_teacher=2", "layer_teacher must be the position of an ensemble member, 0 to 1, got 2"),
        ("teachers=bert-base", "teachers is a list of teachers"),
    ],
)
def test_set_on_an_ensemble_is_refused_with_the_fix(capsys, setting, message):
    assert message in refused(capsys, "--teacher", "bert-base", "--teacher", "hf", "--set", setting)


def test_a_configuration_file_lists_the_teachers(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("teachers: [bert-base, {teacher: hf, weight: 2, teacher_options: {source: org/model}}]\n")
    config = config_of("--config", str(path))
    assert config.teachers == [
        {"teacher": "bert-base"},
        {"teacher": "hf", "weight": 2, "teacher_options": {"source": "org/model"}},
    ]
    assert config_of("--config", str(path), "--teacher-weights", "1", "3").teachers[1]["weight"] == 3.0
    huge = config_of("--config", str(path), "--teacher-weights", "1e308", "1.5e308")  # their sum overflows
    assert [member.weight for member in huge.members()] == pytest.approx([0.4, 0.6])
    one = config_of("--config", str(path), "--teacher", "roberta-base")  # the command line's one teacher wins
    assert (one.teacher, one.teachers) == ("roberta-base", [])


@pytest.mark.parametrize(
    ("teachers", "message"),
    [
        (
            '[a, {teacher: b, weight: "2"}]',
            "teachers[1].weight must be a positive finite number (weights need not "
            "sum to 1), got '2' (text: write the number without quotes)",
        ),
        ("[a, {teacher: b, weight: 0}]", "teachers[1].weight must be a positive finite number"),
        ("[a, {teacher: b, weight: -1}]", "teachers[1].weight must be a positive finite number"),
        ("[a, {teacher: b, weight: .nan}]", "teachers[1].weight must be a positive finite number"),
        ("[a, {teacher: b, weight: 1e400}]", "teachers[1].weight must be a positive finite number"),
        ("[a, {teacher: b, weight: 1" + "0" * 400 + "}]", "teachers[1].weight must be a positive finite number"),
        (
            "[a, {teacher: b, weight: true}]",
            "teachers[1].weight must be a positive finite number (weights need not sum to 1), got True",
        ),
        (
            '"a,b"',
            "teachers is a list of teachers ({teacher: NAME, teacher_options: ..., weight: W} or names), got "
            "the text 'a,b'; several teachers: --teacher A --teacher B",
        ),
        ("{teacher: a}", "teachers is a list of two or more teachers, got one mapping {'teacher': 'a'}: write it as"),
        ("[a, {weight: 2}]", "teachers[1].teacher must name a teacher"),
        (
            "[a, {teacher: b, wieght: 2}]",
            "teachers[1] has unknown keys wieght; valid: teacher, teacher_options, weight",
        ),
        (
            "[a, 3]",
            "teachers[1] must be a mapping {teacher: NAME, teacher_options: {...}, weight: W} or a teacher's "
            "name, got 3",
        ),
        ("[a, {teacher: b, teacher_options: [1]}]", "teachers[1].teacher_options must be a mapping, got [1]"),
        ("[a]", "teachers lists an ensemble: give two or more entries, or the one teacher with teacher: NAME"),
        (
            "[a, {teacher: a, teacher_options: {device_map: cpu}}]",
            "teachers[0] and teachers[1] are the same teacher "
            "(a, the same options): the ensemble would count it twice. List it once and give it a larger weight",
        ),
    ],
)
def test_malformed_teachers_in_the_file_are_refused_naming_the_entry(tmp_path, capsys, teachers, message):
    path = tmp_path / "run.yaml"
    path.write_text(f"teachers: {teachers}\n")
    assert message in refused(capsys, "--config", str(path))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            "teacher: roberta-base\n",
            "teacher 'roberta-base' and teachers (bert-base, hf) both name the run's teacher; "
            "give one: teachers for an ensemble (--teacher A --teacher B), teacher for one",
        ),
        ("teacher_options: {dtype: bf16}\n", "teacher_options (dtype) are one teacher's options"),
    ],
)
def test_a_file_with_both_teacher_and_teachers_is_refused(tmp_path, capsys, lines, message):
    path = tmp_path / "run.yaml"
    path.write_text(lines + "teachers: [bert-base, hf]\n")
    assert message in refused(capsys, "--config", str(path))


def test_one_directory_by_two_paths_is_refused_as_the_same_member(tmp_path, capsys, two_teachers):
    """A symlink to a member's directory, or its path with a trailing slash or a ``.``, is the same teacher:
    listed twice, it would count double in the mean without a word."""
    first = two_teachers[0]
    (tmp_path / "link").symlink_to(first, target_is_directory=True)
    for alias in (str(tmp_path / "link"), first + "/", first.replace("/a", "/./a")):
        message = refused(capsys, "--teacher", first, "--teacher", alias)
        assert "teachers[0] and teachers[1] are the same teacher" in message, (alias, message)
    assert config_of("--teacher", first, "--teacher", two_teachers[1]).members()[1].weight == 0.5


def test_a_weight_whose_share_underflows_is_refused(capsys):
    """1e-308 beside 1e308 is a share of 0 in float64: the member was computed and then counted for nothing."""
    message = refused(capsys, "--teacher", "a", "--teacher", "b", "--teacher-weights", "1e308", "1e-308")
    assert "teachers[1].weight 1e-308 is too small a share of the weights' sum" in message
    tiny = config_of("--teacher", "a", "--teacher", "b", "--teacher-weights", "1", "1e-300").members()
    assert tiny[1].weight == 1e-300 and tiny[0].weight == 1.0


def test_a_huge_teachers_list_is_checked_at_once_with_a_short_message(tmp_path, capsys):
    names = [{"teacher": f"t{number}"} for number in range(10_000)]
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps({"teachers": [*names, {"teacher": "last", "weight": "x" * 10_000}]}))  # YAML reads JSON
    started = time.perf_counter()
    err = refused(capsys, "--config", str(path))
    assert "teachers[10000].weight must be a positive finite number (weights need not sum to 1), got 'xxx" in err
    assert len(err) < 400
    path.write_text(json.dumps({"teachers": [*names, {"teacher": "t5"}]}))
    assert "teachers[5] and teachers[10000] are the same teacher" in refused(capsys, "--config", str(path))
    assert time.perf_counter() - started < 5


def test_command_line_reproduces_an_ensemble():
    config = config_of(
        *("--teacher", "bert-base", "--teacher", "hf", "--teacher", "served:llama"),
        *("--teacher-weights", "2", "1", "0.25", "--set", "teachers.1.teacher_options.source=org/model"),
        *("--set", "teachers.2.teacher_options.prompt=Review: {text} Sentiment:", "--set", "layer_teacher=1"),
        *("--set", "teachers.2.teacher_options.base_url=http://h:8000/v1", "--projector", "pkd-skip"),
    )
    line = command_line(config)
    assert "--teacher bert-base --teacher hf --teacher served:llama --teacher-weights 2.0 1.0 0.25" in line
    again = config_of(*shlex.split(line)[2:])
    assert again.to_dict() == config.to_dict()


@pytest.fixture
def ensemble_run(tmp_path) -> RunConfig:
    """An interrupted ensemble run's directory: its config.yaml, as a run writes it."""
    config = build_config(
        flags={"output": str(tmp_path / "run")},
        overrides=["teachers=[bert-base, {teacher: hf, weight: 2, teacher_options: {source: org/m}}]"],
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(dump_yaml(config))
    return config


@pytest.mark.parametrize(
    ("setting", "change"),
    [
        ("teachers.1.weight=3", "(teachers[1].weight 2 in config.yaml, 3 now)"),
        ("teachers.1.teacher=roberta-base", "(teachers[1] hf in config.yaml, roberta-base now)"),
        ("teachers.1.teacher_options.source=org/other", "teachers[1].teacher_options {'source': 'org/m'} in config"),
        ("teachers.2.teacher=roberta-base", "(teachers[2] unset in config.yaml, roberta-base now;"),
        ("teachers=[bert-base, hf]", "(teachers[1].teacher_options {'source': 'org/m'} in config.yaml, {} now; "),
    ],
)
def test_resume_refuses_changed_members_or_weights(capsys, ensemble_run, setting, change):
    assert main(["run", "--resume", ensemble_run.output, "--set", setting]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the options given change what it trains (" in err and change in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "change"),
    [
        (["--teacher-weights", "1", "5"], "(teachers[1].weight 2 in config.yaml, 5.0 now)"),
        (["--teacher", "bert-base", "--teacher", "roberta-base"], "(teachers[1] hf in config.yaml, roberta-base now"),
        (["--teacher", "bert-base"], "teachers[1] hf in config.yaml, unset now"),
        (["--teacher-weights", "1"], "--teacher-weights gives 1 weight for the 2 teachers of the run in"),
    ],
)
def test_resume_refuses_teacher_flags_that_change_the_ensemble(capsys, ensemble_run, argv, change):
    """``--resume RUN --teacher-weights 1 5`` was ignored without a word: the run went on with its old weights."""
    assert main(["run", "--resume", ensemble_run.output, *argv, "--dry-run"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert change in err and "Traceback" not in err


def test_resume_takes_the_same_teacher_flags():
    written = build_config(
        overrides=["teachers=[bert-base, {teacher: hf, weight: 2, teacher_options: {source: org/m}}]"]
    )
    args = build_parser().parse_args(["run", "--resume", "RUN", "--teacher-weights", "1", "2"])
    check_resume_settings(written, apply(copy.deepcopy(written), resumed_teachers(args, written), source="flags"))


def test_resume_of_a_one_teacher_run_refuses_teacher_weights_saying_it_has_one_teacher():
    """Before: '--teacher-weights gives 1 weight for the 1 teacher(s) of the run in RUN: give one per teacher'."""
    written = build_config(overrides=["teacher=bert-base"])
    args = build_parser().parse_args(["run", "--resume", "RUN", "--teacher-weights", "1"])
    with pytest.raises(
        UsageError, match=r"--teacher-weights weighs an ensemble's members, and the run in RUN has one "
    ):
        resumed_teachers(args, written)


def test_a_members_offload_folder_is_kept_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = config_of(
        "--teacher", "bert-base", "--teacher", "hf", "--set", "teachers.1.teacher_options.offload_folder=offload"
    )
    assert config.teachers[1]["teacher_options"]["offload_folder"] == str(
        tmp_path / "offload"
    )  # a resume elsewhere: same


def test_resume_may_move_a_member(ensemble_run):
    moved = build_config(
        file=str(ensemble_run.output + "/config.yaml"), overrides=["teachers.1.teacher_options.device_map=cpu"]
    )
    check_resume_settings(ensemble_run, moved)  # where a member's modules go is not what it computes


def test_each_member_is_checked_as_one_teacher_naming_it(capsys, two_teachers):
    first, _ = two_teachers
    served = ["--teacher", first, "--teacher", "served:tiny"] + [
        f"--set=teachers.1.teacher_options.{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
        for key, value in SERVED.items()
    ]
    err = refused(capsys, *served, "--set", "teachers.1.teacher_options.base_url=ftp://x")
    assert "teachers[1].teacher_options.base_url must be the server's http(s) address ending in /v1" in err
    err = refused(capsys, *served, "--set", "teachers.1.teacher_options.basee_url=1")
    assert "teachers[1] (served:tiny): teacher 'served:tiny'" in err
    assert "set them with --set teachers.1.teacher_options.NAME=VALUE" in err
    err = refused(capsys, "--teacher", first, "--teacher", "minlm")
    assert "teachers[1] (minlm): cannot load teacher 'minlm'" in err and "Did you mean 'minilm'?" in err


def ensemble(*members, **settings) -> RunConfig:
    return build_config(flags={"student": "bilstm", "task": "demo", **settings}, base={"teachers": list(members)})


def test_layer_methods_read_one_members_layers_or_are_refused_with_the_reason(capsys, two_teachers):
    registry, (first, second) = process_manager().registry, two_teachers
    served = {"teacher": "served:tiny", "teacher_options": SERVED}
    only = ensemble(first, served, projector="pkd-skip")
    notes = preflight.resolve_components(only, registry)
    assert only.layer_teacher == 0 and preflight.layer_member(only, registry).name == first
    assert f"layer methods read teachers[0] ({first}), the one member of the ensemble that has layers" in notes[-1]
    with pytest.raises(UsageError, match=r"several members of the ensemble have layers \(teachers\[0\] .*, teachers"):
        preflight.resolve_components(ensemble(first, second, projector="pkd-skip"), registry)
    assert "name one with --set layer_teacher=N (N from 0" in refused(
        capsys, "--teacher", first, "--teacher", second, "--projector", "pkd-skip"
    )
    named = ensemble(first, second, projector="pkd-skip", layer_teacher=1)
    preflight.resolve_components(named, registry)
    assert preflight.layer_member(named, registry).name == second
    with pytest.raises(UsageError, match=r"layer_teacher=1 names teachers\[1\] \(served:tiny\), which gives kdplug"):
        preflight.resolve_components(ensemble(first, served, projector="pkd-skip", layer_teacher=1), registry)
    other = {"teacher": "served:other", "teacher_options": SERVED}
    with pytest.raises(UsageError, match="no member of the ensemble gives kdplug its layers"):
        preflight.resolve_components(ensemble(served, other, projector="pkd-skip"), registry)
    logits = ensemble(first, second, projector="rkd", layer_teacher=1)
    assert "layer_teacher=1 is not used: projector 'rkd'" in preflight.resolve_components(logits, registry)[-1]


def test_distill_takes_a_list_of_teachers(two_teachers):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    first, second = two_teachers
    common = dict(student="bilstm", projector="pkd-skip", task="demo", echo=None)
    with pytest.raises(UsageError, match=r"several members .*have layers \(teachers\[0\] .*a, teachers\[1\] .*b\)"):
        distill(teacher=[first, second], teacher_weights=[2, 1], **common)
    model = AutoModelForSequenceClassification.from_pretrained(second, num_labels=2)
    with pytest.raises(UsageError, match=r"\(teachers\[0\] .*a, teachers\[1\] python:teacher-0\)"):
        distill(teacher=[first, (model, AutoTokenizer.from_pretrained(second))], **common)
    for wrong, message in [
        (dict(teacher=[first]), "a list of two or more for an ensemble; got 1"),
        (dict(teacher=[first, 3]), "teacher[1] is int 3; each member takes a name"),
        (dict(teacher=[first, second], teacher_weights=[1]), "gives 1 weight(s) for 2 teachers"),
        (dict(teacher=first, teacher_weights=[1, 2]), "teacher_weights= weighs an ensemble's members"),
        (dict(teacher=[first, second], teachers=[first, second]), "give the ensemble once"),
    ]:
        with pytest.raises(ArgumentError, match=".*".join(map(re_escape, message.split(".*")))):
            distill(**wrong, **common)
    with pytest.raises(
        UsageError,
        match=r"teachers\[1\]\.weight must be a positive finite number \(weights need not sum to 1\), got '2'",
    ):
        distill(teachers=[first, {"teacher": second, "weight": "2"}], **common)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_distill_takes_numpy_weights_and_refuses_a_bool_one(two_teachers):
    """``teacher_weights`` from numpy (an array, ``np.float32``, ``np.int64``) are numbers: taken (the run goes
    on to its next check, the layer teacher); ``True`` is no weight: refused, not read as 1."""
    import numpy as np

    first, second = two_teachers
    common = dict(student="bilstm", projector="pkd-skip", task="demo", echo=None, teacher=[first, second])
    for weights in (np.array([2.0, 1.0]), [np.float32(3), np.float32(1)], list(np.arange(1, 3))):
        with pytest.raises(UsageError, match="several members .*have layers"):
            distill(teacher_weights=weights, **common)
    with pytest.raises(UsageError, match=r"teachers\[0\]\.weight must be a positive finite number .*got True"):
        distill(teacher_weights=[True, 1], **common)

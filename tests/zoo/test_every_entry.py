"""Every zoo entry runs (issue 43, item 13): a broken entry is found here, not on a GPU after hours of
teacher fine-tuning.

Two layers, from cheap to real:

* every runnable entry goes through everything before training that needs no model: its config
  parses, every component name resolves, every option passes the registry's typed check, the
  preflight's name and option checks (``preflight.resolve_components``) and the projectors' checks
  against the task; an entry that cannot run names the missing component;
* one real run per combination of what changes the code an entry runs (see ``combination``), on
  stand-ins: tiny random checkpoints of the entry's own hub names (its teacher, the DistilRoBERTa
  it starts from, TAKD's teacher assistant) in a private Hugging Face cache, six generated
  examples in the layout of the entry's own GLUE task, one epoch, tiny sizes. The entry's config
  is otherwise what runs: only the lengths and sizes in ``tiny_settings`` change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kdplug
from kdplug.cli import main
from kdplug.engine import preflight
from kdplug.engine.pipeline import run
from kdplug.testing.tiny import cache_as_hub_model, make_tiny_bert, make_tiny_roberta
from kdplug.zoo import Zoo, ZooEntry, check_entry
from kdplug_models.hf import HUB_TEACHERS
from kdplug_tasks.glue import SPECS

from ..plugin_kit.conftest import write_glue_task

ZOO_DIR = Path(__file__).resolve().parents[2] / "zoo"
REGISTRY = kdplug.get_plugin_manager().registry
ENTRIES = list(Zoo([ZOO_DIR]).entries())
RUNNABLE = [entry for entry in ENTRIES if not entry.missing_components(REGISTRY)]
PENDING = [entry for entry in ENTRIES if entry.missing_components(REGISTRY)]

#: the hub checkpoints entries name, and the depth of their stand-in (the real depth, so layer maps
#: such as PKD's [12] and BERT-6 students fit; 16 wide, so depth costs little)
STAND_IN_DEPTHS = {"bert-base-uncased": 12, "roberta-large": 24, "roberta-base": 12, "distilroberta-base": 6}


def task_shape(task: str) -> str:
    """What of a GLUE task changes the code a run takes: one text or a pair, how many labels."""
    spec = SPECS[task]
    labels = f"{len(spec.label_values)}-class" if spec.labels else "regression"
    return f"{'pair' if spec.is_pair else 'single'} {labels}"


def option_keys(entry: ZooEntry) -> tuple[str, ...]:
    return tuple(
        sorted(f"{key}.{name}" for key, value in entry.config.items() if isinstance(value, dict) for name in value)
    )


def combination(entry: ZooEntry) -> tuple:
    """What picks the code an entry runs: its teacher's kind (BERT, RoBERTa), student, projector,
    recipe, whether a transfer set is made, the baseline. The task's shape and which options are
    set are left out (174 combinations with them, at about 2 s a run: over the suite's budget);
    among the entries of a combination the one run is the one that adds the most task shapes and
    option sets not yet run, so that together the runs still cover each of them (see
    test_the_runs_cover_every_task_shape_and_option_set)."""
    config = entry.config
    return (
        config["teacher"].split("-")[0],
        config["student"],
        config["projector"],
        config["recipe"],
        config.get("augment"),
        config.get("baseline"),
    )


def variety(entry: ZooEntry) -> set:
    """What a run of ``entry`` covers beyond its combination."""
    kind = entry.config["teacher"].split("-")[0]
    return {("shape", kind, task_shape(entry.task)), ("options", option_keys(entry))}


def one_entry_per_combination() -> list[ZooEntry]:
    groups: dict[tuple, list[ZooEntry]] = {}
    for entry in RUNNABLE:
        groups.setdefault(combination(entry), []).append(entry)
    covered: set = set()
    chosen = []
    for members in groups.values():
        best = max(members, key=lambda entry: len(variety(entry) - covered))  # the first on a tie
        covered |= variety(best)
        chosen.append(best)
    return chosen


CHOSEN = one_entry_per_combination()


def test_the_zoo_is_what_these_tests_measure():
    assert len(ENTRIES) == 492 and len(RUNNABLE) == 484
    assert len(CHOSEN) == 42


def test_the_runs_cover_every_task_shape_and_option_set():
    """What the grouping leaves out is still run once: every task shape of each teacher kind, every
    set of option keys (with other values and other components than some entries pair them with)."""
    ran = set().union(*(variety(entry) for entry in CHOSEN))
    assert ran == set().union(*(variety(entry) for entry in RUNNABLE))


def use_stand_ins(monkeypatch, stand_ins: dict[str, Any]) -> None:
    """Hub names load the stand-ins, offline (the environment's HF_HUB_OFFLINE is read at import)."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(stand_ins["hub"]))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


def test_every_runnable_entry_passes_every_check_that_needs_no_model(stand_ins, monkeypatch):
    use_stand_ins(monkeypatch, stand_ins)  # the projectors' checks read the models' shapes from their configs
    failures = {}
    for entry in RUNNABLE:
        try:
            check_entry(entry, REGISTRY)
            config = entry.run_config()
            preflight.resolve_components(config, REGISTRY)  # names, typed options, recipe, losses
            task = REGISTRY.create("task", config.task, data_dir=stand_ins["data"][config.task], **config.task_options)
            preflight.check_projectors(config, REGISTRY, task)  # layer maps, head counts: against the shapes
        except Exception as exc:  # every failing entry is listed, not only the first
            failures[entry.name] = f"{type(exc).__name__}: {exc}"
    assert not failures, "\n".join(f"{name}: {message}" for name, message in failures.items())


def test_entries_that_cannot_run_say_which_component_is_missing(capsys):
    assert PENDING
    for entry in PENDING:
        missing = entry.missing_components(REGISTRY)
        assert missing and set(missing) <= set(entry.requires), entry.name
        assert main(["zoo", "run", entry.name]) == 2
        err = capsys.readouterr().err
        assert all(f"needs {component}" in err for component in missing), (entry.name, err)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, Any]:
    """A Hugging Face cache with a tiny checkpoint for every hub name the zoo uses, and one GLUE
    stand-in per task (six training examples in the task's own layout)."""
    root = tmp_path_factory.mktemp("zoo-stand-ins")
    hub_cache = root / "hub"
    for repo_id, depth in STAND_IN_DEPTHS.items():
        make = make_tiny_roberta if "roberta" in repo_id else make_tiny_bert
        cache_as_hub_model(make(root / "made" / repo_id, num_layers=depth, hidden=16), repo_id, hub_cache)
    data = {task: write_glue_task(root / "glue", spec) for task, spec in SPECS.items()}
    return {"hub": hub_cache, "data": data, "cache": root / "kdplug-cache"}


def tiny_settings(entry: ZooEntry, stand_ins: dict[str, Any], output: Path) -> dict[str, Any]:
    """The entry's config with its lengths and sizes made tiny; the option keys it sets stay set."""
    config = entry.config
    settings = {
        "data_dir": stand_ins["data"][entry.task],
        "cache_dir": str(stand_ins["cache"]),  # the fine-tuned stand-in teachers are shared
        "epochs": 1,
        "teacher_epochs": 1,
        "batch_size": 4,
        "teacher_batch_size": 4,
        "max_length": 32,
        "allow_weak_teacher": True,  # six examples cannot judge a teacher
        "output": str(output),
    }
    student = dict(config.get("student_options") or {})
    if config["student"] in ("bilstm", "gated-cnn"):
        student.update(embedding_dim=16, hidden_size=16)
    settings["student_options"] = student
    recipe = dict(config.get("recipe_options") or {})
    for key, tiny in (("stage2_epochs", 1), ("e1", 1), ("e2", 1)):
        if key in recipe:
            recipe[key] = tiny
    settings["recipe_options"] = recipe
    if config.get("augment"):
        settings["augment_factor"] = 2
    return settings


@pytest.mark.parametrize("entry", [pytest.param(entry, id=entry.name) for entry in CHOSEN])
def test_one_entry_of_each_combination_runs_end_to_end(entry, stand_ins, tmp_path, monkeypatch):
    use_stand_ins(monkeypatch, stand_ins)
    assert HUB_TEACHERS.get(entry.config["teacher"], entry.config["teacher"]) in STAND_IN_DEPTHS
    config = entry.run_config(tiny_settings(entry, stand_ins, tmp_path / "run"))
    run(config, REGISTRY, echo=lambda _: None)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["config"]["zoo"] == entry.name
    assert metrics["student"]["dev"], "the student was evaluated"

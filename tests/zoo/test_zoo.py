"""Every zoo entry: its schema, its components and options against the registry, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import kdplug
from kdplug.cli import main
from kdplug.errors import ConfigError, UsageError
from kdplug.zoo import PAPERS, Zoo, check_entry, parse_entry

ZOO_DIR = Path(__file__).resolve().parents[2] / "zoo"
ENTRIES = list(Zoo([ZOO_DIR]).entries())

#: the rows of every reproduced table (issue 7), and the tasks of each table
TABLE_ROWS = {
    ("alp-kd", 1): 9,
    ("alp-kd", 2): 9,
    ("alp-kd", 3): 8,
    ("alp-kd", 4): 6,
    ("universal-kd", 2): 7,
    ("universal-kd", 4): 7,
    ("universal-kd", 5): 7,
    ("universal-kd", 6): 3,
    ("pkd", 1): 8,
}
TABLE_TASKS = {("universal-kd", 6): 4, ("pkd", 1): 6}


@pytest.fixture(scope="module")
def registry():
    return kdplug.get_plugin_manager().registry


#: entries beyond a fully transcribed table: Tang et al.'s SST-2 rows, Universal-KD Table 5's
#: SST-2 Bi-LSTM rows with a transfer set (issue 17), and Yu et al.'s SST-2 layer-map rows
TRANSFER_ENTRIES = {
    "tang-2019/table1-sst2-nkd",
    "tang-2019/table1-sst2-rkd-tang20",
    "universal-kd/table5-sst2-bilstm-rkd-transfer",
    "universal-kd/table5-sst2-bilstm-universal-ca-transfer",
    *(f"yu-2025/sst2-bert3-{layer_map}" for layer_map in ("none", "forward", "reverse", "all-to-one")),
}


def test_every_table_row_has_an_entry_per_task():
    found: dict[tuple, set] = {}
    for entry in ENTRIES:
        if entry.name not in TRANSFER_ENTRIES:
            found.setdefault((entry.paper, entry.table), set()).add((entry.row, entry.task))
    assert set(found) == set(TABLE_ROWS)
    for key, rows in TABLE_ROWS.items():
        assert len({row for row, _ in found[key]}) == rows, key
        assert len(found[key]) == rows * TABLE_TASKS.get(key, 8), key
    assert len(ENTRIES) == 484 + len(TRANSFER_ENTRIES)


def test_transfer_entries_add_only_the_transfer_set_to_the_papers_row():
    by_name = {entry.name: entry for entry in ENTRIES}
    assert TRANSFER_ENTRIES <= set(by_name)
    for name in ("universal-kd/table5-sst2-bilstm-rkd", "universal-kd/table5-sst2-bilstm-universal-ca"):
        plain, transfer = by_name[name].run_config().to_dict(), by_name[name + "-transfer"].run_config().to_dict()
        changed = {key for key in plain if plain[key] != transfer[key]}
        # the transfer set: the augmenter and its factor (Tang et al.'s 20 for SST-2, written out)
        assert changed == {"augment", "augment_factor", "zoo"} and transfer["augment"] == "tang"
        assert transfer["augment_factor"] == 20
        assert by_name[name + "-transfer"].scores == by_name[name].scores  # the paper's score, to beat


def test_every_entry_names_registered_components_and_valid_options(registry):
    for entry in ENTRIES:
        check_entry(entry, registry)  # raises ConfigError naming the entry
        assert entry.paper in PAPERS
        config = entry.run_config()
        assert config.zoo == entry.name and config.task == entry.task
        for split, metrics in entry.scores.items():
            assert split.startswith("dev")
            assert set(metrics) <= {"accuracy", "f1", "matthews", "pearson"}, entry.name


def test_only_declared_components_are_missing(registry):
    pending = {e.name: e.missing_components(registry) for e in ENTRIES if e.requires}
    assert pending  # MHKD has no projector yet: its rows are kept, marked
    for entry in ENTRIES:
        assert set(entry.missing_components(registry)) <= set(entry.requires), entry.name


def test_paper_hyper_parameters_were_transcribed():
    """Spot checks against the papers' appendix tables, independent of the generator."""
    get = Zoo([ZOO_DIR]).get
    alp = get("alp-kd/table1-sst2-alp").config  # ALP-KD Table 10, SST-2
    assert (alp["lr"], alp["temperature"], alp["eta"], alp["lam"], alp["epochs"]) == (5e-5, 20, 0.2, 0.7, 10)
    pkd = get("alp-kd/table1-cola-pkd").config  # Table 8, CoLA; the (1, 5, 9) map
    assert (pkd["lr"], pkd["temperature"], pkd["eta"], pkd["lam"]) == (2e-5, 5, 0.5, 0.2)
    assert pkd["projector_options"] == {"layer_map": [1, 5, 9]} and pkd["epochs"] == 50
    assert get("alp-kd/table3-stsb-pkd-12").config["projector_options"] == {"layer_map": [12]}
    ukd = get("universal-kd/table5-cola-gated-cnn-universal-ca").config  # Table 9
    assert (ukd["lr"], ukd["batch_size"], ukd["student_options"], ukd["recipe_options"]["beta"]) == (
        2e-4,
        64,
        {"num_layers": 4, "hidden_size": 768, "dropout": 0.4},
        0.5,
    )
    assert ukd["weight_decay"] == 0.0 and ukd["temperature"] == 1.0  # App. A.2: Adam; A.1: T = 1
    assert get("universal-kd/table4-rte-universal-cg").scores == {"dev": {"accuracy": 74.0}}
    mnli = get("pkd/table1-mnli-bert-3-pkd")
    assert mnli.reported_set == "test" and mnli.scores["dev_mismatched"] == {"accuracy": 76.3}
    assert get("pkd/table1-mrpc-bert-6-pkd").scores["dev"] == {"f1": 85.0, "accuracy": 79.9}


def test_the_audit_against_the_papers_text():
    """Issue 13's audit: values the papers state, and no note that contradicts its own config."""
    get = Zoo([ZOO_DIR]).get
    # Universal-KD Table 4's baselines get the paper's own budget (20 + 10 epochs; CoLA 50 + 10), not 3
    for row in ("rkd", "nkd", "dih", "takd"):
        assert get(f"universal-kd/table4-sst2-{row}").config["epochs"] == 30
        assert get(f"universal-kd/table4-cola-{row}").config["epochs"] == 60
    assert get("universal-kd/table4-sst2-annealing").config["recipe_options"] == {"e1": 10, "e2": 3, "tau_max": 10}
    assert get("universal-kd/table4-sst2-rkd").config["temperature"] == 1.0  # 'T to 1 for all experiments'
    assert get("universal-kd/table4-sst2-universal-cg").config["epochs"] == 20
    # rows of Table 2 that are ALP-KD's keep ALP-KD's temperature, and no note claims T = 1 for them
    rkd = get("universal-kd/table2-sst2-rkd")
    assert rkd.config["temperature"] == 10 and not any("T = 1 for all" in note for note in rkd.notes)
    # PKD's own objective: (1 - alpha) CE + alpha KD + beta PT with its code's reduction
    pkd = get("pkd/table1-sst2-bert-6-pkd").config
    assert (pkd["ce_weight"], pkd["eta"], pkd["lam"]) == (0.5, 0.5, 100.0)
    assert pkd["projector_options"] == {"loss_reduction": "mean"} and pkd["student_options"] == {"init": "pretrained"}
    assert (pkd["epochs"], pkd["batch_size"]) == (4, 32)


def test_every_value_of_every_entry_says_where_it_comes_from():
    for entry in ENTRIES:
        keys = [k for k, v in entry.config.items() if not isinstance(v, dict)]
        keys += [f"{k}.{o}" for k, v in entry.config.items() if isinstance(v, dict) for o in v]
        assert sorted(keys) == sorted(entry.sources), entry.name
        assert all(source.startswith(("paper:", "assumed:", "kdplug:")) for source in entry.sources.values())
        rows = {key: source for key, _, source in entry.provenance()}
        assert rows["warmup_ratio"].startswith("kdplug default") or "warmup_ratio" in entry.sources


def test_zoo_show_marks_each_value_as_the_papers_or_kdplugs(capsys):
    from kdplug.cli import main

    for name, expected in [
        ("pkd/table1-sst2-bert-6-pkd", ["paper: PKD §4.2", "kdplug: PKD searches beta", "kdplug default"]),
        ("alp-kd/table1-sst2-alp", ["paper: ALP-KD Table 10 (SST-2 column)", "paper: ALP-KD Table 5"]),
        ("universal-kd/table5-sst2-bilstm-universal-ca", ["paper: Universal-KD Table 9", "App. A.2", "assumed:"]),
    ]:
        assert main(["zoo", "show", name]) == 0
        out = capsys.readouterr().out
        for text in expected:
            assert text in out, (name, text)


def test_files_are_what_the_generator_writes_and_the_index_lists_them():
    import importlib.util

    spec = importlib.util.spec_from_file_location("zoo_generate", ZOO_DIR / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    expected = generate.expected_files()
    on_disk = set(ZOO_DIR.rglob("*.yaml"))
    assert on_disk == set(expected), "run: python zoo/generate.py"
    for path, text in expected.items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale; run: python zoo/generate.py"
    assert sorted(Zoo([ZOO_DIR]).names()) == sorted(e.name for e in ENTRIES)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tabel": 1}, "Did you mean 'table'"),
        ({"measure": "both"}, "measure must be one of"),
        ({"reported": {"set": "val", "scores": {"dev": {"accuracy": 1.0}}}}, "reported.set"),
        ({"seeds": []}, "seeds must be"),
        (
            {"config": {"teacher": "bert-base", "student": "bert-4", "projector": "alp", "task": "sst2", "lrr": 1}},
            "Did you mean 'lr'",
        ),
        (
            {"config": {"teacher": "bert-base", "student": "bert-4", "projector": "alp", "task": "sst2", "eta": 2}},
            "exceeds 1, so the CE weight",
        ),
        ({"config": {"teacher": "bert-base", "student": "bert-4", "task": "sst2"}}, "must name the projector"),
        ({"search": {"lr": []}}, "search.lr must be a non-empty list"),
    ],
)
def test_malformed_entries_are_rejected_with_the_reason(change, message):
    data = yaml.safe_load((ZOO_DIR / "alp-kd" / "table1-sst2-alp.yaml").read_text())
    data.update(change)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_entry(data)


def test_unknown_components_and_options_are_caught(registry):
    base = yaml.safe_load((ZOO_DIR / "alp-kd" / "table1-sst2-alp.yaml").read_text())
    typo = parse_entry({**base, "config": {**base["config"], "projector": "alpp"}})
    with pytest.raises(ConfigError, match="projector alpp"):
        check_entry(typo, registry)
    bad_option = parse_entry({**base, "config": {**base["config"], "projector_options": {"layermap": [1]}}})
    with pytest.raises(ConfigError, match="layermap"):
        check_entry(bad_option, registry)


def test_zoo_list_shows_every_row(capsys):
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{len(ENTRIES)} entries" in out and len(ENTRIES) == 492
    for entry in ENTRIES:
        assert entry.name in out
    assert main(["zoo", "list", "alp-kd/table3-*", "--task", "stsb"]) == 0
    out = capsys.readouterr().out
    assert "8 entries" in out and "S_PKD-12" in out and "table1" not in out


def test_zoo_show_and_unknown_names(capsys):
    assert main(["zoo", "show", "universal-kd/table2-qqp-mhkd"]) == 0
    out = capsys.readouterr().out
    assert "reported (dev):" in out and "not runnable yet: projector mhkd" in out
    assert main(["zoo", "show", "alp-kd/table1-sst2-alq"]) == 2
    assert "Did you mean 'alp-kd/table1-sst2-alp'" in capsys.readouterr().err
    assert main(["zoo", "run", "universal-kd/table2-qqp-mhkd"]) == 2
    assert "needs projector mhkd" in capsys.readouterr().err


def test_kdplug_zoo_env_points_elsewhere(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "myzoo" / "lab"
    mine.mkdir(parents=True)
    data = yaml.safe_load((ZOO_DIR / "alp-kd" / "table1-sst2-alp.yaml").read_text())
    data["name"] = "lab/sst2-alp"
    (mine / "sst2-alp.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("KDPLUG_ZOO", str(tmp_path / "myzoo"))
    assert main(["zoo", "list"]) == 0  # no index.yaml: the directory is scanned
    assert "lab/sst2-alp" in capsys.readouterr().out
    data["name"] = "lab/other"
    (mine / "sst2-alp.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="does not match its file"):
        list(Zoo().entries())
    monkeypatch.setenv("KDPLUG_ZOO", str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="KDPLUG_ZOO"):
        Zoo()


def test_zoo_run_end_to_end_with_tiny_models(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    from tests.zoo.conftest import tiny_overrides

    output = tmp_path / "run"
    code = main(
        [
            "zoo",
            "run",
            "alp-kd/table1-sst2-alp",
            *tiny_overrides(tiny_bert_dir, sst2_dir),
            "--set",
            "student=bert-2",
            "--output",
            str(output),
        ]
    )
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((output / "metrics.json").read_text())
    config = yaml.safe_load((output / "config.yaml").read_text())
    assert config["zoo"] == metrics["config"]["zoo"] == "alp-kd/table1-sst2-alp"
    # the entry's hyper-parameters reached the run; the overrides replaced only what they name
    assert (config["projector"], config["lr"], config["temperature"], config["eta"], config["lam"]) == (
        "alp",
        5e-5,
        20.0,
        0.2,
        0.7,
    )
    assert config["student"] == "bert-2" and config["epochs"] == 1
    assert metrics["stages"]["distill"]["weights"]["lam"] == pytest.approx(0.7)
    assert 0.0 <= metrics["student"]["dev"]["dev"]["accuracy"] <= 1.0

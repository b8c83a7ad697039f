"""The command line: listing, usage errors (exit 2) and a complete tiny run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plugins_lists_every_kind_with_its_distribution(capsys):
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    for heading in ("teachers:", "students:", "layer_extractors:", "projectors:", "losses:", "tasks:", "recipes:"):
        assert heading in out
    assert "pkd-skip" in out and "bilstm" in out and "kdplug 0.1.0" in out


def test_plugins_json_is_machine_readable(capsys):
    code, out, _ = run_cli(capsys, "plugins", "--json")
    data = json.loads(out)
    entry = next(c for c in data["components"] if c["kind"] == "projector" and c["name"] == "pkd-skip")
    assert entry["distribution"] == "kdplug" and entry["plugin"] == "pkd"


def test_disable_plugin_flag_removes_its_components(capsys):
    _, out, _ = run_cli(capsys, "--disable-plugin", "pkd", "plugins", "--kind", "projector")
    assert "pkd-skip" not in out and "alp" in out
    assert "disabled plugins: pkd" in out


def test_unknown_projector_exits_2_with_the_closest_name(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--projector", "pdk", "--output", str(tmp_path / "run"))
    assert code == 2
    assert "unknown projector 'pdk'" in err and "Did you mean 'pkd-skip'" in err
    assert not (tmp_path / "run").exists()  # nothing is started before the names are checked


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "epochz=3"], "Did you mean 'epochs'"),
        (["--set", "epochs=three"], "epochs must be a whole number, or null, got 'three'"),
        (["--set", "novalue"], "--set expects KEY=VALUE"),
        (["--set", "eta=0.8", "--set", "lam=0.5"], "eta + lam = 1.3 exceeds 1"),
    ],
)
def test_bad_options_exit_2_and_say_why(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "run", "--task", "sst2", *argv, "--output", str(tmp_path / "run"))
    assert code == 2 and message in err


def test_malformed_config_file_names_the_line(capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("teacher: minilm\nstudent: [bilstm\n")
    code, _, err = run_cli(capsys, "run", "--config", str(config))
    assert code == 2 and str(config) in err and "line" in err


def test_missing_data_directory_exits_2_naming_it(capsys, tmp_path, tiny_bert_dir):
    missing = tmp_path / "no-such-dir"
    code, _, err = run_cli(
        capsys,
        "run",
        "--teacher",
        tiny_bert_dir,
        "--task",
        "sst2",
        "--data-dir",
        str(missing),
        "--output",
        str(tmp_path / "run"),
    )
    assert code == 2 and str(missing) in err


def test_tiny_run_writes_the_run_directory_and_reuses_the_teacher(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    argv = [
        "run",
        *tiny_run_args(
            teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), projector="pkd-skip", epochs=2, eta=0.3
        ),
        "--baseline",
        "nkd",
    ]
    code, out, _ = run_cli(capsys, *argv, "--output", str(tmp_path / "first"))
    assert code == 0, out
    run_dir = tmp_path / "first"
    for name in ("config.yaml", "metrics.json", "log.txt", "student/model.safetensors"):
        assert (run_dir / name).is_file(), name
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["student"]["dev"]["dev"]["accuracy"] <= 1.0
    assert "stored" in metrics["teacher"]["finetuned"]
    assert [h["epoch"] for h in metrics["stages"]["distill"]["history"]] == [1, 2]
    assert metrics["stages"]["distill"]["weights"]["lam"] > 0  # pkd-skip's ILD term was on
    assert metrics["stages"]["distill"]["weights"]["eta"] == 0.3
    assert metrics["stages"]["baseline-nkd-distill"]["weights"]["ce"] == 1.0  # the run's eta is not the baseline's
    assert "ild" in metrics["stages"]["distill"]["history"][0]["train"]
    assert load_file(str(run_dir / "student" / "model.safetensors"))
    assert "teacher" in out and "bilstm + pkd-skip" in out and "bilstm + nkd" in out  # the closing table

    code, out, _ = run_cli(capsys, *argv, "--output", str(tmp_path / "second"))
    second = json.loads((tmp_path / "second" / "metrics.json").read_text())
    assert code == 0 and "reused" in second["teacher"]["finetuned"]
    assert second["student"]["dev"] == metrics["student"]["dev"]  # same seed, same data: same result

    code, _, err = run_cli(capsys, *argv, "--output", str(tmp_path / "first"))
    assert code == 2 and "already holds a run" in err


def test_console_script_is_installed():
    exe = shutil.which("kdplug") or f"{sys.prefix}/bin/kdplug"
    result = subprocess.run([exe, "run", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for option in ("--teacher", "--student", "--projector", "--task", "--data-dir", "--config", "--set", "--output"):
        assert option in result.stdout


def test_every_command_is_documented_in_docs():
    from pathlib import Path

    from kdplug.cli import build_parser

    docs = "\n".join(p.read_text(encoding="utf-8") for p in (Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in commands:
        assert f"kdplug {name}" in docs, f"'kdplug {name}' is not documented in docs/"


def test_every_doc_page_is_named_by_kdplug_help_and_every_run_option_documented():
    from pathlib import Path

    from kdplug.cli import build_parser

    docs = Path(__file__).resolve().parents[2] / "docs"
    parser = build_parser()
    help_text = " ".join(parser.format_help().split())
    for page in sorted(docs.glob("*.md")):
        assert page.name in help_text, f"docs/{page.name} is not reachable from 'kdplug --help'"
    text = "\n".join(page.read_text(encoding="utf-8") for page in docs.glob("*.md"))
    run_parser = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["run"]
    for action in run_parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and option != "--help":
                assert option in text, f"'kdplug run {option}' is not documented in docs/"


def test_the_log_reads_well(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    code, _, _ = run_cli(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=str(tmp_path / "run")),
    )
    assert code == 0
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "dev accuracy" in log and "dev dev" not in log
    assert "projector None" not in log and "weights ce 0.3, eta 0.7, lam 0, temperature 10" in log
    _, out, _ = run_cli(capsys, "plugins")
    assert "losses:" in out.splitlines() and "losss:" not in out


def test_run_directory_holds_dev_predictions(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    code, _, _ = run_cli(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=str(tmp_path / "run")),
    )
    assert code == 0
    predictions = json.loads((tmp_path / "run" / "predictions.json").read_text())
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    dev = predictions["dev"]
    assert dev["labels"] == [label for _, label in SST2_DEV]
    accuracy = sum(p == y for p, y in zip(dev["predictions"], dev["labels"])) / len(dev["labels"])
    assert accuracy == metrics["student"]["dev"]["dev"]["accuracy"]


def test_cache_list_and_clear(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    cache = tmp_path / "cache"
    assert (
        main(
            [
                "run",
                *tiny_run_args(
                    teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=str(tmp_path / "run")
                ),
                "--cache-dir",
                str(cache),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code, out, _ = run_cli(capsys, "cache", "list", "--cache-dir", str(cache))
    assert code == 0
    assert "fine-tuned teachers (teachers):" in out and "teacher outputs (teacher-cache):" in out
    assert "split train" in out and "split dev" in out and "task sst2" in out
    code, out, _ = run_cli(capsys, "cache", "clear", "--cache-dir", str(cache))
    assert code == 0 and "MiB freed" in out
    assert not (cache / "teacher-cache").exists() and not (cache / "teachers").exists()


@pytest.mark.parametrize("command", ["", "run", "predict", "export", "sweep", "report", "cache", "check-plugin"])
def test_help_does_not_load_torch(command):
    """``kdplug --help`` answers in a fraction of a second: torch (seconds to import) stays unloaded."""
    script = (
        "import sys\nfrom kdplug.cli import main\n"
        f"try:\n    main([*{command.split()!r}, '--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[-2:] == ["False", "False"], done.stderr


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_runs_first_line_says_the_precision_the_teacher_ran_in(
    capsys, tmp_path, tiny_bert_dir, sst2_dir, precision
):
    """The README's figures depend on it: the first line says it, as metrics.json records it."""
    argv = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), output=str(tmp_path / "run"))
    assert main(["run", *argv, "--set", f"precision={precision}", "--set", "measure_speed=false"]) == 0
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kdplug run ->"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["teacher"]["precision"] == precision and f"teacher in {precision}," in first

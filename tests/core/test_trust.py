"""Trust what you load: student packages checked against their checksums and tokenizer record,
damaged files and unwritable places as messages, the Python API's arguments checked first, and
a checkpoint's own code never run unless the user allows it. Faults are real: bytes flipped and
files truncated on disk, a directory made unwritable with chmod (as an unprivileged user when the
tests run as root), a file-size limit set with setrlimit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import kdplug
from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

DEV_TEXTS = [text for text, _ in SST2_DEV]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 2, dev=SST2_DEV)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_dir, data):
    """One finished tiny run with a BiLSTM student."""
    output = tmp_path_factory.mktemp("runs") / "bilstm"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("trust-cache")))
        narrow = {"hidden_size": 16}
        tiny = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data), student_options=narrow)
        assert main(["run", *tiny, "--output", str(output)]) == 0
    return output


@pytest.fixture
def package(run, tmp_path):
    """A copy of the run's student package, to damage."""
    return Path(shutil.copytree(run / "student", tmp_path / "student"))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0xFF]))


def predict_cli(capsys, student, *args):
    code = main(["predict", str(student), *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# -- verified loading ---------------------------------------------------------------------------


def test_a_changed_weight_file_is_refused_by_name_and_loads_with_no_verify(package, run):
    weights = package / "model.safetensors"
    flip_byte(weights, weights.stat().st_size // 2)
    with pytest.raises(kdplug.PackageIntegrityError, match=r"model\.safetensors fails its checksum.*--no-verify"):
        kdplug.load_student(package)
    changed = kdplug.load_student(package, verify=False).model.state_dict()
    original = kdplug.load_student(run).model.state_dict()
    assert any(not torch.equal(changed[name], original[name]) for name in original)  # the changed weights loaded


def test_predict_and_export_check_the_package_before_any_work(capsys, package, tmp_path):
    flip_byte(package / "model.safetensors", (package / "model.safetensors").stat().st_size // 2)
    source = tmp_path / "in.txt"
    source.write_text("a good film\n")
    code, out, err = predict_cli(capsys, package, "--input", source)
    assert code == 2 and out == "" and "model.safetensors fails its checksum" in err and "Traceback" not in err
    code, _, err = predict_cli(capsys, package, "--input", source, "--no-verify")
    assert code == 0
    code = main(["export", str(package), "--format", "onnx", "--output", str(tmp_path / "onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "fails its checksum" in err and not (tmp_path / "onnx").exists()


def test_a_missing_tokenizer_never_predicts_even_unverified(package):
    (package / "tokenizer.json").unlink()
    with pytest.raises(kdplug.PackageIntegrityError, match="tokenizer.json is missing"):
        kdplug.load_student(package)
    with pytest.raises(kdplug.PackageIntegrityError, match=r"tokenizer.json missing.*does not tokenize as"):
        kdplug.load_student(package, verify=False)


def test_the_tokenizer_record_catches_a_replaced_tokenizer(package, tiny_bert_dir):
    """A whole, valid tokenizer of another vocabulary in place of the student's: same files, other ids."""
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(tiny_bert_dir)
    other.add_tokens(["kdplug-extra-token"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (package / name).unlink()
    other.save_pretrained(str(package))
    with pytest.raises(kdplug.PackageIntegrityError, match="does not tokenize as this student was trained"):
        kdplug.load_student(package, verify=False)


def test_a_truncated_weight_file_is_a_message_not_a_safetensors_traceback(capsys, package, tmp_path):
    weights = package / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    with pytest.raises(kdplug.UsageError, match="cannot be read.*damaged or incomplete"):
        kdplug.load_student(package, verify=False)
    source = tmp_path / "in.txt"
    source.write_text("a good film\n")
    code, _, err = predict_cli(capsys, package, "--input", source, "--no-verify")
    assert code == 2 and "damaged or incomplete" in err and "Traceback" not in err


def test_a_package_without_checksums_loads_with_a_note(package, caplog):
    (package / "kdplug_checksums.json").unlink()
    (package / "README.md").write_text("my own card\n")
    with caplog.at_level("WARNING", logger="kdplug"):
        student = kdplug.load_student(package)
    assert len(student.predict(DEV_TEXTS)) == len(DEV_TEXTS)
    assert any("loading it unverified" in record.getMessage() for record in caplog.records)


def test_an_edited_model_card_does_not_fail_verification(package):
    (package / "README.md").write_text("---\nlicense: mit\n---\nmy card\n")
    kdplug.load_student(package)  # the card changes no prediction


# -- the Python API checks its arguments first ----------------------------------------------------


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({"student": 42}, "student="),
        ({"teacher": 42}, "teacher="),
        ({"teacher": ("bert-base-uncased", "tokenizer")}, "teacher="),
        ({"task": 3.5}, "task="),
        ({"student": torch.nn.Linear(2, 2)}, "forward takes no input_ids"),
        ({"projector": 7}, "projector="),
        ({"config": 7}, "config="),
        ({"data_dir": 7}, "data_dir="),
    ],
)
def test_distill_rejects_an_argument_of_the_wrong_kind_before_loading_anything(arguments, named, monkeypatch):
    import kdplug.engine.pipeline

    def must_not_run(*args, **kwargs):
        raise AssertionError("the engine ran")

    monkeypatch.setattr(kdplug.engine.pipeline, "run", must_not_run)
    with pytest.raises(kdplug.ArgumentError, match=named) as raised:
        kdplug.distill(**{"teacher": "minilm", "task": "demo", **arguments})
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, kdplug.UsageError)


def test_load_student_and_predict_name_what_they_accept():
    with pytest.raises(TypeError, match="load_student takes a path"):
        kdplug.load_student(42)
    with pytest.raises(TypeError, match="predict takes a run directory"):
        kdplug.predict(42, ["a text"])
    with pytest.raises(TypeError, match="predict takes texts.*int 42"):  # the texts first: nothing loads
        kdplug.predict("/no/such/run", ["a text", 42])
    with pytest.raises(ValueError, match="does not exist"):  # a UsageError is a ValueError to Python callers
        kdplug.load_student("/no/such/run")


# -- a checkpoint's own code -----------------------------------------------------------------------

HOSTILE = """
import pathlib
pathlib.Path({marker!r}).write_text("the checkpoint's code ran")
from transformers import PretrainedConfig
class HostileConfig(PretrainedConfig):
    model_type = "kdplug-test-hostile"
"""


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_a_checkpoint_asking_to_run_its_code_is_refused_and_its_code_never_runs(
    capsys, tmp_path, tiny_bert_dir, data, kind
):
    hostile, marker = tmp_path / "hostile", tmp_path / "RAN"
    shutil.copytree(tiny_bert_dir, hostile)
    config = json.loads((hostile / "config.json").read_text())
    config.update(
        model_type="kdplug-test-hostile",
        auto_map={
            "AutoConfig": "configuration_hostile.HostileConfig",
            "AutoModelForSequenceClassification": "configuration_hostile.HostileConfig",
        },
    )
    (hostile / "config.json").write_text(json.dumps(config))
    (hostile / "configuration_hostile.py").write_text(HOSTILE.format(marker=str(marker)))
    models = {"teacher": str(hostile), "student": "bilstm"} if kind == "teacher" else {}
    models = models or {"teacher": tiny_bert_dir, "student": str(hostile)}
    argv = ["run", "--teacher", models["teacher"], "--student", models["student"], "--task", "sst2"]
    argv += ["--data-dir", str(data), "--epochs", "1", "--output", str(tmp_path / "run")]
    argv += ["--set", "teacher_epochs=1", "--set", "allow_weak_teacher=true"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{kind}_options.trust_remote_code=true" in err and "auto_map" in err
    assert not marker.exists()


def test_kdplugs_own_students_with_an_auto_map_need_no_remote_code(run):
    """A BiLSTM package names its modeling code in auto_map, but its model type is kdplug's own: a
    fresh process's option checks accept it as a student directory."""
    script = (
        "import sys; from kdplug.engine import preflight; from kdplug.plugins import get_plugin_manager; "
        "preflight.check_model_reference(get_plugin_manager().registry, 'student', sys.argv[1]); print('accepted')"
    )
    config = json.loads((run / "student" / "config.json").read_text())
    assert "auto_map" in config and config["model_type"] == "kdplug-bilstm"
    result = subprocess.run(
        [sys.executable, "-c", script, str(run / "student")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "accepted" in result.stdout, result.stderr


# -- every failure a message ------------------------------------------------------------------------


def test_predict_output_onto_a_directory_is_refused_before_predicting(capsys, run, tmp_path):
    source, target = tmp_path / "in.txt", tmp_path / "mine"
    source.write_text("a good film\n")
    target.mkdir()
    (target / "notes.txt").write_text("mine\n")
    code, _, err = predict_cli(capsys, run, "--input", source, "--output", target, "--overwrite")
    assert code == 2 and "is a directory" in err and (target / "notes.txt").read_text() == "mine\n"


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory the operating system refuses new files in: chmod 555 for a user, and for root
    (whom chmod does not bind) sysfs, which refuses even root."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        return locked
    locked = Path("/sys/kernel")
    try:
        with tempfile.TemporaryFile(dir=locked):
            pytest.skip("no directory here refuses root's writes")
    except OSError:
        return locked


def test_predict_into_an_unwritable_directory_is_a_message_before_any_work(capsys, run, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("a good film\n")
    locked = unwritable_directory(tmp_path)
    code, out, err = predict_cli(capsys, run, "--input", source, "--output", locked / "out.tsv")
    assert code == 2 and out == "", err
    assert "cannot write in" in err and ("permission denied" in err or "read-only" in err)
    assert "Traceback" not in err and not (locked / "out.tsv").exists()


def test_a_usage_error_found_during_a_run_prints_its_message_alone_and_debug_adds_the_traceback(
    tmp_path, tiny_bert_dir
):
    """Found after the run started (a max_length beyond the teacher's positions, checked once the
    teacher is loaded): the terminal gets the message, log.txt the traceback; --debug puts the
    traceback on the terminal."""
    data = write_sst2(tmp_path / "SST-2")
    for debug in (False, True):
        output = tmp_path / f"run-{debug}"
        command = [sys.executable, "-m", "kdplug.cli", *(["--debug"] if debug else []), "run"]
        command += ["--teacher", tiny_bert_dir, "--student", "bilstm", "--task", "sst2", "--data-dir", str(data)]
        command += ["--set", "teacher_epochs=1", "--set", "allow_weak_teacher=true", "--set", "max_length=100000"]
        command += ["--output", str(output)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert result.returncode == 2, result.stderr
        assert ("Traceback" in result.stderr) is debug, result.stderr
        assert result.stderr.rstrip().splitlines()[-1].startswith("kdplug: error: ")
        assert "max_length=100000 exceeds the teacher's" in result.stderr
        assert "Traceback" in (output / "log.txt").read_text()


def test_a_file_size_limit_while_the_teachers_optimizer_state_is_saved_says_how_to_resume(tmp_path, tiny_bert_dir):
    """RLIMIT_FSIZE set so that the teacher's weights fit and its optimizer state (twice their size,
    written by torch.save) does not: a message with --resume, no traceback; the resume finishes."""
    import resource

    data = write_sst2(tmp_path / "SST-2")
    limit = int(1.5 * (Path(tiny_bert_dir) / "model.safetensors").stat().st_size)
    output = tmp_path / "run"
    command = [sys.executable, "-m", "kdplug.cli", "run", "--teacher", tiny_bert_dir, "--student", "bilstm"]
    command += ["--task", "sst2", "--data-dir", str(data), "--epochs", "1", "--output", str(output)]
    command += ["--set", "teacher_epochs=2", "--set", "allow_weak_teacher=true"]
    command += ["--set", "student_options.hidden_size=16"]

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=dict(os.environ), preexec_fn=limit_file_size
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "checkpoint of stage 'teacher'" in result.stderr and "ulimit -f" in result.stderr
    assert f"kdplug run --resume {output}" in result.stderr and "Traceback" in (output / "log.txt").read_text()
    resumed = subprocess.run(
        [sys.executable, "-m", "kdplug.cli", "run", "--resume", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (output / "student" / "model.safetensors").is_file()


def test_the_package_is_the_same_whether_the_teacher_was_stored_or_fine_tuned(tmp_path, tiny_bert_dir, data):
    """Two runs of one command and seed, one cache: the first fine-tunes and stores the teacher, the
    second reuses it. Every file of student/ is the same, but for the timings it measured."""
    outputs = [tmp_path / "fine-tuned", tmp_path / "stored"]
    for output in outputs:
        argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(data), "--student", "bilstm"]
        argv += ["--projector", "rkd", "--epochs", "1", "--output", str(output), "--set", "teacher_epochs=1"]
        argv += ["--set", "allow_weak_teacher=true", "--set", "student_options.hidden_size=16"]
        assert main(argv) == 0
    teachers = [json.loads((output / "metrics.json").read_text())["teacher"]["finetuned"] for output in outputs]
    assert "reused" not in teachers[0] and "reused" in teachers[1]
    first, second = (output / "student" for output in outputs)
    names = sorted(path.name for path in first.iterdir())
    assert names == sorted(path.name for path in second.iterdir())
    timed = {"README.md", "kdplug_student.json", "kdplug_checksums.json"}  # speed figures, and their checksums
    for name in set(names) - timed:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    infos = [json.loads((directory / "kdplug_student.json").read_text()) for directory in (first, second)]
    assert {k: v for k, v in infos[0].items() if k != "speed"} == {k: v for k, v in infos[1].items() if k != "speed"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--transfer", "{empty}"], "holds no texts"),
        (["--transfer", "{header}"], "holds no texts (a header line alone)"),
        (["--augment", "tang", "--set", "augment_options.spacy_model=en_core_web_nosuch"], "no installed spaCy"),
    ],
)
def test_transfer_and_augmenter_problems_are_found_before_the_teacher_loads(
    capsys, tmp_path, tiny_bert_dir, data, extra, message
):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "header.tsv").write_text("sentence\n")
    extra = [item.format(empty=tmp_path / "empty.txt", header=tmp_path / "header.tsv") for item in extra]
    argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(data), "--student", "bilstm"]
    code = main([*argv, *extra, "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists()  # found by the checks before the run directory, data or teacher


def test_predict_output_under_a_file_says_it_is_not_a_directory(capsys, run, tmp_path):
    source, blocker = tmp_path / "in.txt", tmp_path / "afile"
    source.write_text("a good film\n")
    blocker.write_text("mine\n")
    code, _, err = predict_cli(capsys, run, "--input", source, "--output", blocker / "out.tsv")
    assert code == 2 and "is a file, not a directory" in err and blocker.read_text() == "mine\n"

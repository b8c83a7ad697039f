"""No code runs that nobody trusted, and exports end in messages. Faults are real: a student package
whose own code writes a file when imported, loaded by the real command line on a real terminal (a
pty) where transformers would ask whether to run it; a teacher whose files name code of their own;
a package without its tokenizer.json; a real SIGINT sent to a starting `kdplug export`."""

from __future__ import annotations

import ast
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kdplug
from kdplug.cli import main
from kdplug.storage import write_checksums

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "[y/N]"  # how transformers asks whether to run a checkpoint's code


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 2, dev=SST2_DEV)


def distil(teacher: str, data: Path, output: Path, *, student: str = "bilstm", **settings: str) -> Path:
    argv = ["run", "--teacher", teacher, "--task", "sst2", "--data-dir", str(data), "--student", student]
    argv += ["--projector", "rkd", "--epochs", "1", "--output", str(output)]
    for key, value in {"teacher_epochs": "1", "allow_weak_teacher": "true", **settings}.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    return output


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_dir, data):
    """One finished tiny run with a BiLSTM student."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("cache")))
        return distil(
            tiny_bert_dir, data, tmp_path_factory.mktemp("runs") / "bilstm", **{"student_options.hidden_size": "16"}
        )


def in_a_terminal(argv: list[str], timeout: float = 240) -> tuple[int, str]:
    """``argv`` run with a pseudo-terminal as its stdin, stdout and stderr, as from a user's shell;
    a question to run a checkpoint's code is answered yes, as a user who trusts kdplug's checks
    might. The exit code and everything the terminal showed."""
    controller, terminal = os.openpty()
    process = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True)
    os.close(terminal)
    shown, answered, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([controller], [], [], 0.5)[0]:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
                if PROMPT.encode() in shown and not answered:
                    os.write(controller, b"y\n")
                    answered = True
            elif process.poll() is not None:
                break
        else:
            process.kill()
            pytest.fail(f"{argv} did not finish in {timeout}s; the terminal showed: {shown.decode()[-2000:]}")
        return process.wait(timeout=60), shown.decode(errors="replace")
    finally:
        os.close(controller)


# -- every load passes trust_remote_code ----------------------------------------------------------


def test_every_from_pretrained_in_kdplug_passes_trust_remote_code():
    """Left out, transformers asks on the terminal (and waits) whether to run a checkpoint's code.
    The exceptions: a model class's own from_pretrained handing its caller's arguments on, and peft's
    PeftModel, which reads an adapter's JSON config and weights and never runs a checkpoint's code
    (it has no trust_remote_code to pass: the base it wraps was loaded with it)."""
    missing = []
    for path in [p for d in ("kdplug", "plugins") for p in (ROOT / d).rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "from_pretrained" or any(k.arg == "trust_remote_code" for k in node.keywords):
                continue
            forwarding = isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", "") == "super"
            adapter = isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "PeftModel"
            if not (forwarding or adapter):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, f"from_pretrained without trust_remote_code: {missing}"


# -- a student package's own code ------------------------------------------------------------------

HOSTILE = """
import pathlib
pathlib.Path({marker!r}).write_text("the package's code ran")
from transformers import PretrainedConfig
class HostileConfig(PretrainedConfig):
    model_type = "kdplug-test-hostile"
"""


def hostile_package(run: Path, directory: Path, marker: Path, *, where: str, checksums: bool) -> Path:
    """A copy of the run's student whose config.json (or tokenizer_config.json) names a module of its
    own, for a model type (or tokenizer class) nobody provides; the module writes ``marker``."""
    package = Path(shutil.copytree(run / "student", directory))
    (package / "hostile_code.py").write_text(HOSTILE.format(marker=str(marker)))
    if where == "config":
        config = json.loads((package / "config.json").read_text())
        config.update(
            model_type="kdplug-test-hostile",
            auto_map={
                "AutoConfig": "hostile_code.HostileConfig",
                "AutoModelForSequenceClassification": "hostile_code.HostileConfig",
            },
        )
        (package / "config.json").write_text(json.dumps(config))
    else:
        tokenizer = json.loads((package / "tokenizer_config.json").read_text())
        tokenizer.update(tokenizer_class="HostileTokenizer", auto_map={"AutoTokenizer": ["hostile_code.Nope", None]})
        (package / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (package / "kdplug_checksums.json").unlink()
    if checksums:  # whoever wrote the package can write its checksums too
        write_checksums(package)
    return package


@pytest.mark.parametrize("checksums", [False, True], ids=["no-checksums", "checksums"])
@pytest.mark.parametrize(
    "where, command",
    [
        ("config", "predict"),
        ("config", "export"),
        ("config", "python"),
        ("tokenizer", "predict"),
    ],
)
def test_a_package_with_code_of_its_own_is_refused_on_a_terminal_without_a_question(
    run, tmp_path, where, command, checksums
):
    marker = tmp_path / "RAN"
    package = hostile_package(run, tmp_path / "package", marker, where=where, checksums=checksums)
    texts = tmp_path / "in.txt"
    texts.write_text("a good film\n")
    argv = {
        "predict": ["-m", "kdplug.cli", "predict", str(package), "--input", str(texts)],
        "export": ["-m", "kdplug.cli", "export", str(package), "--format", "hf", "--output", str(tmp_path / "out")],
        "python": ["-c", "import kdplug, sys; kdplug.predict(sys.argv[1], ['a good film'])", str(package)],
    }[command]
    code, shown = in_a_terminal([sys.executable, *argv])
    assert PROMPT not in shown, shown[-2000:]
    assert not marker.exists(), "the package's code ran"
    assert "asks to run Python code of its own" in shown and "hostile_code.py" in shown, shown[-2000:]
    assert code == (1 if command == "python" else 2), shown[-2000:]  # Python: a PackageIntegrityError
    if command != "python":
        assert "Traceback" not in shown
    assert not (tmp_path / "out").exists()


# -- nothing of the teacher's own code reaches the student package ------------------------------------


@pytest.fixture(scope="module")
def teacher_with_code(tmp_path_factory, tiny_bert_dir):
    """A BERT checkpoint whose files name code of their own, as a hub repository with custom code
    does: an auto_map in config.json and in tokenizer_config.json, and a custom tokenizer_class;
    transformers' own BERT classes load it, so kdplug needs none of that code (absent here)."""
    teacher = Path(shutil.copytree(tiny_bert_dir, tmp_path_factory.mktemp("teacher") / "bert-with-code"))
    config = json.loads((teacher / "config.json").read_text())
    config.update(
        auto_map={
            "AutoConfig": "configuration_teacher.TeacherConfig",
            "AutoModelForSequenceClassification": "modeling_teacher.TeacherModel",
        },
        tokenizer_class="TeacherTokenizer",
    )
    (teacher / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((teacher / "tokenizer_config.json").read_text())
    tokenizer.update(
        auto_map={
            "AutoTokenizer": ["tokenization_teacher.TeacherTokenizer", "tokenization_teacher.TeacherTokenizerFast"]
        },
        tokenizer_class="TeacherTokenizer",
    )
    (teacher / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return teacher


PLAIN_TRANSFORMERS = """
import sys
from transformers import AutoModelForSequenceClassification, AutoTokenizer
model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1], trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
print(model(**tokenizer(["a good film"], return_tensors="pt")).logits.argmax(-1).item())
"""


def assert_loads_with_plain_transformers(package: Path) -> None:
    """As docs/deploy.md shows, in a process that never imports kdplug."""
    for name in ("config.json", "tokenizer_config.json"):
        data = json.loads((package / name).read_text())
        assert "teacher" not in json.dumps(data.get("auto_map", {})).lower(), (name, data.get("auto_map"))
        assert data.get("tokenizer_class") != "TeacherTokenizer", name
    result = subprocess.run(
        [sys.executable, "-c", PLAIN_TRANSFORMERS, str(package)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() in ("0", "1"), result.stderr[-3000:]


@pytest.mark.parametrize("student", ["bilstm", "bert-2"])
def test_a_teachers_own_code_is_not_named_by_the_student_package(tmp_path, teacher_with_code, data, student):
    run = distil(str(teacher_with_code), data, tmp_path / "run", student=student)
    assert_loads_with_plain_transformers(run / "student")
    kdplug.load_student(run)  # and kdplug's own load verifies it as written


def test_an_export_of_an_older_package_drops_the_teachers_code(capsys, run, tmp_path):
    """A package written before kdplug left the teacher's auto_map out: its export (plain, and with
    a trimmed vocabulary) names no code the export does not carry."""
    older = Path(shutil.copytree(run, tmp_path / "older"))
    path = older / "student" / "tokenizer_config.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["auto_map"] = {"AutoTokenizer": ["tokenization_teacher.TeacherTokenizer", None]}
    path.write_text(json.dumps(tokenizer))
    write_checksums(older / "student")
    for extra in ([], ["--trim-vocab"]):
        output = tmp_path / f"export{len(extra)}"
        assert main(["export", str(older), "--format", "hf", *extra, "--output", str(output)]) == 0, capsys.readouterr()
        assert_loads_with_plain_transformers(output)


# -- exports: messages, not tracebacks ---------------------------------------------------------------


def test_an_export_without_tokenizer_json_is_a_message(capsys, run, tmp_path):
    """A package whose tokenizer only tokenizer.json describes (the generic fast class), without it."""
    package = Path(shutil.copytree(run, tmp_path / "run"))
    path = package / "student" / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}))
    (package / "student" / "tokenizer.json").unlink()
    output = tmp_path / "trimmed"
    code = main(["export", str(package), "--trim-vocab", "--no-verify", "--format", "hf", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "tokenizer.json is missing" in err and "damaged or incomplete" in err and not output.exists()


def test_a_damaged_run_student_is_not_advised_the_export_that_just_failed(capsys, run, tmp_path):
    """Exports are made from a run's student/: for it, the advice is what can write it again."""
    package = Path(shutil.copytree(run, tmp_path / "run"))
    weights = package / "student" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 0xFF]))
    code = main(["export", str(package), "--format", "onnx", "--output", str(tmp_path / "onnx")])
    err = capsys.readouterr().err
    assert code == 2 and "model.safetensors fails its checksum" in err, err
    assert "kdplug export" not in err, err
    assert f"kdplug run --config {package / 'config.yaml'} --output NEW_DIR" in err
    (package / "checkpoints").mkdir()  # a run that kept its checkpoints writes its package again from them
    main(["export", str(package), "--format", "onnx", "--output", str(tmp_path / "onnx")])
    assert f"kdplug run --resume {package}" in capsys.readouterr().err


# -- Ctrl-C at the start of an export -------------------------------------------------------------------


def wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def torch_is_loading(pid: int) -> bool:
    """torch's native library is mapped: ``import torch`` has begun, and takes a second or more yet."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see where the process is")
@pytest.mark.parametrize("moment", ["importing", "writing"])
def test_ctrl_c_in_an_export_exits_130_with_one_line_and_writes_nothing(run, tmp_path, moment):
    """SIGINT while the command imports torch (its first seconds), and while the export is being
    written (its staging folder exists): exit 130, one line, no traceback, nothing left behind."""
    place = tmp_path / "exports"
    place.mkdir()
    output = place / "onnx"
    process = subprocess.Popen(
        [sys.executable, "-m", "kdplug.cli", "export", str(run), "--format", "onnx", "--output", str(output)],
        stderr=subprocess.PIPE,
        text=True,
        # a job started in the background by a non-interactive shell inherits SIGINT ignored: a user's
        # terminal delivers Ctrl-C with its default action, so the child starts with that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    if moment == "importing":
        wait_for(lambda: torch_is_loading(process.pid) or process.poll() is not None)
    else:
        wait_for(lambda: any(place.iterdir()) or process.poll() is not None)
    assert process.poll() is None, "the export ended before the signal"
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=120)[1]
    # kdplug exits 130; once a library has run Python code through the C API (pybind11's exec), Python
    # ends a process that caught a KeyboardInterrupt by re-raising SIGINT, which a shell shows as 130 too
    assert process.returncode in ((130,) if moment == "importing" else (130, -signal.SIGINT)), err
    assert "Traceback" not in err and err.strip().splitlines() == [err.strip().splitlines()[-1]], err
    assert err.strip().startswith("kdplug: interrupted"), err
    assert list(place.iterdir()) == []  # neither the export nor its staging folder

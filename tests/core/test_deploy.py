"""Ship the student: a standalone package that plain transformers loads, kdplug.predict, the
predict and export commands, and speed in every result (tiny runs, real files, real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import kdplug
from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

FAMILIES = ("bert-2", "bilstm", "gated-cnn")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 3, dev=SST2_DEV)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir, data):
    """One finished run per student family (universal-ca for the BiLSTM: it has projector weights
    that must stay out of the package)."""
    root = tmp_path_factory.mktemp("runs")
    projectors = {"bert-2": "rkd", "bilstm": "universal-ca", "gated-cnn": "rkd"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("deploy-cache")))
        for family in FAMILIES:
            width = {} if family == "bert-2" else {"hidden_size": 16, "embedding_dim": 16}
            settings = dict(student=family, projector=projectors[family], epochs=2, student_options=width)
            tiny = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data), **settings)
            argv = ["run", *tiny, "--set", "head_epochs=1", "--set", "lr=0.01", "--output", str(root / family)]
            assert main(argv) == 0
    return {family: root / family for family in FAMILIES}


def dev_texts():
    return [text for text, _ in SST2_DEV]


def run_predictions(run):
    return json.loads((run / "predictions.json").read_text())["dev"]["predictions"]


# -- the package -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_the_student_directory_stands_alone(runs, family, tiny_bert_dir):
    student = runs[family] / "student"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "kdplug_student.json",
        "README.md",
    ):
        assert (student / name).is_file(), name
    config = json.loads((student / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"} and not config.get("output_hidden_states")
    # only the student's weights: no projector, pseudo classifier or teacher head
    keys = set(load_file(str(student / "model.safetensors")))
    model = kdplug.load_student(runs[family]).model
    assert keys == set(model.state_dict()) and not any("projector" in key or "head" in key for key in keys)
    # nothing points into kdplug's cache or the teacher's directory
    for path in student.iterdir():
        if path.suffix in (".json", ".md"):
            text = path.read_text()
            assert os.environ["KDPLUG_CACHE"] not in text and "teacher-cache" not in text, path.name
    info = json.loads((student / "kdplug_student.json").read_text())
    assert info["labels"] == ["negative", "positive"] and info["text_columns"] == ["sentence"]
    assert info["max_length"] == 64 and not info["is_pair"]


def test_the_model_card_names_the_runs_metrics_and_how_to_reproduce_it(runs):
    card = (runs["bilstm"] / "student" / "README.md").read_text()
    metrics = json.loads((runs["bilstm"] / "metrics.json").read_text())
    accuracy = metrics["student"]["dev"]["dev"]["accuracy"]
    assert card.startswith("---\n") and "pipeline_tag: text-classification" in card
    assert f"value: {round(accuracy, 4)}" in card and f"{accuracy * 100:.2f}" in card
    assert "kdplug run --teacher" in card and "--student bilstm --projector universal-ca" in card
    assert "wu2021universalkd" in card  # the paper to cite
    assert "speed-up" in card and "import kdplug" in card


def test_the_tokenizer_is_the_one_the_student_was_trained_with(runs, tiny_bert_dir):
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(str(runs["bert-2"] / "student"))
    teacher = AutoTokenizer.from_pretrained(tiny_bert_dir)
    assert saved.get_vocab() == teacher.get_vocab()  # not a 5-word tokenizer that makes everything [UNK]
    assert saved.unk_token_id not in saved("the movie was good")["input_ids"]


# -- loading with plain transformers, in a fresh process -------------------------------------------

LOAD = """
import json, sys
{import_kdplug}
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
directory, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
tokenizer = AutoTokenizer.from_pretrained(directory)
with torch.no_grad():
    logits = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
classify = pipeline("text-classification", model=directory, truncation=True, top_k=None)
print(json.dumps({{"argmax": logits.argmax(-1).tolist(), "probabilities": logits.softmax(-1).tolist(),
                  "pipeline": [{{item["label"]: item["score"] for item in row}} for row in classify(texts)],
                  "class": type(model).__name__}}))
"""


def load_in_fresh_process(directory, import_kdplug):
    script = LOAD.format(import_kdplug="import kdplug" if import_kdplug else "")
    result = subprocess.run(
        [sys.executable, "-c", script, str(directory), json.dumps(dev_texts())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family, import_kdplug", [("bert-2", False), ("bilstm", True), ("gated-cnn", True)])
def test_students_load_with_transformers_and_predict_what_kdplug_predicted(runs, family, import_kdplug):
    loaded = load_in_fresh_process(runs[family] / "student", import_kdplug)
    assert loaded["argmax"] == run_predictions(runs[family])  # kdplug's own evaluation of the dev set
    ours = kdplug.predict(runs[family], dev_texts())
    for mine, theirs, pipe in zip(ours, loaded["probabilities"], loaded["pipeline"]):
        assert [mine.probabilities["negative"], mine.probabilities["positive"]] == pytest.approx(theirs, abs=1e-6)
        assert [pipe["negative"], pipe["positive"]] == pytest.approx(theirs, abs=1e-6)
    assert len({round(p[1], 6) for p in loaded["probabilities"]}) > 1  # a real model, not a constant


def test_pooled_students_without_kdplug_ask_for_trust_remote_code(runs):
    script = (
        "from transformers import AutoModelForSequenceClassification\n"
        f"AutoModelForSequenceClassification.from_pretrained({str(runs['bilstm'] / 'student')!r})"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "trust_remote_code" in result.stderr


STANDALONE = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
directory, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSequenceClassification.from_pretrained(directory, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
with torch.no_grad():
    logits = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
classify = pipeline("text-classification", model=directory, truncation=True, top_k=None, trust_remote_code=True)
print(json.dumps({"probabilities": logits.softmax(-1).tolist(), "module": type(model).__module__,
                  "pipeline": [{item["label"]: item["score"] for item in row} for row in classify(texts)],
                  "kdplug": sorted(m for m in sys.modules if m.startswith("kdplug"))}))
"""


def assert_loads_like_kdplug(python, run, env=None):
    # run elsewhere than the checkout: a checkout on the path would make kdplug importable after all
    result = subprocess.run(
        [python, "-c", STANDALONE, str(run / "student"), json.dumps(dev_texts())],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=run,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["kdplug"] == [] and loaded["module"].startswith("transformers_modules.")  # the package's own code
    ours = kdplug.predict(run, dev_texts())
    for mine, theirs, pipe in zip(ours, loaded["probabilities"], loaded["pipeline"]):
        assert [mine.probabilities["negative"], mine.probabilities["positive"]] == pytest.approx(theirs, abs=1e-6)
        assert [pipe["negative"], pipe["positive"]] == pytest.approx(theirs, abs=1e-6)


@pytest.mark.parametrize("family", ["bilstm", "gated-cnn"])
def test_pooled_students_load_where_kdplug_cannot_be_imported(runs, family, tmp_path):
    for package in ("kdplug", "kdplug_models"):  # first on the path: importing kdplug fails, as where it is absent
        (tmp_path / "block" / package).mkdir(parents=True)
        (tmp_path / "block" / package / "__init__.py").write_text("raise ImportError('kdplug is not installed')\n")
    config = json.loads((runs[family] / "student" / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModelForSequenceClassification"}
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "block"), "HF_MODULES_CACHE": str(tmp_path / "modules")}
    assert_loads_like_kdplug(sys.executable, runs[family], env)


@pytest.mark.slow
def test_a_bilstm_student_loads_in_a_fresh_environment_with_only_transformers_and_torch(runs, tmp_path):
    """A new virtual environment with transformers and torch installed, nothing else of this one."""
    import venv

    root = Path(__file__).resolve().parents[2]
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = subprocess.run(
        # --no-compile: byte-compiling every file of torch took 40 of the test's 55 s; Python
        # compiles what it imports anyway
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-compile",
            "-c",
            str(root / "constraints.txt"),
            "torch",
            "transformers",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # nothing of this checkout
    assert subprocess.run([python, "-c", "import kdplug"], capture_output=True, env=clean, cwd=tmp_path).returncode
    assert_loads_like_kdplug(python, runs["bilstm"], {**clean, "HF_MODULES_CACHE": str(tmp_path / "modules")})


# -- the Python API ----------------------------------------------------------------------------


def test_load_student_returns_model_tokenizer_and_labels_in_eval_mode(runs):
    student = kdplug.load_student(runs["bilstm"] / "student")
    assert not student.model.training and student.labels == ("negative", "positive")
    assert type(student.model).__name__ == "BiLSTMForSequenceClassification"
    predictions = kdplug.predict(student, ["the movie was good", "the plot was dull"], batch_size=1)
    assert [p.label for p in predictions] == [
        p.label for p in student.predict(["the movie was good", "the plot was dull"])
    ]
    assert all(sum(p.probabilities.values()) == pytest.approx(1.0) for p in predictions)
    with pytest.raises(kdplug.UsageError, match="single texts"):
        student.predict([("a", "b")])


def test_load_student_names_what_is_missing(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(kdplug.UsageError, match="tokenizer_config.json.*kdplug_student.json"):
        kdplug.load_student(tmp_path)
    with pytest.raises(kdplug.UsageError, match="does not exist"):
        kdplug.load_student(tmp_path / "nowhere")


def test_predict_on_regression_gives_scores(tmp_path, tiny_bert_dir):
    data = tmp_path / "sts"
    data.mkdir()
    rows = ["text,other,score"] + [
        f"the movie {w},the film {w},{i % 5}.0"
        for i, w in enumerate(["was good", "was bad", "is fine", "is dull", "was fun", "was poor"])
    ]
    for split in ("train", "dev"):
        (data / f"{split}.csv").write_text("\n".join(rows) + "\n")
    assert (
        main(
            [
                "run",
                *tiny_run_args(
                    teacher=tiny_bert_dir,
                    task="local",
                    data_dir=str(data),
                    student="bert-2",
                    student_options=None,
                    task_options={"text_pair_column": "other", "label_column": "score", "regression": True},
                    output=tmp_path / "run",
                ),
            ]
        )
        == 0
    )
    predictions = kdplug.predict(tmp_path / "run", [("the movie was good", "the film was bad")])
    assert predictions[0].score is not None and predictions[0].label is None
    with pytest.raises(kdplug.UsageError, match="sentence pairs"):
        kdplug.predict(tmp_path / "run", ["only one text"])


# -- kdplug predict ----------------------------------------------------------------------------


def predict_cli(capsys, *argv):
    code = main(["predict", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "suffix, content",
    [
        (".tsv", "sentence\tid\n{0}\t1\n{1}\t2\n"),
        (".csv", 'id,sentence\n1,"{0}"\n2,"{1}"\n'),
        (".jsonl", '{{"sentence": "{0}", "id": 1}}\n{{"text": "ignored", "sentence": "{1}"}}\n'),
        (".txt", "{0}\n\n{1}\n"),
    ],
)
def test_predict_reads_every_format_and_keeps_the_rows(capsys, tmp_path, runs, suffix, content):
    texts = dev_texts()[:2]
    source = tmp_path / f"input{suffix}"
    source.write_text(content.format(*texts))
    output = tmp_path / f"out{suffix if suffix != '.txt' else '.tsv'}"
    code, _, err = predict_cli(capsys, runs["bert-2"], "--input", source, "--output", output)
    assert code == 0, err
    assert "2 predictions written" in err
    expected = [p.label for p in kdplug.predict(runs["bert-2"], texts)]
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in output.read_text().splitlines()]
        assert [r["label"] for r in rows] == expected and rows[0]["id"] == 1
        assert set(rows[0]["probabilities"]) == {"negative", "positive"}
    else:
        lines = output.read_text().splitlines()
        delimiter = "," if suffix == ".csv" else "\t"
        header = lines[0].split(delimiter)
        assert header[-3:] == ["label", "probability_negative", "probability_positive"]
        assert [line.split(delimiter)[header.index("label")] for line in lines[1:]] == expected


def test_predict_by_a_token_budget_writes_the_rows_in_order_with_the_count_batches_labels(capsys, tmp_path, runs):
    """--tokens-per-batch sorts the texts by length into batches of at most N padded tokens; the output keeps
    the input's rows in order, with the labels of --batch-size batches and their probabilities to 1e-6."""
    texts = dev_texts()
    source = tmp_path / "in.tsv"
    source.write_text(
        "sentence\tid\n" + "".join(f"{' '.join([text] * (1 + i % 4))}\t{i}\n" for i, text in enumerate(texts))
    )
    outputs = {}
    for name, option in (("count", []), ("budget", ["--tokens-per-batch", 24])):
        code, _, err = predict_cli(
            capsys, runs["bert-2"], "--input", source, "--output", tmp_path / f"{name}.tsv", *option
        )
        assert code == 0, err
        outputs[name] = [line.split("\t") for line in (tmp_path / f"{name}.tsv").read_text().splitlines()]
    count, budget = outputs["count"], outputs["budget"]
    assert [row[:3] for row in budget] == [row[:3] for row in count]  # text, id and label of every row, in order
    assert [row[1] for row in budget[1:]] == [str(i) for i in range(len(texts))]
    for a, b in zip(budget[1:], count[1:]):
        assert all(abs(float(x) - float(y)) < 1e-6 for x, y in zip(a[3:], b[3:]))


def test_predict_reads_and_writes_as_it_goes_in_flat_memory(capsys, tmp_path, runs, monkeypatch):
    """Six times the rows, about the same peak of Python memory: the input is read, predicted and
    written a chunk at a time (it was read whole, and its output built in memory)."""
    import tracemalloc

    monkeypatch.setattr("kdplug.commands.predict.CHUNK_ROWS", 256)
    texts = dev_texts()
    peaks = {}
    for rows in (10, 2_000, 12_000):  # the first only imports what predicting needs
        source = tmp_path / f"in-{rows}.tsv"
        source.write_text("sentence\tid\n" + "".join(f"{texts[i % len(texts)]} {i}\t{i}\n" for i in range(rows)))
        tracemalloc.start()
        code, _, err = predict_cli(capsys, runs["bilstm"], "--input", source, "--output", tmp_path / f"out-{rows}.tsv")
        peaks[rows] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert code == 0 and f"{rows} predictions written" in err, err
        lines = (tmp_path / f"out-{rows}.tsv").read_text().splitlines()
        assert len(lines) == rows + 1 and lines[-1].split("\t")[1] == str(rows - 1)  # every row, in order
    assert peaks[12_000] < 1.5 * peaks[2_000], peaks


def test_predict_stopped_by_sigterm_leaves_no_staging_file(tmp_path, runs):
    """A real SIGTERM while the predictions are being written: exit 143, no output, no staging file."""
    import signal
    import time

    texts = dev_texts()
    source = tmp_path / "in.tsv"
    source.write_text("sentence\n" + "".join(f"{texts[i % len(texts)]} {i}\n" for i in range(40_000)))
    output = tmp_path / "out" / "predictions.tsv"
    output.parent.mkdir()
    argv = [sys.executable, "-m", "kdplug.cli", "predict", str(runs["bilstm"]), "--input", str(source)]
    process = subprocess.Popen([*argv, "--output", str(output)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(output.parent.iterdir()) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "the command ended before it was stopped"
    process.send_signal(signal.SIGTERM)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 143, err
    assert "Traceback" not in err and list(output.parent.iterdir()) == []


def test_predict_from_stdin_to_stdout_and_counts_truncation(capsys, runs, monkeypatch):
    import io

    long_text = " ".join(["the movie was really very good"] * 30)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"the film was dull\n{long_text}\n".encode())))
    code, out, err = predict_cli(capsys, runs["bilstm"], "--input", "-")
    assert code == 0, err
    assert out.splitlines()[0].startswith("text\tlabel") and len(out.splitlines()) == 3
    assert "1 longer than the student's 64 tokens were truncated" in err


@pytest.mark.parametrize(
    "case, content, message",
    [
        ("wrong columns", "review\tid\ngood\t1\n", ["input.tsv", "line 1", "'sentence'", "--text-column"]),
        ("empty", "", ["input.tsv is empty"]),
        ("header only", "sentence\tid\n", ["holds no texts"]),
        ("malformed", "sentence\tid\ngood\t1\t3\n", ["input.tsv", "line 2", "expected 2 fields"]),
    ],
)
def test_predict_bad_input_is_a_clear_usage_error(capsys, tmp_path, runs, case, content, message):
    source = tmp_path / "input.tsv"
    source.write_text(content)
    code, _, err = predict_cli(capsys, runs["bert-2"], "--input", source, "--output", tmp_path / "out.tsv")
    assert code == 2, (case, err)
    for text in message:
        assert text in err, (case, err)
    assert not (tmp_path / "out.tsv").exists()  # nothing half-written


def test_predict_does_not_overwrite_a_file_and_names_a_directory_that_is_no_student(capsys, tmp_path, runs):
    source, existing = tmp_path / "in.txt", tmp_path / "mine.tsv"
    source.write_text("good film\n")
    existing.write_text("my notes\n")
    code, _, err = predict_cli(capsys, runs["bert-2"], "--input", source, "--output", existing)
    assert code == 2 and "--overwrite" in err and existing.read_text() == "my notes\n"
    code, _, err = predict_cli(capsys, tmp_path, "--input", source)
    assert code == 2 and "config.json" in err and "not a run directory" in err


def test_predict_latin1_file_needs_its_encoding(capsys, tmp_path, runs):
    source = tmp_path / "in.txt"
    source.write_bytes("the film was très good\n".encode("latin-1"))
    code, _, err = predict_cli(capsys, runs["bert-2"], "--input", source)
    assert code == 2 and "line 1" in err and "--encoding=latin-1" in err
    code, _, err = predict_cli(capsys, runs["bert-2"], "--input", source, "--encoding", "latin-1")
    assert code == 0, err


# -- kdplug export -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_onnx_export_computes_what_the_student_computes(capsys, tmp_path, runs, family):
    import onnxruntime

    output = tmp_path / "onnx"
    assert main(["export", str(runs[family]), "--format", "onnx", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert "largest absolute difference" in out
    info = json.loads((output / "kdplug_student.json").read_text())
    assert info["onnx"]["max_abs_diff"] <= 1e-4 and info["onnx"]["checked_on"] == len(SST2_DEV)
    # ONNX Runtime on new inputs of another batch size and length, against kdplug.predict
    student = kdplug.load_student(runs[family])
    texts = dev_texts()[:3] + ["we hated the plot and the acting , it was really boring and dull"]
    encoded = student.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="np")
    session = onnxruntime.InferenceSession(str(output / "model.onnx"))
    feed = {name: encoded[name] for name in info["onnx"]["inputs"]}
    logits = session.run(["logits"], feed)[0]
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = [[p.probabilities["negative"], p.probabilities["positive"]] for p in student.predict(texts)]
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)


def test_hf_export_copies_the_package_and_refuses_foreign_directories(capsys, tmp_path, runs):
    output = tmp_path / "hf"
    assert main(["export", str(runs["bilstm"]), "--format", "hf", "--output", str(output)]) == 0
    assert [p.label for p in kdplug.predict(output, dev_texts())] == [
        p.label for p in kdplug.predict(runs["bilstm"], dev_texts())
    ]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["export", str(runs["bilstm"]), "--format", "hf", "--output", str(foreign)]) == 2
    assert "not written by kdplug" in capsys.readouterr().err and (foreign / "notes.txt").is_file()


def test_push_to_hub_is_checked_before_any_export_work(capsys, tmp_path, runs, monkeypatch):
    """Offline, unreachable, a bad repository id, no token: exit 2 at once, nothing written."""
    import socket
    import time

    run = str(runs["bert-2"])
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "HF_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # not logged in
    output = tmp_path / "export"

    def export(*extra):
        start = time.monotonic()
        code = main(["export", run, "--output", str(output), *extra])
        return code, capsys.readouterr().err, time.monotonic() - start

    code, err, seconds = export("--push-to-hub", "my-org/sst2-bert2")  # HF_HUB_OFFLINE=1 in every test
    assert code == 2 and "cannot push to my-org/sst2-bert2: the Hugging Face hub is switched off" in err
    assert "--output DIR" in err and seconds < 5 and not output.exists()

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    code, err, seconds = export("--format", "onnx", "--push-to-hub", "my-org/sst2-bert2")
    assert code == 2 and "(http://127.0.0.1:9) cannot be reached" in err and seconds < 5 and not output.exists()

    code, err, _ = export("--push-to-hub", "not a repo/id!")
    assert code == 2 and "is not a repository id" in err

    with socket.socket() as server:  # a hub that answers, but no token to push with
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        code, err, _ = export("--push-to-hub", "my-org/sst2-bert2")
    assert code == 2 and "needs a Hugging Face token with write access: run 'hf auth login'" in err
    assert not output.exists()

    code, err, _ = export("--private")
    assert code == 2 and "kdplug export needs --format" in err
    assert main(["export", run, "--format", "hf", "--output", str(output), "--private"]) == 2
    assert "go with --push-to-hub" in capsys.readouterr().err


# -- speed -------------------------------------------------------------------------------------


def test_every_run_measures_size_and_speed_against_the_teacher(runs):
    metrics = json.loads((runs["bert-2"] / "metrics.json").read_text())
    speed = metrics["speed"]
    for who in ("teacher", "student"):
        assert speed[who]["latency_ms"] > 0 and speed[who]["throughput"] > 0 and speed[who]["weights_mb"] > 0
    assert speed["student"]["parameters"] < speed["teacher"]["parameters"]
    assert speed["speedup"] == pytest.approx(speed["student"]["throughput"] / speed["teacher"]["throughput"], rel=1e-2)
    assert speed["teacher"]["batch_size"] == len(SST2_DEV)  # real dev inputs, all of them (fewer than 32)


# -- smaller and faster: int8, a trimmed vocabulary, ONNX Runtime in predict ------------------------


def labels_of(student_dir, texts, runtime="auto"):
    return [p.label for p in kdplug.load_student(student_dir, device="cpu", runtime=runtime).predict(texts)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_int8_export_of_every_family_is_checked_against_the_fp32_student(capsys, tmp_path, runs, family, fmt):
    output = tmp_path / "int8"
    code = main(
        [
            "export",
            str(runs[family]),
            "--format",
            fmt,
            "--quantize",
            "int8",
            "--max-drop",
            "100",
            "--output",
            str(output),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    info = json.loads((output / "kdplug_student.json").read_text())
    fp32 = labels_of(runs[family], dev_texts(), "torch")
    int8 = labels_of(output, dev_texts())
    agreement = sum(a == b for a, b in zip(fp32, int8)) / len(fp32)
    assert info["check"]["agreement"] == pytest.approx(agreement)  # what the export printed and recorded
    assert f"agreement with the fp32 student {agreement * 100:.2f}%" in out
    assert "dev accuracy" not in out or "fp32 ->" in out
    if fmt == "hf":  # int8 modules rebuilt on load
        from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

        student = kdplug.load_student(output)
        assert any(isinstance(m, QuantizedLinear) for m in student.model.modules())
    else:  # int8 weights in the file: ONNX Runtime's quantized operators
        import onnx

        graph = onnx.load(str(output / "model.onnx")).graph
        assert {n.op_type for n in graph.node} & {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeLSTM"}
    assert "examples/s at batch 32" in out and "MB exported" in out
    assert "ms/example at batch 1" in out and " ±" in out  # the run's timing routine: each figure with its spread


@pytest.mark.parametrize("family", ["bert-2", "bilstm"])
def test_the_int8_onnx_exports_parity_figure_is_the_file_shipped(capsys, tmp_path, runs, family):
    """The figure saved and printed is the int8 file's, recomputed here from the file with ONNX
    Runtime against the fp32 PyTorch student (it was the fp32 file's, measured before quantization)."""
    import onnxruntime

    output = tmp_path / "int8"
    argv = ["export", str(runs[family]), "--format", "onnx", "--quantize", "int8", "--max-drop", "100"]
    assert main([*argv, "--output", str(output)]) == 0
    out = capsys.readouterr().out
    info = json.loads((output / "kdplug_student.json").read_text())["onnx"]
    student = kdplug.load_student(runs[family], device="cpu", runtime="torch")
    session = onnxruntime.InferenceSession(str(output / "model.onnx"))
    texts = dev_texts()
    worst, same = 0.0, 0
    for index, chunk in enumerate([texts[i : i + 16] for i in range(0, len(texts), 16)] + [[t] for t in texts[:4]]):
        encoded = student.tokenizer(chunk, padding=True, truncation=True, max_length=64, return_tensors="pt")
        feed = {name: encoded[name] for name in info["inputs"]}
        with torch.inference_mode():
            expected = student.model(**feed).logits.numpy()
        got = session.run(["logits"], {name: value.numpy() for name, value in feed.items()})[0]
        worst = max(worst, float(np.abs(got - expected).max()))
        same += int((got.argmax(-1) == expected.argmax(-1)).sum()) if index * 16 < len(texts) else 0
    assert worst > 1e-4  # an int8 file: not the fp32 file's 1e-6
    assert info["max_abs_diff"] == pytest.approx(worst, rel=1e-5, abs=1e-7)
    assert info["weights"] == "int8" and info["fp32_max_abs_diff"] <= 1e-4 and info["same_class"] == same
    assert f"the int8 file shipped (ONNX Runtime) vs the fp32 PyTorch student on the same {len(texts)}" in out
    assert f"largest absolute difference of the logits {worst:.2e}, the same predicted class for {same} of" in out


def test_max_drop_refuses_a_degraded_int8_student():
    from kdplug.errors import KdplugError
    from kdplug.export import DevSet, ExportReport, _check_drop
    from kdplug.inference import Prediction

    class Fixed:  # a student whose predictions are given: one fp32, one int8 that gets one of four wrong
        labels = ("negative", "positive")

        def __init__(self, labels):
            self.answers = labels

        def predict(self, texts):
            return [Prediction(label=label) for label in self.answers]

    dev = DevSet(
        ["a", "b", "c", "d"],
        labels=[0, 1, 0, 1],
        metrics=lambda p, r: {"accuracy": sum(x == y for x, y in zip(p, r)) / len(r)},
        main_metric="accuracy",
    )
    fp32, int8 = (
        Fixed(["negative", "positive", "negative", "positive"]),
        Fixed(["negative", "positive", "negative", "negative"]),
    )
    report = ExportReport(Path("out"))
    with pytest.raises(KdplugError, match=r"loses 25.00 points of dev accuracy \(--max-drop 1\).*--allow-drop"):
        _check_drop(report, fp32, int8, dev, max_drop=1.0, allow_drop=False)
    assert report.reference_metric == 1.0 and report.export_metric == 0.75 and report.agreement == 0.75
    _check_drop(ExportReport(Path("out")), fp32, int8, dev, max_drop=25.0, allow_drop=False)  # within the bound
    _check_drop(ExportReport(Path("out")), fp32, int8, dev, max_drop=1.0, allow_drop=True)  # told to keep it
    unlabelled = DevSet(["a", "b", "c", "d"])
    with pytest.raises(KdplugError, match="agreement with the fp32 student"):
        _check_drop(ExportReport(Path("out")), fp32, int8, unlabelled, max_drop=1.0, allow_drop=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_trimmed_vocabulary_keeps_every_dev_prediction_and_shrinks_the_table(capsys, tmp_path, runs, family):
    from safetensors import safe_open

    output = tmp_path / "trimmed"
    assert main(["export", str(runs[family]), "--format", "hf", "--trim-vocab", "--output", str(output)]) == 0
    out = capsys.readouterr().out
    before, after = (
        json.loads((d / "config.json").read_text())["vocab_size"] for d in (runs[family] / "student", output)
    )
    assert after < before and f"vocabulary {before} -> {after} tokens" in out
    full, small = kdplug.load_student(runs[family]), kdplug.load_student(output)
    assert len(small.tokenizer) == after and small.model.get_input_embeddings().num_embeddings == after
    texts = dev_texts()
    for a, b in zip(full.predict(texts), small.predict(texts)):
        assert a.label == b.label and a.probabilities == pytest.approx(b.probabilities, abs=1e-6)
    # each kept row is the old row of the same token
    old_vocab, new_vocab = full.tokenizer.get_vocab(), small.tokenizer.get_vocab()
    name = "embeddings.weight" if family != "bert-2" else "bert.embeddings.word_embeddings.weight"
    with (
        safe_open(str(runs[family] / "student" / "model.safetensors"), "pt") as a,
        safe_open(str(output / "model.safetensors"), "pt") as b,
    ):
        old_rows, new_rows = a.get_tensor(name), b.get_tensor(name)
    for token in ("the", "movie", "[CLS]", "[UNK]"):
        assert (new_rows[new_vocab[token]] == old_rows[old_vocab[token]]).all(), token
    # a word the task never used becomes the unknown token, as any unseen word would
    assert small.tokenizer("zebra")["input_ids"][1] == small.tokenizer.unk_token_id


HELD_OUT = ["you saw that book", "the service was quite fine but the food was not", "a different film"]


def test_a_trimmed_vocabulary_reports_and_warns_what_held_out_text_loses_and_keeps_a_named_corpus(
    capsys, tmp_path, runs
):
    """The vocabulary is built from the training split (and transfer set, and --vocab-corpus), never
    from the texts it is checked on: the share of their tokens read as unknown is printed, recorded,
    and warned about above 1%; a corpus of what the student will serve keeps its words."""
    sample, corpus = tmp_path / "held-out.txt", tmp_path / "corpus.txt"
    sample.write_text("\n".join(HELD_OUT) + "\n")
    corpus.write_text("did you read that book or saw it\nthe service and the food were quite fine but different\n")
    base = ["export", str(runs["bilstm"]), "--format", "hf", "--trim-vocab", "--sample", str(sample)]
    assert main([*base, "--max-drop", "100", "--output", str(tmp_path / "narrow")]) == 0
    out, err = capsys.readouterr()
    full = kdplug.load_student(runs["bilstm"]).tokenizer
    narrow = kdplug.load_student(tmp_path / "narrow").tokenizer
    ids = [i for text in HELD_OUT for i in narrow(text)["input_ids"][1:-1]]
    share = ids.count(narrow.unk_token_id) / len(ids)
    assert share > 0.3  # "you", "saw", "that", "book", "service" ... were never in the training split
    recorded = json.loads((tmp_path / "narrow" / "kdplug_student.json").read_text())["vocabulary"]
    assert recorded["unknown_after"] == pytest.approx(share) and recorded["unknown_before"] == 0.0
    assert recorded["measured_on"] == "texts of --sample"
    assert f"on the texts of --sample (not used to build it) {share * 100:.1f}% of the tokens are unknown" in out
    assert "warning: the trimmed vocabulary reads" in err and "--vocab-corpus FILE" in err
    assert main([*base, "--vocab-corpus", str(corpus), "--output", str(tmp_path / "served")]) == 0
    out, err = capsys.readouterr()
    served = kdplug.load_student(tmp_path / "served").tokenizer
    for text in HELD_OUT[1:]:  # every word of these is in the corpus: read as the full vocabulary reads it
        assert served.convert_ids_to_tokens(served(text)["input_ids"]) == full.convert_ids_to_tokens(
            full(text)["input_ids"]
        )
    assert "warning" not in err and "(0.0% with the full vocabulary)" in out
    # a floor above the corpus's counts keeps none of its words; options alone are refused before any work
    assert main([*base, "--vocab-corpus", str(corpus), "--vocab-min-count", "3", "--output", str(tmp_path / "f")]) == 0
    assert "warning: the trimmed vocabulary reads" in capsys.readouterr().err
    for argv, message in (
        (["export", str(runs["bilstm"]), "--format", "hf", "--vocab-corpus", str(corpus)], "go with --trim-vocab"),
        ([*base, "--vocab-corpus", str(tmp_path / "none.txt")], "--vocab-corpus"),
        ([*base, "--vocab-min-count", "0"], "1 or more"),
    ):
        assert main([*argv, "--output", str(tmp_path / "refused")]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "refused").exists()


def test_trim_refuses_a_byte_level_bpe_vocabulary(tmp_path):
    from transformers import AutoTokenizer

    from kdplug.testing.tiny import make_tiny_roberta
    from kdplug.vocab import trim_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(make_tiny_roberta(tmp_path / "roberta"))
    with pytest.raises(kdplug.UsageError, match="BPE model; kdplug trims WordPiece and Unigram"):
        trim_tokenizer(tokenizer, [0, 1, 2])


def test_predict_with_the_onnx_runtime_gives_the_labels_of_pytorch(capsys, tmp_path, runs):
    exported = tmp_path / "onnx"
    assert main(["export", str(runs["bilstm"]), "--format", "onnx", "--output", str(exported)]) == 0
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(dev_texts() + ["we hated the plot and the acting , it was really boring"]) + "\n")
    capsys.readouterr()
    outputs = {}
    for runtime, where in (("torch", runs["bilstm"]), ("onnx", exported)):
        assert main(["predict", str(where), "--input", str(texts), "--runtime", runtime]) == 0
        outputs[runtime] = [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()[1:]]
    assert outputs["onnx"] == outputs["torch"] and len(outputs["onnx"]) == 5
    student = kdplug.load_student(exported)  # auto: an ONNX export runs in ONNX Runtime
    assert student.runtime == "onnx" and student.model is None
    with pytest.raises(kdplug.UsageError, match="is an ONNX export"):
        kdplug.load_student(exported, runtime="torch")
    assert main(["predict", str(runs["bilstm"]), "--input", str(texts), "--runtime", "onnx"]) == 2
    assert "kdplug export" in capsys.readouterr().err
    with pytest.raises(kdplug.UsageError, match="a pair"):  # the same checks on bad input in both runtimes
        student.predict([("a", "pair")])


def test_a_run_can_train_its_student_on_a_trimmed_vocabulary(tmp_path, tiny_bert_dir, data):
    output = tmp_path / "run"
    assert (
        main(
            [
                "run",
                *tiny_run_args(
                    teacher=tiny_bert_dir, task="sst2", data_dir=str(data), trim_vocab=True, output=str(output)
                ),
            ]
        )
        == 0
    )
    metrics = json.loads((output / "metrics.json").read_text())
    vocabulary = metrics["student"]["init"]["vocabulary"]
    assert vocabulary["after"] < vocabulary["before"]
    student = kdplug.load_student(output)
    assert len(student.tokenizer) == vocabulary["after"] == student.model.get_input_embeddings().num_embeddings
    # it reads the task's words as before, token for token
    from transformers import AutoTokenizer

    full = AutoTokenizer.from_pretrained(tiny_bert_dir)
    for text in dev_texts():
        assert student.tokenizer.convert_ids_to_tokens(
            student.tokenizer(text)["input_ids"]
        ) == full.convert_ids_to_tokens(full(text)["input_ids"])


def test_a_run_trims_to_its_training_texts_and_a_corpus_and_measures_the_dev_texts_it_held_out(
    tmp_path, tiny_bert_dir, caplog
):
    """trim_vocab during a run: dev is held out of the vocabulary; its unknown share is recorded
    and warned about; trim_vocab_corpus keeps the words of what the student will serve."""
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN * 2, dev=[(text, 1) for text in HELD_OUT] + SST2_DEV)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("you saw that book\nthe service and the food were quite fine but different\n")
    shares = {}
    for name, extra in (("narrow", []), ("served", ["--set", f"trim_vocab_corpus={corpus}"])):
        tiny = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data), trim_vocab=True)
        caplog.clear()
        assert main(["run", *tiny, *extra, "--output", str(tmp_path / name)]) == 0
        vocabulary = json.loads((tmp_path / name / "metrics.json").read_text())["student"]["init"]["vocabulary"]
        tokenizer = kdplug.load_student(tmp_path / name).tokenizer
        ids = [i for text, _ in [(t, 1) for t in HELD_OUT] + SST2_DEV for i in tokenizer(text)["input_ids"][1:-1]]
        assert vocabulary["unknown_after"] == pytest.approx(ids.count(tokenizer.unk_token_id) / len(ids))
        shares[name] = (vocabulary["unknown_after"], "trimmed vocabulary reads" in caplog.text)
    assert shares["narrow"][0] > 0.1 and shares["narrow"][1]  # warned
    assert shares["served"] == (0.0, False)
    missing = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data), trim_vocab=True)
    assert (
        main(["run", *missing, "--set", f"trim_vocab_corpus={tmp_path / 'none.txt'}", "--output", str(tmp_path / "x")])
        == 2
    )
    assert not (tmp_path / "x").exists()


def test_a_vocabulary_corpus_not_in_utf8_is_told_to_be_saved_as_utf8(tmp_path):
    from kdplug.errors import DataError
    from kdplug.vocab import read_corpus

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes("un café crème\n".encode("latin-1"))
    with pytest.raises(DataError) as raised:
        read_corpus(str(corpus), "--vocab-corpus")
    message = str(raised.value)
    assert "Save it as UTF-8" in message and str(corpus) in message and "=latin-1" not in message, message


def test_the_export_help_states_the_unknown_token_warning_as_the_code_applies_it(capsys):
    from kdplug.cli import main
    from kdplug.vocab import UNKNOWN_WARNING

    with pytest.raises(SystemExit):
        main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    points = f"{UNKNOWN_WARNING * 100:.0f} point"
    assert f"more than {points} above the full vocabulary's" in text and "above 1%" not in text

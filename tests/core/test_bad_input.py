"""Every bad input gets a clear message (what, where, how to fix) and the right exit code,
and leaves earlier results intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import write_sst2


def sst2_with(tmp_path, train_text=None, dev_text=None):
    directory = write_sst2(tmp_path / "SST-2")
    if train_text is not None:
        (directory / "train.tsv").write_text(train_text)
    if dev_text is not None:
        (directory / "dev.tsv").write_text(dev_text)
    return directory


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "case, extra, code, messages",
    [
        ("unknown teacher", ["--teacher", "bert-bsae"], 2, ["unknown teacher 'bert-bsae'", "Did you mean 'bert-base'"]),
        ("unknown student", ["--student", "bilstn"], 2, ["unknown student 'bilstn'", "Did you mean 'bilstm'"]),
        ("unknown task", ["--task", "sst-2"], 2, ["unknown task 'sst-2'", "Did you mean 'sst2'"]),
        ("unknown recipe", ["--recipe", "two_stage"], 2, ["unknown recipe 'two_stage'", "'two-stage'"]),
        ("unknown option", ["--set", "projector_options.temprature=2"], 2, ["temprature", "Its options are"]),
        ("unknown key", ["--set", "learning_rate=1e-5"], 2, ["unknown configuration key 'learning_rate'"]),
        (
            "unknown augmenter option",
            ["--augment", "tang", "--set", "augment_options.nope=1"],
            2,
            ["nope", "--set augment_options.NAME=VALUE"],
        ),
        ("wrong type", ["--set", "batch_size=[32]"], 2, ["batch_size must be a whole number, got [32]"]),
        ("bad precision", ["--precision", "fp8"], 2, ["invalid choice"]),
        (
            "missing teacher directory",
            ["--teacher", "./no/such/checkpoint"],
            2,
            ["./no/such/checkpoint", "does not exist"],
        ),
    ],
)
def test_usage_errors(capsys, tmp_path, tiny_bert_dir, case, extra, code, messages):
    argv = [
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_with(tmp_path))),
        *extra,
        "--output",
        str(tmp_path / "run"),
    ]
    try:
        got, err = run(capsys, *argv)
    except SystemExit as exit_:  # argparse's own errors
        got, err = exit_.code, capsys.readouterr().err
    assert got == code, err
    for message in messages:
        assert message in err, (case, err)
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize(
    "case, train, dev, messages",
    [
        (
            "malformed line",
            "sentence\tlabel\ngood film\t1\na\tb\tc\n",
            None,
            ["train.tsv", "line 3", "expected 2 fields"],
        ),
        (
            "label outside the label set",
            "sentence\tlabel\ngood film\t1\nbad film\t7\n",
            None,
            ["train.tsv", "line 3", "'7'"],
        ),
        ("missing column", "text\tlabel\ngood film\t1\n", None, ["train.tsv", "sentence"]),
        ("empty split", None, "sentence\tlabel\n", ["dev.tsv", "no examples"]),
    ],
)
def test_data_errors_name_the_file_and_line(capsys, tmp_path, tiny_bert_dir, case, train, dev, messages):
    data = sst2_with(tmp_path, train, dev)
    code, err = run(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data)),
        "--output",
        str(tmp_path / "run"),
    )
    assert code == 2, err
    for message in messages:
        assert message in err, (case, err)


@pytest.mark.parametrize(
    "student, vectors, message",
    [
        ("bilstm", None, "glove.txt: no such file"),
        ("gated-cnn", None, "glove.txt: no such file"),
        ("bilstm", "directory", "glove.txt: is a directory"),
        ("bilstm", "movie 1 2 3\n", "student_options.embedding_dim=16, but the vectors of"),  # tiny_run_args sets 16
    ],
)
def test_a_word_vector_file_that_cannot_serve_stops_the_run_before_the_teacher_is_fine_tuned(
    capsys, tmp_path, tiny_bert_dir, student, vectors, message
):
    file = tmp_path / "glove.txt"
    if vectors == "directory":
        file.mkdir()
    elif vectors is not None:
        file.write_text(vectors, encoding="utf-8")
    argv = ["run", *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_with(tmp_path)))]
    argv += ["--student", student, "--set", f"student_options.embeddings={file}", "--output", str(tmp_path / "run")]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err, captured.err
    assert "fine-tuning" not in captured.out  # found before the expensive part, not when the student is built


def test_output_directory_with_another_run_is_left_intact(capsys, tmp_path, tiny_bert_dir):
    output = tmp_path / "run"
    output.mkdir()
    (output / "metrics.json").write_text('{"earlier": "results"}')
    code, err = run(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_with(tmp_path))),
        "--output",
        str(output),
    )
    assert code == 2 and "already holds a run" in err and "--overwrite" in err
    assert (output / "metrics.json").read_text() == '{"earlier": "results"}'


# -- real write failures: the process's file-size limit (RLIMIT_FSIZE) set at a chosen point -----


def kdplug_process(*argv, fault=None):
    env = {**os.environ}
    if fault:
        env["KDPLUG_FAULT_AT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "kdplug.cli", *argv], env=env, capture_output=True, text=True, timeout=300
    )


def no_staging_left(root):
    return not list(Path(root).rglob(".staging-*"))


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, tiny_bert_dir):
    output, data = tmp_path / "run", sst2_with(tmp_path)
    argv = [
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data)),
        "--epochs",
        "3",
        "--output",
        str(output),
    ]
    # checkpoint writes: 1 the teacher's, 2 distill epoch 1, 3 distill epoch 2 (fails: 1,000-byte file limit)
    failed = kdplug_process(*argv, fault="checkpoint-write:3:fsize=1000")
    assert failed.returncode == 1, failed.stderr
    assert "could not write the checkpoint of stage 'distill'" in failed.stderr
    assert "size limit" in failed.stderr and "is intact" in failed.stderr and "--resume" in failed.stderr
    state = json.loads((output / "checkpoints" / "distill" / "state.json").read_text())
    assert state["epoch"] == 2  # epoch 1's checkpoint survives
    assert no_staging_left(output)
    assert json.loads((output / "metrics.json").read_text())["status"] == "failed"

    resumed = kdplug_process("run", "--resume", str(output))  # nothing lost: the run finishes from there
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((output / "metrics.json").read_text())["status"] == "completed"


def test_a_failed_teacher_cache_write_leaves_no_partial_cache(tmp_path, tiny_bert_dir):
    output, data = tmp_path / "run", sst2_with(tmp_path)
    argv = [
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data)),
        "--projector",
        "alp",  # a layer method: its layer vectors fill the cache (rkd's logits alone are a few bytes)
        "--output",
        str(output),
    ]
    failed = kdplug_process(*argv, fault="cache-write:1:fsize=2000")  # dev's layers (1 KiB) fit, train's (4 KiB) not
    assert failed.returncode == 1, failed.stderr
    assert "could not write the teacher cache" in failed.stderr and "size limit" in failed.stderr
    cache = Path(os.environ["KDPLUG_CACHE"])
    assert no_staging_left(cache)
    caches = [p for p in (cache / "teacher-cache").iterdir() if p.is_dir()]
    metas = [json.loads((p / "meta.json").read_text()) for p in caches]  # complete entries only
    assert sorted((m["kind"], m["description"]["split"]) for m in metas) == [("layers", "dev"), ("logits", "dev")]
    again = kdplug_process(*argv, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert "reusing the fine-tuned teacher" in again.stdout


def test_a_failed_teacher_store_stores_nothing(tmp_path, tiny_bert_dir):
    output, data = tmp_path / "run", sst2_with(tmp_path)
    failed = kdplug_process(
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data)),
        "--output",
        str(output),
        fault="teacher-store:1:fsize=10000",
    )
    assert failed.returncode == 1, failed.stderr
    assert "could not write the fine-tuned teacher" in failed.stderr and "nothing was stored" in failed.stderr
    teachers = Path(os.environ["KDPLUG_CACHE"]) / "teachers"
    assert no_staging_left(teachers) and not [p for p in teachers.iterdir() if p.is_dir()]


def test_a_failed_student_save_keeps_the_trained_student_for_resume(tmp_path, tiny_bert_dir):
    output, data = tmp_path / "run", sst2_with(tmp_path)
    failed = kdplug_process(
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data)),
        "--output",
        str(output),
        fault="run-results:1:fsize=1000",
    )
    assert failed.returncode == 1, failed.stderr
    assert "could not write the student package" in failed.stderr and "--resume" in failed.stderr
    assert (output / "checkpoints" / "distill" / "state.json").is_file()
    resumed = kdplug_process("run", "--resume", str(output))
    assert resumed.returncode == 0, resumed.stderr
    assert (output / "student" / "model.safetensors").is_file() and not (output / "checkpoints").exists()


def test_student_whose_vocabulary_does_not_match_the_tokenizer(capsys, tmp_path, tiny_bert_dir):
    """A third-party student with a smaller embedding table than the teacher's tokenizer."""
    import kdplug
    from kdplug.config import build_config
    from kdplug.engine.pipeline import run
    from kdplug.errors import UsageError
    from kdplug.plugins import PluginManager

    class SmallVocabulary:
        @kdplug.hookimpl
        def kdplug_register_students(self, register):
            def factory(task, teacher):
                student = kdplug.create_student("bilstm", task, teacher, embedding_dim=8, hidden_size=8)
                student.embeddings = torch.nn.Embedding(5, 8)  # too few rows for the teacher's vocabulary
                return student

            register("small-vocab", factory)

    manager = PluginManager()
    manager.register(SmallVocabulary(), "small-vocab-test")
    config = build_config(
        flags={
            "teacher": tiny_bert_dir,
            "task": "sst2",
            "data_dir": str(sst2_with(tmp_path)),
            "student": "small-vocab",
            "projector": "rkd",
            "epochs": 1,
            "teacher_epochs": 1,
            "allow_weak_teacher": True,
            "output": str(tmp_path / "run"),
        }
    )
    with pytest.raises(UsageError) as error:
        run(config, manager.registry, echo=lambda text: None)
    assert "embedding table has 5 rows" in str(error.value) and "tokenizer" in str(error.value)


# -- every configuration value checked before any work -------------------------------------------


@pytest.mark.parametrize(
    "setting, message",
    [
        ("lr=-1", "lr must be a positive finite number, e.g. 5e-5, got -1.0"),
        ("lr=.nan", "lr must be a number, or null, got nan (float)"),
        ("seed=-1", "seed must be 0 or more and below 2**32 (4294967296), got -1"),
        ("num_workers=-2", "num_workers must be 0 or more, got -2"),
        ("max_length=0", "max_length must be a positive number of tokens"),
        ("warmup_ratio=1.5", "warmup_ratio must be between 0 and 1, got 1.5"),
        ("weight_decay=-0.1", "weight_decay must be 0 or a positive finite number, got -0.1"),
        ("batch_size=0", "batch_size must be at least 1, got 0"),
        ("teacher_lr=0", "teacher_lr must be a positive finite number"),
        ("eta=-0.2", "eta must be 0 or a positive finite number"),
        ("temperature=0", "temperature must be a positive finite number"),
    ],
)
def test_bad_values_are_usage_errors_naming_key_value_and_range(capsys, tmp_path, tiny_bert_dir, setting, message):
    output = tmp_path / "run"
    code, err = run(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_with(tmp_path))),
        "--set",
        setting,
        "--output",
        str(output),
    )
    assert code == 2 and message in err, err
    assert not output.exists()  # checked before anything was created


@pytest.mark.parametrize(
    "setting, message",
    [
        ("max_length=1", "max_length=1 leaves no room for text: the tokenizer adds 2 special tokens"),
        ("max_length=100000", "max_length=100000 exceeds the teacher's 64 positions"),
        ("student_options.hiden_size=8", "hiden_size"),
    ],
)
def test_values_that_need_the_models_fail_before_the_teacher_is_fine_tuned(
    capsys, tmp_path, tiny_bert_dir, setting, message
):
    code, err = run(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_with(tmp_path))),
        "--set",
        setting,
        "--output",
        str(tmp_path / "run"),
    )
    assert code == 2 and message in err, err
    teachers = Path(os.environ["KDPLUG_CACHE"]) / "teachers"
    assert not teachers.exists() or not any(teachers.iterdir())  # nothing was fine-tuned or stored
    log = tmp_path / "run" / "log.txt"
    assert not log.exists() or "teacher epoch" not in log.read_text()


def test_a_bert_student_option_is_checked_against_the_teachers_config_first(capsys, tmp_path, tiny_bert_dir):
    code, err = run(
        capsys,
        "run",
        "--teacher",
        tiny_bert_dir,
        "--task",
        "sst2",
        "--data-dir",
        str(sst2_with(tmp_path)),
        "--student",
        "bert-2",
        "--set",
        "student_options.hidden_dropout_prb=0.2",
        "--set",
        "allow_weak_teacher=true",
        "--output",
        str(tmp_path / "run"),
    )
    assert code == 2 and "hidden_dropout_prb" in err and "BertConfig" in err
    log = tmp_path / "run" / "log.txt"
    assert not log.exists() or "teacher epoch" not in log.read_text()


def test_a_yaml_key_given_twice_is_an_error(capsys, tmp_path):
    config = tmp_path / "setup.yaml"
    config.write_text("task: sst2\nlr: 1e-5\nepochs: 2\nlr: 5e-5\n")
    code, err = run(capsys, "run", "--config", str(config), "--output", str(tmp_path / "run"))
    assert code == 2 and "setup.yaml" in err and "line 4" in err and "'lr' appears twice" in err


# -- text files in other encodings ---------------------------------------------------------------


def local_files(tmp_path, encoding, *, bom=b""):
    data = tmp_path / "reviews"
    data.mkdir()
    rows = "text,label\n" + "".join(
        f"{w} film à voir,{i % 2}\n" for i, w in enumerate(["great", "dull", "superb", "awful", "charming", "boring"])
    )
    for split in ("train", "dev"):
        (data / f"{split}.csv").write_bytes(bom + rows.encode(encoding))
    return data


def local_run(capsys, tmp_path, tiny_bert_dir, data, *extra):
    return run(
        capsys,
        "run",
        *tiny_run_args(teacher=tiny_bert_dir, task="local", data_dir=str(data)),
        *extra,
        "--output",
        str(tmp_path / "run"),
        "--overwrite",
    )


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_a_file_that_is_not_utf8_names_its_bytes_and_the_option(capsys, tmp_path, tiny_bert_dir, encoding):
    data = local_files(tmp_path, encoding)
    code, err = local_run(capsys, tmp_path, tiny_bert_dir, data)
    assert code == 2, err
    assert "train.csv, line 2" in err and "not valid UTF-8" in err and "\\xe0" in err
    assert "task_options.encoding=latin-1" in err
    code, err = local_run(capsys, tmp_path, tiny_bert_dir, data, "--set", f"task_options.encoding={encoding}")
    assert code == 0, err


def test_a_utf16_file_with_a_byte_order_mark_reads_without_options(capsys, tmp_path, tiny_bert_dir):
    import codecs

    data = local_files(tmp_path, "utf-16-le", bom=codecs.BOM_UTF16_LE)
    code, err = local_run(capsys, tmp_path, tiny_bert_dir, data)
    assert code == 0, err


def test_a_missing_column_names_the_option_that_names_it(capsys, tmp_path, tiny_bert_dir):
    data = tmp_path / "reviews"
    data.mkdir()
    for split in ("train", "dev"):
        (data / f"{split}.csv").write_text("review,label\ngood,1\nbad,0\n")
    code, err = local_run(capsys, tmp_path, tiny_bert_dir, data)
    assert code == 2 and "no column 'text'" in err and "'review', 'label'" in err
    assert "--set task_options.text_column=NAME" in err

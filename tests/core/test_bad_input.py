"""Every bad input gets a clear message (what, where, how to fix) and the right exit code,
and leaves earlier results intact."""

from __future__ import annotations

import errno

import pytest
import torch

from kdplug.cli import main
from kdplug.engine import checkpoint

from ..conftest import write_sst2

TINY = ["--student", "bilstm", "--projector", "rkd", "--epochs", "1", "--set", "teacher_epochs=1",
        "--set", "student_options.embedding_dim=16", "--set", "student_options.hidden_size=16"]


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


@pytest.mark.parametrize("case, extra, code, messages", [
    ("unknown teacher", ["--teacher", "bert-bsae"], 2, ["unknown teacher 'bert-bsae'", "Did you mean 'bert-base'"]),
    ("unknown student", ["--student", "bilstn"], 2, ["unknown student 'bilstn'", "Did you mean 'bilstm'"]),
    ("unknown task", ["--task", "sst-2"], 2, ["unknown task 'sst-2'", "Did you mean 'sst2'"]),
    ("unknown recipe", ["--recipe", "two_stage"], 2, ["unknown recipe 'two_stage'", "'two-stage'"]),
    ("unknown option", ["--set", "projector_options.temprature=2"], 2, ["temprature", "Its options are"]),
    ("unknown key", ["--set", "learning_rate=1e-5"], 2, ["unknown configuration key 'learning_rate'"]),
    ("wrong type", ["--set", "batch_size=[32]"], 2, ["batch_size must be int"]),
    ("bad precision", ["--precision", "fp8"], 2, ["invalid choice"]),
    ("missing teacher directory", ["--teacher", "./no/such/checkpoint"], 2, ["./no/such/checkpoint", "does not exist"]),
])
def test_usage_errors(capsys, tmp_path, tiny_bert_dir, case, extra, code, messages):
    argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(sst2_with(tmp_path)), *TINY,
            *extra, "--output", str(tmp_path / "run")]
    try:
        got, err = run(capsys, *argv)
    except SystemExit as exit_:  # argparse's own errors
        got, err = exit_.code, capsys.readouterr().err
    assert got == code, err
    for message in messages:
        assert message in err, (case, err)
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.parametrize("case, train, dev, messages", [
    ("malformed line", "sentence\tlabel\ngood film\t1\na\tb\tc\n", None, ["train.tsv", "line 3", "expected 2 fields"]),
    ("label outside the label set", "sentence\tlabel\ngood film\t1\nbad film\t7\n", None, ["train.tsv", "line 3", "'7'"]),
    ("missing column", "text\tlabel\ngood film\t1\n", None, ["train.tsv", "sentence"]),
    ("empty split", None, "sentence\tlabel\n", ["dev.tsv", "no examples"]),
])
def test_data_errors_name_the_file_and_line(capsys, tmp_path, tiny_bert_dir, case, train, dev, messages):
    data = sst2_with(tmp_path, train, dev)
    code, err = run(capsys, "run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(data), *TINY,
                    "--output", str(tmp_path / "run"))
    assert code == 2, err
    for message in messages:
        assert message in err, (case, err)


def test_output_directory_with_another_run_is_left_intact(capsys, tmp_path, tiny_bert_dir):
    output = tmp_path / "run"
    output.mkdir()
    (output / "metrics.json").write_text('{"earlier": "results"}')
    code, err = run(capsys, "run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(sst2_with(tmp_path)),
                    *TINY, "--output", str(output))
    assert code == 2 and "already holds a run" in err and "--overwrite" in err
    assert (output / "metrics.json").read_text() == '{"earlier": "results"}'


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(capsys, tmp_path, tiny_bert_dir, monkeypatch):
    real_save = checkpoint.save_file
    calls = []

    def save_file(tensors, path, *args, **kwargs):
        if ".distill." in str(path):
            calls.append(path)
            if len(calls) > 3:  # the first distill checkpoint (model, best, rng) fits, the next one does not
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", save_file)
    output = tmp_path / "run"
    code, err = run(capsys, "run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(sst2_with(tmp_path)),
                    *TINY, "--epochs", "3", "--output", str(output))
    assert code == 1
    assert "the disk is full" in err and "is intact" in err and "--resume" in err
    assert (output / "checkpoints" / "distill" / "state.json").is_file()  # epoch 1's checkpoint survives
    assert not [p for p in (output / "checkpoints").iterdir() if p.name.startswith(".")]  # no half-written one


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
    config = build_config(flags={"teacher": tiny_bert_dir, "task": "sst2", "data_dir": str(sst2_with(tmp_path)),
                                 "student": "small-vocab", "projector": "rkd", "epochs": 1, "teacher_epochs": 1,
                                 "output": str(tmp_path / "run")})
    with pytest.raises(UsageError) as error:
        run(config, manager.registry, echo=lambda text: None)
    assert "embedding table has 5 rows" in str(error.value) and "tokenizer" in str(error.value)

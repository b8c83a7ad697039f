"""The Python API checks every argument of ``load_student`` and ``predict`` (``kdplug.predict`` and
``LoadedStudent.predict`` / ``iter_predict``) before any work: a wrong value is an error that names
the argument, what was passed and what to pass, never an empty result, a prediction per character
or key, or a raw ``range()`` / ``TypeError`` / torch error. Against one real tiny run."""

from __future__ import annotations

import datasets
import numpy as np
import pandas
import pytest

import kdplug
from kdplug.cli import main
from kdplug.testing import tiny_run_args

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

TEXTS = ["the movie was good", "the plot was dull", "a fine film"]
NO_RUN = "/no/such/run"  # where an argument error must come first: nothing is loaded


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_dir):
    data = write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 2, dev=SST2_DEV)
    output = tmp_path_factory.mktemp("runs") / "bilstm"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KDPLUG_CACHE", str(tmp_path_factory.mktemp("cache")))
        narrow = {"hidden_size": 16}
        tiny = tiny_run_args(teacher=tiny_bert_dir, task="sst2", data_dir=str(data), student_options=narrow)
        assert main(["run", *tiny, "--output", str(output)]) == 0
    return output


@pytest.fixture(scope="module")
def student(run):
    return kdplug.load_student(run, device="cpu")


BAD_BATCH_SIZES = [
    (-1, kdplug.UsageError, r"batch_size= must be at least 1 \(the number of texts per forward pass\), got -1"),
    (0, kdplug.UsageError, r"batch_size= must be at least 1 .*got 0"),
    (1.5, kdplug.ArgumentError, r"batch_size= takes a whole number of at least 1, such as 32; got float 1\.5$"),
    ("8", kdplug.ArgumentError, r"got str '8': pass batch_size=8$"),
    (8.0, kdplug.ArgumentError, r"got float 8\.0: pass batch_size=8$"),
    (True, kdplug.ArgumentError, r"got bool True"),
    (None, kdplug.ArgumentError, r"got NoneType None"),
]


@pytest.mark.parametrize("batch_size, error, message", BAD_BATCH_SIZES, ids=repr)
def test_a_bad_batch_size_is_refused_by_every_predict_before_any_work(student, batch_size, error, message):
    with pytest.raises(error, match=message):
        kdplug.predict(NO_RUN, TEXTS, batch_size=batch_size)  # before the student loads
    with pytest.raises(error, match=message):
        student.predict(TEXTS, batch_size=batch_size)  # -1 gave [], 0 a range() error
    with pytest.raises(error, match=message):
        student.iter_predict(TEXTS, batch_size=batch_size)  # on the call, not on the first next()


def test_every_whole_batch_size_gives_the_same_predictions(student):  # a guard: the checks refuse no good value
    expected = [p.label for p in student.predict(TEXTS)]
    for batch_size in (1, 2, np.int64(2), 1000):
        assert [p.label for p in kdplug.predict(student, TEXTS, batch_size=batch_size)] == expected
    assert [p.label for p in kdplug.predict(student, pandas.Series(TEXTS))] == expected  # a column is texts
    assert [p.label for p in student.iter_predict(iter(TEXTS), batch_size=2)] == expected


BAD_TEXTS = [
    ({"first": TEXTS[0], "second": TEXTS[1]}, r"got a dict: pass list\(texts\.values\(\)\) or the texts$"),
    (set(TEXTS), r"got a set, which has no order: pass sorted\(texts\)$"),
    (pandas.DataFrame({"sentence": TEXTS}), r"got a table \(DataFrame\): pass one column, texts\['sentence'\], or a"),
    (datasets.Dataset.from_dict({"review": TEXTS}), r"got a table \(Dataset\): pass one column, texts\['review'\]"),
    (tuple(TEXTS), r"got tuple .*: a tuple is one \(text, pair\) input; pass several texts as a list"),
    (42, "got int 42$"),
    (b"the movie was good", "got bytes b'the movie was good'$"),
    ([TEXTS[0], b"raw"], r"got bytes b'raw' \(item 1 of 2\): decode bytes first"),
    ([["a text", "its pair"]], r"got list \['a text', 'its pair'\]: a pair is a tuple, \(text, pair\)"),
]


@pytest.mark.parametrize("texts, message", BAD_TEXTS, ids=lambda value: type(value).__name__)
def test_texts_that_are_not_texts_are_refused_not_iterated(student, texts, message):
    pattern = r"predict takes texts: a string, or a list of strings, or of \(text, pair\) tuples; " + message
    with pytest.raises(kdplug.ArgumentError, match=pattern) as raised:
        kdplug.predict(NO_RUN, texts)  # a dict gave one prediction per key, a set in no order
    assert isinstance(raised.value, TypeError)
    with pytest.raises(kdplug.ArgumentError, match=pattern):
        student.predict(texts)


def test_a_string_is_one_text_and_a_tuple_one_pair(student):
    (one,) = kdplug.predict(student, TEXTS[0])  # one prediction, not one per character
    assert one == student.predict([TEXTS[0]])[0]
    with pytest.raises(kdplug.UsageError, match=r"reads single texts .*got a pair \(several texts go in a list"):
        kdplug.predict(student, (TEXTS[0], TEXTS[1]))
    with pytest.raises(kdplug.UsageError, match="nothing to predict: texts holds no texts; pass a string"):
        kdplug.predict(NO_RUN, [])  # before the path is looked at


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"device": "gpu"}, kdplug.UsageError, r"device 'gpu' is not a device torch knows: pass cpu, cuda, cuda:1"),
        ({"device": "cuda:99"}, kdplug.UsageError, r"device 'cuda:99': this machine has (no|\d+) CUDA device"),
        ({"device": 2.5}, kdplug.ArgumentError, r"device= takes 'cpu', 'cuda', 'cuda:1' \.\.\. or a torch\.device"),
        ({"verify": "no"}, kdplug.ArgumentError, r"verify= takes True or False, got str 'no'"),
    ],
)
def test_load_options_are_checked_before_the_student_loads(run, options, error, message):
    with pytest.raises(error, match=message):
        kdplug.load_student(run, **options)
    with pytest.raises(error, match=message):
        kdplug.predict(run, TEXTS, **options)


def test_an_empty_path_is_not_the_current_directory():
    with pytest.raises(kdplug.UsageError, match="predict got an empty path: pass a run directory"):
        kdplug.predict("", TEXTS)
    with pytest.raises(kdplug.UsageError, match="load_student got an empty path"):
        kdplug.load_student(" ")


def test_options_that_only_apply_when_loading_are_refused_for_a_loaded_student(student):
    with pytest.raises(kdplug.UsageError, match=r"device= and runtime= choose how predict loads a student.*torch on"):
        kdplug.predict(student, TEXTS, device="cpu")  # it was ignored
    with pytest.raises(kdplug.ArgumentError, match="progress= takes True or False, got str 'yes'"):
        student.predict(TEXTS, progress="yes")


def test_the_predict_command_names_a_bad_device(capsys, run, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    code = main(["predict", str(run), "--input", str(texts), "--device", "gpu"])  # was a RuntimeError traceback
    assert code == 2
    assert "device 'gpu' is not a device torch knows: pass cpu, cuda, cuda:1" in capsys.readouterr().err


# -- the rest of the Python API: kdplug.distill's flags and the component helpers ---------------------


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"overwrite": "no"}, "overwrite= takes True or False, got str 'no'"),
        ({"teacher_finetuned": "no"}, "teacher_finetuned= takes True or False, got str 'no'"),
        ({"echo": 42}, r"echo= takes a function of one str \(print, a logger's info\) or None, got int 42"),
    ],
)
def test_distill_flags_are_booleans_and_echo_a_function_before_anything_runs(arguments, message, monkeypatch):
    import kdplug.engine.pipeline

    def must_not_run(*args, **kwargs):
        raise AssertionError("the engine ran")

    monkeypatch.setattr(kdplug.engine.pipeline, "run", must_not_run)
    with pytest.raises(kdplug.ArgumentError, match=message):
        kdplug.distill(teacher="minilm", student="bilstm", projector="rkd", task="demo", **arguments)


def test_overwrite_no_leaves_an_existing_run_as_it_was(run, tmp_path, tiny_bert_dir):
    data = write_sst2(tmp_path / "SST-2")
    before = (run / "metrics.json").read_bytes()
    with pytest.raises(kdplug.ArgumentError, match="overwrite= takes True or False"):  # "no" read as true: replaced
        kdplug.distill(
            teacher=tiny_bert_dir,
            student="bilstm",
            projector="rkd",
            task="sst2",
            data_dir=str(data),
            output=str(run),
            overwrite="no",
            echo=None,
            epochs=1,
            teacher_epochs=1,
            allow_weak_teacher=True,
        )
    assert (run / "metrics.json").read_bytes() == before


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: kdplug.list_components("projectr"), kdplug.UsageError, "unknown component kind 'projectr'. Did you"),
        (lambda: kdplug.list_projectors(42), kdplug.ArgumentError, r"pattern= takes a glob \(str\) such as 'pkd-\*'"),
        (lambda: kdplug.create_loss(42), kdplug.ArgumentError, r"create_loss takes a loss's registered name \(str;"),
        (lambda: kdplug.create_task(["sst2"]), kdplug.ArgumentError, "create_task takes a task's registered name"),
        (lambda: kdplug.create_task("sst2", data_dir=42), kdplug.ArgumentError, "data_dir= takes a directory"),
    ],
    ids=["kind", "pattern", "name", "unhashable name", "data_dir"],
)
def test_the_component_helpers_name_a_bad_argument(call, error, message):
    with pytest.raises(error, match=message):  # were a KeyError, "object of type 'int' has no len()" ...
        call()

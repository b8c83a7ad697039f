"""Your own teacher and data: hub ids, a checkpoint's labels matched by name, the teacher check,
early stopping, ``--dry-run``, and a model card that keeps your file system to itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import kdplug
from kdplug.cli import main
from kdplug.config import parse_value
from kdplug.engine import health
from kdplug.engine.trainer import stop_early
from kdplug.testing import tiny_run_args
from kdplug.testing.tiny import TinyTask, cache_as_hub_model, make_tiny_bert, make_tiny_classifier

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

#: enough dev examples for the teacher to be judged (kdplug refuses fewer than 10 unless allow_weak_teacher)
JUDGED_DEV = SST2_DEV * 3

#: a tiny run from a teacher used as given (never fine-tuned): two student epochs, small batches
AS_GIVEN = dict(epochs=2, teacher_epochs=None, batch_size=4)


@pytest.fixture
def sst2_dir(tmp_path):
    return write_sst2(tmp_path / "SST-2", dev=JUDGED_DEV)


def run_cli(capsys, *argv):
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def logits(teacher, texts=("the movie was very good", "a bad film", "i hated the plot")):
    inputs = teacher.tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.no_grad():
        return teacher.model.eval()(**inputs).logits


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory):
    """The same tiny classifier saved by plain transformers with its labels in the task's order and
    in the opposite order, as a user's checkpoints fine-tuned elsewhere would be."""
    root = tmp_path_factory.mktemp("classifiers")
    return {
        "ordered": make_tiny_classifier(root / "ordered"),
        "reversed": make_tiny_classifier(root / "reversed", order=[1, 0]),
    }


# -- labels matched by name ------------------------------------------------------------------------


def test_a_checkpoint_with_its_labels_in_another_order_is_reordered(classifiers):
    task = TinyTask()  # labels (negative, positive)
    ordered = kdplug.create_teacher("hf", task, source=classifiers["ordered"])
    reversed_ = kdplug.create_teacher("hf", task, source=classifiers["reversed"])
    assert reversed_.model.config.id2label == {0: "negative", 1: "positive"}
    torch.testing.assert_close(logits(reversed_), logits(ordered))  # logit i means task label i in both
    assert reversed_.extra["labels"]["reordered"] and not ordered.extra["labels"]["reordered"]
    assert reversed_.extra["labels"]["checkpoint_labels"] == ["positive", "negative"]
    # a head that fits the task is a fine-tuned teacher: used as it is, not fine-tuned again
    assert ordered.finetuned and reversed_.finetuned
    assert ordered.pretrained is None  # a fine-tuned checkpoint is not a pre-trained one
    assert any("reordered" in note for note in reversed_.notes)


def test_names_are_matched_ignoring_case_and_spacing(tmp_path):
    task = TinyTask(labels=("not_entailment", "entailment"))
    path = make_tiny_classifier(
        tmp_path / "nli",
        labels=("not_entailment", "entailment"),
        order=[1, 0],
        label_names=["ENTAILMENT", "Not Entailment"],
    )
    reference = make_tiny_classifier(tmp_path / "reference", labels=("not_entailment", "entailment"))
    torch.testing.assert_close(
        logits(kdplug.create_teacher("hf", task, source=path)),
        logits(kdplug.create_teacher("hf", task, source=reference)),
    )


def test_names_that_do_not_match_are_a_usage_error_with_both_sides_and_the_fix(tmp_path):
    path = make_tiny_classifier(tmp_path / "other", label_names=["bad", "good"])
    with pytest.raises(kdplug.UsageError) as error:
        kdplug.create_teacher("hf", TinyTask(), source=path)
    message = str(error.value)
    assert "['bad', 'good']" in message and "['negative', 'positive']" in message
    assert "teacher_options.label_map" in message and "finetuned=false" in message
    # said explicitly, by name or by output index, the same model loads in the task's order
    named = kdplug.create_teacher("hf", TinyTask(), source=path, label_map={"good": "positive", "bad": "negative"})
    indexed = kdplug.create_teacher("hf", TinyTask(), source=path, label_map={1: "negative", 0: "positive"})
    torch.testing.assert_close(logits(indexed), logits(named).flip(-1))
    with pytest.raises(kdplug.UsageError, match="leaves the task label"):
        kdplug.create_teacher("hf", TinyTask(), source=path, label_map={"good": "positive"})


def label_map(text: str):
    """``teacher_options.label_map`` as ``--set teacher_options.label_map=TEXT`` delivers it (read as YAML)."""
    return parse_value(text)


@pytest.mark.parametrize(
    "written, message",
    [
        # 0 is the output called bad: both task classes would read one logit
        ("{bad: negative, 0: positive}", "'bad' and 0 both name output 0 ('bad')"),
        ("{0: negative, 2: positive}", "output index 2 is out of range: "),
        ("{bad: negative, good: negative}", "'bad' and 'good' both map to the task label 'negative'"),
        ("{bad: negative, good: nice}", "'nice' is not a label of the task"),
        ("{bad: negative}", "leaves the task label(s) ['positive'] without a checkpoint label"),
        ("{yes: positive, no: negative}", "YAML reads yes/true/on as true, and none of"),
    ],
)
def test_a_label_map_must_pair_the_outputs_and_the_task_labels_one_to_one(tmp_path, written, message):
    path = make_tiny_classifier(tmp_path / "other", label_names=["bad", "good"])
    with pytest.raises(kdplug.UsageError) as error:
        kdplug.create_teacher("hf", TinyTask(), source=path, label_map=label_map(written))
    assert message in str(error.value) and "teacher_options.label_map" in str(error.value)


def test_label_names_yaml_reads_as_booleans_are_the_words_written(tmp_path):
    """``--set 'teacher_options.label_map={yes: positive, no: negative}'`` reaches kdplug as
    ``{True: 'positive', False: 'negative'}``: the checkpoint's outputs called yes and no."""
    yes_no = make_tiny_classifier(tmp_path / "yes-no", label_names=["no", "yes"])
    quoted = kdplug.create_teacher("hf", TinyTask(), source=yes_no, label_map={"yes": "negative", "no": "positive"})
    for written in ("{yes: negative, no: positive}", "{on: negative, off: positive}"):
        teacher = kdplug.create_teacher("hf", TinyTask(), source=yes_no, label_map=label_map(written))
        assert teacher.extra["labels"]["checkpoint_output_of_each_task_label"] == [1, 0]
        torch.testing.assert_close(logits(teacher), logits(quoted))
    # and the task's labels on the other side of the map
    bad_good = make_tiny_classifier(tmp_path / "bad-good", label_names=["bad", "good"])
    teacher = kdplug.create_teacher(
        "hf", TinyTask(labels=("yes", "no")), source=bad_good, label_map=label_map("{bad: no, good: yes}")
    )
    assert teacher.extra["labels"]["checkpoint_output_of_each_task_label"] == [1, 0]
    # a checkpoint with two such words: which was written is lost, so the quoting to use is said
    two = make_tiny_classifier(tmp_path / "two", label_names=["true", "yes"])
    with pytest.raises(kdplug.UsageError) as error:
        kdplug.create_teacher("hf", TinyTask(), source=two, label_map=label_map("{yes: positive, 0: negative}"))
    assert """--set 'teacher_options.label_map={"yes": positive, 0: negative}'""" in str(error.value)
    teacher = kdplug.create_teacher("hf", TinyTask(), source=two, label_map=label_map('{"yes": positive, 0: negative}'))
    assert teacher.extra["labels"]["checkpoint_output_of_each_task_label"] == [0, 1]


def test_a_label_map_naming_one_output_twice_exits_2_and_yes_no_labels_run(capsys, tmp_path):
    data = write_sst2(tmp_path / "SST-2")
    bad_good = make_tiny_classifier(tmp_path / "bad-good", label_names=["bad", "good"])
    yes_no = make_tiny_classifier(tmp_path / "yes-no", label_names=["no", "yes"])
    common = dict(task="sst2", data_dir=data, **AS_GIVEN)
    twice = {"teacher_options": {"label_map": "{bad: negative, 0: positive}"}}
    code, _, err = run_cli(
        capsys, "run", *tiny_run_args(teacher=bad_good, **common, **twice, output=tmp_path / "twice")
    )
    assert code == 2 and "'bad' and 0 both name output 0 ('bad')" in err
    yes_no_map = {"teacher_options": {"label_map": "{yes: positive, no: negative}"}}
    code, _, err = run_cli(
        capsys, "run", *tiny_run_args(teacher=yes_no, **common, **yes_no_map, output=tmp_path / "yes-no-run")
    )
    assert code == 0, err
    labels = json.loads((tmp_path / "yes-no-run" / "metrics.json").read_text())["teacher"]["labels"]
    assert labels["checkpoint_output_of_each_task_label"] == [0, 1] and labels["matched_by"] == "label_map"


def test_positional_names_and_numbered_task_labels_are_matched_by_position(tmp_path):
    anonymous = make_tiny_classifier(tmp_path / "anonymous", label_names=["LABEL_0", "LABEL_1"])
    teacher = kdplug.create_teacher("hf", TinyTask(), source=anonymous)
    assert teacher.extra["labels"]["matched_by"] == "positional" and not teacher.extra["labels"]["reordered"]
    named = make_tiny_classifier(tmp_path / "named", order=[1, 0])  # positive, negative
    teacher = kdplug.create_teacher("hf", TinyTask(labels=("0", "1")), source=named)
    assert teacher.extra["labels"]["matched_by"] == "positional"
    assert "label_map" in " ".join(teacher.notes)  # the user is told how to say otherwise


def test_finetuned_false_fine_tunes_a_fitting_checkpoint_and_its_base_model_is_found(
    classifiers, tmp_path, monkeypatch
):
    again = kdplug.create_teacher("hf", TinyTask(), source=classifiers["ordered"], finetuned=False)
    assert not again.finetuned and again.pretrained is None
    # a model card that names its base model, available in the local hub cache: that is the pre-trained one
    hub_cache = tmp_path / "hub"
    cache_as_hub_model(make_tiny_bert(tmp_path / "base", num_layers=2, hidden=32), "org/tiny-base", hub_cache)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache))
    carded = make_tiny_classifier(tmp_path / "carded")
    (Path(carded) / "README.md").write_text("---\nbase_model: org/tiny-base\nlicense: mit\n---\n# my model\n")
    teacher = kdplug.create_teacher("hf", TinyTask(), source=carded)
    assert teacher.finetuned and teacher.pretrained == "org/tiny-base"
    student = kdplug.create_student("bert-1", TinyTask(), teacher)
    assert student.kdplug_init["init"] == "pretrained" and student.kdplug_init["from"] == "org/tiny-base"


# -- hub ids wherever a model is named ---------------------------------------------------------------


def test_an_uncached_hub_id_fails_in_seconds_offline_with_what_to_do(capsys, tmp_path, sst2_dir):
    start = time.monotonic()
    code, _, err = run_cli(
        capsys,
        "run",
        "--teacher",
        "textattack/bert-base-uncased-SST-2",
        "--task",
        "sst2",
        "--data-dir",
        sst2_dir,
        "--output",
        tmp_path / "run",
    )
    assert code == 2 and time.monotonic() - start < 10
    assert "cannot load teacher 'textattack/bert-base-uncased-SST-2'" in err and "switched off" in err
    assert "hf download textattack/bert-base-uncased-SST-2" in err and "--teacher DIR" in err
    assert "teacher_options.source" in err
    assert not (tmp_path / "run").exists()


def test_a_registered_short_name_offline_stops_before_the_run_directory_is_made(capsys, tmp_path, sst2_dir):
    code, out, err = run_cli(
        capsys, "run", "--teacher", "bert-base", "--task", "sst2", "--data-dir", sst2_dir, "--output", tmp_path / "run"
    )
    assert code == 2
    assert err.startswith("kdplug: error: cannot load teacher 'bert-base' (bert-base-uncased on the Hugging Face hub)")
    assert "switched off" in err and "hf download bert-base-uncased" in err
    assert not (tmp_path / "run").exists()  # was a failed run directory


def test_an_unreachable_hub_fails_in_seconds(capsys, tmp_path, sst2_dir, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    start = time.monotonic()
    code, _, err = run_cli(
        capsys,
        "run",
        "--student",
        "someone/some-student",
        "--task",
        "sst2",
        "--data-dir",
        sst2_dir,
        "--output",
        tmp_path / "run",
    )
    assert code == 2 and time.monotonic() - start < 15
    assert "cannot load student 'someone/some-student'" in err and "cannot be reached" in err
    assert "HF_HUB_OFFLINE=1" in err


def test_a_plain_unknown_name_keeps_its_suggestions_and_says_what_a_hub_id_needs(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--teacher", "bert-base-uncased", "--output", tmp_path / "run")
    assert code == 2
    # the offline explanation opens the message: a plain hub id is the likelier meaning
    assert err.startswith(
        "kdplug: error: cannot load teacher 'bert-base-uncased': the Hugging Face hub is switched off"
    ), err
    assert "unknown teacher 'bert-base-uncased'" in err and "Did you mean 'bert-base'" in err
    assert "If 'bert-base-uncased' is a Hugging Face hub id" in err and "hf download bert-base-uncased" in err


def test_a_cached_hub_id_reaches_the_hf_plugin_for_teacher_and_student(capsys, tmp_path, sst2_dir, monkeypatch):
    hub_cache = tmp_path / "hub"
    cache_as_hub_model(make_tiny_bert(tmp_path / "tiny", num_layers=2, hidden=32), "bert-base-uncased", hub_cache)
    cache_as_hub_model(make_tiny_bert(tmp_path / "small", num_layers=1, hidden=32), "org/small-student", hub_cache)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub_cache))
    code, out, err = run_cli(
        capsys,
        "run",
        "--teacher",
        "bert-base-uncased",
        "--student",
        "org/small-student",
        "--projector",
        "rkd",
        "--task",
        "sst2",
        "--data-dir",
        sst2_dir,
        "--dry-run",
        "--output",
        tmp_path / "run",
    )
    assert code == 0, err
    assert "teacher     bert-base-uncased: BertForSequenceClassification" in out and "from bert-base-uncased" in out
    assert "student     org/small-student: BertForSequenceClassification" in out and "pretrained from org/small" in out


# -- the teacher check -----------------------------------------------------------------------------


def test_check_teacher_against_the_majority_class():
    task = TinyTask()
    labels = [0] * 6 + [1] * 4  # the majority class scores 60
    good = health.check_teacher(task, [0] * 6 + [1] * 3 + [0], labels, 0.9)
    assert good["passed"] and good["majority_class"] == pytest.approx(0.6)
    flipped = health.check_teacher(task, [1] * 6 + [0] * 4, labels, 0.0)
    assert not flipped["passed"] and "below the majority class's 60.00" in flipped["problems"][0]
    assert "label_map" in health.weak_teacher_causes(task, flipped).split("(2)")[0]  # permuted labels first
    # a prompted teacher is never fine-tuned (asking for it is refused): its causes are its prompt's
    prompted = health.weak_teacher_causes(task, flipped, prompted=True)
    assert "finetuned" not in prompted and "label_map" not in prompted
    assert "teacher_options.verbalizer" in prompted and "teacher_options.calibrate=true" in prompted
    one_class = health.check_teacher(task, [0] * 10, labels, 0.6)
    assert not one_class["passed"] and "predicts 'negative' for every dev example" in one_class["problems"][0]
    close = health.check_teacher(task, [0] * 6 + [1] + [0] * 3, labels, 0.63)  # 3 points above: not clearly
    assert not close["passed"] and "not clearly above" in close["problems"][-1]


def test_a_teacher_that_predicts_one_class_stops_the_run_before_any_student_training(capsys, tmp_path, sst2_dir):
    teacher = make_tiny_classifier(tmp_path / "stuck", class_bias=[0.0, 50.0])  # always "positive"
    output = tmp_path / "run"
    code, out, err = run_cli(
        capsys,
        "run",
        *tiny_run_args(teacher=teacher, task="sst2", data_dir=sst2_dir, allow_weak_teacher=None, **AS_GIVEN),
        "--baseline",
        "nkd",
        "--output",
        output,
    )
    assert code == 2
    assert "predicts 'positive' for every dev example" in err and "allow_weak_teacher=true" in err
    assert "majority class scores 50.00" in err and "label_map" in err
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["status"] == "failed" and metrics["teacher"]["check"]["passed"] is False
    assert metrics["teacher"]["check"]["predicted_classes"] == ["positive"]
    assert "stages" not in metrics and not (output / "checkpoints").exists()  # no student was trained

    code, out, err = run_cli(
        capsys,
        "run",
        *tiny_run_args(teacher=teacher, task="sst2", data_dir=sst2_dir, **AS_GIVEN),
        "--output",
        output,
        "--overwrite",
    )
    assert code == 0, err
    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["teacher"]["check"]["allowed"] is True and "WARNING" in out


def test_a_reversed_checkpoint_distils_the_same_student_and_mismatched_names_exit_2(capsys, tmp_path, classifiers):
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN * 2, dev=JUDGED_DEV)
    runs = {}
    for name, checkpoint in classifiers.items():
        code, out, err = run_cli(
            capsys,
            "run",
            *tiny_run_args(teacher=checkpoint, task="sst2", data_dir=data, **AS_GIVEN),
            "--output",
            tmp_path / name,
        )
        assert code == 0, err
        assert "teacher: fine-tuning" not in out  # used as it is: never fine-tuned again
        runs[name] = (
            json.loads((tmp_path / name / "metrics.json").read_text()),
            load_file(str(tmp_path / name / "student" / "model.safetensors")),
        )
    (ordered, ordered_weights), (reversed_, reversed_weights) = runs["ordered"], runs["reversed"]
    assert "finetuned" in ordered["teacher"] and ordered["teacher"]["finetuned"] == {"given": True}
    assert reversed_["teacher"]["labels"]["reordered"] and not ordered["teacher"]["labels"]["reordered"]
    assert reversed_["teacher"]["dev"] == ordered["teacher"]["dev"]
    assert reversed_["student"]["dev"] == ordered["student"]["dev"]
    for key, tensor in ordered_weights.items():
        torch.testing.assert_close(reversed_weights[key], tensor, rtol=0, atol=1e-6, msg=key)

    mismatched = make_tiny_classifier(tmp_path / "mismatched", label_names=["bad", "good"])
    code, _, err = run_cli(
        capsys,
        "run",
        *tiny_run_args(teacher=mismatched, task="sst2", data_dir=data, allow_weak_teacher=None, **AS_GIVEN),
        "--output",
        tmp_path / "mismatched-run",
    )
    assert code == 2 and "['bad', 'good']" in err and "teacher_options.label_map" in err


# -- early stopping ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scores, patience, baseline, stop",
    [
        ([0.6, 0.7, 0.7, 0.7], 2, 0.5, True),  # the best, epoch 2, is two epochs old
        ([0.6, 0.7, 0.7, 0.8], 2, 0.5, False),  # still improving
        ([0.6, 0.7, 0.65], 2, 0.5, False),  # one epoch without improvement is not two
        ([0.5, 0.5, 0.5, 0.5, 0.5], 2, 0.5, False),  # at the majority class since epoch 1: a slow start, not a plateau
        ([0.9, 0.5, 0.4], 2, None, True),
    ],
)
def test_stop_early(scores, patience, baseline, stop):
    assert stop_early(scores, patience, baseline) is stop


def test_early_stopping_waits_a_quarter_of_the_epochs_unless_told():
    from kdplug.engine.schedule import resolve_min_epochs

    assert [resolve_min_epochs(None, epochs) for epochs in (1, 4, 5, 12, 50)] == [1, 1, 2, 3, 13]
    assert resolve_min_epochs(0, 50) == 0 and resolve_min_epochs(20, 50) == 20


def test_a_warm_up_that_changes_nothing_leaves_the_stored_teachers_key():
    from kdplug.config import RunConfig
    from kdplug.engine.inputs import finetune_settings

    class Teacher:  # what finetune_settings reads of one: the model's family defaults and its own lr
        model = torch.nn.Linear(1, 1)
        default_lr = None  # kdplug.types.Teacher's default

    def settings(examples, **config):
        return finetune_settings(RunConfig(**config), Teacher(), [None] * examples, 64, 42)

    # 12 epochs: a warm-up of 3 is shorter than patience 3 + 1 allows a stop anyway
    assert "min_epochs" not in settings(800, teacher_batch_size=32) and settings(800)["epochs"] == 12
    assert settings(12)["min_epochs"] == 8  # 30 epochs
    assert settings(12, min_epochs=20)["min_epochs"] == 20
    assert "min_epochs" not in settings(12, teacher_epochs=30)  # no early stopping, nothing to wait for


def test_patience_defaults_on_only_where_kdplug_chose_the_epochs():
    from kdplug.engine.schedule import DEFAULT_PATIENCE, resolve_patience

    assert resolve_patience(None, epochs_chosen_by_kdplug=True) == DEFAULT_PATIENCE
    assert resolve_patience(None, epochs_chosen_by_kdplug=False) == 0
    assert resolve_patience(1, epochs_chosen_by_kdplug=False) == 1
    assert resolve_patience(0, epochs_chosen_by_kdplug=True) == 0


# -- --dry-run ---------------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_writes_nothing(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    output, cache = tmp_path / "run", Path(os.environ["KDPLUG_CACHE"])
    before = sorted(cache.rglob("*"))
    code, out, err = run_cli(
        capsys,
        "run",
        "--teacher",
        tiny_bert_dir,
        "--task",
        "sst2",
        "--data-dir",
        sst2_dir,
        "--student",
        "bilstm",
        "--projector",
        "universal-ca",
        "--output",
        output,
        "--dry-run",
    )
    assert code == 0, err
    assert "task        sst2: 2 labels (negative, positive); train 12, dev 12" in out
    assert (
        "fine-tuning: 30 epochs at lr 5e-05, batch 32, early stopping after 3, not before epoch 8 (not stored yet)"
        in out
    )
    assert "stage teacher_heads: warm up 4 pseudo classifiers" in out
    assert "stage stage1:" in out and "weights ce 0, eta 0.5, lam 0.5, temperature 1" in out
    assert "stage stage2:" in out and "weights ce 1, eta 0, lam 0" in out
    assert f"output      {output} (a new run directory)" in out
    assert not output.exists() and sorted(cache.rglob("*")) == before
    # the time, from steps timed on the run's own batches: the stages' spans and their sum
    stage2 = next(line for line in out.splitlines() if line.startswith("  stage stage2:"))
    assert " an epoch here now, " in stage2 and stage2.endswith(" in all")
    time_line = next(line for line in out.splitlines() if line.startswith("time        about "))
    assert "teacher fine-tuning " in time_line and "stage1 " in time_line and "stage2 " in time_line
    assert "Estimated from 3 steps of each model timed here now" in time_line and " thread(s) (" in time_line


def test_dry_run_exits_2_with_the_first_problem(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    code, _, err = run_cli(
        capsys,
        "run",
        "--teacher",
        tiny_bert_dir,
        "--task",
        "sst2",
        "--data-dir",
        sst2_dir,
        "--student",
        "bert-9",
        "--output",
        tmp_path / "run",
        "--dry-run",
    )
    assert code == 2 and "ask for 1 to 4 layers" in err


# -- what the run hands to the world ----------------------------------------------------------------


def test_the_student_package_holds_no_absolute_path(capsys, tmp_path, classifiers):
    data = write_sst2(tmp_path / "SST-2")
    output = tmp_path / "run"
    code, _, err = run_cli(
        capsys,
        "run",
        "--teacher",
        classifiers["ordered"],
        "--student",
        "bert-1",
        "--projector",
        "rkd",
        "--task",
        "sst2",
        "--data-dir",
        data,
        "--epochs",
        "1",
        "--set",
        "allow_weak_teacher=true",
        "--output",
        output,
    )
    assert code == 0, err
    metrics = json.loads((output / "metrics.json").read_text())
    # the teacher came fine-tuned and names no base model: the student starts from its layers, and says so
    assert metrics["student"]["init"]["init"] == "teacher"
    card = (output / "student" / "README.md").read_text()
    assert "- initialisation: teacher from `ordered`" in card
    for path in (output / "student").iterdir():
        if path.suffix in (".md", ".json") and path.name != "tokenizer.json":
            text = path.read_text()
            for private in (str(tmp_path), str(Path.home()), "/tmp/"):
                assert private not in text, (path.name, private)


def test_a_listing_piped_into_head_ends_quietly():
    listing = subprocess.Popen(
        [sys.executable, "-m", "kdplug.cli", "zoo", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    listing.stdout.readline()
    listing.stdout.close()  # what `| head -1` does once it has its line
    _, err = listing.communicate(timeout=60)
    assert err == b"" and listing.returncode in (0, 141)


def test_a_teacher_kdplug_fine_tuned_is_not_told_to_let_kdplug_fine_tune_it(capsys, tmp_path, tiny_bert_dir):
    """teacher_options.finetuned=false, fine-tuned here and still weak: the check told it to set
    teacher_options.finetuned=false (and to suspect its label order, which kdplug's own head has)."""
    # 11 of 12 dev examples negative: the majority class scores 91.7, which one epoch cannot beat by 5
    skewed = [(text, 0) for text, _ in SST2_DEV * 4][:11] + [("a truly great film .", 1)]
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=skewed)
    settings = dict(teacher=tiny_bert_dir, task="sst2", data_dir=data, allow_weak_teacher=None, teacher_epochs=1)
    code, _, err = run_cli(
        capsys,
        "run",
        *tiny_run_args(**settings),
        "--set",
        "teacher_options.finetuned=false",
        "--output",
        tmp_path / "r",
    )
    err = " ".join(err.split())
    assert code == 2 and "The teacher is not worth distilling" in err
    assert "finetuned=false" not in err and "label_map" not in err
    assert "its fine-tuning here did not learn the task: more epochs (--set teacher_epochs=N)" in err

"""Every registered component passes its contract: parametrised over the registry, so a new
plugin is covered as soon as it is installed. The contracts are :mod:`kdplug.testing.contracts`,
the same code ``kdplug check-plugin`` and third-party authors run."""

from __future__ import annotations

import pytest

import kdplug
from kdplug.testing import contracts
from kdplug.testing.decoders import make_tiny_causal_lm
from kdplug.testing.tiny import make_tiny_roberta

#: test-size options for the built-in students whose paper-size defaults are slow on a CPU
STUDENT_OPTIONS = {
    "bilstm": {"embedding_dim": 16, "hidden_size": 16},
    "gated-cnn": {"embedding_dim": 16, "hidden_size": 16},
}


def names(kind):
    registry = kdplug.get_plugin_manager().registry
    return [contracts.concrete_name(entry) for entry in registry.entries(kind)]


def assert_passes(report):
    assert report.ok, report.failure_message() + "\n\n" + report.format(verbose=True)
    assert not report.not_checked, report.format()
    assert {r.check for r in report.results} == set(contracts.CHECKS[report.kind])


@pytest.mark.parametrize("name", names("projector"))
def test_projector_contract(name):
    assert_passes(contracts.check_projector(name))


@pytest.mark.parametrize("name", names("loss"))
def test_loss_contract(name):
    assert_passes(contracts.check_loss(name))


@pytest.mark.parametrize("name", names("student"))
def test_student_contract(name, workspace):
    options = STUDENT_OPTIONS.get(name, {})
    if name in ("distilroberta", "hf"):  # a hub checkpoint (by default, or always): a tiny RoBERTa instead
        options = {"source": make_tiny_roberta(workspace.path(f"roberta-{name}"))}
    assert_passes(contracts.check_student(name, options=options, workspace=workspace))


@pytest.mark.parametrize("name", names("teacher"))
def test_teacher_contract(name, workspace):
    # Every teacher factory accepts `source` (the teacher hook): a tiny BERT stands in for the real one,
    # and a tiny causal language model, read through a prompt, for the prompted one's.
    options = None
    if name == "prompted-lm":
        lm = make_tiny_causal_lm(workspace.path("causal-lm"))
        options = {
            "source": lm,
            "prompt": "Review: {text}\nSentiment:",
            "verbalizer": {"negative": " bad", "positive": " good"},
        }
    if name.startswith("served:"):  # a tiny model behind the test kit's OpenAI-compatible server, under the name
        from kdplug.testing.openai_server import OpenAIServer

        lm = make_tiny_causal_lm(workspace.path("causal-lm"))
        with OpenAIServer(lm, name=name.split(":", 1)[1]) as server:
            options = {"base_url": server.base_url, "tokenizer": lm, "prompt": "Review: {text}\nSentiment:"}
            options["verbalizer"] = {"negative": " bad", "positive": " good"}
            cases = contracts.MODEL_CASES[:1]
            report = contracts.check_teacher(name, options=options, workspace=workspace, cases=cases)
        assert_passes(report)
        return
    assert_passes(contracts.check_teacher(name, options=options, workspace=workspace, cases=contracts.MODEL_CASES[:1]))


def test_teacher_contract_on_every_task_shape(workspace):
    assert_passes(contracts.check_teacher("hf", workspace=workspace))


@pytest.mark.parametrize("name", names("task"))
def test_task_contract(name, glue_dirs, workspace):
    data_dir, options = glue_dirs.get(name), {}
    if name == "local":
        data_dir = workspace.sst2_dir
        options = {"train_file": "train.tsv", "dev_file": "dev.tsv", "text_column": "sentence"}
    assert_passes(contracts.check_task(name, data_dir=data_dir, options=options))


@pytest.mark.parametrize("name", names("recipe"))
def test_recipe_contract(name, workspace):
    assert_passes(contracts.check_recipe(name, workspace=workspace))


def test_a_task_without_its_files_is_not_checked_and_says_why():
    report = contracts.check_task("local")
    assert report.ok and "needs data" in report.not_checked
    assert "verdict: NOT CHECKED" in report.format()


def test_every_kind_with_a_registration_hook_has_a_contract():
    from kdplug.registry import KINDS

    assert set(contracts.CONTRACT_KINDS) == set(KINDS) - {"layer_extractor"}


@pytest.mark.parametrize("name", names("augmenter"))
def test_augmenter_contract(name):
    assert_passes(contracts.check_augmenter(name))

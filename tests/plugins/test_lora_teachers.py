"""LoRA and large teachers: a PEFT adapter directory as the teacher, a teacher fine-tuned with a
LoRA adapter (teacher_options.lora) and stored as one, and teacher_options.dtype."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import kdplug
from kdplug.cli import main
from kdplug.engine import teacher as teacher_stage
from kdplug.engine.data import EncodedSplit
from kdplug.engine.trainer import Trainer, build_accelerator
from kdplug.errors import UsageError
from kdplug.testing.decoders import make_tiny_decoder
from kdplug.testing.tiny import TinyTask

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

peft = pytest.importorskip("peft")

TEXTS = ["the story was good", "a bad film", "i loved the music and the plot", "the plot was boring"]


def _logits(model, tokenizer, texts=TEXTS) -> torch.Tensor:
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.eval()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits


def _peft_adapter(base: str, directory, seed: int = 1) -> str:
    """An adapter trained elsewhere, as peft saves one: random LoRA matrices (B not zero, so it
    changes the model) on the attention and MLP projections, and a head of its own."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(base)
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    wrapped = peft.get_peft_model(model, config)
    with torch.no_grad():
        wrapped.base_model.model.score.modules_to_save["default"].weight.normal_()
    wrapped.save_pretrained(str(directory))
    return str(directory)


def test_an_adapter_directory_is_a_teacher_with_peft_s_logits(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = make_tiny_decoder(tmp_path / "llama", "llama")
    adapter = _peft_adapter(base, tmp_path / "adapter")
    teacher = kdplug.create_teacher("hf", TinyTask(), source=adapter)
    assert teacher.finetuned and teacher.extra["kind"] == f"a LoRA adapter over {base} (r=4)"
    assert type(teacher.model).__name__ == "LlamaForSequenceClassification"  # merged: a plain model
    assert not any("lora" in name for name in teacher.model.state_dict())
    # the reference: peft's own PeftModel over the base, unmerged, in float64
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.pad_token = tokenizer.eos_token  # as transformers pads a decoder without a padding token
    plain = AutoModelForSequenceClassification.from_pretrained(base, pad_token_id=tokenizer.pad_token_id)
    reference = peft.PeftModel.from_pretrained(plain, adapter).double()
    expected = _logits(reference, tokenizer)
    torch.testing.assert_close(_logits(teacher.model, teacher.tokenizer).double(), expected, rtol=1e-4, atol=1e-5)
    untouched = AutoModelForSequenceClassification.from_pretrained(base, pad_token_id=tokenizer.pad_token_id)
    assert not torch.allclose(_logits(untouched, tokenizer).double(), expected, atol=1e-3)  # the adapter counts

    # the teacher's fingerprint follows the adapter's weights
    other = kdplug.create_teacher("hf", TinyTask(), source=_peft_adapter(base, tmp_path / "other", seed=2))
    assert kdplug.fingerprint.of_module(other.model) != kdplug.fingerprint.of_module(teacher.model)


def _split(tokenizer, examples) -> EncodedSplit:
    ids = [tokenizer(text, truncation=True, max_length=32)["input_ids"] for text, _ in examples]
    return EncodedSplit(
        input_ids=ids,
        token_type_ids=None,
        labels=[int(label) for _, label in examples],
        is_regression=False,
        pad_id=tokenizer.pad_token_id,
    )


@pytest.mark.parametrize("architecture, targets", [("llama", ["q_proj", "v_proj"]), ("bert", ["query", "value"])])
def test_lora_fine_tuning_trains_the_adapter_and_head_only_and_stores_an_adapter(
    tmp_path, tiny_bert_dir, architecture, targets
):
    task = TinyTask()
    base = tiny_bert_dir if architecture == "bert" else make_tiny_decoder(tmp_path / "llama", "llama")
    teacher = kdplug.create_teacher("hf", task, source=base, finetuned=False, lora={"r": 4, "alpha": 8})
    assert not teacher.finetuned and teacher.default_lr == 5e-4
    assert teacher.finetuning["lora"]["target_modules"] == targets  # peft's defaults for the architecture
    before = {name: tensor.clone() for name, tensor in teacher.model.state_dict().items()}
    train, dev = _split(teacher.tokenizer, SST2_TRAIN), {"dev": _split(teacher.tokenizer, SST2_DEV)}
    trainer = Trainer(build_accelerator("fp32"), task, batch_size=8, seed=0)
    extractor = kdplug.find_layer_extractor(teacher.model)
    teacher_stage.finetune(
        teacher,
        extractor,
        trainer,
        task,
        train,
        dev,
        epochs=2,
        lr=1e-2,
        task_loss=kdplug.create_loss("ce"),
        regression=False,
    )
    after = teacher.model.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("lora_" in name or "modules_to_save" in name for name in changed), sorted(changed)
    assert any("modules_to_save" in name for name in changed)  # the head (score, classifier) is trained in full
    frozen = [name for name in before if "lora_" not in name and "modules_to_save" not in name]
    assert all(before[name].numpy().tobytes() == after[name].numpy().tobytes() for name in frozen)

    stored = teacher_stage.store(teacher, tmp_path / "cache", "key", {"epochs": 2})
    files = set(os.listdir(stored))
    assert {"adapter_config.json", "adapter_model.safetensors", "kdplug_finetuned.json"} <= files
    assert not files & {"model.safetensors", "pytorch_model.bin"}  # an adapter, not a copy of the model
    assert json.loads((stored / "adapter_config.json").read_text())["base_model_name_or_path"] == os.path.abspath(base)

    teacher.after_finetuning()  # merged, as the engine does before the teacher's pass
    assert not any("lora" in name for name in teacher.model.state_dict())
    expected = _logits(teacher.model, teacher.tokenizer)
    reloaded = kdplug.create_teacher("hf", task, source=str(stored), lora=True)  # the run's options again
    assert reloaded.finetuned and not reloaded.notes and reloaded.extra["kind"].startswith("a LoRA adapter over")
    torch.testing.assert_close(_logits(reloaded.model, reloaded.tokenizer), expected, rtol=1e-5, atol=1e-6)
    assert kdplug.fingerprint.of_module(reloaded.model) == kdplug.fingerprint.of_module(teacher.model)


def test_bf16_loads_bf16_weights_and_fp16_is_refused_on_a_cpu(tmp_path):
    base = make_tiny_decoder(tmp_path / "llama", "llama")
    teacher = kdplug.create_teacher("hf", TinyTask(), source=base, dtype="bf16")
    assert {parameter.dtype for parameter in teacher.model.parameters()} == {torch.bfloat16}
    assert teacher.extra["dtype"] == "bf16"
    assert _logits(teacher.model, teacher.tokenizer).dtype == torch.bfloat16
    if not torch.cuda.is_available():
        auto = kdplug.create_teacher("hf", TinyTask(), source=base, dtype="auto")
        assert {parameter.dtype for parameter in auto.model.parameters()} == {torch.float32}
        with pytest.raises(UsageError, match="dtype=fp16 needs a CUDA GPU"):
            kdplug.create_teacher("hf", TinyTask(), source=base, dtype="fp16")


def test_without_peft_lora_options_and_adapters_say_how_to_install_it(tmp_path, monkeypatch):
    base = make_tiny_decoder(tmp_path / "llama", "llama")
    adapter = _peft_adapter(base, tmp_path / "adapter")
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError, as where it is not installed
    with pytest.raises(UsageError, match=r'^teacher_options.lora needs the peft library.*pip install "kdplug\[llm\]"'):
        kdplug.create_teacher("hf", TinyTask(), source=base, lora=True, finetuned=False)
    with pytest.raises(UsageError, match=rf'^the adapter teacher {adapter} needs the peft library.*"kdplug\[llm\]"'):
        kdplug.create_teacher("hf", TinyTask(), source=adapter)


def test_the_dry_run_says_the_teacher_is_an_adapter_or_fine_tuned_with_lora(capsys, tmp_path):
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    base = make_tiny_decoder(tmp_path / "llama", "llama")
    adapter = _peft_adapter(base, tmp_path / "adapter")
    argv = ["run", "--student", "bilstm", "--projector", "rkd", "--task", "sst2", "--data-dir", str(data)]
    argv += ["--set", "allow_weak_teacher=true", "--output", str(tmp_path / "run"), "--dry-run"]
    assert main([*argv, "--teacher", adapter]) == 0
    assert f"kind: a LoRA adapter over {base} (r=4)" in capsys.readouterr().out
    lora = ["--set", "teacher_options.finetuned=false", "--set", "teacher_options.lora={r: 16}"]
    assert main([*argv, "--teacher", base, *lora]) == 0
    out = capsys.readouterr().out
    kind = "kind: a LlamaForSequenceClassification fine-tuned on the task with LoRA r=16, alpha 16, dropout 0.05"
    assert f"{kind} on q_proj, v_proj" in out
    assert "at lr 0.0005" in out and "the head trained in full" in out
    # the default rate is said to be RoBERTa-base's, measured on nothing else
    assert (
        "with teacher_lr unset, LoRA fine-tunes at 0.0005, the LoRA paper's rate for RoBERTa-base on GLUE (4e-4 to "
        "5e-4), not measured on a LlamaForSequenceClassification" in " ".join(out.split())
    )


@pytest.mark.parametrize(
    "lora, message",
    [
        ("yes", "must be true or a mapping"),
        ({"rank": 4}, "unknown teacher_options.lora key"),
        ({"r": 0}, "lora.r must be a positive whole number"),
        ({"target_modules": ["no_such_layer"]}, "LoRA cannot adapt this LlamaForSequenceClassification"),
    ],
)
def test_bad_lora_options_are_refused(tmp_path, lora, message):
    base = make_tiny_decoder(tmp_path / "llama", "llama")
    with pytest.raises(UsageError, match=message):
        kdplug.create_teacher("hf", TinyTask(), source=base, finetuned=False, lora=lora)


def test_a_run_fine_tunes_with_lora_and_the_next_reuses_the_stored_adapter_and_its_outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("KDPLUG_CACHE", str(tmp_path / "cache"))
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN, dev=SST2_DEV)
    argv = ["run", "--teacher", make_tiny_decoder(tmp_path / "llama", "llama"), "--student", "bilstm"]
    argv += ["--projector", "rkd", "--task", "sst2", "--data-dir", str(data), "--epochs", "1"]
    for setting in ("teacher_epochs=1", "allow_weak_teacher=true", "student_options.hidden_size=16") + (
        "measure_speed=false",
        "teacher_options.finetuned=false",
        "teacher_options.lora=true",
    ):
        argv += ["--set", setting]
    assert main([*argv, "--output", str(tmp_path / "first")]) == 0
    first = json.loads((tmp_path / "first" / "metrics.json").read_text())["teacher"]["finetuned"]
    assert os.path.isfile(os.path.join(first["stored"], "adapter_config.json"))
    outputs = sorted(os.listdir(tmp_path / "cache" / "teacher-cache"))

    assert main([*argv, "--output", str(tmp_path / "second")]) == 0
    second = json.loads((tmp_path / "second" / "metrics.json").read_text())["teacher"]
    assert os.path.samefile(second["finetuned"]["reused"], first["stored"])
    assert second["kind"].startswith("a LlamaForSequenceClassification fine-tuned on the task with LoRA r=8")
    # the adapter reloaded and merged is the teacher the first run merged: its cached outputs are reused
    assert sorted(os.listdir(tmp_path / "cache" / "teacher-cache")) == outputs


def test_an_adapter_s_missing_base_is_named_with_the_option_that_points_to_it(tmp_path, monkeypatch):
    base = make_tiny_decoder(tmp_path / "llama", "llama")
    adapter = _peft_adapter(base, tmp_path / "adapter")
    config_path = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    for named, message in (
        ("some-org/llama-base", "cannot load the base model some-org/llama-base of the adapter .* switched off"),
        (str(tmp_path / "moved"), "names its base model .*moved, which is not a directory here"),
    ):
        config_path.write_text(json.dumps({**config, "base_model_name_or_path": named}))
        with pytest.raises(UsageError, match=message) as error:
            kdplug.create_teacher("hf", TinyTask(), source=adapter)
        assert "--set teacher_options.base=" in str(error.value)
    teacher = kdplug.create_teacher("hf", TinyTask(), source=adapter, base=base)  # the option points to it
    assert teacher.extra["kind"] == f"a LoRA adapter over {base} (r=4)"


def test_a_pickled_adapter_is_refused_before_any_weights_load(tmp_path):
    """adapter_model.bin is a pickle, which torch loads only with weights_only=False, that is by
    running code from the file: kdplug reads safetensors adapters only, and says how to convert one
    (torch's advice to set weights_only=False surfaced instead)."""
    base = make_tiny_decoder(tmp_path / "llama", "llama")
    adapter = _peft_adapter(base, tmp_path / "adapter")
    from safetensors.torch import load_file

    weights = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    os.remove(os.path.join(adapter, "adapter_model.safetensors"))
    torch.save(weights, os.path.join(adapter, "adapter_model.bin"))  # what peft wrote before safetensors
    with pytest.raises(UsageError, match=r"adapter_model.bin.*pickle.*safetensors adapters only") as error:
        kdplug.create_teacher("hf", TinyTask(), source=adapter)
    assert "weights_only=False" not in str(error.value) and "save_pretrained" in str(error.value)

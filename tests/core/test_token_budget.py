"""Batches by a budget of padded tokens (``teacher_tokens_per_batch``, ``eval_tokens_per_batch``,
``kdplug predict --tokens-per-batch``): sorted by length, results back in the data's order, the same
predictions as batches by count, and no change at all where the settings are unset."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import kdplug
from kdplug import token_budget
from kdplug.cli import main
from kdplug.engine import teacher as teacher_stage
from kdplug.engine.data import Collator, EncodedSplit
from kdplug.engine.objective import layer_vectors, model_forward
from kdplug.engine.trainer import Trainer, build_accelerator
from kdplug.inference import LoadedStudent
from kdplug.testing.tiny import TinyTask, wordpiece_tokenizer

#: the run's batch size: the pass's count batches hold 8 examples
BATCH = 4


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=200,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        output_hidden_states=True,
    )
    return BertForSequenceClassification(config).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def split():
    """70 examples of 3 to 40 tokens, long and short mixed as a data set mixes them."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 41, 70)
    ids = [[2, *rng.integers(5, 200, n - 2).tolist(), 3] for n in lengths]
    return EncodedSplit(
        input_ids=ids, token_type_ids=None, labels=rng.integers(0, 2, 70).tolist(), is_regression=False, pad_id=0
    )


def trainer(**budgets) -> Trainer:
    return Trainer(build_accelerator("fp32"), TinyTask(), batch_size=BATCH, seed=0, **budgets)


def build(model, split, root: Path, **budgets):
    teacher = kdplug.Teacher(model=model, tokenizer=None, source="tiny", finetuned=True)
    return teacher_stage.build_cache(
        teacher,
        kdplug.find_layer_extractor(model),
        trainer(**budgets),
        TinyTask(),
        "train",
        split,
        root=root,
        precision="fp32",
        teacher_fingerprint="tiny",
        tokenizer_fingerprint="tiny",
    )


def entry_bytes(cache) -> dict[str, bytes]:
    return {
        entry.meta.kind: (entry.directory / entry.meta.data_file).read_bytes()
        for entry in (cache.logits_entry, cache.layers_entry)
    }


def test_budget_batches_cover_every_row_once_longest_first_within_the_budget():
    lengths = [5, 40, 3, 12, 12, 7, 30, 2]
    batches = token_budget.budget_batches(lengths, range(1, 8), 36)
    assert sorted(i for batch in batches for i in batch) == list(range(1, 8))
    assert batches[0] == [1]  # 40 tokens, over the budget: alone
    assert all(len(b) * max(lengths[i] for i in b) <= 36 for b in batches if len(b) > 1)
    assert [lengths[i] for b in batches for i in b] == sorted((lengths[i] for i in range(1, 8)), reverse=True)
    assert batches[2] == [3, 4, 5]  # 3 x 12 tokens: the budget; equal lengths keep the data's order


def test_without_a_budget_the_cache_is_byte_identical_to_count_batches_in_the_datas_order(model, split, tmp_path):
    """Unset, the pass is the one kdplug always ran: batches of twice batch_size, in order."""
    cache = build(model, split, tmp_path)
    loader = torch.utils.data.DataLoader(
        split, batch_size=2 * BATCH, shuffle=False, collate_fn=Collator(split.pad_id, False)
    )
    extractor = kdplug.find_layer_extractor(model)
    _, positions = teacher_stage.matchable_specs(extractor, model)
    logits, layers = [], []
    with torch.no_grad():
        for batch in loader:
            outputs = model_forward(model, batch)
            logits.append(outputs.logits.float())
            vectors = layer_vectors(extractor, model, outputs, batch)
            layers.append(torch.cat([vectors[i].float() for i in positions], 1).half())
    expected = {"logits": torch.cat(logits).numpy().tobytes(), "layers": torch.cat(layers).numpy().tobytes()}
    assert entry_bytes(cache) == expected


@pytest.mark.parametrize("budget", [96, 16])  # 16: below the longest example (40 tokens), which goes alone
def test_a_token_budget_gives_the_count_batches_cache_to_float_rounding(model, split, tmp_path, budget):
    """The same outputs in the same rows, written in order (the checksum hashed as they are written);
    the floats differ from count batches' in their last bits only, as batch shapes choose kernels."""
    from kdplug import fingerprint

    counted = build(model, split, tmp_path / "count")
    budgeted = build(model, split, tmp_path / "budget", teacher_tokens_per_batch=budget)
    assert np.allclose(budgeted.logits, counted.logits, rtol=0, atol=1e-5)
    assert np.allclose(budgeted.layers, counted.layers, rtol=0, atol=2e-3)  # fp16 vectors: a rounding step apart
    assert np.array_equal(np.argmax(budgeted.logits, 1), np.argmax(counted.logits, 1))
    for entry in (budgeted.logits_entry, budgeted.layers_entry):
        ((name, checksum),) = entry.meta.checksums.items()
        assert checksum == fingerprint.of_file(str(entry.directory / name))
    plan = teacher_stage.pass_plan(trainer(teacher_tokens_per_batch=budget), split, range(len(split)))
    assert max(len(batch) for window in plan for batch in window) > 2 * BATCH or budget < 40


def test_evaluation_by_a_token_budget_gives_the_same_predictions_and_metrics(model, split):
    dev = {"dev": split}
    counted, budgeted = {}, {}
    metrics = trainer().evaluate(model, dev, counted)
    assert trainer(eval_tokens_per_batch=64).evaluate(model, dev, budgeted) == metrics
    assert budgeted == counted
    assert trainer(eval_tokens_per_batch=5).evaluate(model, dev) == metrics  # every example alone


def test_predict_by_a_token_budget_keeps_the_order_and_the_predictions(model, tmp_path):
    words = [f"w{i}" for i in range(150)]
    student = LoadedStudent(
        model=model,
        tokenizer=wordpiece_tokenizer(words),
        labels=("negative", "positive"),
        is_regression=False,
        is_pair=False,
        max_length=32,
        text_columns=("sentence",),
        directory=tmp_path,
        info={},
    )
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(words, n).tolist()) for n in rng.integers(1, 45, 50)]
    counted = student.predict(texts, batch_size=8)
    budgeted = student.predict(texts, tokens_per_batch=60)
    assert [p.label for p in budgeted] == [p.label for p in counted]
    assert [p.truncated for p in budgeted] == [p.truncated for p in counted] and any(p.truncated for p in counted)
    for a, b in zip(budgeted, counted):
        assert a.probabilities.keys() == b.probabilities.keys()
        assert all(abs(a.probabilities[k] - b.probabilities[k]) < 1e-6 for k in a.probabilities)
    with pytest.raises(kdplug.UsageError, match="tokens_per_batch= takes a whole number"):
        student.predict(texts, tokens_per_batch="4096")
    with pytest.raises(kdplug.UsageError, match=r"tokens_per_batch= must be at least 1"):
        student.predict(texts, tokens_per_batch=0)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("teacher_tokens_per_batch=lots", "teacher_tokens_per_batch must be a whole number"),
        ("eval_tokens_per_batch=2.5", "eval_tokens_per_batch must be a whole number"),
        ("teacher_tokens_per_batch=0", "teacher_tokens_per_batch must be a positive number of padded tokens"),
        ("eval_tokens_per_batch=-3", "eval_tokens_per_batch must be a positive number of padded tokens"),
    ],
)
def test_wrong_budgets_exit_2_before_anything_loads(capsys, tmp_path, setting, message):
    code = main(["run", "--dry-run", "--set", setting, "--output", str(tmp_path / "run")])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "many"])
def test_predict_refuses_a_wrong_tokens_per_batch_before_loading(capsys, tmp_path, value):
    with pytest.raises(SystemExit) as exit_info:
        code = main(["predict", str(tmp_path / "absent"), "--input", "-", "--tokens-per-batch", value])
        raise SystemExit(code)
    assert exit_info.value.code == 2
    assert "--tokens-per-batch" in capsys.readouterr().err


class PaddedTokenClock(torch.nn.Module):
    """A teacher whose forward takes a fixed time per padded token (and little CPU): the time of a pass
    over a split is that of its batches as cut."""

    SECONDS_PER_TOKEN = 1e-4

    def forward(self, input_ids, attention_mask):
        from transformers.modeling_outputs import SequenceClassifierOutput

        time.sleep(input_ids.numel() * self.SECONDS_PER_TOKEN)
        return SequenceClassifierOutput(logits=torch.zeros(len(input_ids), 2))


@pytest.mark.parametrize("budgets", [{}, {"teacher_tokens_per_batch": 160}])
def test_the_dry_runs_teacher_pass_time_is_the_pass_as_the_run_cuts_it(split, tmp_path, budgets):
    """Before, the dry run timed batches of teacher_batch_size (fine-tuning's) whatever the pass cut: with a
    token budget it quoted the padding the budget saves (1.7x the pass's time here)."""
    from types import SimpleNamespace

    from kdplug.engine.estimate import teacher_seconds

    clock = PaddedTokenClock()
    teacher = kdplug.Teacher(model=clock, tokenizer=None, source="clock", finetuned=True)
    inputs = SimpleNamespace(trainer=trainer(**budgets), teacher=teacher, train=split, dev={"dev": split})
    config = SimpleNamespace(teacher_batch_size=32)
    planned = teacher_seconds("ready", {"train": "computed", "dev": "computed"}, config, inputs, "teacher")
    started = time.perf_counter()
    for _ in ("train", "dev"):  # the run's teacher pass, without the cache around it
        batches = teacher_stage._teacher_batches(teacher, None, inputs.trainer, split, "fp32", [], range(len(split)))
        assert sum(len(batch[0]) for batch in batches) == len(split)
    passed = time.perf_counter() - started
    assert planned["teacher outputs"][0] == pytest.approx(passed, rel=0.25)

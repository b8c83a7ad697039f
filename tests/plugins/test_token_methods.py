"""Token-level distillation with the teacher in the loop: TinyBERT and MiniLMv2.

The reference values are computed here from the papers' equations with explicit loops over
examples, heads and token positions (NumPy, float64), not from kdplug's code: TinyBERT's
L_embd + Σ(L_hidn + L_attn) with A = QKᵀ/√d_k per head (Jiao et al. 2020, eqs. 7-10), and
MiniLMv2's KL of the Q-Q/K-K/V-V relation rows after re-splitting into A_r relation heads
(Wang et al. 2021, eqs. 1-3). Padding follows kdplug's documented choice: real tokens only.
"""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import kdplug
from kdplug.cli import main
from kdplug.errors import UsageError
from kdplug.types import DistillInputs, LayerSpec, ProjectionRequest, TokenSignals, TokenSpec

from ..conftest import SST2_DEV, SST2_TRAIN, interrupted_run, write_sst2

BATCH, LENGTH = 3, 5
LENGTHS = (5, 3, 4)  # real tokens per example: the others are padding


def request(teacher: TokenSpec, student: TokenSpec) -> ProjectionRequest:
    return ProjectionRequest(
        teacher_layers=tuple(LayerSpec(i, teacher.width, "transformer") for i in range(1, teacher.layers + 1)),
        student_layers=tuple(LayerSpec(i, student.width, "transformer") for i in range(1, student.layers + 1)),
        num_outputs=2,
        teacher_tokens=teacher,
        student_tokens=student,
    )


def signals(spec: TokenSpec, seed: int) -> TokenSignals:
    generator = torch.Generator().manual_seed(seed)
    draw = lambda: torch.randn(BATCH, LENGTH, spec.width, generator=generator)  # noqa: E731
    mask = torch.tensor([[t < n for t in range(LENGTH)] for n in LENGTHS])
    blocks = lambda: [draw() for _ in range(spec.layers)]  # noqa: E731
    return TokenSignals(mask, [draw() for _ in range(spec.layers + 1)], blocks(), blocks(), blocks(), spec.heads)


def inputs(teacher: TokenSignals, student: TokenSignals) -> DistillInputs:
    empty = torch.zeros(BATCH, 2)
    return DistillInputs([], [], empty, empty, teacher_tokens=teacher, student_tokens=student)


# -- TinyBERT ----------------------------------------------------------------------------------


def tinybert_reference(teacher, student, w_e, w_h, layer_of):
    """Each example's [L_embd, L_hidn(m)..., L_attn(m)...] from TinyBERT's equations, looping."""

    def mse_over_tokens(s, t, n):  # MSE(H^S W, H^T) over the example's n real tokens
        return sum(float(np.sum((s[i] - t[i]) ** 2)) for i in range(n)) / (n * t.shape[1])

    def scores(q, k, heads, n):  # A_i = Q_i K_iᵀ / √d_k for each head i, real tokens only
        d = q.shape[1] // heads
        return [
            [
                [float(q[a, i * d : (i + 1) * d] @ k[b, i * d : (i + 1) * d]) / math.sqrt(d) for b in range(n)]
                for a in range(n)
            ]
            for i in range(heads)
        ]

    rows = []
    for x in range(BATCH):
        n = LENGTHS[x]
        hs = [h[x].double().numpy() for h in student.hidden]
        ht = [h[x].double().numpy() for h in teacher.hidden]
        row = [mse_over_tokens(hs[0] @ w_e, ht[0], n)]
        row += [mse_over_tokens(hs[m] @ w_h, ht[g], n) for m, g in layer_of.items()]
        for m, g in layer_of.items():
            a_s = np.array(
                scores(
                    student.queries[m - 1][x].double().numpy(),
                    student.keys[m - 1][x].double().numpy(),
                    student.heads,
                    n,
                )
            )
            a_t = np.array(
                scores(
                    teacher.queries[g - 1][x].double().numpy(),
                    teacher.keys[g - 1][x].double().numpy(),
                    teacher.heads,
                    n,
                )
            )
            row.append(float(np.mean((a_s - a_t) ** 2)))  # (1/h) Σ_i MSE(A_i^S, A_i^T)
        rows.append(row)
    return np.array(rows)


def test_tinybert_terms_follow_the_paper():
    teacher_spec, student_spec = TokenSpec(layers=4, width=6, heads=2), TokenSpec(layers=2, width=4, heads=2)
    torch.manual_seed(0)
    projector = kdplug.create_projector("tinybert", request(teacher_spec, student_spec))
    teacher, student = signals(teacher_spec, 1), signals(student_spec, 2)
    terms = projector(inputs(teacher, student)).terms
    w_e = projector.embedding_projection.weight.detach().double().numpy().T  # (d', d)
    w_h = projector.hidden_projection.weight.detach().double().numpy().T
    expected = tinybert_reference(teacher, student, w_e, w_h, {1: 2, 2: 4})  # g(m) = m·N/M = 2m
    np.testing.assert_allclose(terms.detach().double().numpy(), expected, rtol=1e-5, atol=1e-6)
    assert projector.matching["terms"] == [
        "embeddings 0:0",
        "hidden 1:2",
        "hidden 2:4",
        "attention 1:2",
        "attention 2:4",
    ]


def test_tinybert_loss_trains_the_student_and_its_projections_not_the_teacher():
    teacher_spec, student_spec = TokenSpec(4, 6, 2), TokenSpec(2, 4, 2)
    projector = kdplug.create_projector("tinybert", request(teacher_spec, student_spec))
    teacher, student = signals(teacher_spec, 1), signals(student_spec, 2)
    for tensor in [*teacher.hidden, *teacher.queries, *student.hidden, *student.queries, *student.keys]:
        tensor.requires_grad_()
    projector(inputs(teacher, student)).terms.mean(0).sum().backward()
    assert all(t.grad is None or not t.grad.any() for t in [*teacher.hidden, *teacher.queries])
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in [*student.hidden, *student.queries])
    assert projector.hidden_projection.weight.grad.abs().sum() > 0
    # padding carries no loss: changing a padded position changes nothing
    before = projector(inputs(teacher, student)).terms
    student.hidden[1].data[1, 4] += 100.0
    student.queries[0].data[1, 3:] += 100.0
    torch.testing.assert_close(projector(inputs(teacher, student)).terms, before)


def test_tinybert_layer_maps_and_head_counts():
    teacher_spec = TokenSpec(12, 24, 4)
    pairs = lambda **o: [
        p[1][0]
        for p in kdplug.create_projector("tinybert", request(teacher_spec, TokenSpec(4, 8, 4)), **o).matching["pairs"]
    ]  # noqa: E731
    assert pairs() == [3, 6, 9, 12]  # TinyBERT4's g(m) = 3m
    assert pairs(layer_map="reverse") == [12, 9, 6, 3]
    assert pairs(layer_map="1:1,2:2,3:3,4:12") == [1, 2, 3, 12]
    with pytest.raises(UsageError, match="attention=false.*minilm-v2"):
        kdplug.create_projector("tinybert", request(teacher_spec, TokenSpec(4, 8, 2)))
    projector = kdplug.create_projector("tinybert", request(teacher_spec, TokenSpec(4, 8, 2)), attention=False)
    assert len(projector.matching["terms"]) == 5  # embeddings + 4 hidden states
    pooled = ProjectionRequest(
        teacher_layers=(LayerSpec(1, 24, "transformer"),),
        student_layers=(LayerSpec(1, 8, "lstm"),),
        num_outputs=2,
        teacher_tokens=teacher_spec,
    )
    with pytest.raises(UsageError, match="pools each sentence"):
        kdplug.create_projector("tinybert", pooled)


# -- MiniLMv2 ----------------------------------------------------------------------------------


def minilm_reference(teacher, student, teacher_layer, relation_heads):
    """Each example's [L_QQ, L_KK, L_VV]: 1/(A_r·|x|) Σ_a Σ_t KL(R^T_a,t ‖ R^S_a,t) over real tokens."""

    def relations(x, n):  # softmax_u(x_a[t]·x_a[u] / √d_r) for each relation head a
        d = x.shape[1] // relation_heads
        out = np.zeros((relation_heads, n, n))
        for a in range(relation_heads):
            for t in range(n):
                logits = np.array(
                    [x[t, a * d : (a + 1) * d] @ x[u, a * d : (a + 1) * d] for u in range(n)]
                ) / math.sqrt(d)
                out[a, t] = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        return out

    rows = []
    for x in range(BATCH):
        n = LENGTHS[x]
        row = []
        for field in ("queries", "keys", "values"):
            r_t = relations(getattr(teacher, field)[teacher_layer - 1][x].double().numpy(), n)
            r_s = relations(getattr(student, field)[-1][x].double().numpy(), n)
            row.append(float(np.sum(r_t * np.log(r_t / r_s))) / (relation_heads * n))
        rows.append(row)
    return np.array(rows)


@pytest.mark.parametrize("teacher_layer", [None, 2])
def test_minilm_v2_relations_follow_the_paper(teacher_layer):
    # different widths and head counts: relation heads free the student from both
    teacher_spec, student_spec = TokenSpec(layers=3, width=12, heads=3), TokenSpec(layers=2, width=8, heads=2)
    options = {"relation_heads": 4} | ({"teacher_layer": teacher_layer} if teacher_layer else {})
    projector = kdplug.create_projector("minilm-v2", request(teacher_spec, student_spec), **options)
    teacher, student = signals(teacher_spec, 3), signals(student_spec, 4)
    terms = projector(inputs(teacher, student)).terms
    expected = minilm_reference(teacher, student, teacher_layer or 3, 4)
    np.testing.assert_allclose(terms.detach().double().numpy(), expected, rtol=1e-5, atol=1e-7)


def test_minilm_v2_identical_relations_cost_nothing():
    spec = TokenSpec(layers=2, width=8, heads=2)
    projector = kdplug.create_projector("minilm-v2", request(spec, spec), relation_heads=2)
    same = signals(spec, 5)
    assert float(projector(inputs(same, same)).terms.abs().max()) < 1e-6
    assert float(projector(inputs(same, signals(spec, 6))).terms.min()) > 0


def test_minilm_v2_relation_heads():
    spec = lambda width: TokenSpec(6, width, 12)  # noqa: E731
    assert (
        kdplug.create_projector("minilm-v2", request(spec(768), spec(384))).relation_heads == 48
    )  # the paper's, base size
    assert kdplug.create_projector("minilm-v2", request(spec(1024), spec(384))).relation_heads == 64  # large size
    # TinyBERT4's 312 under BERT-base: 48 does not divide 312, the largest count below it that divides both is 24
    assert kdplug.create_projector("minilm-v2", request(spec(768), spec(312))).relation_heads == 24
    with pytest.raises(UsageError, match="must divide both widths"):
        kdplug.create_projector("minilm-v2", request(spec(768), spec(384)), relation_heads=5)
    with pytest.raises(UsageError, match="teacher layers are numbered 1..6"):
        kdplug.create_projector("minilm-v2", request(spec(768), spec(384)), teacher_layer=7)


# -- reading the signals of a real encoder -------------------------------------------------------


def test_captured_queries_and_keys_are_the_models_own(tiny_bert_dir):
    """The hooks give each block's Q and K as the model computed them: their softmax(QKᵀ/√d + mask)
    equals the attention probabilities transformers itself returns (eager attention)."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    batch = tokenizer(["the movie was great", "bad"], padding=True, return_tensors="pt")
    from kdplug_models.hf import HFEncoderExtractor
    from kdplug_models.tokens import forward_with_tokens

    with torch.no_grad():
        outputs, tokens = forward_with_tokens(
            model, lambda: model(**batch, output_hidden_states=True, output_attentions=True), batch["attention_mask"]
        )
    assert (
        len(tokens.hidden) == model.config.num_hidden_layers + 1
        and len(tokens.queries) == model.config.num_hidden_layers
    )
    for layer in range(1, model.config.num_hidden_layers + 1):
        scores = tokens.attention_scores(layer)
        scores = scores.masked_fill(~tokens.mask[:, None, None, :], float("-inf"))
        torch.testing.assert_close(scores.softmax(-1), outputs.attentions[layer - 1], atol=1e-5, rtol=1e-4)
    spec = HFEncoderExtractor().token_spec(model)
    assert (spec.layers, spec.width, spec.heads) == (
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.config.num_attention_heads,
    )


# -- runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_run(tmp_path_factory, tiny_bert_dir):
    data = write_sst2(tmp_path_factory.mktemp("data") / "SST-2", train=SST2_TRAIN * 4, dev=SST2_DEV * 2)
    argv = ["run", "--teacher", tiny_bert_dir, "--task", "sst2", "--data-dir", str(data), "--student", "bert-2"]
    argv += [
        "--projector",
        "tinybert",
        "--epochs",
        "2",
        "--set",
        "teacher_epochs=1",
        "--set",
        "allow_weak_teacher=true",
    ]
    argv += ["--set", "batch_size=4", "--set", "checkpoint_every=5", "--set", "precision=fp32"]
    return argv


def finished(run_dir):
    return json.loads((run_dir / "metrics.json").read_text()), load_file(str(run_dir / "student" / "model.safetensors"))


def test_a_pooled_student_is_refused_before_any_work(token_run, tmp_path, capsys):
    argv = [*token_run[: token_run.index("bert-2")], "bilstm", *token_run[token_run.index("bert-2") + 1 :]]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 2
    assert "no tokens or attention" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_tinybert_runs_its_two_stages_with_the_teacher_in_the_loop(token_run, tmp_path):
    assert main([*token_run, "--output", str(tmp_path / "run")]) == 0
    metrics, _ = finished(tmp_path / "run")
    intermediate, prediction = metrics["stages"]["intermediate"], metrics["stages"]["prediction"]
    assert intermediate["teacher_in_the_loop"] is True and "teacher_in_the_loop" not in prediction
    assert intermediate["weights"] == {"ce": 0.0, "eta": 0.0, "lam": 1.0, "temperature": 1.0}
    assert prediction["weights"]["eta"] == 1.0 and prediction["weights"]["ce"] == 0.0
    assert intermediate["best_epoch"] == 2 and "kept" in intermediate  # dev cannot judge a stage that trains no head
    assert [h["train"]["ild"] for h in intermediate["history"]][-1] < intermediate["history"][0]["train"]["ild"]


def test_the_teacher_in_the_loop_resumes_exactly_after_a_kill(token_run, tmp_path, monkeypatch):
    monkeypatch.setenv("KDPLUG_CACHE", str(tmp_path / "cache"))
    assert main([*token_run, "--output", str(tmp_path / "reference")]) == 0
    expected_metrics, expected_weights = finished(tmp_path / "reference")

    run_dir = tmp_path / "run"
    # mid-epoch, 3 steps after a checkpoint
    killed = interrupted_run(token_run, run_dir, KDPLUG_SIGNAL_AT="intermediate:2:8:SIGKILL")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (run_dir / "checkpoints" / "intermediate" / "state.json").is_file()
    assert main(["run", "--resume", str(run_dir)]) == 0
    metrics, weights = finished(run_dir)
    for stage in ("intermediate", "prediction"):
        history = [h["train"]["loss"] for h in metrics["stages"][stage]["history"]]
        expected = [h["train"]["loss"] for h in expected_metrics["stages"][stage]["history"]]
        assert history == pytest.approx(expected, abs=1e-6)
    assert metrics["student"]["dev"] == expected_metrics["student"]["dev"]
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-6, rtol=0)

"""The capacity-gap recipes (DIH, TAKD, Annealing KD) against METHODS.md, and each one end to end.

The losses and schedules are checked against values computed here with plain ``math`` from the
definitions, on tiny hand-made tensors; the end-to-end runs go through ``kdplug run`` with a tiny
random BERT teacher and a tiny BiLSTM student.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_model

import kdplug
from kdplug import fingerprint
from kdplug.cli import main
from kdplug.errors import ConfigError
from kdplug.testing import tiny_run_args
from kdplug.types import LayerSpec, StepState
from kdplug_recipes.annealing import AnnealingObjective, annealing_multiplier
from kdplug_recipes.dih import DIHObjective, default_head_layers, head_positions
from kdplug_recipes.takd import Link, link_key, plan_chain

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2


def softmax(values, tau=1.0):
    exps = [math.exp(v / tau) for v in values]
    return [e / sum(exps) for e in exps]


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def state(student, labels, teacher=None, heads=None):
    return StepState(
        student_logits=torch.tensor(student),
        student_layers=[],
        labels=torch.tensor(labels),
        teacher_logits=None if teacher is None else torch.tensor(teacher),
        teacher_layers=None,
        teacher_head_logits=None if heads is None else torch.tensor(heads),
        pairs=None,
    )


# -- DIH --------------------------------------------------------------------------------------


def dih_objective(alpha, tau, positions):
    return DIHObjective(
        alpha=alpha,
        head_positions=positions,
        kd_loss=kdplug.create_loss("kd", temperature=tau),
        task_loss=kdplug.create_loss("ce"),
    )


def test_dih_loss_keeps_the_references_kd_to_ce_ratio():
    # reference: sum_h [alpha tau^2 KL_h + (1 - alpha) CE] over the final output and the heads;
    # kdplug divides it by the number of terms: alpha * mean_h(tau^2 KL_h) + (1 - alpha) * CE
    student, teacher, labels = [[1.0, 0.0], [0.0, 2.0]], [[2.0, 0.0], [0.5, 0.5]], [0, 1]
    heads = [[[0.0, 1.0], [1.0, 1.0]], [[3.0, 0.0], [0.0, 0.0]]]  # (B=2, n=2, C=2)
    alpha, tau = 0.1, 5.0
    targets = [[teacher[b]] + heads[b] for b in range(2)]  # final output, head 1, head 2
    kd_terms = [
        tau**2 * sum(kl(softmax(targets[b][h], tau), softmax(student[b], tau)) for b in range(2)) / 2 for h in range(3)
    ]
    ce = sum(-math.log(softmax(student[b])[labels[b]]) for b in range(2)) / 2
    reference = sum(alpha * kd_h + (1 - alpha) * ce for kd_h in kd_terms)
    terms = dih_objective(alpha, tau, [0, 1])(state(student, labels, teacher, heads))
    assert terms["kd"].item() == pytest.approx(sum(kd_terms) / 3, rel=1e-5)
    assert terms["ce"].item() == pytest.approx(ce, rel=1e-5)
    assert terms["loss"].item() == pytest.approx(reference / 3, rel=1e-5)

    only_second = dih_objective(alpha, tau, [1])(state(student, labels, teacher, heads))
    assert only_second["kd"].item() == pytest.approx((kd_terms[0] + kd_terms[2]) / 2, rel=1e-5)


def test_dih_kd_to_ce_ratio_does_not_grow_with_the_number_of_heads():
    student, labels = [[1.0, 0.0], [0.0, 2.0]], [0, 1]
    teacher = [[1.0, 0.0], [0.0, 2.0]]  # identical to the student: every KD term is 0
    heads = [[[1.0, 0.0]] * 24, [[0.0, 2.0]] * 24]
    few = dih_objective(0.1, 5.0, [0])(state(student, labels, teacher, heads))
    many = dih_objective(0.1, 5.0, list(range(24)))(state(student, labels, teacher, heads))
    assert many["loss"].item() == pytest.approx(few["loss"].item(), abs=1e-6)  # CE keeps weight 0.9 either way


@pytest.mark.parametrize(
    "n, expected", [(12, [3, 6, 9]), (24, [6, 12, 18]), (6, [2, 3, 5]), (4, [1, 2, 3]), (2, [1]), (1, [])]
)
def test_dih_default_heads_sit_at_a_quarter_half_and_three_quarters(n, expected):
    assert default_head_layers(n) == expected
    assert n not in default_head_layers(n)  # never the last layer: its head would repeat the teacher's output


def test_dih_layers_select_heads_by_teacher_layer_index():
    specs = [LayerSpec(i, 8, "transformer") for i in range(1, 7)]
    assert head_positions(specs, None) == [1, 2, 4]  # layers 2, 3, 5 of 6
    assert head_positions(specs, [2, 4, 6]) == [1, 3, 5]
    assert head_positions(specs, 3) == [2]
    with pytest.raises(ConfigError, match=r"layers=\[0, 7\].*\[1, 2, 3, 4, 5, 6\]"):
        head_positions(specs, [0, 7])


# -- Annealing KD -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "e1, tau_max, expected",
    [
        (10, 10, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),  # the GLUE defaults: one step per epoch
        (6, 3, [1 / 3, 1 / 3, 2 / 3, 2 / 3, 1.0, 1.0]),  # ⌊6/3⌋ = 2 epochs per step
        (10, 3, [1 / 3] * 3 + [2 / 3] * 3 + [1.0] * 4),  # t stops at τ_max
        (2, 10, [0.5, 1.0]),  # E1 < τ_max: t = ⌈e·τ_max/E1⌉, still ending on the full logits
        (3, 10, [0.4, 0.7, 1.0]),
    ],
)
def test_annealing_multiplier_per_epoch(e1, tau_max, expected):
    assert [annealing_multiplier(epoch, e1, tau_max) for epoch in range(1, e1 + 1)] == pytest.approx(expected)


def test_annealing_phase1_is_mse_to_scaled_teacher_logits_without_labels():
    objective = AnnealingObjective(tau_max=10, loss=kdplug.create_loss("mse"))
    student, teacher = [[1.0, -1.0], [0.5, 2.0]], [[4.0, -2.0], [1.0, 6.0]]
    objective.set_epoch(3, 10)  # φ = 0.3
    expected = sum((s - 0.3 * t) ** 2 for row_s, row_t in zip(student, teacher) for s, t in zip(row_s, row_t)) / 4
    with_labels = objective(state(student, [0, 1], teacher))
    assert with_labels["loss"].item() == pytest.approx(expected, rel=1e-6)
    assert with_labels["phi"].item() == pytest.approx(0.3)
    assert objective(state(student, [1, 0], teacher))["loss"].item() == with_labels["loss"].item()  # no labels


# -- TAKD -------------------------------------------------------------------------------------


def test_takd_chain_runs_teacher_side_first_and_ends_with_the_student():
    chain = plan_chain(["bert-4", {"name": "bilstm", "hidden_size": 8}], "gated-cnn", {"hidden_size": 16})
    assert chain == [
        Link("bert-4"),
        Link("bilstm", {"hidden_size": 8}),
        Link("gated-cnn", {"hidden_size": 16}, final=True),
    ]
    assert plan_chain("roberta-base", "distilroberta") == [Link("roberta-base"), Link("distilroberta", final=True)]
    with pytest.raises(ConfigError, match="ta is empty"):
        plan_chain([], "bilstm")
    with pytest.raises(ConfigError, match="name or"):
        plan_chain([{"hidden_size": 8}], "bilstm")


def test_takd_link_key_chains_through_the_previous_link():
    first, second = Link("bert-4"), Link("bilstm", {"hidden_size": 8})
    key1 = link_key("teacher-fp", first, "data", {"epochs": 3})
    key2 = link_key(key1, second, "data", {"epochs": 3})
    assert key2 == link_key(link_key("teacher-fp", first, "data", {"epochs": 3}), second, "data", {"epochs": 3})
    other_first = link_key("teacher-fp", Link("bert-3"), "data", {"epochs": 3})
    assert link_key(other_first, second, "data", {"epochs": 3}) != key2  # a new TA 1 invalidates TA 2
    assert link_key("other-teacher", first, "data", {"epochs": 3}) != key1
    assert link_key("teacher-fp", first, "data", {"epochs": 4}) != key1


# -- end to end -------------------------------------------------------------------------------


def tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, recipe, *extra, output="run"):
    argv = [
        "run",
        *tiny_run_args(
            teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), projector=None, epochs=2, head_epochs=2
        ),
        "--recipe",
        recipe,
        *extra,
        "--output",
        str(tmp_path / output),
    ]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads((tmp_path / output / "metrics.json").read_text())


def test_dih_run_warms_up_heads_then_distils_from_the_selected_ones(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "dih", "--set", "recipe_options.layers=[2, 4]")
    stages = metrics["stages"]
    assert list(stages) == ["teacher_heads", "distill"]
    heads = stages["teacher_heads"]
    assert len(heads["best_held_out_loss"]) == 4  # one head per tiny-BERT layer
    # selected on a held-out tenth of train (12 examples: index 9), never on the dev split
    assert (heads["trained_on"], heads["held_out"]) == (11, 1) and "held out" in heads["selection"]
    assert stages["distill"]["heads"] == [2, 4]
    assert stages["distill"]["weights"] == {"ce": 0.9, "eta": 0.1, "lam": 0.0, "temperature": 5.0}
    assert {"kd", "ce", "loss"} <= set(stages["distill"]["history"][0]["train"])
    assert metrics["student"]["recipe"] == "dih"

    # the same fine-tuned teacher and training data with other dev data: the heads do not depend
    # on dev, so they are reused
    stored = metrics["teacher"]["finetuned"]["stored"]
    (sst2_dir / "dev.tsv").write_text("sentence\tlabel\nthe film was fun .\t1\nthe plot was dull .\t0\n")
    again = tiny_run(capsys, tmp_path, stored, sst2_dir, "dih", output="again")
    assert "reused" in again["stages"]["teacher_heads"] and again["stages"]["teacher_heads"]["held_out"] == 1
    assert again["stages"]["distill"]["heads"] == [1, 2, 3]  # n/4, n/2, 3n/4 of the 4 layers


def test_annealing_run_scales_the_teacher_up_then_fine_tunes(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    metrics = tiny_run(
        capsys,
        tmp_path,
        tiny_bert_dir,
        sst2_dir,
        "annealing",
        "--set",
        "recipe_options.e1=3",
        "--set",
        "recipe_options.e2=1",
        "--set",
        "recipe_options.tau_max=3",
    )
    phase1, phase2 = metrics["stages"]["phase1"], metrics["stages"]["phase2"]
    assert [h["train"]["phi"] for h in phase1["history"]] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert "ce" not in phase1["history"][0]["train"]  # phase 1 sees no labels
    assert len(phase2["history"]) == 1 and set(phase2["history"][0]["train"]) == {"ce", "loss"}


def test_annealing_phase1_runs_its_whole_schedule_whatever_the_patience(capsys, tmp_path, tiny_bert_dir):
    # a teacher that learns (75% on dev) and a student that reaches 100% in phase 1's 4th epoch: with
    # patience 1 the 5th epoch, no better, would end phase 1 at phi = 5/6, short of the full logits
    data = write_sst2(tmp_path / "SST-2", train=SST2_TRAIN * 4, dev=SST2_DEV * 2)
    learns = ["--set", "teacher_epochs=15", "--set", "teacher_lr=0.003", "--set", "lr=0.01", "--set", "batch_size=4"]
    schedule = ["--set", "recipe_options.e1=6", "--set", "recipe_options.tau_max=6", "--set", "recipe_options.e2=1"]
    stopping = ["--set", "patience=1", "--set", "min_epochs=1"]
    metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, data, "annealing", *learns, *schedule, *stopping)
    phase1 = metrics["stages"]["phase1"]
    assert [h["epoch"] for h in phase1["history"]] == [1, 2, 3, 4, 5, 6] and "stopped_early" not in phase1
    assert phase1["history"][-1]["train"]["phi"] == pytest.approx(1.0) and phase1["patience"] == 0
    assert metrics["stages"]["phase2"]["patience"] == 1  # the run's patience is phase 2's


def test_takd_run_trains_each_link_from_the_last_and_reuses_the_ta(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    ta = ["--set", "recipe_options.ta=[bert-2]"]
    metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "takd", *ta)
    stages = metrics["stages"]
    assert list(stages) == ["link1-bert-2", "link2-bilstm"]
    link1, link2 = stages["link1-bert-2"], stages["link2-bilstm"]
    assert link1["teacher"] == tiny_bert_dir and link2["teacher"] == "bert-2 (link 1)"
    assert link1["dev"] and link2["dev"] and link1["weights"]["eta"] == 0.7  # RKD's defaults

    # link 2 learnt from link 1's stored model: its teacher fingerprint is that model's, and the
    # teacher cache it read was built from that model
    task = kdplug.create_task("sst2", str(sst2_dir))
    ta_model = kdplug.create_student("bert-2", task, kdplug.create_teacher("hf", task, source=tiny_bert_dir))
    load_model(ta_model, f"{link1['stored']}/model.safetensors")
    assert link2["teacher_fingerprint"] == fingerprint.of_module(ta_model) != link1["teacher_fingerprint"]
    metas = [
        json.loads(path.read_text()) for path in Path(os.environ["KDPLUG_CACHE"]).glob("teacher-cache/*/meta.json")
    ]
    assert {m["description"]["split"] for m in metas if m["description"]["teacher"] == link1["stored"]} == {
        "train",
        "dev",
    }

    again = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "takd", *ta, output="again")
    assert again["stages"]["link1-bert-2"]["reused"] == link1["stored"]
    assert again["stages"]["link1-bert-2"]["dev"] == link1["dev"]  # the link's result is still reported
    untimed = lambda history: [{k: v for k, v in epoch.items() if k != "seconds"} for epoch in history]  # noqa: E731
    assert untimed(again["stages"]["link2-bilstm"]["history"]) == untimed(link2["history"])  # the same student


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, options",
    [
        ("dih", []),
        ("annealing", ["--set", "recipe_options.e1=2", "--set", "recipe_options.e2=1"]),
        ("takd", ["--set", "recipe_options.ta=[bert-3]"]),
    ],
)
def test_recipe_with_the_minilm_teacher_on_the_demo_task(capsys, tmp_path, recipe, options):
    argv = [
        "run",
        *tiny_run_args(
            teacher="minilm", task="demo", projector=None, head_epochs=1, task_options={"num_train": 64, "num_dev": 32}
        ),
        "--recipe",
        recipe,
        *options,
        "--output",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 0, capsys.readouterr().out
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["stages"] and 0.0 <= metrics["student"]["dev"]["dev"]["accuracy"] <= 1.0


class _RecordingContext:
    """Runs a recipe's schedule without training: the real weight resolution, stages recorded."""

    def __init__(self, config):
        from kdplug.types import Settings

        self.settings = Settings(config.to_dict())
        self.config = config
        self.stages = {}

    def new_student(self):
        return object()

    def new_projector(self, student):
        return type("UniversalLike", (), {"default_weights": {"eta": 0.5, "lam": 0.5, "temperature": 1.0}})()

    def weights(self, projector, **given):
        from kdplug.engine.recipe import stage_weights

        return stage_weights(self.config, projector, **given)

    def train_stage(self, name, student, projector, *, weights, **options):
        self.stages[name] = weights


@pytest.mark.parametrize("beta", [None, 0.7])
@pytest.mark.parametrize("eta", [None, 0.2])
@pytest.mark.parametrize("lam", [None, 0.3, 0.8])
@pytest.mark.parametrize("ce_weight", [None, 0.4])
def test_two_stage_stage1_never_has_a_ce_term(beta, eta, lam, ce_weight):
    # Universal-KD (Wu et al. 2021) stage 1: L = beta KD + (1 - beta) L_Univ, no CE whatever is set
    from kdplug.config import RunConfig
    from kdplug_recipes.basic import TwoStage

    config = RunConfig(eta=eta, lam=lam, ce_weight=ce_weight)
    context = _RecordingContext(config)
    TwoStage(beta=beta).run(context)
    stage1, stage2 = context.stages["stage1"], context.stages["stage2"]
    expected = beta if beta is not None else eta if eta is not None else 1 - lam if lam is not None else 0.5
    assert stage1.ce == 0 and stage1.eta == pytest.approx(expected) and stage1.lam == pytest.approx(1 - expected)
    assert stage2.ce == 1 and stage2.eta == 0 and stage2.lam == 0


def test_a_staged_baseline_runs_its_own_schedule(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    # --baseline universal-ca: Universal-KD's two stages (stage 1 without CE, stage 2 CE only),
    # with the projector's own weights, not the run's eta
    metrics = tiny_run(
        capsys, tmp_path, tiny_bert_dir, sst2_dir, "standard", "--baseline", "universal-ca", "--set", "eta=0.9"
    )
    stages = metrics["stages"]
    stage1, stage2 = stages["baseline-universal-ca-stage1"], stages["baseline-universal-ca-stage2"]
    assert stage1["weights"]["ce"] == 0 and stage1["weights"]["lam"] > 0
    assert (stage2["weights"]["ce"], stage2["weights"]["eta"], stage2["weights"]["lam"]) == (1.0, 0.0, 0.0)
    assert [h["epoch"] for h in stage2["history"]] == [1, 2]
    assert metrics["baseline"]["recipe"] == "two-stage"
    assert stages["distill"]["weights"]["eta"] == 0.9  # the run's own student keeps the run's settings
    # the baseline's reported score is its final (stage-2) student's, evaluated on dev
    assert metrics["baseline"]["dev"]["dev"]["accuracy"] == pytest.approx(
        next(h["dev"]["dev"]["accuracy"] for h in stage2["history"] if h["epoch"] == stage2["best_epoch"])
    )


def test_a_universal_kd_baseline_trains_at_the_papers_temperature_and_kd_loss(
    capsys, tmp_path, tiny_bert_dir, sst2_dir
):
    # Universal-KD (eq. 1, appendix A: "We set T to 1 for all experiments"): stage 1 is
    # beta * 1^2 KL(σ(z_t) ‖ σ(z_s)) + (1 - beta) * L_Univ, whatever temperature and logit loss the run
    # chose for its own projector
    argv = ("--baseline", "universal-il", "--set", "temperature=4", "--set", "kd_loss=dist", "--set", "ild_loss=mse")
    metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "standard", "--projector", "pkd-skip", *argv)
    stage1 = metrics["stages"]["baseline-universal-il-stage1"]
    assert stage1["weights"] == {"ce": 0.0, "eta": 0.5, "lam": 0.5, "temperature": 1.0}
    assert stage1["losses"] == {"kd": {"name": "kd", "temperature": 1.0}, "ild": {"name": "kl"}}
    assert metrics["stages"]["baseline-universal-il-stage2"]["weights"]["temperature"] == 1.0
    distill = metrics["stages"]["distill"]  # the run's own student keeps the run's settings
    assert distill["losses"] == {"kd": {"name": "dist", "temperature": 4.0}, "ild": {"name": "mse"}}
    log = (tmp_path / "run" / "log.txt").read_text()
    line = next(line for line in log.splitlines() if "stage baseline-universal-il-stage1:" in line)
    assert "temperature 1, kd loss kd, ild loss kl" in line
    assert "not with the run's temperature 4, kd_loss 'dist', ild_loss 'mse'" in line


def test_a_bilstm_distilled_with_pkd_is_exported_without_the_learned_map(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    # the BiLSTM is as wide as the tiny teacher (32): only the learned map puts its layers beside the teacher's
    extra = ("--projector", "pkd-skip", "--set", "student_options.hidden_size=32")
    metrics = tiny_run(capsys, tmp_path, tiny_bert_dir, sst2_dir, "standard", *extra)
    assert "ild" in metrics["stages"]["distill"]["history"][0]["train"]
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    with safe_open(str(tmp_path / "run" / "student" / "model.safetensors"), "pt") as exported:
        names = list(exported.keys())
    assert names and not [n for n in names if "adapter" in n or "projector" in n]
    _, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "student", output_loading_info=True)
    assert not any(info.values())  # nothing missing, nothing unexpected


def test_a_student_from_scratch_on_few_labels_is_told_about_transfer_sets(capsys, tmp_path, tiny_bert_dir, sst2_dir):
    common = dict(teacher=tiny_bert_dir, task="sst2", data_dir=str(sst2_dir), measure_speed=False)
    outputs = {}
    for name, argv in {
        "rkd": tiny_run_args(**common),
        "nkd": tiny_run_args(**common, projector="nkd"),  # no teacher: nothing for a transfer set to teach
        "augmented": [*tiny_run_args(**common), "--augment", "tang", "--augment-factor", "2"],
        "bert": tiny_run_args(**common, student="bert-1", student_options=None),  # pre-trained, not from scratch
    }.items():
        assert main(["run", *argv, "--output", str(tmp_path / name)]) == 0
        outputs[name] = capsys.readouterr().out
    assert "tip: a student trained from scratch on 12 labelled examples" in outputs["rkd"]
    tip = next(line for line in outputs["rkd"].splitlines() if line.startswith("tip: "))
    assert "--augment tang" in tip and "docs/transfer-sets.md" in tip and "{" not in tip
    assert "movie snippets" in tip and "tweets" in tip  # it promises what was measured, and on which data
    assert not [name for name in ("nkd", "augmented", "bert") if "tip: a student trained" in outputs[name]]


def test_a_stray_keyword_to_train_stage_is_named_as_train_stages():
    """A recipe author reads their own ``ctx.train_stage(...)`` call, not the engine's StageRequest:
    the error names train_stage, the stray keyword and the ones it takes (before any work)."""
    from types import SimpleNamespace

    from kdplug.engine.recipe import EngineContext

    with pytest.raises(TypeError) as caught:  # refused before the context is used beyond its stage prefix
        EngineContext.train_stage(SimpleNamespace(stage_prefix=""), "stage", torch.nn.Linear(2, 2), temprature=2.0)
    message = str(caught.value)
    assert message.startswith("train_stage() got an unexpected keyword argument 'temprature'"), message
    assert "StageRequest" not in message and "epochs, lr, objective, patience, weights" in message, message

"""Teacher ensembles: the target is the weighted mean of the members' probabilities at the run's
temperature (checked against the formula computed here, in float64, from each member model run
directly, and inside the real training step); each member is cached under its own key, so changing
one recomputes only its outputs; a member whose labels are not the task's is refused before training."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kdplug.cli import main
from kdplug.engine.ensemble import EnsembleCache
from kdplug.testing import tiny_run_args
from kdplug.testing.tiny import make_tiny_classifier
from kdplug_methods.losses import KDLoss

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

ROOT = Path(__file__).resolve().parents[2]


def inference_benchmark():
    """benchmarks/inference.py as a module (it sets two environment variables and sys.path: undone after)."""
    import importlib.util

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "path", list(sys.path))
        for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
            patch.delenv(name, raising=False)  # recorded: what the module sets is undone on leaving
        spec = importlib.util.spec_from_file_location("inference_benchmark", ROOT / "benchmarks" / "inference.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


TEMPERATURE = 3.0
#: one student epoch from teachers used as given (their heads fit the task: never fine-tuned), in fp32 as
#: the reference computes them (this CPU runs the teacher in bf16 under auto)
SETTINGS = dict(epochs=1, teacher_epochs=None, batch_size=4, temperature=TEMPERATURE, precision="fp32")


def sharp_classifier(path, seed: int) -> str:
    """A tiny classifier whose logits differ from example to example by units (a random head's are
    all near 0, and would hide a wrong row behind a small difference): its head scaled up, and
    centred on the task's sentences."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    make_tiny_classifier(path, seed=seed)
    model, tokenizer = BertForSequenceClassification.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    texts = [text for text, _ in SST2_TRAIN + SST2_DEV]
    with torch.no_grad():
        model.classifier.weight.mul_(1000.0)
        model.classifier.bias.zero_()
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
        model.classifier.bias.copy_(-logits.mean(dim=0))
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """Tiny classifiers of the task's labels (three seeds) and one whose labels are other names."""
    root = tmp_path_factory.mktemp("members")
    return {
        "a": sharp_classifier(root / "a", seed=0),
        "b": sharp_classifier(root / "b", seed=1),
        "c": sharp_classifier(root / "c", seed=2),
        "other_labels": make_tiny_classifier(root / "other", label_names=["bad", "good"], seed=3),
    }


@pytest.fixture
def sst2_dir(tmp_path):
    return write_sst2(tmp_path / "SST-2", dev=SST2_DEV * 3)


def teachers(*entries) -> str:
    """``--set teachers=[...]``: each entry a path, or (path, weight)."""
    parts = [f"{{teacher: {e}}}" if isinstance(e, str) else f"{{teacher: {e[0]}, weight: {e[1]}}}" for e in entries]
    return f"teachers=[{', '.join(parts)}]"


def run(capsys, data, output, *extra):
    code = main(["run", *tiny_run_args(task="sst2", data_dir=data, **SETTINGS), *extra, "--output", str(output)])
    captured = capsys.readouterr()
    metrics_path = output / "metrics.json"
    return code, captured.out + captured.err, json.loads(metrics_path.read_text()) if metrics_path.exists() else {}


def member_logits(path: str, texts: list[str]) -> np.ndarray:
    """The member's logits, from its checkpoint run directly by transformers, one text at a time."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    tokenizer, model = AutoTokenizer.from_pretrained(path), BertForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return np.stack([model(**tokenizer(text, return_tensors="pt")).logits[0].double().numpy() for text in texts])


def mean_probabilities(logits: list[np.ndarray], weights: list[float], temperature: float) -> np.ndarray:
    """sum_i w_i softmax(z_i / T), in float64."""
    total = 0.0
    for z, w in zip(logits, weights):
        e = np.exp(z / temperature - (z / temperature).max(axis=1, keepdims=True))
        total = total + w * e / e.sum(axis=1, keepdims=True)
    return total


def test_the_target_is_the_weighted_mean_of_the_members_probabilities_and_the_student_learns_it(
    capsys, tmp_path, sst2_dir, members, monkeypatch
):
    fetched, kd_terms = [], []
    original_fetch, original_kd = EnsembleCache.fetch, KDLoss.forward

    def fetch(self, index, device="cpu"):
        logits, layers = original_fetch(self, index, device)
        fetched.append((index.clone(), logits.clone(), self.temperature))
        return logits, layers

    def kd(self, student_logits, teacher_logits, weights=None):
        value = original_kd(self, student_logits, teacher_logits, weights)
        kd_terms.append((student_logits.detach().double().clone(), teacher_logits.clone(), float(value.detach())))
        return value

    monkeypatch.setattr(EnsembleCache, "fetch", fetch)
    monkeypatch.setattr(KDLoss, "forward", kd)
    code, out, metrics = run(capsys, sst2_dir, tmp_path / "run", "--set", teachers(members["a"], (members["b"], 3)))
    assert code == 0, out

    # the formula, computed here from each member's own logits: weights 1 and 3 are 0.25 and 0.75
    texts = [text for text, _ in SST2_TRAIN]
    reference = mean_probabilities([member_logits(members[m], texts) for m in ("a", "b")], [0.25, 0.75], TEMPERATURE)
    index, logits, temperature = fetched[0]
    assert temperature == TEMPERATURE
    assert np.ptp(reference[:, 1]) > 0.01  # the members' probabilities differ from example to example
    target = torch.softmax(logits.double() / TEMPERATURE, dim=-1).numpy()
    np.testing.assert_allclose(target, reference[index.numpy()], atol=1e-6, rtol=0)
    # ... and the KD term of the first training step is τ²·KL(target ‖ student) against that reference
    student, teacher_logits, value = kd_terms[0]
    assert torch.equal(teacher_logits, logits)
    log_student = torch.log_softmax(student / TEMPERATURE, dim=-1).numpy()
    rows = reference[index.numpy()]
    expected = TEMPERATURE**2 * np.mean(np.sum(rows * (np.log(rows) - log_student), axis=1))
    assert value == pytest.approx(expected, rel=0, abs=1e-6)  # the loss sums float32 terms of about 0.3

    teacher = metrics["teacher"]
    assert teacher["ensemble"]["weights"] == [0.25, 0.75] and teacher["ensemble"]["temperature"] == TEMPERATURE
    assert [member["name"] for member in teacher["members"]] == [members["a"], members["b"]]
    # the ensemble's dev accuracy is the argmax of the mean on dev; each member's its own
    dev_texts = [text for text, _ in SST2_DEV * 3]
    dev_labels = np.array([label for _, label in SST2_DEV * 3])
    dev_logits = [member_logits(members[m], dev_texts) for m in ("a", "b")]
    ensemble_accuracy = (mean_probabilities(dev_logits, [0.25, 0.75], TEMPERATURE).argmax(1) == dev_labels).mean()
    assert teacher["dev"]["dev"]["accuracy"] == pytest.approx(ensemble_accuracy)
    for member, z in zip(teacher["members"], dev_logits):
        assert member["dev"]["dev"]["accuracy"] == pytest.approx((z.argmax(1) == dev_labels).mean())
    assert "ensemble of 2 teachers" in out and "teacher 1 (" in out  # the closing table's rows

    # the report's teacher column is the ensemble's, and it names the members; so does the model card
    assert main(["report", str(tmp_path / "run"), "--output", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "the teacher is an ensemble of 2" in report and f"dev accuracy {ensemble_accuracy * 100:.2f}" in report
    assert "`a` (weight 0.25" in report and "`b` (weight 0.75" in report
    card = (tmp_path / "run" / "student" / "README.md").read_text()
    assert "distilled from an ensemble of a + b" in card and "(weight 0.75)" in card


def reused(member: dict, split: str) -> bool:
    return member["cache"][split]["logits"]["reused"]


def test_changing_one_member_recomputes_only_its_outputs(capsys, tmp_path, sst2_dir, members):
    code, out, single = run(capsys, sst2_dir, tmp_path / "single", "--teacher", members["a"])
    assert code == 0, out
    code, out, first = run(capsys, sst2_dir, tmp_path / "ab", "--set", teachers(members["a"], members["b"]))
    assert code == 0, out
    a, b = first["teacher"]["members"]
    # a's entries are the ones its one-teacher run made: the same keys, reused
    assert a["cache"]["train"]["logits"]["key"] == single["teacher"]["cache"]["train"]["logits"]["key"]
    assert reused(a, "train") and reused(a, "dev") and not reused(b, "train") and not reused(b, "dev")

    code, out, second = run(capsys, sst2_dir, tmp_path / "ac", "--set", teachers(members["a"], members["c"]))
    assert code == 0, out
    a, c = second["teacher"]["members"]
    assert reused(a, "train") and reused(a, "dev") and not reused(c, "train") and not reused(c, "dev")
    assert c["cache"]["train"]["logits"]["key"] != b["cache"]["train"]["logits"]["key"]


def test_a_member_whose_labels_are_not_the_tasks_is_refused_before_training(capsys, tmp_path, sst2_dir, members):
    output = tmp_path / "run"
    code, out, metrics = run(capsys, sst2_dir, output, "--set", teachers(members["a"], members["other_labels"]))
    assert code == 2, out
    assert "teacher 1 (" in out and "['bad', 'good']" in out and "['negative', 'positive']" in out
    assert "--set 'teachers.1.teacher_options.label_map=" in out  # the member's own option
    assert "Traceback" not in out
    assert "stages" not in metrics and not (output / "checkpoints").exists()


def test_the_dry_run_lists_each_member_with_what_the_cache_holds_of_it(capsys, tmp_path, sst2_dir, members):
    code, out, _ = run(capsys, sst2_dir, tmp_path / "single", "--teacher", members["a"])
    assert code == 0, out
    code, out, _ = run(capsys, sst2_dir, tmp_path / "plan", "--set", teachers(members["a"], members["b"]), "--dry-run")
    assert code == 0, out
    assert "an ensemble of 2" in out
    first, second = (line for line in out.splitlines() if line.startswith("  member "))
    assert "member 0" in first and "weight 0.5" in first and "train cached, dev cached" in first
    assert "member 1" in second and "train computed once, then cached" in second
    assert not (tmp_path / "plan").exists()


def test_the_dry_runs_cache_size_and_time_count_every_member(capsys, tmp_path, sst2_dir, members):
    """Before, they counted the first member alone: half the bytes and the time of two."""
    code, out, _ = run(capsys, sst2_dir, tmp_path / "plan", "--set", teachers(members["a"], members["b"]), "--dry-run")
    assert code == 0, out
    examples = len(SST2_TRAIN) + len(SST2_DEV) * 3
    expected = 2 * examples * 2 * 4  # two members, each its float32 logits of two classes per example
    assert f"cache size: {expected:,} bytes: logits {expected:,}, no layer vectors" in out, out
    (time,) = (line for line in out.splitlines() if line.startswith("time "))
    assert re.search(r"teacher 0 \([^)]*\) outputs .*teacher 1 \([^)]*\) outputs", time), time


def test_the_speed_table_times_every_member_and_the_student_against_the_whole_ensemble(
    capsys, tmp_path, sst2_dir, members
):
    """Before, the ensemble's row had no speed and the student's speed-up was against member 0 alone."""
    both = ["--set", teachers(members["a"], members["b"]), "--set", "measure_speed=true"]
    code, out, metrics = run(capsys, sst2_dir, tmp_path / "run", *both)
    assert code == 0, out
    speed = metrics["speed"]
    first, second = speed["members"]
    ensemble, student = speed["teacher"], speed["student"]
    assert ensemble["parameters"] == first["parameters"] + second["parameters"] == metrics["teacher"]["parameters"]
    # run one after the other, the two take longer per example than either
    assert ensemble["throughput"] < min(first["throughput"], second["throughput"])
    assert ensemble["latency_ms"] > max(first["latency_ms"], second["latency_ms"])
    assert speed["speedup"] == pytest.approx(student["throughput"] / ensemble["throughput"], rel=1e-3)
    (row,) = (line for line in out.splitlines() if line.startswith("ensemble of 2 teachers  "))  # the table's
    assert row.rstrip().endswith("1.00x"), row
    # the model card quotes them too (before: the ensemble's row and the student's speed-up were left blank)
    card = (tmp_path / "run" / "student" / "README.md").read_text()
    (ensemble_row,) = (line for line in card.splitlines() if line.startswith("| teacher ensemble |"))
    (student_row,) = (line for line in card.splitlines() if line.startswith("| student |"))
    assert f"| {ensemble['latency_ms']:.2f} | {ensemble['throughput']:.0f} | 1.00x |" in ensemble_row, ensemble_row
    assert student_row.endswith(f"| {speed['speedup']:.2f}x |"), student_row


def test_a_served_member_and_an_in_process_one_and_the_served_ones_answers_reused(capsys, tmp_path, members):
    """A served language model (the test kit's OpenAI-compatible server on localhost) beside a checkpoint:
    each is asked once; changing the checkpoint sends the server no request on the next run."""
    from kdplug.testing.decoders import make_tiny_causal_lm
    from kdplug.testing.openai_server import OpenAIServer

    lm = make_tiny_causal_lm(tmp_path / "gpt2", "gpt2")
    data = write_sst2(tmp_path / "SST-2")
    prompt = {"prompt": "Review: {text}\nSentiment:", "verbalizer": {"negative": " bad", "positive": " good"}}
    with OpenAIServer(lm) as server:

        def config(checkpoint: str) -> str:
            served = {"base_url": server.base_url, "tokenizer": lm, **prompt}
            entries = [{"teacher": checkpoint}, {"teacher": f"served:{server.name}", "teacher_options": served}]
            path = tmp_path / f"ensemble-{len(list(tmp_path.glob('ensemble-*')))}.json"
            path.write_text(json.dumps({"teachers": entries}))
            return str(path)

        code, out, _ = run(
            capsys, data, tmp_path / "plan", "--config", config(members["a"]), "--augment", "tang", "--dry-run"
        )
        served_notes = [
            line for line in out.splitlines() if line.startswith(f"  note: teacher 1 (served:{server.name})")
        ]
        assert code == 0 and any("its transfer set at most" in line for line in served_notes), out  # was: no count
        assert server.requests["completions"] == 0
        code, out, first = run(
            capsys, data, tmp_path / "first", "--config", config(members["a"]), "--set", "measure_speed=true"
        )
        assert code == 0, out
        # no size, no speed and no speed-up for an ensemble with a served member (before: the size was the
        # checkpoint's alone, in the closing table and the model card)
        (row,) = (line for line in out.splitlines() if line.startswith("ensemble of 2 teachers  "))
        assert first["speed"]["teacher"] is None and first["speed"]["speedup"] is None
        card = (tmp_path / "first" / "student" / "README.md").read_text()
        (card_row,) = (line for line in card.splitlines() if line.startswith("| teacher ensemble |"))
        assert card_row.startswith("| teacher ensemble |  |  |") and card_row.endswith("|  |  |  |"), card_row
        assert "K " not in row and not re.search(r"\d+(\.\d+)?[KMB]\b", row.split("teachers", 1)[1]), row
        asked = server.requests["completions"]
        assert asked > 0 and set(server.answered.values()) == {1}
        code, out, second = run(capsys, data, tmp_path / "second", "--config", config(members["c"]))
        assert code == 0, out
        assert server.requests["completions"] == asked  # the served member's answers: all from the cache
    checkpoint, served_member = second["teacher"]["members"]
    assert reused(served_member, "train") and reused(served_member, "dev") and not reused(checkpoint, "train")
    assert "dev" in served_member and "dev" in second["teacher"]
    # benchmarks/inference.py --run times the checkpoint member and the student, the ensemble not at all, and
    # gives no ratio against it (before: it timed nothing and exited 1 at the served member)
    benchmark = inference_benchmark()
    teachers, served = benchmark._teachers(first["teacher"])
    assert [who for who, _ in teachers] == ["teacher 0"] and served == [f"served:{server.name}"]
    assert benchmark._with_ensemble([("teacher 0: fp32 PyTorch", {})], 0) == [("teacher 0: fp32 PyTorch", {})]
    cells = {
        "size": 0.1,
        "score": 0.5,
        **{f"{kind} t={t}": 1.0 for kind in ("ms b=1", "ex/s b=32") for t in (1, torch.get_num_threads())},
    }
    info = {"max_length": 8}
    benchmark._print_table(
        tmp_path,
        SimpleNamespace(name="sst2", main_metric="accuracy"),
        ["a"],
        info,
        1,
        [("student: fp32 PyTorch", cells)],
    )
    printed = capsys.readouterr().out
    assert "x: none: a served teacher, or an ensemble with a served member, has no time" in printed, printed


def test_a_layer_method_reads_the_named_members_layers_and_without_one_is_refused(capsys, tmp_path, sst2_dir, members):
    pair = ["--projector", "cka", "--set", teachers(members["a"], members["b"])]
    code, out, metrics = run(capsys, sst2_dir, tmp_path / "unnamed", *pair)
    assert code == 2 and "layer_teacher" in out and "Traceback" not in out, out
    assert "stages" not in metrics

    code, out, metrics = run(capsys, sst2_dir, tmp_path / "named", *pair, "--set", "layer_teacher=1")
    assert code == 0, out
    first, second = metrics["teacher"]["members"]
    assert first["cache"]["train"]["layers"] is None  # logits only: its layers are never read
    assert second["cache"]["train"]["layers"] is not None and metrics["teacher"]["ensemble"]["layer_teacher"] == 1


def test_a_layer_method_is_checked_against_the_layer_teacher_alone(capsys, tmp_path, sst2_dir, members):
    """PKD on a 4-layer layer teacher beside a 2-layer member whose layers it never reads: the dry run and
    the run go ahead (the 2-layer member was refused as if its layers were matched); named the other way
    round, the 2-layer one is refused before any stage."""
    deep = make_tiny_classifier(tmp_path / "deep", num_layers=4, seed=7)
    pair = ["--projector", "pkd-last", "--set", teachers(members["a"], deep)]
    code, out, _ = run(capsys, sst2_dir, tmp_path / "plan", *pair, "--set", "layer_teacher=1", "--dry-run")
    assert code == 0, out
    # the plan names the member whose layers are read (before: 'layers read by' under member 0's block alone)
    (second,) = (line for line in out.splitlines() if line.startswith("  member 1 "))
    assert second.endswith("; the layer teacher: layer methods read its layers") and "layers read by" not in out, out
    code, out, metrics = run(capsys, sst2_dir, tmp_path / "run", *pair, "--set", "layer_teacher=1")
    assert code == 0, out
    assert metrics["teacher"]["members"][1]["cache"]["train"]["layers"] is not None
    code, out, metrics = run(capsys, sst2_dir, tmp_path / "shallow", *pair, "--set", "layer_teacher=0")
    assert code == 2 and "2 layers cannot supply" in out and "Traceback" not in out, out
    assert "stages" not in metrics


def test_takd_keys_its_assistant_by_a_prompted_members_prompt(capsys, tmp_path, sst2_dir, members):
    """Two ensembles that differ only in a prompted member's prompt have different targets: the assistant
    TAKD trained for the first is not reused for the second (its key knew the member's weights alone)."""
    from kdplug.testing.decoders import make_tiny_causal_lm

    lm = make_tiny_causal_lm(tmp_path / "lm")
    verbalizer = "{negative: ' bad', positive: ' good'}"
    stored = []
    for prompt in ("Review: {text} Sentiment:", "Movie: {text} Verdict:"):
        options = f"teachers.1.teacher_options={{source: {lm}, prompt: '{prompt}', verbalizer: {verbalizer}}}"
        ensemble = ["--teacher", members["a"], "--teacher", "prompted-lm", "--set", options]
        code, out, metrics = run(capsys, sst2_dir, tmp_path / f"run{len(stored)}", *ensemble, "--recipe", "takd")
        assert code == 0, out
        link = metrics["stages"]["link1-bert-1"]
        assert link.get("reused") is None, link  # trained, not taken from the other ensemble's
        stored.append(link["stored"])
    assert stored[0] != stored[1]


def test_takd_keys_its_assistant_by_a_prompted_teachers_prompt_for_one_teacher_too(capsys, tmp_path, sst2_dir):
    """The same with one prompted teacher: its key was its weights alone, so a second prompt reused the
    assistant trained on the first prompt's target."""
    from kdplug.testing.decoders import make_tiny_causal_lm

    lm = make_tiny_causal_lm(tmp_path / "lm")
    stored = []
    for prompt in ("Review: {text} Sentiment:", "Movie: {text} Verdict:"):
        options = (
            f"teacher_options={{source: {lm}, prompt: '{prompt}', verbalizer: {{negative: ' bad', positive: ' good'}}}}"
        )
        teacher = ["--teacher", "prompted-lm", "--set", options, "--set", "allow_weak_teacher=true"]
        takd = ["--recipe", "takd", "--set", "recipe_options.ta=[{name: bilstm, hidden_size: 8}]"]
        code, out, metrics = run(capsys, sst2_dir, tmp_path / f"run{len(stored)}", *teacher, *takd)
        assert code == 0, out
        link = metrics["stages"]["link1-bilstm"]
        assert link.get("reused") is None, link
        stored.append(link["stored"])
    assert stored[0] != stored[1]


def test_the_combination_is_stable_for_confident_members_and_a_mean_of_scores_for_a_regression():
    from kdplug.engine.ensemble import combined_logits

    # one member sure of class 0 (a probability of e^-1000 for class 1), the other of class 1, weights 1/4 and 3/4
    z = combined_logits([np.array([[1000.0, 0.0]]), np.array([[0.0, 1000.0]])], [0.25, 0.75], 1.0, False)
    assert np.isfinite(z).all()
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(z).double(), -1).numpy(), [[0.25, 0.75]], atol=1e-7)
    scores = combined_logits([np.array([[1.0], [2.0]]), np.array([[3.0], [6.0]])], [0.25, 0.75], 2.0, True)
    np.testing.assert_allclose(scores, [[2.5], [5.0]])


def test_the_transfer_sets_target_is_the_members_mean_too(capsys, tmp_path, sst2_dir, members, monkeypatch):
    opened = []
    original = EnsembleCache.__init__

    def init(self, caches, combination):
        original(self, caches, combination)
        opened.append(self)

    monkeypatch.setattr(EnsembleCache, "__init__", init)
    transfer = tmp_path / "transfer.txt"
    transfer.write_text("a dull and lifeless plot\nwhat a wonderful film\nthe music was loud\n")
    both = teachers(members["a"], (members["b"], 3))
    code, out, metrics = run(capsys, sst2_dir, tmp_path / "run", "--set", both, "--transfer", str(transfer))
    assert code == 0, out
    assert len(metrics["transfer"]["teacher_cache"]["cache"]["members"]) == 2
    (target,) = [cache for cache in opened if len(cache) == 3]  # the transfer set's, at the run's temperature
    probabilities = [
        torch.softmax(torch.from_numpy(c.logits[:].copy()).double() / TEMPERATURE, -1) for c in target.members
    ]
    mean = 0.25 * probabilities[0] + 0.75 * probabilities[1]
    ensemble = torch.softmax(torch.from_numpy(target.logits).double() / TEMPERATURE, -1)
    np.testing.assert_allclose(ensemble.numpy(), mean.numpy(), atol=1e-6)


def stored_cache(root, key: str, logits: np.ndarray):
    """Logits stored as a teacher's cache entry (the cache's own writing and reading)."""
    from kdplug.engine.cache import open_or_build

    batch = (torch.arange(len(logits)), torch.from_numpy(logits.astype(np.float32)), [])
    return open_or_build(
        root,
        key,
        num_examples=len(logits),
        num_outputs=logits.shape[1],
        specs=[],
        compute=lambda *_: [batch],
        description={},
    )


def test_a_stage_at_another_temperature_reads_the_mean_at_its_own(tmp_path):
    """DIH's τ 5 or annealing's 1 on a run at 3: the stage reads softmax(z_ens / τ) = the members' mean at τ,
    the transfer set's rows too."""
    from kdplug.engine.cache import ConcatCache
    from kdplug.engine.ensemble import Combination, at_temperature

    rng = np.random.default_rng(0)
    z = [rng.normal(scale=4.0, size=(6, 3)) for _ in range(2)]
    members = [stored_cache(tmp_path, f"m{i}", z[i]) for i in range(2)]
    transfer = [stored_cache(tmp_path, f"t{i}", z[i][:2] + 1.0) for i in range(2)]
    combination = Combination(weights=(0.25, 0.75), temperature=3.0, regression=False)
    labelled, on_transfer = EnsembleCache(members, combination), EnsembleCache(transfer, combination)
    for tau in (1.0, 5.0):
        stage = at_temperature(ConcatCache(labelled, on_transfer), tau)
        logits, _ = stage.fetch(torch.arange(8))
        stored = [np.concatenate([m.logits[:], t.logits[:]]).astype(np.float64) for m, t in zip(members, transfer)]
        expected = mean_probabilities(stored, [0.25, 0.75], tau)
        np.testing.assert_allclose(torch.softmax(logits.double() / tau, -1).numpy(), expected, atol=1e-6)
    assert at_temperature(labelled, 3.0) is labelled and at_temperature(members[0], 5.0) is members[0]


def test_every_member_is_fine_tuned_once_whatever_the_members_before_it_did(capsys, tmp_path, sst2_dir, members):
    """Each member starts from the seed a one-teacher run of it starts from: the second member's random
    head (and so its stored fine-tuning) must not depend on whether the first was fine-tuned or reused."""
    from kdplug.testing.tiny import make_tiny_bert

    bases = [make_tiny_bert(tmp_path / f"base{seed}", num_layers=2, seed=seed) for seed in (0, 1)]  # heads random
    common = ["--set", teachers(*bases), "--set", "teacher_epochs=1", "--set", "teacher_seed=42"]
    code, out, first = run(capsys, sst2_dir, tmp_path / "seed42", *common, "--set", "seed=42")
    assert code == 0, out
    assert [("reused" in m["finetuned"]) for m in first["teacher"]["members"]] == [False, False]
    code, out, second = run(capsys, sst2_dir, tmp_path / "seed43", *common, "--set", "seed=43")
    assert code == 0, out
    assert [("reused" in m["finetuned"]) for m in second["teacher"]["members"]] == [True, True], out


def test_a_weak_members_advice_names_its_own_options(capsys, tmp_path):
    """A member judged weak was told `--set teacher_options.finetuned=false`, which an ensemble refuses:
    the advice, and the lines about the member, name `teachers.N.teacher_options`."""
    from kdplug.testing.tiny import make_tiny_classifier

    one_class = write_sst2(tmp_path / "one-class", dev=[(text, 1) for text, _ in SST2_DEV * 3])  # unbeatable
    members = [make_tiny_classifier(tmp_path / f"m{seed}", seed=seed) for seed in (5, 6)]
    settings = {**SETTINGS, "allow_weak_teacher": False}
    argv = ["run", *tiny_run_args(task="sst2", data_dir=one_class, **settings), "--set", teachers(*members)]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "not worth distilling" in err and "--set teachers.0.teacher_options.finetuned=false" in err
    assert "--set teacher_options." not in err

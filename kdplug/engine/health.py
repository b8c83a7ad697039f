"""Training that goes nowhere says so: checks after every epoch of every stage.

Three failures are common enough in distillation to look for each epoch, and silent otherwise:

- the model predicts one class for every dev example (a student that has not learned the task yet,
  or a teacher fine-tuned at a learning rate that does not suit it);
- the training loss has not moved from chance level since the first epoch;
- the intermediate-layer term collapsed while CE stays at chance: the student matched the
  teacher's layer vectors without learning the task (PKD on a from-scratch BiLSTM at λ = 0.7).

A finding is reported once it has lasted a third of the stage's epochs (at least two), or at the
stage's last epoch: slow starts that recover (a truncated BERT often predicts one class for its
first epochs) stay quiet. Each finding names what is wrong and what to change; the trainer logs
it once per stage and records it in the stage's summary (``warnings`` in metrics.json).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

#: below this relative change between the first and the latest epoch a loss "has not moved"
FLAT = 0.01
#: a term that fell below this fraction of its first-epoch value has collapsed
COLLAPSED = 0.1
#: CE within this fraction of ln(C) is at chance level
CHANCE = 0.9


@dataclass(frozen=True)
class Finding:
    code: str  # "single-class", "flat-loss", "ild-collapse"
    message: str


def _knobs(stage: str) -> tuple[str, str]:
    """The options that set a stage's learning rate and length."""
    if stage == "teacher":
        return "--set teacher_lr=...", "--set teacher_epochs=..."
    return "--set lr=...", "--epochs ..."


def patience(epochs: int) -> int:
    """How many epochs a problem must last before it is reported."""
    return max(2, -(-epochs // 3))


def stuck_since_start(history: Sequence[dict]) -> bool:
    """Whether the model predicted one class on dev in every epoch so far (``predicted_classes``)."""
    return all(record.get("predicted_classes") == 1 for record in history)


#: a training loss that grew this many times since epoch 1, or a CE this many times chance level
#: (ln C), is a model pushed off by steps too large (one stuck at chance sits near ln C)
DIVERGED = 3.0


def loss_grown(history: Sequence[dict], classes: int) -> Optional[str]:
    """How the training loss went the wrong way, e.g. ``"ce went from 1.794e+11 to 3.539e+22"``;
    None when it did not. A model that predicts one class with such a loss was pushed off by a
    learning rate too large, not held back by one too small."""
    first, last = history[0]["train"], history[-1]["train"]
    key = "ce" if "ce" in first and "ce" in last else "loss"
    if key not in first or key not in last:
        return None
    chance = math.log(classes) if classes > 1 else math.inf
    if last[key] > DIVERGED * abs(first[key]) or (key == "ce" and last[key] > DIVERGED * chance):
        return (
            f"{key} went from {first[key]:.4g} to {last[key]:.4g}" if len(history) > 1 else f"{key} is {last[key]:.4g}"
        )
    return None


def check_epoch(
    stage: str,
    history: Sequence[dict],
    *,
    epochs: int,
    lr: float,
    labels: Sequence[str],
    predictions: Optional[Sequence[float]],
) -> list[Finding]:
    """What looks wrong after the latest epoch in ``history`` (``{"epoch", "train": {term: mean},
    "predicted_classes": n}``); ``predictions`` are the latest epoch's on the first dev split."""
    findings = []
    epoch = history[-1]["epoch"]
    settled = epoch >= patience(epochs) or epoch == epochs
    lr_knob, epochs_knob = _knobs(stage)
    if labels and predictions and settled and stuck_since_start(history):
        counts = Counter(int(p) for p in predictions)
        if len(counts) == 1:
            only = next(iter(counts))
            label = labels[only] if 0 <= only < len(labels) else only
            grown = loss_grown(history, len(labels))
            advice = (
                f"its training {grown}: the learning rate {lr:g} is too large. Lower it ({lr_knob}), or leave it "
                f"unset for kdplug's default."
                if grown
                else f"Train longer ({epochs_knob}) or with a larger learning rate ({lr_knob}; it is {lr:g}); a "
                f"model trained on few examples needs many epochs."
            )
            findings.append(
                Finding(
                    "single-class",
                    f"stage {stage!r}, epoch {epoch}: the model predicts {label!r} for every dev example: it has "
                    f"not learned the task{', and ' if grown else '. '}{advice}",
                )
            )
    if len(history) >= 2 and settled:
        first, last = history[0]["train"], history[-1]["train"]
        chance = math.log(len(labels)) if len(labels) > 1 else None
        key = "ce" if "ce" in first and "ce" in last else "loss"
        moved = abs(last[key] - first[key]) / max(abs(first[key]), 1e-12)
        at_chance = chance is None or last[key] >= CHANCE * chance
        if moved < FLAT and at_chance:
            findings.append(
                Finding(
                    "flat-loss",
                    (
                        f"stage {stage!r}, epoch {epoch}: the training {key} has not moved ({first[key]:.4f} -> "
                        f"{last[key]:.4f} since epoch 1). The learning rate {lr:g} may be too small for this model "
                        f"(try ten times larger: {lr_knob}), or the inputs carry nothing the model can use."
                    ),
                )
            )
        if "ild" in first and "ild" in last and "ce" in last and chance is not None:
            if last["ild"] < COLLAPSED * first["ild"] and last["ce"] >= CHANCE * chance:
                findings.append(
                    Finding(
                        "ild-collapse",
                        (
                            f"stage {stage!r}, epoch {epoch}: the layer-matching term fell from {first['ild']:.4f} "
                            f"to {last['ild']:.4f} while CE stays at chance ({last['ce']:.4f}; ln {len(labels)} = "
                            f"{chance:.4f}): the student imitates the teacher's layer vectors without learning the "
                            f"task. Lower its weight (--set lam=0.1), or match in the output space instead "
                            f"(--projector universal-ca)."
                        ),
                    )
                )
    return findings


# -- against the majority class -------------------------------------------------------------------

#: a teacher must beat the majority class by this much of its main metric (0.05 = 5 points)
TEACHER_MARGIN = 0.05


def constant_baseline(task, labels: Sequence[float]) -> float:
    """The main metric of a model that always predicts the same thing: the majority class (its
    accuracy is the majority's share; its Matthews correlation 0), or for regression the mean (a
    constant has no correlation: 0)."""
    if not labels:
        return 0.0
    constant = Counter(labels).most_common(1)[0][0] if task.labels else float(sum(labels) / len(labels))
    with warnings.catch_warnings():  # a constant prediction makes correlations undefined, by design
        warnings.simplefilter("ignore")
        score = task.compute_metrics([constant] * len(labels), list(labels))[task.main_metric]
    return 0.0 if score is None or (isinstance(score, float) and math.isnan(score)) else float(score)


def check_teacher(task, predictions: Sequence[float], labels: Sequence[float], score: float) -> dict:
    """Whether the teacher is worth distilling: its dev ``score`` (the main metric) against a model
    that predicts one constant, and whether it predicts more than one class. The findings name the
    likely causes; the run stops on them unless ``allow_weak_teacher`` is set."""
    baseline = constant_baseline(task, labels)
    record = {
        "metric": task.main_metric,
        "teacher": score,
        "majority_class": baseline,
        "margin": TEACHER_MARGIN,
        "examples": len(labels),
    }
    problems = []
    if task.labels:
        classes = sorted({int(p) for p in predictions})
        record["predicted_classes"] = [task.labels[c] for c in classes if 0 <= c < len(task.labels)]
        if len(classes) == 1 and len(set(labels)) > 1:
            problems.append(f"it predicts {record['predicted_classes'][0]!r} for every dev example")
    elif len({round(float(p), 6) for p in predictions}) == 1:
        problems.append("it predicts the same value for every dev example")
    if score < baseline + TEACHER_MARGIN:
        below = "below" if score < baseline else "not clearly above"
        what = "the majority class" if task.labels else "a constant prediction"
        problems.append(
            f"its dev {task.main_metric} {score * 100:.2f} is {below} {what}'s {baseline * 100:.2f} "
            f"(kdplug asks for {TEACHER_MARGIN * 100:.0f} points more)"
        )
    record["passed"] = not problems
    record["problems"] = problems
    return record


def weak_teacher_causes(task, record: dict, *, prompted: Any = None, finetuned_here: bool = False) -> str:
    """The likely causes of a failed teacher check, most likely first, each with a fix the run has
    not tried. A prompted teacher (a language model reading a prompt, never fine-tuned: ``prompted``
    is its record, or True) has its own: fine-tuning it is refused, and its verbalizer, not a head,
    maps its answers to the labels; calibration or shots already set are not suggested again. A
    teacher kdplug fine-tuned (``finetuned_here``) is not told to let kdplug fine-tune it."""
    if prompted:
        return _numbered(_prompted_causes(prompted if isinstance(prompted, dict) else {}))
    if finetuned_here:  # its head was trained here, on the task's labels in order
        return _numbered(
            [
                "its fine-tuning here did not learn the task: more epochs (--set teacher_epochs=N) or another "
                "learning rate (--set teacher_lr=...), or a larger teacher",
                "the data: check --task, --data-dir and the task's label column",
            ]
        )
    causes = []
    if task.labels and record["teacher"] < record["majority_class"] - TEACHER_MARGIN:
        causes.append(
            "its labels are in another order than the task's (a checkpoint saved with other label names "
            "or order: say how they map with --set teacher_options.label_map={...})"
        )
    causes += [
        "it is not fine-tuned on this task (a pre-trained checkpoint with a new head: let kdplug fine-tune it "
        "with --set teacher_options.finetuned=false, or more epochs: --set teacher_epochs=N)",
        "it was fine-tuned for another task or data set (check --task, --data-dir and the task's label column)",
    ]
    if not any("label_map" in cause for cause in causes) and task.labels:
        causes.append("its labels are in another order than the task's (--set teacher_options.label_map={...})")
    return _numbered(causes)


def _prompted_causes(prompted: dict) -> list[str]:
    """A prompted teacher's likely causes, with the fixes its ``prompted`` record has not tried."""
    shots = int(prompted.get("shots") or 0)
    fixes = [] if prompted.get("calibrate") else ["--set teacher_options.calibrate=true"]
    fixes.append(
        "show it examples: --set teacher_options.shots=4"
        if shots == 0
        else f"show it more examples than its {shots}: --set teacher_options.shots={2 * shots}"
    )
    return [
        "the prompt or the verbalizer does not fit the model: write each verbalizer as the model would "
        "continue the prompt (--set teacher_options.prompt=... and teacher_options.verbalizer={...})",
        f"its answers lean towards one label whatever the text: {', or '.join(fixes)}",
        "the model is too small or not instruction-tuned for this prompt: a larger or an instruct model, or a "
        "classifier fine-tuned on the task (docs/llm-teachers.md)",
    ]


def _numbered(causes: list[str]) -> str:
    return "; ".join(f"({i}) {cause}" for i, cause in enumerate(causes, 1))

"""The report's sections, written from what was collected and computed: the runs, ours beside the
papers', the comparisons (prose and tables from :mod:`kdplug.report.comparisons`' numbers), and
the figures."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional

from .. import compare
from ..hub import display_name
from ..layout import ATTENTION_FILE
from ..progress import human_count
from .comparisons import Group, GroupComparison, Method, PairComparison
from .document import Document, _interval, _needed, pct, points
from .figures import attention_figure, curves_figure, layers_figure
from .runs import Run

CHECKPOINT_POLICY = {"best": "best dev epoch", "last": "last epoch"}


def summary_section(doc: Document, runs: list[Run]) -> None:
    doc.heading("Runs")
    rows = [_summary_row(run) for run in runs]
    doc.table(
        [
            "run",
            "task",
            "data",
            "student",
            "projector",
            "recipe",
            "seed",
            "checkpoint",
            "score",
            "student",
            "teacher",
            "agreement",
            "params",
            "time",
            "zoo entry",
        ],
        rows,
    )
    stopped = [run for run in runs if run.stopped]
    for run in stopped:
        doc.para(f"{run.label} stopped before it finished ({run.stopped}): it has no student to report.")
    for run in runs:
        prompted = run.metrics.get("teacher", {}).get("prompted")
        if prompted:
            doc.para(f"{run.label}: {prompted_teacher_line(prompted)}")
        if run.metrics.get("teacher", {}).get("members"):
            doc.para(
                f"{run.label}: {ensemble_line(run.metrics['teacher'], run.metrics.get('main_metric', 'accuracy'))}"
            )
    doc.para(
        "agreement: the share of dev examples on which the student predicts the teacher's class (what "
        "distillation optimises; a transfer set raises it before it raises accuracy)."
    )
    doc.para(
        "checkpoint: the student kept at the **best** dev epoch (as the papers report) or the **last** epoch "
        "(configuration key best_checkpoint); the choice alone moves scores, so compare runs with the same one."
    )


def _summary_row(run: Run) -> list[str]:
    """A run's row of the runs table: a stopped run says so where its scores would be."""
    metric = run.metrics.get("main_metric", "accuracy")
    dev = run.metrics.get("student", {}).get("dev", {})
    split = next(iter(dev), "dev")
    student = run.metrics.get("student", {})
    setting = [
        run.label,
        run.task,
        run.data,
        str(run.config.get("student", "?")),
        str(run.config.get("projector", "?")),
        str(run.config.get("recipe", "?")),
        str(run.seed),
        str(run.config.get("best_checkpoint", "best")),
    ]
    closing = [f"{run.metrics.get('wall_seconds', 0):.0f}s", run.config.get("zoo") or "–"]
    if run.stopped:
        return [*setting, f"**stopped** ({run.metrics.get('status')})", "–", "–", "–", "–", *closing]
    return [
        *setting,
        f"{split} {metric}",
        pct(run.score(split, metric)),
        pct(run.score(split, metric, "teacher")),
        pct(run.metrics.get("agreement", {}).get(split)),
        human_count(student.get("parameters", 0)),
        *closing,
    ]


def ensemble_line(teacher: dict[str, Any], metric: str) -> str:
    """An ensemble teacher as metrics.json recorded it: each member's weight and dev score, and the
    ensemble's (the teacher column's)."""

    def score(record: dict[str, Any]) -> str:
        dev = record.get("dev") or {}
        split = next(iter(dev), None)
        return f"{split} {metric} {pct(dev[split].get(metric))}" if split else "not judged"

    members = "; ".join(
        f"teacher {i} `{display_name(str(member.get('name')))}` (weight {member.get('weight', 0):.3g}, {score(member)})"
        for i, member in enumerate(teacher["members"])
    )
    temperature = teacher.get("ensemble", {}).get("temperature")
    return (
        f"the teacher is an ensemble of {len(teacher['members'])}, its target the weighted mean of their "
        f"probabilities at temperature {temperature:g}: {members}; the ensemble's {score(teacher)}"
    )


def prompted_teacher_line(prompted: dict[str, Any]) -> str:
    """How a prompted teacher labelled the task, as metrics.json recorded it (``teacher.prompted``)."""
    verbalizer = ", ".join(f"{label} -> {json.dumps(text)}" for label, text in prompted.get("verbalizer", {}).items())
    calibrated = prompted.get("calibrate")
    return (
        f"the teacher is a language model read through a prompt, not fine-tuned: prompt "
        f"`{json.dumps(prompted.get('template'))}`, verbalizer {verbalizer}, {prompted.get('shots', 0)} shot(s)"
        f"{', in its chat template' if prompted.get('chat_template') is True else ''}"
        f"{', contextual calibration (Zhao et al. 2021)' if calibrated else ''}."
    )


def paper_section(doc: Document, runs: list[Run]) -> None:
    """Ours beside the paper's, one table per paper table: rows as the paper's, columns tasks."""
    doc.heading("Our scores beside the papers'")
    with_entry = [r for r in runs if r.entry is not None]
    if not with_entry:
        doc.para(
            "No run comes from a zoo entry ('kdplug zoo run NAME' records it), so there is nothing to "
            "compare with a paper."
        )
        return
    tables: dict[tuple[str, int], dict[str, dict[str, list]]] = {}
    for run in with_entry:
        entry = run.entry
        cell = (
            tables.setdefault((entry.paper, entry.table), {})
            .setdefault(entry.row, {})
            .setdefault(entry.task, [entry, []])
        )
        split, metric, _ = entry.main_score()
        score = run.score(split, metric, entry.measure)
        if score is not None:
            cell[1].append(score)
    for (paper, table), rows in tables.items():
        tasks = sorted({task for row in rows.values() for task in row})
        header = ["row"] + [f"{task} (ours / paper)" for task in tasks]
        body = []
        sets = set()
        for row, cells in rows.items():
            line = [row]
            for task in tasks:
                if task not in cells:
                    line.append("")
                    continue
                entry, scores = cells[task]
                sets.add(entry.reported_set)
                split, metric, paper_value = entry.main_score()
                ours = "–"
                if scores:
                    mean = statistics.fmean(scores) * 100
                    ours = f"{mean:.2f}" + (f" ± {statistics.stdev(scores) * 100:.2f}" if len(scores) > 1 else "")
                    ours += f" (n={len(scores)})"
                line.append(f"{ours} / {paper_value:g} ({metric})")
            body.append(line)
        doc.para(
            f"**{paper} Table {table}**"
            + (" (the paper reports GLUE test scores; ours are dev)" if "test" in sets else "")
            + ": ours as mean ± sample std over "
            "n seeds, the paper's a single number."
        )
        doc.table(header, body)


def comparisons_section(
    doc: Document, comparisons: list[GroupComparison], *, resamples: int = 2000, level: float = 0.95
) -> list[dict[str, Any]]:
    """Per group, every compared pair on every dev metric: per-seed differences, their mean, the
    t-interval over seeds, the paired bootstrap interval, the verdict and the seeds needed; for zoo
    groups, the paper's ordering of each pair against ours. Returns the records (JSON)."""
    doc.heading("Comparisons")
    comparable = [c for c in comparisons if len(c.group.methods) > 1]
    if not comparable:
        doc.para(
            "No two methods were run on the same setup, so there is nothing to compare. Run each method on "
            "several seeds (kdplug run --seeds 5, or a sweep's seed axis) and pass all the run directories."
        )
    for comparison in comparisons:
        if len(comparison.group.methods) == 1:
            for note in dict.fromkeys(next(iter(comparison.group.methods.values())).notes):
                doc.para(f"Note ({comparison.group.title}): {note}.")
    if not comparable:
        return []
    doc.para(
        f"A − B per seed, in points (×100), on the seeds both methods ran; {level:.0%} intervals: the "
        f"{compare.T_METHOD} (mean ± t·sd/√n; the dev set taken as fixed) and, where both runs kept "
        f"predictions.json, the {compare.BOOTSTRAP_METHOD} ({resamples} resamples; one resample of the dev "
        f"examples shared by both methods and all seeds, the metric recomputed on it). Verdict: **better** or "
        f"**worse** when every interval excludes zero on that side, otherwise not resolved; one seed resolves "
        f"nothing. Seeds needed: how many seeds make the interval exclude zero with 80% probability if the "
        f"observed mean difference and spreads are the truth (normal approximation, see kdplug/compare.py); "
        f"∞ when the dev set's own sampling noise is as large as the difference."
    )
    records: list[dict[str, Any]] = []
    for comparison in comparable:
        records += _group_comparisons(doc, comparison, level)
    return records


def _group_comparisons(doc: Document, comparison: GroupComparison, level: float) -> list[dict[str, Any]]:
    """One group's methods, its pairs' table, the paper's ordering (zoo groups) and the notes, each
    said once; returns the pairs' records."""
    group = comparison.group
    policy = CHECKPOINT_POLICY.get(group.best_checkpoint, group.best_checkpoint)
    seeds = {m.label: sorted(next(iter(m.results.values()), {})) for m in group.methods.values()}
    doc.para(
        f"**{group.title}**: student checkpoint: {policy} (best_checkpoint: {group.best_checkpoint}); "
        "methods: " + "; ".join(f"{label} (seeds {', '.join(map(str, s))})" for label, s in seeds.items()) + "."
    )
    pair_notes: dict[str, list[str]] = {}  # a note -> the comparisons it applies to: each said once
    rows, ordering_rows, records = [], [], []
    for pair in comparison.pairs:
        for note in pair.result.notes:
            pair_notes.setdefault(note, []).append(f"{pair.a.label} − {pair.b.label} ({pair.split} {pair.metric})")
        rows.append(_pair_row(pair))
        if pair.paper is not None:
            ordering_rows.append(_ordering_row(pair))
        records.append(pair.record(group))
    if rows:
        doc.table(
            [
                "A − B",
                "metric",
                "seeds",
                "per-seed differences",
                "mean",
                f"{level:.0%} CI ({compare.T_METHOD})",
                f"{level:.0%} CI (paired bootstrap)",
                "verdict",
                "seeds needed",
            ],
            rows,
        )
    if ordering_rows:
        doc.para(f"The paper's ordering ({group.title}): does our difference confirm the paper's?")
        doc.table(
            ["A vs B", "paper (A, B)", "ours: A", "ours: B", "A − B (mean)", "verdict", "paper's ordering"],
            ordering_rows,
        )
    for note, subjects in pair_notes.items():
        which = "every comparison above" if len(subjects) == len(rows) else ", ".join(subjects)
        doc.para(f"Note: {note} ({which}).")
    for note in dict.fromkeys(comparison.notes):
        doc.para(f"Note: {note}.")
    return records


def _pair_row(pair: PairComparison) -> list[str]:
    result = pair.result
    return [
        f"{pair.a.label} − {pair.b.label}",
        f"{pair.split} {pair.metric}",
        str(len(result.seeds)),
        ", ".join(points(d) for d in result.differences),
        points(result.mean),
        _interval(result.t_interval),
        _interval(result.bootstrap),
        f"**{result.verdict}**" if result.verdict in (compare.BETTER, compare.WORSE) else result.verdict,
        _needed(result),
    ]


def _ordering_row(pair: PairComparison) -> list[str]:
    result, (paper_a, paper_b) = pair.result, pair.paper

    def ours(method: Method) -> str:
        values = [method.results[pair.split][s].scores[pair.metric] for s in result.seeds]
        text = f"{statistics.fmean(values) * 100:.2f}"
        return text + (f" ± {statistics.stdev(values) * 100:.2f}" if len(values) > 1 else "") + f" (n={len(values)})"

    relation = ">" if paper_a > paper_b else "=" if paper_a == paper_b else "<"
    return [
        f"{pair.a.label} vs {pair.b.label}",
        f"{paper_a:g} {relation} {paper_b:g}",
        ours(pair.a),
        ours(pair.b),
        points(result.mean),
        result.verdict,
        f"**{compare.ordering(paper_a, paper_b, result)}**",
    ]


def figure_name(kind: str, group: int, method: Optional[int] = None) -> str:
    """A figure's file name: its kind, group and method by number (``attention-2-3.png``); the captions
    name them. Titles and labels carry paths and settings: as names they ran past 200 characters."""
    return f"{kind}-{group}" + (f"-{method}" if method is not None else "") + ".png"


def figures_sections(doc: Document, groups: list[Group], out: Path) -> None:
    """Curves, attention and layer figures: per setup, one run per method (its lowest seed; the
    other seeds' figures are in their run directories), each skip said once."""
    shown = [
        (
            group,
            [
                (method.label, method.representative)
                for method in group.methods.values()
                if method.representative is not None
            ],
        )
        for group in groups
    ]
    shown = [(group, methods) for group, methods in shown if methods]
    several = any(len(method.runs) > 1 for group in groups for method in group.methods.values())
    which = " (per method, its lowest seed; every run's own figures are in its directory)" if several else ""

    doc.heading("Training curves")
    drawn = False
    for index, (group, methods) in enumerate(shown, 1):
        name = curves_figure(methods, out / figure_name("curves", index))
        if name:
            drawn = True
            doc.image(
                name,
                f"{group.title}{which}: one panel per method and training stage, in order; the training "
                f"loss terms (epoch means, unweighted; 'loss' is the weighted sum optimised), the dev "
                f"score on the right axis, the kept epoch starred.",
            )
    if not drawn:
        doc.para("No run recorded a training history.")

    doc.heading("Attention over teacher layers")
    without: list[str] = []
    for index, (group, methods) in enumerate(shown, 1):
        for position, (label, run) in enumerate(methods, 1):
            path = run.path / ATTENTION_FILE
            if not path.is_file():
                without.append(label)
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
            name = attention_figure(run, record, out / figure_name("attention", index, position))
            doc.image(
                name,
                f"{group.title}, {label} (seed {run.seed}): attention of each matched student layer "
                f"over the teacher layers; mean over {record.get('num_examples', '?')} dev examples and "
                f"per example.",
            )
    if without:
        doc.para(
            f"No attention recorded by {', '.join(dict.fromkeys(without))}: logit-only methods (nkd, rkd) and "
            f"runs of older kdplug versions record none."
        )

    doc.heading("Layer representations: the pairs each method compared")
    without = []
    for index, (group, methods) in enumerate(shown, 1):
        for position, (label, run) in enumerate(methods, 1):
            name = layers_figure(label, run, out / figure_name("layers", index, position))
            if name is None:
                without.append(label)
                continue
            doc.image(
                name,
                f"{group.title}, {label} (seed {run.seed}): for each pair the projector compared (up to "
                f"four), in the space where it compared them, the first two principal components of the "
                f"teacher's (green) and the student's (red) dev vectors, and per dev example the ILD term "
                f"the method minimised for that pair (ALP-KD Figure 4).",
            )
    if without:
        doc.para(
            f"No compared pairs recorded by {', '.join(dict.fromkeys(without))}: logit-only methods (nkd, rkd) "
            f"compare no layers, methods whose pairs describe the whole batch (cka) have no term per example, "
            f"token-level methods (tinybert, minilm-v2) need the teacher run live on each batch, which the record "
            f"does not repeat, and runs of older kdplug versions did not record them."
        )

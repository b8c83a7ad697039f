"""``kdplug report``: runs side by side with the papers, as Markdown and HTML with PNG figures.

Reads only run directories: ``config.yaml``, ``metrics.json``, and where present
``predictions.json``, ``attention.json`` and ``layers_dev.safetensors`` (written by the engine). A
figure whose data a run lacks is skipped with a note, never an error.

Comparisons (``comparisons.json`` too): runs that differ only in their method and seed are paired
on their common seeds, and every difference gets a 95% interval, a verdict and an estimate of the
seeds that would resolve it (:mod:`kdplug.compare`). Zoo runs are grouped by paper table and task
column, and the paper's ordering of each pair of rows is checked against ours.

Figures, per setup and method (the method's lowest seed; each run keeps its own in its directory):
- ``curves-<setup>.png``: one panel per method and training stage, in order: every loss term its
  own line, the dev score on a second axis, the kept epoch starred;
- ``attention-<setup>-<method>.png``: the mean attention of every matched student layer over the
  teacher layers, and per example for the first student layer (ALP-KD Figure 3) and the last
  matched one (Universal-KD Figure 3);
- ``layers-<setup>-<method>.png``: the pairs the projector compared, in the space it compared them
  (ALP's attention mix, Universal-KD's pseudo-classifier outputs, PKD's mapped layers): the PCA
  of both sides' dev vectors and, per example, the ILD term the method minimised (ALP-KD Figure 4).
"""

from __future__ import annotations

import html
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from . import compare
from .errors import UsageError
from .zoo import Zoo, ZooEntry

ATTENTION_FILE, LAYERS_FILE = "attention.json", "layers_dev.safetensors"
PREDICTIONS_FILE, COMPARISONS_FILE = "predictions.json", "comparisons.json"
BASELINE_PREDICTIONS_FILE = "baseline_predictions.json"
CHECKPOINT_POLICY = {"best": "best dev epoch", "last": "last epoch"}


@dataclass
class Run:
    path: Path
    label: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    entry: Optional[ZooEntry] = None

    @property
    def task(self) -> str:
        return self.metrics.get("task") or self.config.get("task", "?")

    def score(self, split: str, metric: str, measure: str = "student") -> Optional[float]:
        """A dev score of the student (or the teacher), as a fraction."""
        if measure == "teacher":
            dev = self.metrics.get("teacher", {}).get("dev") or self.metrics.get("teacher", {}).get(
                "finetuned", {}).get("dev", {})
        else:
            dev = self.metrics.get("student", {}).get("dev", {})
        value = dev.get(split, {}).get(metric)
        return float(value) if value is not None else None

    @property
    def seed(self) -> Optional[int]:
        seed = self.config.get("seed", self.metrics.get("config", {}).get("seed"))
        return int(seed) if seed is not None else None

    def predictions(self, name: str = PREDICTIONS_FILE) -> dict[str, dict[str, list]]:
        """The final student's (or, with ``BASELINE_PREDICTIONS_FILE``, the ``--baseline`` student's)
        dev predictions and labels per split ({} for runs without the file)."""
        path = self.path / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def expand_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run directories; a ``kdplug run --seeds`` output (``seed-*/``) or a sweep (``points/*/``)
    stands for its finished runs."""
    expanded = []
    for raw in paths:
        path = Path(raw)
        is_group = (path / "seeds.json").is_file() or (path / "sweep.yaml").is_file()
        if is_group and not (path / "metrics.json").is_file():
            inner = sorted(path.glob("seed-*/metrics.json")) + sorted(path.glob("points/*/metrics.json"))
            expanded += [m.parent for m in inner] or [path]
        else:
            expanded.append(path)
    return expanded


def load_runs(paths: list[str | Path], zoo: Optional[Zoo] = None) -> list[Run]:
    runs = []
    for path in expand_run_dirs(paths):
        metrics_file = path / "metrics.json"
        if not metrics_file.is_file():
            raise UsageError(f"{path} is not a finished run directory (no metrics.json); pass directories "
                             f"written by 'kdplug run', 'kdplug zoo run' or 'kdplug sweep' (points/*)")
        metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
        config_file = path / "config.yaml"
        config = yaml.safe_load(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        config = config or metrics.get("config", {})
        runs.append(Run(path, path.name, config, metrics))
    seen: dict[str, int] = {}
    for run in runs:  # unique, short labels
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.path.parent.name}/{run.path.name}"
    for run in runs:
        name = run.config.get("zoo")
        if name:
            try:
                run.entry = (zoo or Zoo()).get(name)
            except UsageError:
                run.entry = None  # a zoo entry renamed or a zoo not installed: the run is still reported
    return runs


# -- the document: blocks rendered to Markdown and to HTML -------------------------------------

@dataclass
class Document:
    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def image(self, path: str, caption: str) -> None:
        self.blocks.append(("img", (path, caption)))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "h2":
                out += [f"## {value}", ""]
            elif kind == "p":
                out += [value, ""]
            elif kind == "table":
                header, rows = value
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "---|" * len(header))
                out += ["| " + " | ".join(row) + " |" for row in rows]
                out.append("")
            elif kind == "img":
                out += [f"![{value[1]}]({value[0]})", "", f"*{value[1]}*", ""]
        return "\n".join(out)

    def html(self) -> str:
        esc = html.escape
        body = [f"<h1>{esc(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "h2":
                body.append(f"<h2>{esc(value)}</h2>")
            elif kind == "p":
                body.append(f"<p>{esc(value).replace('**', '')}</p>")
            elif kind == "table":
                header, rows = value
                body.append("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead><tbody>")
                body += ["<tr>" + "".join(f"<td>{esc(c).replace('**', '')}</td>" for c in row) + "</tr>" for row in rows]
                body.append("</tbody></table>")
            elif kind == "img":
                body.append(f'<figure><img src="{esc(value[0])}" alt="{esc(value[1])}">'
                            f"<figcaption>{esc(value[1])}</figcaption></figure>")
        style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
                 "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
                 "text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}img{max-width:100%}"
                 "figcaption{font-style:italic;color:#555}")
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title>"
                f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def human(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.1f}K"


def pct(value: Optional[float]) -> str:
    return "–" if value is None or math.isnan(value) else f"{value * 100:.2f}"


# -- sections -------------------------------------------------------------------------------------

def summary_section(doc: Document, runs: list[Run]) -> None:
    doc.heading("Runs")
    rows = []
    for run in runs:
        metric = run.metrics.get("main_metric", "accuracy")
        dev = run.metrics.get("student", {}).get("dev", {})
        split = next(iter(dev), "dev")
        student = run.metrics.get("student", {})
        rows.append([run.label, run.task, str(run.config.get("student", "?")), str(run.config.get("projector", "?")),
                     str(run.config.get("recipe", "?")), str(run.seed), str(run.config.get("best_checkpoint", "best")),
                     f"{split} {metric}", pct(run.score(split, metric)),
                     pct(run.score(split, metric, "teacher")), pct(run.metrics.get("agreement", {}).get(split)),
                     human(student.get("parameters", 0)), f"{run.metrics.get('wall_seconds', 0):.0f}s",
                     run.config.get("zoo") or "–"])
    doc.table(["run", "task", "student", "projector", "recipe", "seed", "checkpoint", "score", "student", "teacher",
               "agreement", "params", "time", "zoo entry"], rows)
    doc.para("agreement: the share of dev examples on which the student predicts the teacher's class (what "
             "distillation optimises; a transfer set raises it before it raises accuracy).")
    doc.para("checkpoint: the student kept at the **best** dev epoch (as the papers report) or the **last** epoch "
             "(configuration key best_checkpoint); the choice alone moves scores, so compare runs with the same one.")


def paper_section(doc: Document, runs: list[Run]) -> None:
    """Ours beside the paper's, one table per paper table: rows as the paper's, columns tasks."""
    doc.heading("Our scores beside the papers'")
    with_entry = [r for r in runs if r.entry is not None]
    if not with_entry:
        doc.para("No run comes from a zoo entry ('kdplug zoo run NAME' records it), so there is nothing to "
                 "compare with a paper.")
        return
    tables: dict[tuple[str, int], dict[str, dict[str, list]]] = {}
    for run in with_entry:
        entry = run.entry
        cell = tables.setdefault((entry.paper, entry.table), {}).setdefault(entry.row, {}).setdefault(
            entry.task, [entry, []])
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
        doc.para(f"**{paper} Table {table}**" + (" (the paper reports GLUE test scores; ours are dev)"
                                                  if "test" in sets else "") + ": ours as mean ± sample std over "
                 "n seeds, the paper's a single number.")
        doc.table(header, body)


# -- comparisons -----------------------------------------------------------------------------------

#: configuration keys that make two runs a different setup (not comparable); keys in neither
#: tuple (projector, recipe, their options, eta, lam, temperature, lr, epochs ...) are the method
SETUP_KEYS = ("task", "task_options", "data_dir", "teacher", "teacher_options", "student", "student_options",
              "max_length", "teacher_epochs", "teacher_lr", "teacher_batch_size", "best_checkpoint")
#: keys that change neither the setup nor the method
IGNORED_KEYS = ("seed", "teacher_seed", "output", "cache_dir", "num_workers", "checkpoint_every", "keep_checkpoints",
                "precision", "zoo", "baseline", "report_to", "measure_speed")
#: with more methods than this in a group, each is compared with the best one only
ALL_PAIRS_UP_TO = 4


@dataclass
class Method:
    label: str
    values: dict[str, Any]  # the method's configuration keys (zoo: the entry's row)
    results: dict[str, dict[int, compare.SeedResult]] = field(default_factory=dict)  # split -> seed -> result
    entry: Optional[ZooEntry] = None
    notes: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)  # its run directories (a baseline student has none of its own)

    @property
    def representative(self) -> Optional[Run]:
        """The run the report's figures show for this method: its lowest seed."""
        return min(self.runs, key=lambda run: run.seed if run.seed is not None else math.inf, default=None)

    def add(self, seed: int, dev: dict[str, dict[str, float]], predictions: dict[str, dict[str, list]],
            where: str) -> None:
        for split, scores in dev.items():
            seeds = self.results.setdefault(split, {})
            if seed in seeds:
                self.notes.append(f"{self.label}: seed {seed} appears twice; {where} is left out")
                return
            record = predictions.get(split) or {}
            seeds[seed] = compare.SeedResult(
                seed, scores, np.asarray(record["predictions"]) if "predictions" in record else None,
                np.asarray(record["labels"]) if "labels" in record else None)

    def mean(self, split: str, metric: str) -> Optional[float]:
        values = [r.scores[metric] for r in self.results.get(split, {}).values() if metric in r.scores]
        return statistics.fmean(values) if values else None


@dataclass
class Group:
    title: str
    main_metric: str
    best_checkpoint: str
    setup: dict[str, Any]
    methods: dict[str, Method] = field(default_factory=dict)  # key -> method, in order of appearance
    zoo: Optional[tuple[str, int, str]] = None  # (paper, table, task)
    config: dict[str, Any] = field(default_factory=dict)  # one run's configuration: to re-create the task


def _key(values: Any) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _method_label(values: dict[str, Any]) -> str:
    label = str(values.get("projector", "?"))
    recipe = values.get("recipe", "standard")
    return label + (f" / {recipe}" if recipe not in (None, "standard") else "")


def _distinguish(labels: dict[str, str], values: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Labels made unique by the keys in which same-labelled items differ: ``rkd (lr=0.001)``."""
    result = dict(labels)
    for label in set(labels.values()):
        same = [k for k, v in labels.items() if v == label]
        if len(same) < 2:
            continue
        keys = sorted({key for k in same for key in values[k]})
        differing = [key for key in keys if len({_key(values[k].get(key)) for k in same}) > 1]
        for k in same:
            result[k] = label + " (" + ", ".join(f"{key}={values[k].get(key)}" for key in differing) + ")"
    return result


#: method keys a run may leave to kdplug (None), read back from what the run actually used
RESOLVED_FROM_STAGE = ("lr", "epochs")
RESOLVED_FROM_WEIGHTS = {"eta": "eta", "lam": "lam", "temperature": "temperature", "ce_weight": "ce"}


def resolved_config(run: Run) -> dict[str, Any]:
    """The run's configuration with the values kdplug chose filled in (``lr=None`` -> the lr its
    student trained at), so that methods are told apart, and labelled, by what actually ran."""
    config = {**run.metrics.get("config", {}), **run.config}
    student = run.metrics.get("student", {})
    if config.get("recipe") is None and student.get("recipe"):
        config["recipe"] = student["recipe"]
    stages = [stage for name, stage in run.metrics.get("stages", {}).items()
              if name != "teacher_heads" and not name.startswith("baseline-") and "lr" in stage]
    if stages:
        first = stages[0]
        for key in RESOLVED_FROM_STAGE:
            if config.get(key) is None and first.get(key) is not None:
                config[key] = first[key]
        for key, weight in RESOLVED_FROM_WEIGHTS.items():
            if config.get(key) is None and (first.get("weights") or {}).get(weight) is not None:
                config[key] = first["weights"][weight]
    return config


def comparison_groups(runs: list[Run]) -> list[Group]:
    """Runs grouped into comparable sets: zoo runs by paper table and task column (methods = the
    paper's rows), others by setup (methods = the remaining keys); a run's ``--baseline`` student
    counts as one more method (its metrics, and its predictions from ``baseline_predictions.json``)."""
    groups: dict[str, Group] = {}
    for run in runs:
        seed = run.seed
        student_dev = run.metrics.get("student", {}).get("dev")
        if seed is None or not student_dev:
            continue
        config = resolved_config(run)
        policy = str(config.get("best_checkpoint", "best"))
        setup = {k: config.get(k) for k in SETUP_KEYS}
        if run.entry is not None:
            if run.entry.measure != "student":
                continue  # teacher rows: the teacher's score, not a method's
            zoo_key = (run.entry.paper, run.entry.table, run.entry.task)
            title = f"{run.entry.paper} Table {run.entry.table}, {run.entry.task}"
            group = groups.setdefault(_key(["zoo", zoo_key, setup]), Group(
                title, run.metrics.get("main_metric", "accuracy"), policy, setup, zoo=zoo_key, config=config))
            method = group.methods.setdefault(run.entry.row, Method(run.entry.row, {"row": run.entry.row},
                                                                    entry=run.entry))
            method.add(seed, student_dev, run.predictions(), run.label)
            method.runs.append(run)
            continue
        values = {k: v for k, v in config.items() if k not in SETUP_KEYS and k not in IGNORED_KEYS}
        teacher = Path(str(setup["teacher"])).name
        group = groups.setdefault(_key(["setup", setup]), Group(
            f"{run.task}: {teacher} → {setup['student']}", run.metrics.get("main_metric", "accuracy"), policy, setup,
            config=config))
        method = group.methods.setdefault(_key(values), Method(_method_label(values), values))
        method.add(seed, student_dev, run.predictions(), run.label)
        method.runs.append(run)
        baseline = run.metrics.get("baseline")
        if baseline and baseline.get("dev"):
            stage = run.metrics.get("stages", {}).get(f"baseline-{baseline['projector']}", {})
            weights = stage.get("weights") or {}
            base_values = {**values, "projector": baseline["projector"], "projector_options": {}, "recipe": "standard",
                           "recipe_options": {}, "lr": stage.get("lr", values.get("lr")),
                           "epochs": stage.get("epochs", values.get("epochs")),
                           **{key: weights.get(weight) for key, weight in RESOLVED_FROM_WEIGHTS.items()}}
            key = _key(base_values)
            existing = group.methods.get(key)
            if existing is None:
                existing = group.methods[key] = Method(_method_label(base_values), base_values)
            if all(seed not in seeds for seeds in existing.results.values()):
                existing.add(seed, baseline["dev"], run.predictions(BASELINE_PREDICTIONS_FILE),
                             f"{run.label} (baseline)")
    result = list(groups.values())
    titles = _distinguish({str(i): g.title for i, g in enumerate(result)},
                          {str(i): g.setup for i, g in enumerate(result)})
    for i, group in enumerate(result):
        group.title = titles[str(i)]
        labels = _distinguish({k: m.label for k, m in group.methods.items()},
                              {k: m.values for k, m in group.methods.items()})
        for key, method in group.methods.items():
            method.label = labels[key]
    return result


def method_pairs(group: Group) -> list[tuple[Method, Method]]:
    """(A, B) pairs to compare as A − B. Zoo: A is the row the paper scores higher. Otherwise B is
    the reference: nkd if present, else the one listed first; with many methods, A is the best."""
    methods = list(group.methods.values())
    split = next(iter(methods[0].results), "dev") if methods else "dev"
    if group.zoo is None and len(methods) > ALL_PAIRS_UP_TO:
        best = max(methods, key=lambda m: _or(m.mean(split, group.main_metric), -math.inf))
        return [(best, m) for m in methods if m is not best]
    pairs = []
    for i, earlier in enumerate(methods):
        for later in methods[i + 1:]:
            if group.zoo is not None:
                higher = earlier.entry.main_score()[2] >= later.entry.main_score()[2]
                pairs.append((earlier, later) if higher else (later, earlier))
            elif later.values.get("projector") == "nkd" and earlier.values.get("projector") != "nkd":
                pairs.append((earlier, later))
            else:
                pairs.append((later, earlier))
    return pairs


def _or(value: Optional[float], default: float) -> float:
    return default if value is None else value


def _metric_function(group: Group, metric: str, notes: list[str]) -> Optional[compare.WeightedMetric]:
    """The weighted form of ``metric``; for a metric kdplug does not know, the task's own
    ``compute_metrics`` (re-created from a run's configuration), resample by resample."""
    if metric in compare.WEIGHTED_METRICS:
        return compare.WEIGHTED_METRICS[metric]
    from . import create_task

    try:
        task = create_task(str(group.config.get("task")), group.config.get("data_dir"),
                           **(group.config.get("task_options") or {}))
    except Exception as exc:  # noqa: BLE001 - a task that cannot be re-created here: no bootstrap
        notes.append(f"{metric}: the task could not be re-created here ({exc}); t-interval only")
        return None
    return compare.weighted_metric(lambda pred, ref: float(task.compute_metrics(list(pred), list(ref))[metric]))


def points(value: Optional[float], signed: bool = True) -> str:
    if value is None or math.isnan(value):
        return "–"
    if math.isinf(value):
        return "−∞" if value < 0 else "∞"
    return f"{value * 100:+.2f}" if signed else f"{value * 100:.2f}"


def _interval(interval: Optional[tuple[float, float]]) -> str:
    return "–" if interval is None else f"[{points(interval[0])}, {points(interval[1])}]"


def _needed(comparison: compare.Comparison) -> str:
    if comparison.sd is None:
        return "– (one seed)"
    if comparison.seeds_needed is None:
        return "∞ (no difference)" if comparison.mean == 0 else "∞ (dev set too small)"
    return str(comparison.seeds_needed)


def comparisons_section(doc: Document, groups: list[Group], *, resamples: int = 2000,
                        level: float = 0.95) -> list[dict[str, Any]]:
    """Per group, every pair of methods on every dev metric: per-seed differences, their mean, the
    t-interval over seeds, the paired bootstrap interval, the verdict and the seeds needed; for
    zoo groups, the paper's ordering of each pair against ours. Returns the records (JSON)."""
    doc.heading("Comparisons")
    records: list[dict[str, Any]] = []
    comparable = [g for g in groups if len(g.methods) > 1]
    if not comparable:
        doc.para("No two methods were run on the same setup, so there is nothing to compare. Run each method on "
                 "several seeds (kdplug run --seeds 5, or a sweep's seed axis) and pass all the run directories.")
    for group in groups:
        if len(group.methods) == 1:
            for note in dict.fromkeys(next(iter(group.methods.values())).notes):
                doc.para(f"Note ({group.title}): {note}.")
    if not comparable:
        return records
    doc.para(f"A − B per seed, in points (×100), on the seeds both methods ran; {level:.0%} intervals: the "
             f"{compare.T_METHOD} (mean ± t·sd/√n; the dev set taken as fixed) and, where both runs kept "
             f"predictions.json, the {compare.BOOTSTRAP_METHOD} ({resamples} resamples; one resample of the dev "
             f"examples shared by both methods and all seeds, the metric recomputed on it). Verdict: **better** or "
             f"**worse** when every interval excludes zero on that side, otherwise not resolved; one seed resolves "
             f"nothing. Seeds needed: how many seeds make the interval exclude zero with 80% probability if the "
             f"observed mean difference and spreads are the truth (normal approximation, see kdplug/compare.py); "
             f"∞ when the dev set's own sampling noise is as large as the difference.")
    for group in comparable:
        policy = CHECKPOINT_POLICY.get(group.best_checkpoint, group.best_checkpoint)
        seeds = {m.label: sorted(next(iter(m.results.values()), {})) for m in group.methods.values()}
        doc.para(f"**{group.title}**: student checkpoint: {policy} (best_checkpoint: {group.best_checkpoint}); "
                 "methods: " + "; ".join(f"{label} (seeds {', '.join(map(str, s))})"
                                         for label, s in seeds.items()) + ".")
        rows, notes, ordering_rows = [], [], []
        pair_notes: dict[str, list[str]] = {}  # a note -> the comparisons it applies to: each said once
        functions: dict[str, Optional[compare.WeightedMetric]] = {}
        for a, b in method_pairs(group):
            for split in a.results:
                if split not in b.results:
                    continue
                metrics = [m for m in next(iter(a.results[split].values())).scores
                           if any(m in r.scores for r in b.results[split].values())]
                metrics.sort(key=lambda m: m != group.main_metric)
                for metric in metrics:
                    if metric not in functions:
                        functions[metric] = _metric_function(group, metric, notes) if resamples else None
                    try:
                        result = compare.compare(a.results[split], b.results[split], metric, name_a=a.label,
                                                 name_b=b.label, metric_fn=functions[metric], level=level,
                                                 resamples=resamples if functions[metric] else 0)
                    except ValueError:
                        notes.append(f"{a.label} and {b.label} share no seed on {split}; not compared")
                        continue
                    for note in result.notes:
                        pair_notes.setdefault(note, []).append(f"{a.label} − {b.label} ({split} {metric})")
                    rows.append([f"{a.label} − {b.label}", f"{split} {metric}", str(len(result.seeds)),
                                 ", ".join(points(d) for d in result.differences), points(result.mean),
                                 _interval(result.t_interval), _interval(result.bootstrap),
                                 f"**{result.verdict}**" if result.verdict in (compare.BETTER, compare.WORSE)
                                 else result.verdict, _needed(result)])
                    record = {"group": group.title, "split": split, "best_checkpoint": group.best_checkpoint,
                              **result.to_dict()}
                    if group.zoo is not None and metric == a.entry.main_score()[1] and split == a.entry.main_score()[0]:
                        paper_a, paper_b = a.entry.main_score()[2], b.entry.main_score()[2]
                        record["paper"] = {"a": paper_a, "b": paper_b,
                                           "ordering": compare.ordering(paper_a, paper_b, result)}
                        ordering_rows.append(_ordering_row(a, b, split, metric, paper_a, paper_b, result))
                    records.append(record)
        for method in group.methods.values():
            notes += method.notes
        if rows:
            doc.table(["A − B", "metric", "seeds", "per-seed differences", "mean",
                       f"{level:.0%} CI ({compare.T_METHOD})", f"{level:.0%} CI (paired bootstrap)", "verdict",
                       "seeds needed"], rows)
        if ordering_rows:
            doc.para(f"The paper's ordering ({group.title}): does our difference confirm the paper's?")
            doc.table(["A vs B", "paper (A, B)", "ours: A", "ours: B", "A − B (mean)", "verdict", "paper's ordering"],
                      ordering_rows)
        for note, subjects in pair_notes.items():
            which = "every comparison above" if len(subjects) == len(rows) else ", ".join(subjects)
            doc.para(f"Note: {note} ({which}).")
        for note in dict.fromkeys(notes):
            doc.para(f"Note: {note}.")
    return records


def _ordering_row(a: Method, b: Method, split: str, metric: str, paper_a: float, paper_b: float,
                  result: compare.Comparison) -> list[str]:
    def ours(method: Method) -> str:
        values = [method.results[split][s].scores[metric] for s in result.seeds]
        text = f"{statistics.fmean(values) * 100:.2f}"
        return text + (f" ± {statistics.stdev(values) * 100:.2f}" if len(values) > 1 else "") + f" (n={len(values)})"

    relation = ">" if paper_a > paper_b else "=" if paper_a == paper_b else "<"
    return [f"{a.label} vs {b.label}", f"{paper_a:g} {relation} {paper_b:g}", ours(a), ours(b), points(result.mean),
            result.verdict, f"**{compare.ordering(paper_a, paper_b, result)}**"]


#: the order loss terms are drawn in (others follow, alphabetically)
TERM_ORDER = ("ce", "kd", "ild", "loss")


def _term_order(term: str) -> tuple[int, str]:
    return (TERM_ORDER.index(term) if term in TERM_ORDER else len(TERM_ORDER) - 0.5, term)


TERM_COLOURS = {"ce": "tab:blue", "kd": "tab:orange", "ild": "tab:green", "loss": "tab:red"}


def curves_figure(methods: list[tuple[str, Run]], out: Path, columns: int = 3) -> Optional[str]:
    """One panel per method (its representative run) and training stage, in order: every loss
    term its own line (log scale when they differ by more than 30x), the dev score on the right
    axis, the kept epoch starred."""
    panels = []
    for label, run in methods:
        stages = [(name, stage) for name, stage in run.metrics.get("stages", {}).items()
                  if any("dev" in record for record in stage.get("history", []))]  # not the heads' warm-up
        panels += [(label, run, number, len(stages), name, stage) for number, (name, stage) in enumerate(stages, 1)]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.2 * rows), squeeze=False)
    for axis in axes.flat[len(panels):]:
        axis.axis("off")
    for (label, run, number, count, name, stage), axis in zip(panels, axes.flat):
        metric = run.metrics.get("main_metric", "accuracy")
        history = stage["history"]
        epochs = [record["epoch"] for record in history]
        terms = sorted({term for record in history for term in record.get("train", {})}, key=_term_order)
        values = []
        for term in terms:
            line = [record.get("train", {}).get(term, float("nan")) for record in history]
            values += [v for v in line if v > 0]
            axis.plot(epochs, line, marker="o", ms=3, lw=1.8 if term == "loss" else 1.2,
                      ls="-" if term == "loss" else "--", color=TERM_COLOURS.get(term), label=term)
        if values and max(values) / min(values) > 30:
            axis.set_yscale("log")
        dev_axis = axis.twinx()
        split = next(iter(history[0].get("dev", {})), None)
        dev = [record["dev"][split].get(metric, float("nan")) * 100 if split else float("nan") for record in history]
        dev_axis.plot(epochs, dev, color="black", marker="s", ms=3, lw=1, label=f"dev {metric}")
        best = stage.get("best_epoch")
        if best and 1 <= best <= len(dev):
            dev_axis.plot([best], [dev[best - 1]], marker="*", ms=12, color="gold", mec="black", ls="none",
                          label="kept epoch")
        weights = stage.get("weights") or {}
        shown = ", ".join(f"{k} {v:g}" for k, v in weights.items() if isinstance(v, (int, float)))
        stage_text = f"stage {number}/{count} '{name}'" if count > 1 else f"'{name}'"
        axis.set_title(f"{label}, seed {run.seed}: {stage_text}\n{shown}", fontsize=8)
        axis.set_xlabel("epoch")
        axis.set_ylabel("training loss terms (epoch mean)", fontsize=8)
        dev_axis.set_ylabel(f"dev {metric} (×100)", fontsize=8)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        handles, labels = axis.get_legend_handles_labels()
        dev_handles, dev_labels = dev_axis.get_legend_handles_labels()
        axis.legend(handles + dev_handles, labels + dev_labels, fontsize=7, loc="best")
    return _save(figure, out)


def attention_figure(run: Run, record: dict, out: Path) -> str:
    plt = _pyplot()
    teacher = [f"T{i}" for i in record["teacher_layers"]]
    rows = record.get("student_rows") or [f"S{i + 1}" for i in range(len(record["mean"]))]
    examples = np.asarray(record.get("examples") or [], dtype=float)  # (k, P, n)
    panels = [("mean over the dev set", np.asarray(record["mean"], dtype=float), rows)]
    if examples.size:
        labels = [f"ex {i + 1}" for i in range(examples.shape[0])]
        panels.append((f"{rows[0]}, per example (ALP-KD Fig. 3)", examples[:, 0, :], labels))
        if examples.shape[1] > 1:
            panels.append((f"{rows[-1]}, per example (Universal-KD Fig. 3)", examples[:, -1, :], labels))
    width = max(4.0, 0.45 * len(teacher) + 1.5)
    figure, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4.0), squeeze=False)
    for axis, (title, values, ylabels) in zip(axes[0], panels):
        image = axis.imshow(values, cmap="viridis", vmin=0.0, vmax=max(1e-6, float(values.max())), aspect="auto")
        axis.set_title(title, fontsize=10)
        axis.set_xticks(range(len(teacher)), teacher, fontsize=8)
        axis.set_yticks(range(len(ylabels)), ylabels, fontsize=8)
        axis.set_xlabel("teacher layer")
        figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
    figure.suptitle(f"{run.label}: attention over teacher layers ({record.get('stage', '')}, "
                    f"{record.get('split', 'dev')})", fontsize=11)
    return _save(figure, out)


def load_pairs(path: Path) -> tuple[list[dict], list[tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]]:
    """The pairs a run's projector compared on the dev set: their labels, and per pair the student
    and teacher vectors and the ILD loss of each example (None if not recorded)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(path), framework="numpy") as handle:
        metadata = handle.metadata() or {}
    labels = json.loads(metadata.get("pairs", "[]"))
    tensors = load_file(str(path))
    pairs = [(tensors[f"pair.{p}.student"].astype(np.float64), tensors[f"pair.{p}.teacher"].astype(np.float64),
              tensors[f"pair.{p}.loss"].astype(np.float64) if f"pair.{p}.loss" in tensors else None)
             for p in range(len(labels)) if f"pair.{p}.student" in tensors]
    return labels[:len(pairs)], pairs


def relative_distance(student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
    """‖s − t‖² per example over the teacher side's mean ‖t − t̄‖²: 0 identical, about 2 for a
    student unrelated to the teacher with the same spread (when no ILD loss was recorded)."""
    spread = float(((teacher - teacher.mean(axis=0)) ** 2).sum(axis=1).mean()) or 1.0
    return ((student - teacher) ** 2).sum(axis=1) / spread


def layers_figure(label: str, run: Run, out: Path, max_pairs: int = 4) -> Optional[str]:
    """Per compared pair, in the space the method compared it: the PCA of the student's and the
    teacher's dev vectors, and per example the ILD term the method minimised (ALP-KD Figure 4)."""
    path = run.path / LAYERS_FILE
    if not path.is_file():
        return None
    names, pairs = load_pairs(path)
    if not pairs:
        return None
    loss_name = run.metrics.get("analysis", {}).get("ild_loss") or "the method's pair loss"
    unit = loss_name == "normalized-mse"  # PKD compares unit vectors: so does its PCA
    chosen = list(range(len(pairs))) if len(pairs) <= max_pairs else \
        sorted({round(i * (len(pairs) - 1) / (max_pairs - 1)) for i in range(max_pairs)})  # first to last, spread
    plt = _pyplot()
    figure, axes = plt.subplots(len(chosen), 2, figsize=(11, 3.4 * len(chosen)), squeeze=False)
    for p, (pca_axis, distance_axis) in zip(chosen, axes):
        student, teacher, losses = pairs[p]
        name = names[p]
        if unit:  # the space PKD's loss compares in
            student, teacher = (v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12) for v in (student, teacher))
        both = np.concatenate([teacher, student])
        centred = both - both.mean(axis=0)
        _, _, components = np.linalg.svd(centred, full_matrices=False)
        projected = centred @ components[:2].T  # (2N, 2)
        count = len(teacher)
        pca_axis.scatter(projected[:count, 0], projected[:count, 1], s=8, c="tab:green", alpha=0.6,
                         label=f"teacher: {name['teacher']}")
        pca_axis.scatter(projected[count:, 0], projected[count:, 1], s=8, c="tab:red", alpha=0.6,
                         label=f"student: {name['student']}")
        distance = losses if losses is not None else relative_distance(student, teacher)
        what = (f"its ILD term ({loss_name}) per dev example" if losses is not None
                else "‖s − t‖² / teacher spread per dev example")
        distance_axis.plot(range(1, count + 1), distance, c="tab:red", lw=0.8)
        distance_axis.axhline(float(distance.mean()), color="black", ls="--", lw=1,
                              label=f"mean {distance.mean():.4g}")
        pair = f"{name['student']} vs teacher: {name['teacher']}"
        space = ", unit-normalised as its loss compares them" if unit else ""
        pca_axis.set_title(f"{pair}\nPCA of both sides ({teacher.shape[1]} values each{space})", fontsize=9)
        pca_axis.set(xlabel="PC 1", ylabel="PC 2")
        distance_axis.set_title(f"{pair}\n{what}", fontsize=9)
        distance_axis.set(xlabel="dev example", ylabel="distance", ylim=(0, None))
        for axis in (pca_axis, distance_axis):
            _grid_and_legend(axis)
    figure.suptitle(f"{label}, seed {run.seed}: the pairs its projector compared, where it compared them", fontsize=11)
    return _save(figure, out)


def _grid_and_legend(axis) -> None:
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)


def _save(figure, out: Path) -> str:
    """Write a figure as the report's PNGs are written, free it, and return its file name."""
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    _pyplot().close(figure)
    return out.name


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


# -- the report ---------------------------------------------------------------------------------

def figures_sections(doc: Document, groups: list[Group], out: Path) -> None:
    """Curves, attention and layer figures: per setup, one run per method (its lowest seed; the
    other seeds' figures are in their run directories), each skip said once."""
    shown = [(group, [(method.label, method.representative) for method in group.methods.values()
                      if method.representative is not None]) for group in groups]
    shown = [(group, methods) for group, methods in shown if methods]
    several = any(len(method.runs) > 1 for group in groups for method in group.methods.values())
    which = " (per method, its lowest seed; every run's own figures are in its directory)" if several else ""

    doc.heading("Training curves")
    drawn = False
    for index, (group, methods) in enumerate(shown, 1):
        name = curves_figure(methods, out / f"curves-{index}-{_safe(group.title)}.png")
        if name:
            drawn = True
            doc.image(name, f"{group.title}{which}: one panel per method and training stage, in order; the training "
                            f"loss terms (epoch means, unweighted; 'loss' is the weighted sum optimised), the dev "
                            f"score on the right axis, the kept epoch starred.")
    if not drawn:
        doc.para("No run recorded a training history.")

    doc.heading("Attention over teacher layers")
    without: list[str] = []
    for index, (group, methods) in enumerate(shown, 1):
        for label, run in methods:
            path = run.path / ATTENTION_FILE
            if not path.is_file():
                without.append(label)
                continue
            record = json.loads(path.read_text(encoding="utf-8"))
            name = attention_figure(run, record, out / f"attention-{index}-{_safe(label)}.png")
            doc.image(name, f"{group.title}, {label} (seed {run.seed}): attention of each matched student layer "
                            f"over the teacher layers; mean over {record.get('num_examples', '?')} dev examples and "
                            f"per example.")
    if without:
        doc.para(f"No attention recorded by {', '.join(dict.fromkeys(without))}: logit-only methods (nkd, rkd) and "
                 f"runs of older kdplug versions record none.")

    doc.heading("Layer representations: the pairs each method compared")
    without = []
    for index, (group, methods) in enumerate(shown, 1):
        for label, run in methods:
            name = layers_figure(label, run, out / f"layers-{index}-{_safe(label)}.png")
            if name is None:
                without.append(label)
                continue
            doc.image(name, f"{group.title}, {label} (seed {run.seed}): for each pair the projector compared (up to "
                            f"four), in the space where it compared them, the first two principal components of the "
                            f"teacher's (green) and the student's (red) dev vectors, and per dev example the ILD term "
                            f"the method minimised for that pair (ALP-KD Figure 4).")
    if without:
        doc.para(f"No compared pairs recorded by {', '.join(dict.fromkeys(without))}: logit-only methods (nkd, rkd) "
                 f"compare no layers, and runs of older kdplug versions did not record them.")


def write_report(paths: list[str | Path], output: str | Path, *, title: str = "kdplug report",
                 zoo: Optional[Zoo] = None, resamples: int = 2000) -> dict[str, Path]:
    """Write ``report.md``, ``report.html``, ``comparisons.json`` and the PNG figures into
    ``output``; return their paths. ``resamples``: of the paired bootstrap (0: t-intervals only)."""
    runs = load_runs(paths, zoo)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    doc = Document(title)
    summary_section(doc, runs)
    paper_section(doc, runs)
    groups = comparison_groups(runs)
    records = comparisons_section(doc, groups, resamples=resamples)

    figures_sections(doc, groups, out)
    files = {"markdown": out / "report.md", "html": out / "report.html", "comparisons": out / COMPARISONS_FILE}
    files["markdown"].write_text(doc.markdown(), encoding="utf-8")
    files["html"].write_text(doc.html(), encoding="utf-8")
    files["comparisons"].write_text(json.dumps(_finite(records), indent=1, allow_nan=False), encoding="utf-8")
    return files


def _finite(value: Any) -> Any:
    """Plain JSON: tuples as lists, an unbounded interval end (one seed) as null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

"""``kdplug report``: runs side by side with the papers, as Markdown and HTML with PNG figures.

Reads only run directories: ``config.yaml``, ``metrics.json``, and where present
``predictions.json``, ``attention.json`` and ``layers_dev.safetensors`` (written by the engine). A
figure whose data a run lacks is skipped with a note, never an error.

Comparisons (``comparisons.json`` too): runs that differ only in their method and seed are paired
on their common seeds, and every difference gets a 95% interval, a verdict and an estimate of the
seeds that would resolve it (:mod:`kdplug.compare`). Zoo runs are grouped by paper table and task
column, and the paper's ordering of each pair of rows is checked against ours.

Figures:
- ``curves.png``: dev main metric and training loss per epoch, every run and stage;
- ``attention-<run>.png``: the mean attention of every matched student layer over the teacher
  layers, and per example for the first student layer (ALP-KD Figure 3) and the last matched one
  (Universal-KD Figure 3);
- ``layers-<task>.png``: for each matched student layer j, the PCA of the student's and the
  teacher's dev vectors, and the cosine distance to the teacher per example (ALP-KD Figure 4).
  Student layer j of an m-layer student is compared with teacher layer 1 + ⌊(j−1)·n/(m−1)⌋
  (ALP-KD's 4-of-12 map 1, 5, 9).
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

    def predictions(self) -> dict[str, dict[str, list]]:
        """The final student's dev predictions and labels per split ({} for runs without the file)."""
        path = self.path / PREDICTIONS_FILE
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
                     pct(run.score(split, metric, "teacher")),
                     human(student.get("parameters", 0)), f"{run.metrics.get('wall_seconds', 0):.0f}s",
                     run.config.get("zoo") or "–"])
    doc.table(["run", "task", "student", "projector", "recipe", "seed", "checkpoint", "score", "student", "teacher",
               "params", "time", "zoo entry"], rows)
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


def comparison_groups(runs: list[Run]) -> list[Group]:
    """Runs grouped into comparable sets: zoo runs by paper table and task column (methods = the
    paper's rows), others by setup (methods = the remaining keys); a run's ``--baseline`` student
    counts as one more method (metrics only, no predictions)."""
    groups: dict[str, Group] = {}
    for run in runs:
        seed = run.seed
        student_dev = run.metrics.get("student", {}).get("dev")
        if seed is None or not student_dev:
            continue
        config = {**run.metrics.get("config", {}), **run.config}
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
            continue
        values = {k: v for k, v in config.items() if k not in SETUP_KEYS and k not in IGNORED_KEYS}
        teacher = Path(str(setup["teacher"])).name
        group = groups.setdefault(_key(["setup", setup]), Group(
            f"{run.task}: {teacher} → {setup['student']}", run.metrics.get("main_metric", "accuracy"), policy, setup,
            config=config))
        method = group.methods.setdefault(_key(values), Method(_method_label(values), values))
        method.add(seed, student_dev, run.predictions(), run.label)
        baseline = run.metrics.get("baseline")
        if baseline and baseline.get("dev"):
            base_values = {**values, "projector": baseline["projector"], "projector_options": {}, "recipe": "standard",
                           "recipe_options": {}, "eta": None, "lam": None, "temperature": None}
            key = _key(base_values)
            existing = group.methods.get(key)
            if existing is None:
                existing = group.methods[key] = Method(_method_label(base_values), base_values)
            if all(seed not in seeds for seeds in existing.results.values()):
                existing.add(seed, baseline["dev"], {}, f"{run.label} (baseline)")
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
                    notes += [f"{a.label} − {b.label}, {split} {metric}: {n}" for n in result.notes]
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


def curves_figure(runs: list[Run], out: Path) -> Optional[str]:
    plt = _pyplot()
    figure, (dev_axis, loss_axis) = plt.subplots(1, 2, figsize=(12, 4.2))
    drawn = 0
    for run in runs:
        metric = run.metrics.get("main_metric", "accuracy")
        offset, xs, dev, losses = 0, [], [], []
        for stage in run.metrics.get("stages", {}).values():
            for record in stage.get("history", []):
                split = next(iter(record.get("dev", {})), None)
                xs.append(offset + record["epoch"])
                dev.append(record["dev"][split].get(metric, float("nan")) * 100 if split else float("nan"))
                losses.append(record.get("train", {}).get("loss", float("nan")))
            offset = xs[-1] if xs else offset
        if not xs:
            continue
        drawn += 1
        dev_axis.plot(xs, dev, marker="o", label=run.label)
        loss_axis.plot(xs, losses, marker="o", label=run.label)
    if not drawn:
        plt.close(figure)
        return None
    dev_axis.set(title="dev score per epoch (all stages in order)", xlabel="epoch", ylabel="dev main metric (×100)")
    loss_axis.set(title="training loss per epoch", xlabel="epoch", ylabel="loss")
    from matplotlib.ticker import MaxNLocator

    for axis in (dev_axis, loss_axis):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        _grid_and_legend(axis)
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


def teacher_layer_for(j: int, m: int, n: int) -> int:
    """ALP-KD Fig. 4's pairing: student layer j of m against teacher layer 1 + ⌊(j−1)·n/(m−1)⌋."""
    return 1 + ((j - 1) * n) // max(m - 1, 1)


def load_layers(path: Path) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    from safetensors.numpy import load_file

    tensors = load_file(str(path))
    side = lambda prefix: {int(k.split(".", 1)[1]): v.astype(np.float64)  # noqa: E731
                           for k, v in tensors.items() if k.startswith(prefix + ".")}
    return side("teacher"), side("student")


def layers_figure(runs: list[tuple[Run, dict, dict]], out: Path, notes: list[str]) -> Optional[str]:
    """PCA and cosine distance to the teacher per example, per matched student layer (ALP-KD Fig. 4)."""
    plt = _pyplot()
    teacher = runs[0][1]
    n = max(teacher)
    depth = min(max(student) for _, _, student in runs)
    matched = list(range(1, depth)) or [1]
    rows = []
    for j in matched:
        t = teacher_layer_for(j, depth, n)
        students = [(run, student[j]) for run, _, student in runs if student[j].shape[1] == teacher[t].shape[1]]
        for run, _, student in runs:
            if student[j].shape[1] != teacher[t].shape[1]:
                notes.append(f"{run.label}: student layer {j} is {student[j].shape[1]} wide, teacher layer {t} is "
                             f"{teacher[t].shape[1]}; no common space for the PCA and the distance, skipped.")
        if students:
            rows.append((j, t, students))
    if not rows:
        return None
    figure, axes = plt.subplots(len(rows), 2, figsize=(12, 3.8 * len(rows)), squeeze=False)
    for (j, t, students), (pca_axis, dist_axis) in zip(rows, axes):
        count = min(len(teacher[t]), *(len(s) for _, s in students))
        points = np.concatenate([teacher[t][:count]] + [s[:count] for _, s in students])
        centred = points - points.mean(axis=0)
        _, _, components = np.linalg.svd(centred, full_matrices=False)
        projected = centred @ components[:2].T  # (rows, 2)
        pca_axis.scatter(projected[:count, 0], projected[:count, 1], s=12, c="tab:green", label=f"teacher T{t}")
        colours = ["tab:red", "tab:blue", "tab:orange", "tab:purple", "tab:brown"]
        for k, (run, _) in enumerate(students):
            chunk = projected[count * (k + 1): count * (k + 2)]
            pca_axis.scatter(chunk[:, 0], chunk[:, 1], s=12, c=colours[k % len(colours)], label=f"{run.label} S{j}")
            t_vec, s_vec = teacher[t][:count], students[k][1][:count]
            cosine = (t_vec * s_vec).sum(1) / (np.linalg.norm(t_vec, axis=1) * np.linalg.norm(s_vec, axis=1) + 1e-12)
            dist_axis.plot(range(1, count + 1), 1.0 - cosine, c=colours[k % len(colours)], lw=1.2, label=run.label)
        pca_axis.set(title=f"PCA of student layer S{j} and teacher layer T{t}", xlabel="PC 1", ylabel="PC 2")
        dist_axis.set(title=f"cosine distance of S{j} to T{t} per dev example", xlabel="dev example",
                      ylabel="1 − cos")
        for axis in (pca_axis, dist_axis):
            _grid_and_legend(axis)
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

    doc.heading("Training curves")
    name = curves_figure(runs, out / "curves.png")
    if name:
        doc.image(name, "Dev score (left) and training loss (right) per epoch; stages follow one another.")
    else:
        doc.para("No run recorded a training history.")

    doc.heading("Attention over teacher layers")
    for run in runs:
        path = run.path / ATTENTION_FILE
        if not path.is_file():
            doc.para(f"{run.label}: no {ATTENTION_FILE} (its projector records no attention, e.g. nkd, rkd, "
                     f"or the run predates the engine's analysis step); skipped.")
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        name = attention_figure(run, record, out / f"attention-{_safe(run.label)}.png")
        doc.image(name, f"{run.label} ({run.config.get('projector')}): attention of each matched student layer "
                        f"over the teacher layers; mean over {record.get('num_examples', '?')} dev examples and "
                        f"per example.")

    doc.heading("Layer representations (PCA, cosine distance to the teacher)")
    by_task: dict[str, list[tuple[Run, dict, dict]]] = {}
    for run in runs:
        path = run.path / LAYERS_FILE
        if not path.is_file():
            doc.para(f"{run.label}: no {LAYERS_FILE}; skipped.")
            continue
        teacher, student = load_layers(path)
        if not teacher or not student:
            doc.para(f"{run.label}: {LAYERS_FILE} holds no teacher or no student layers; skipped.")
            continue
        by_task.setdefault(run.task, []).append((run, teacher, student))
    for task, group in by_task.items():
        notes: list[str] = []
        name = layers_figure(group, out / f"layers-{_safe(task)}.png", notes)
        for note in notes:
            doc.para(note)
        if name:
            doc.image(name, f"{task}: per matched student layer, the first two principal components of the "
                            f"teacher's (green) and each student's dev vectors (left), and each student's cosine "
                            f"distance to the teacher per example (right), as in ALP-KD Figure 4.")
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

"""``kdplug report``: runs side by side with the papers, as Markdown and HTML with PNG figures.

Reads only run directories: ``config.yaml``, ``metrics.json``, and where present
``attention.json`` and ``layers_dev.safetensors`` (written by the engine's analysis step). A
figure whose data a run lacks is skipped with a note, never an error.

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

from .errors import UsageError
from .zoo import Zoo, ZooEntry

ATTENTION_FILE, LAYERS_FILE = "attention.json", "layers_dev.safetensors"


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


def load_runs(paths: list[str | Path], zoo: Optional[Zoo] = None) -> list[Run]:
    runs = []
    for raw in paths:
        path = Path(raw)
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
                     str(run.config.get("recipe", "?")), f"{split} {metric}", pct(run.score(split, metric)),
                     pct(run.score(split, metric, "teacher")),
                     human(student.get("parameters", 0)), f"{run.metrics.get('wall_seconds', 0):.0f}s",
                     run.config.get("zoo") or "–"])
    doc.table(["run", "task", "student", "projector", "recipe", "score", "student", "teacher", "params",
               "time", "zoo entry"], rows)


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
                line.append(f"{ours} / {paper_value:g} ({metric})")
            body.append(line)
        doc.para(f"**{paper} Table {table}**" + (" (the paper reports GLUE test scores; ours are dev)"
                                                  if "test" in sets else "") + ".")
        doc.table(header, body)


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
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out.name


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
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out.name


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
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
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
                 zoo: Optional[Zoo] = None) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` and the PNG figures into ``output``; return their paths."""
    runs = load_runs(paths, zoo)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    doc = Document(title)
    summary_section(doc, runs)
    paper_section(doc, runs)

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
    files = {"markdown": out / "report.md", "html": out / "report.html"}
    files["markdown"].write_text(doc.markdown(), encoding="utf-8")
    files["html"].write_text(doc.html(), encoding="utf-8")
    return files

"""The report's figures: training curves, attention over teacher layers, and the pairs each method
compared (PNG files, drawn with matplotlib's Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from ..layout import LAYERS_FILE
from .runs import Run

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
        stages = [
            (name, stage)
            for name, stage in run.metrics.get("stages", {}).items()
            if any("dev" in record for record in stage.get("history", []))
        ]  # not the heads' warm-up
        panels += [(label, run, number, len(stages), name, stage) for number, (name, stage) in enumerate(stages, 1)]
    if not panels:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    columns = min(columns, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.2 * rows), squeeze=False)
    for axis in axes.flat[len(panels) :]:
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
            axis.plot(
                epochs,
                line,
                marker="o",
                ms=3,
                lw=1.8 if term == "loss" else 1.2,
                ls="-" if term == "loss" else "--",
                color=TERM_COLOURS.get(term),
                label=term,
            )
        if values and max(values) / min(values) > 30:
            axis.set_yscale("log")
        dev_axis = axis.twinx()
        split = next(iter(history[0].get("dev", {})), None)
        dev = [record["dev"][split].get(metric, float("nan")) * 100 if split else float("nan") for record in history]
        dev_axis.plot(epochs, dev, color="black", marker="s", ms=3, lw=1, label=f"dev {metric}")
        best = stage.get("best_epoch")
        if best and 1 <= best <= len(dev):
            dev_axis.plot(
                [best], [dev[best - 1]], marker="*", ms=12, color="gold", mec="black", ls="none", label="kept epoch"
            )
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
    figure.suptitle(
        f"{run.label}: attention over teacher layers ({record.get('stage', '')}, {record.get('split', 'dev')})",
        fontsize=11,
    )
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
    pairs = [
        (
            tensors[f"pair.{p}.student"].astype(np.float64),
            tensors[f"pair.{p}.teacher"].astype(np.float64),
            tensors[f"pair.{p}.loss"].astype(np.float64) if f"pair.{p}.loss" in tensors else None,
        )
        for p in range(len(labels))
        if f"pair.{p}.student" in tensors
    ]
    return labels[: len(pairs)], pairs


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
    chosen = (
        list(range(len(pairs)))
        if len(pairs) <= max_pairs
        else sorted({round(i * (len(pairs) - 1) / (max_pairs - 1)) for i in range(max_pairs)})
    )  # first to last, spread
    plt = _pyplot()
    figure, axes = plt.subplots(len(chosen), 2, figsize=(11, 3.4 * len(chosen)), squeeze=False)
    for p, (pca_axis, distance_axis) in zip(chosen, axes):
        student, teacher, losses = pairs[p]
        name = names[p]
        if unit:  # the space PKD's loss compares in
            student, teacher = (
                v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12) for v in (student, teacher)
            )
        both = np.concatenate([teacher, student])
        centred = both - both.mean(axis=0)
        _, _, components = np.linalg.svd(centred, full_matrices=False)
        projected = centred @ components[:2].T  # (2N, 2)
        count = len(teacher)
        pca_axis.scatter(
            projected[:count, 0],
            projected[:count, 1],
            s=8,
            c="tab:green",
            alpha=0.6,
            label=f"teacher: {name['teacher']}",
        )
        pca_axis.scatter(
            projected[count:, 0], projected[count:, 1], s=8, c="tab:red", alpha=0.6, label=f"student: {name['student']}"
        )
        distance = losses if losses is not None else relative_distance(student, teacher)
        what = (
            f"its ILD term ({loss_name}) per dev example"
            if losses is not None
            else "‖s − t‖² / teacher spread per dev example"
        )
        distance_axis.plot(range(1, count + 1), distance, c="tab:red", lw=0.8)
        distance_axis.axhline(float(distance.mean()), color="black", ls="--", lw=1, label=f"mean {distance.mean():.4g}")
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

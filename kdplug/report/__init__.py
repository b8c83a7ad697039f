"""``kdplug report``: runs side by side with the papers, as Markdown and HTML with PNG figures.

Reads only run directories: ``config.yaml``, ``metrics.json``, and where present
``predictions.json``, ``attention.json`` and ``layers_dev.safetensors`` (written by the engine). A
figure whose data a run lacks is skipped with a note, never an error.

Comparisons (``comparisons.json`` too): runs that differ only in their method and seed are paired
on their common seeds, and every difference gets a 95% interval, a verdict and an estimate of the
seeds that would resolve it (:mod:`kdplug.compare`). Zoo runs are grouped by paper table and task
column, and the paper's ordering of each pair of rows is checked against ours.

Figures, per setup and method (the method's lowest seed; each run keeps its own in its directory),
named by numbers (group, method: short and path-free; the captions say what each shows):
- ``curves-<group>.png``: one panel per method and training stage, in order: every loss term its
  own line, the dev score on a second axis, the kept epoch starred;
- ``attention-<group>-<method>.png``: the mean attention of every matched student layer over the
  teacher layers, and per example for the first student layer (ALP-KD Figure 3) and the last
  matched one (Universal-KD Figure 3);
- ``layers-<group>-<method>.png``: the pairs the projector compared, in the space it compared them
  (ALP's attention mix, Universal-KD's pseudo-classifier outputs, PKD's mapped layers): the PCA
  of both sides' dev vectors and, per example, the ILD term the method minimised (ALP-KD Figure 4).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from ..storage import WriterLock, check_own_directory, write_atomic
from ..version import __version__
from ..zoo import Zoo
from .comparisons import TaskFactory, compare_group, comparison_groups
from .document import Document
from .runs import load_runs
from .sections import comparisons_section, figures_sections, paper_section, summary_section

COMPARISONS_FILE = "comparisons.json"
#: marks a directory as kdplug's report: only such a directory (or a new or empty one) is written to
REPORT_MARKER = "kdplug_report.json"
REPORT_LOCK = "kdplug_report.lock"


def write_report(
    paths: list[str | Path],
    output: str | Path,
    *,
    title: str = "kdplug report",
    zoo: Optional[Zoo] = None,
    resamples: int = 2000,
    task_factory: Optional[TaskFactory] = None,
) -> dict[str, Path]:
    """Write ``report.md``, ``report.html``, ``comparisons.json`` and the PNG figures into
    ``output``; return their paths. ``resamples``: of the paired bootstrap (0: t-intervals only).
    ``task_factory``: re-creates a run's task from its configuration, for the bootstrap of a metric
    kdplug has no weighted form of (``kdplug report`` passes one from its registry)."""
    out = Path(output)
    check_report_directory(out)  # before any work
    runs = load_runs(paths, zoo)  # collect
    groups = comparison_groups(runs)
    comparisons = [compare_group(group, resamples=resamples, task_factory=task_factory) for group in groups]  # compute
    check_report_directory(out)
    out.mkdir(parents=True, exist_ok=True)
    with WriterLock(out / REPORT_LOCK).acquire(f"report directory {out}", "wait for it, or choose another --output"):
        write_atomic(out / REPORT_MARKER, json.dumps({"kdplug": __version__, "runs": [str(p) for p in paths]}))
        doc = Document(title)  # write
        summary_section(doc, runs)
        paper_section(doc, runs)
        records = comparisons_section(doc, comparisons, resamples=resamples)
        figures_sections(doc, groups, out)  # draw
        files = {"markdown": out / "report.md", "html": out / "report.html", "comparisons": out / COMPARISONS_FILE}
        write_atomic(files["markdown"], doc.markdown())
        write_atomic(files["html"], doc.html())
        write_atomic(files["comparisons"], json.dumps(_finite(records), indent=1, allow_nan=False))
    return files


def check_report_directory(out: Path) -> None:
    """A report replaces only a report: ``out`` is new, empty, or one kdplug wrote (its marker, or
    the files of a report an earlier version wrote, which had none)."""
    if out.is_dir() and all((out / name).is_file() for name in ("report.md", "report.html", COMPARISONS_FILE)):
        return
    check_own_directory(out, REPORT_MARKER, writes="report.md, report.html, comparisons.json and figures")


def _finite(value: Any) -> Any:
    """Plain JSON: tuples as lists, an unbounded interval end (one seed) as null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

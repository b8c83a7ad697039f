"""Paired comparisons of two methods run on the same seeds and data: intervals and a verdict.

Two seeds of one setup can differ by more than the gap between two methods, so a difference
means something only next to its uncertainty. For methods A and B, each run once per seed on the
same data, everything here is about the per-seed differences d_s = score_A(s) − score_B(s):

- **t-interval over seeds**: mean(d) ± t_{n−1, 1−α/2} · sd(d) / √n. Exact for normal d_s, valid
  with few seeds; treats the dev set as fixed (it says nothing about another sample of examples).
- **paired bootstrap over examples and seeds** (when both runs kept their predictions): each
  resample draws n seeds with replacement and one resample of the dev examples, shared by both
  methods and by every seed (they all saw the same dev set); the statistic is the mean over the
  drawn seeds of metric_A − metric_B, the metric recomputed on the resampled examples; the
  interval is the 2.5 and 97.5 percentiles. It covers the dev set's sampling noise too, but a
  bootstrap over a handful of seeds underestimates their spread.

**Verdict**: "better" (A > B) when every available interval lies above zero, "worse" when every
one lies below, otherwise "not resolved at n seeds"; one seed never resolves anything.

**Seeds needed**: with the observed mean difference d, the per-seed spread s = sd(d_s) and the
dev-set variance v (the bootstrap variance of the difference with the seeds held fixed; 0 without
predictions), the 95% interval excludes zero with about 80% probability once
(t_{0.975, n−1} + t_{0.8, n−1})² · (s²/n + v) ≤ d²; the smallest such n (at least 2). The usual
power approximation, with t-quantiles so that it stays honest at a handful of seeds. If
d²/(z_{0.975} + z_{0.8})² ≤ v (the limit n → ∞), no number of seeds resolves d on this dev set.

Every kdplug metric is higher-is-better (the task contract), so "better" means a higher score.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np
from scipy import stats

T_METHOD = "t-interval over seeds"
BOOTSTRAP_METHOD = "paired bootstrap over examples and seeds"
BETTER, WORSE = "better", "worse"
POWER = 0.8  # of the seeds-needed estimate

#: a metric over many resamples of one run's examples: predictions (n,), references (n,) and
#: weights (R, n), row r the number of times each example was drawn in resample r -> (R,)
WeightedMetric = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


# -- metrics over many resamples at once ---------------------------------------------------------
# The same definitions as the first-party tasks' metrics (kdplug_tasks.base.METRICS, sklearn's),
# computed from example weights: a resample's confusion matrix is weights @ one-hot(pred, ref),
# so thousands of resamples take a matrix product instead of thousands of metric calls.


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (sklearn's zero_division=0)."""
    safe = np.where(denominator == 0, 1, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)


def confusion(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(counts, labels): counts[r, i, j] = weighted number of examples with reference labels[i]
    predicted as labels[j] in resample r."""
    labels = np.union1d(pred, ref)
    k = len(labels)
    cells = np.searchsorted(labels, ref) * k + np.searchsorted(labels, pred)  # (n,)
    onehot = np.zeros((len(cells), k * k))
    onehot[np.arange(len(cells)), cells] = 1.0
    return (weights @ onehot).reshape(len(weights), k, k), labels  # (R, k, k)


def accuracy(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (weights * (pred == ref)).sum(axis=1) / weights.sum(axis=1)


def f1(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Binary F1 of class 1 (MRPC, QQP)."""
    tp = (weights * ((pred == 1) & (ref == 1))).sum(axis=1)
    return _ratio(2.0 * tp, (weights * (pred == 1)).sum(axis=1) + (weights * (ref == 1)).sum(axis=1))


def macro_f1(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The mean F1 over the classes present in each resample's predictions or references."""
    counts, _ = confusion(pred, ref, weights)
    tp = np.diagonal(counts, axis1=1, axis2=2)  # (R, k)
    both = counts.sum(axis=1) + counts.sum(axis=2)  # predicted + actual, (R, k)
    return _ratio(_ratio(2.0 * tp, both).sum(axis=1), (both > 0).sum(axis=1))


def matthews(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Matthews correlation, multi-class (Gorodkin's R_K, as sklearn computes it)."""
    counts, _ = confusion(pred, ref, weights)
    actual, predicted = counts.sum(axis=2), counts.sum(axis=1)  # (R, k)
    n = counts.sum(axis=(1, 2))
    correct = np.trace(counts, axis1=1, axis2=2)
    numerator = correct * n - (actual * predicted).sum(axis=1)
    denominator = np.sqrt((n * n - (predicted**2).sum(axis=1)) * (n * n - (actual**2).sum(axis=1)))
    return _ratio(numerator, denominator)


def pearson(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted Pearson correlation per resample; 0 where either side is constant (no information)."""
    x, y = pred - pred.mean(), ref - ref.mean()  # centred once, against cancellation
    total = weights.sum(axis=1)
    mx, my = weights @ x / total, weights @ y / total
    cov = weights @ (x * y) / total - mx * my
    vx, vy = weights @ (x * x) / total - mx * mx, weights @ (y * y) / total - my * my
    drawn = weights > 0
    constant = _constant(x, drawn) | _constant(y, drawn)
    return np.where(constant, 0.0, _ratio(cov, np.sqrt(np.clip(vx, 0, None) * np.clip(vy, 0, None))))


def _constant(values: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    return np.where(drawn, values, -np.inf).max(axis=1) == np.where(drawn, values, np.inf).min(axis=1)


def _weighted_ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The average rank (1-based, ties averaged) each example's value has in each resample."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # first position of each distinct value
    group_of = np.cumsum(np.r_[True, ordered[1:] != ordered[:-1]]) - 1  # (n,) in sorted order
    sizes = np.add.reduceat(weights[:, order], starts, axis=1)  # (R, groups): draws of each value
    ranks = np.cumsum(sizes, axis=1) - sizes + (sizes + 1) / 2  # (R, groups)
    result = np.empty_like(weights, dtype=float)
    result[:, order] = ranks[:, group_of]
    return result


def spearman(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Pearson correlation of the ranks each resample gives (ties averaged, as scipy's rankdata)."""
    rx, ry = _weighted_ranks(pred, weights), _weighted_ranks(ref, weights)
    total = weights.sum(axis=1, keepdims=True)
    mx, my = (weights * rx).sum(axis=1, keepdims=True) / total, (weights * ry).sum(axis=1, keepdims=True) / total
    cov = (weights * (rx - mx) * (ry - my)).sum(axis=1)
    vx, vy = (weights * (rx - mx) ** 2).sum(axis=1), (weights * (ry - my) ** 2).sum(axis=1)
    drawn = weights > 0
    constant = _constant(pred, drawn) | _constant(ref, drawn)
    return np.where(constant, 0.0, _ratio(cov, np.sqrt(vx * vy)))


WEIGHTED_METRICS: dict[str, WeightedMetric] = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "matthews": matthews,
    "pearson": pearson,
    "spearman": spearman,
}


def weighted_metric(scalar: Callable[[np.ndarray, np.ndarray], float]) -> WeightedMetric:
    """A weighted metric from any ``fn(predictions, references) -> float`` (e.g. a plugin task's
    ``compute_metrics(...)[name]``): each resample is expanded and scored, slower but exact."""

    def metric(pred: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
        rows = [np.repeat(np.arange(len(pred)), row.astype(int)) for row in weights]
        return np.array([scalar(pred[index], ref[index]) for index in rows], dtype=float)

    return metric


# -- intervals -----------------------------------------------------------------------------------


def t_interval(differences: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """mean ± t_{n−1} · sd / √n over the per-seed differences; unbounded with fewer than two seeds."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        return -math.inf, math.inf
    half = stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


@dataclass(frozen=True)
class Bootstrap:
    interval: tuple[float, float]
    example_variance: float  # variance of the mean difference from resampling the examples alone
    resamples: int


def paired_bootstrap(
    predictions_a: np.ndarray,
    predictions_b: np.ndarray,
    references: np.ndarray,
    metric: WeightedMetric,
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    chunk_elements: int = 1_000_000,
) -> Bootstrap:
    """The paired bootstrap interval of mean_s [metric(A_s) − metric(B_s)].

    ``predictions_a`` and ``predictions_b``: (seeds, examples), row s the predictions of the run
    with seed s (the same seeds, in the same order, on both sides); ``references``: (examples,).
    A resample of the examples is a row of draw counts, shared by both methods and every seed;
    a resample of the seeds weighs each seed's difference by how often it was drawn.
    Deterministic for a given ``seed``.
    """
    a, b, y = np.asarray(predictions_a), np.asarray(predictions_b), np.asarray(references)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] != y.shape[0] or y.ndim != 1:
        raise ValueError(
            f"expected predictions (seeds, examples) on both sides and references (examples,), "
            f"got {a.shape}, {b.shape} and {y.shape}"
        )
    seeds, n = a.shape
    rng = np.random.default_rng(seed)
    chunk = max(1, chunk_elements // n)
    joint, examples_only = [], []
    for start in range(0, resamples, chunk):
        c = min(chunk, resamples - start)
        drawn = rng.integers(0, n, size=(c, n)) + n * np.arange(c)[:, None]
        weights = np.bincount(drawn.ravel(), minlength=c * n).reshape(c, n).astype(float)  # (c, n) draw counts
        differences = np.stack([metric(a[s], y, weights) - metric(b[s], y, weights) for s in range(seeds)], axis=1)
        seed_draws = rng.integers(0, seeds, size=(c, seeds)) + seeds * np.arange(c)[:, None]
        seed_weights = np.bincount(seed_draws.ravel(), minlength=c * seeds).reshape(c, seeds) / seeds  # (c, seeds)
        joint.append((seed_weights * differences).sum(axis=1))
        examples_only.append(differences.mean(axis=1))
    joint_d, examples_d = np.concatenate(joint), np.concatenate(examples_only)
    low, high = np.quantile(joint_d, [0.5 - level / 2, 0.5 + level / 2])
    return Bootstrap((float(low), float(high)), float(examples_d.var(ddof=1)) if resamples > 1 else 0.0, resamples)


# -- verdict and seeds needed ----------------------------------------------------------------------


def verdict(intervals: Sequence[tuple[float, float]], seeds: int) -> str:
    """ "better" if every interval lies above zero, "worse" if every one lies below, else not resolved."""
    if seeds >= 2 and intervals:
        if all(low > 0 for low, _ in intervals):
            return BETTER
        if all(high < 0 for _, high in intervals):
            return WORSE
    return f"not resolved at {seeds} seed{'s' if seeds != 1 else ''}"


def seeds_needed(
    mean: float, sd: float, example_variance: float = 0.0, *, level: float = 0.95, power: float = POWER
) -> Optional[int]:
    """Seeds for the interval to exclude zero with probability ``power`` if the true difference is
    ``mean`` and the per-seed spread ``sd`` (module docstring); None when no number of seeds
    would: a zero difference, or dev-set noise alone as large as the difference."""
    z = stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(power)
    budget = (mean / z) ** 2 - example_variance  # the variance the seed term may still have, as n -> inf
    if mean == 0 or budget <= 0:
        return None
    normal = max(2, math.ceil(sd * sd / budget))  # the answer with normal quantiles; t needs a few more
    n = np.arange(2, 2 * normal + 30)
    t = stats.t.ppf(0.5 + level / 2, n - 1) + stats.t.ppf(power, n - 1)
    enough = t**2 * (sd * sd / n + example_variance) <= mean * mean
    return int(n[np.argmax(enough)]) if enough.any() else None


# -- one comparison ------------------------------------------------------------------------------


@dataclass
class SeedResult:
    """One run of a method: its seed, its scores on one split, and (optionally) its predictions."""

    seed: int
    scores: Mapping[str, float]
    predictions: Optional[np.ndarray] = None
    references: Optional[np.ndarray] = None


@dataclass
class Comparison:
    a: str
    b: str
    metric: str
    seeds: list[int]
    differences: list[float]  # a − b per seed, in ``seeds`` order
    mean: float
    sd: Optional[float]
    t_interval: tuple[float, float]
    bootstrap: Optional[tuple[float, float]]
    verdict: str
    seeds_needed: Optional[int]
    level: float = 0.95
    notes: list[str] = field(default_factory=list)

    @property
    def methods(self) -> str:
        """Which intervals the verdict rests on."""
        return T_METHOD + (f" and {BOOTSTRAP_METHOD}" if self.bootstrap is not None else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "methods": self.methods}


def compare(
    a: Mapping[int, SeedResult],
    b: Mapping[int, SeedResult],
    metric: str,
    *,
    name_a: str = "A",
    name_b: str = "B",
    metric_fn: Optional[WeightedMetric] = None,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """A − B on ``metric`` over the seeds both ran. The bootstrap runs when ``metric_fn`` is given
    (default: :data:`WEIGHTED_METRICS`' entry for ``metric``), ``resamples`` > 0, and every common
    seed has predictions on the same references on both sides."""
    common = sorted(s for s in set(a) & set(b) if metric in a[s].scores and metric in b[s].scores)
    if not common:
        raise ValueError(f"{name_a} and {name_b} share no seed with a {metric!r} score")
    differences = [float(a[s].scores[metric]) - float(b[s].scores[metric]) for s in common]
    mean = float(np.mean(differences))
    sd = float(np.std(differences, ddof=1)) if len(common) > 1 else None
    interval = t_interval(differences, level)
    notes: list[str] = []
    boot = None
    metric_fn = metric_fn or WEIGHTED_METRICS.get(metric)
    with_predictions = all(r.predictions is not None and r.references is not None for s in common for r in (a[s], b[s]))
    if resamples > 0 and with_predictions and metric_fn is not None:
        references = np.asarray(a[common[0]].references)
        if all(np.array_equal(np.asarray(r.references), references) for s in common for r in (a[s], b[s])):
            boot = paired_bootstrap(
                np.stack([np.asarray(a[s].predictions) for s in common]),
                np.stack([np.asarray(b[s].predictions) for s in common]),
                references,
                metric_fn,
                level=level,
                resamples=resamples,
                seed=seed,
            )
        else:
            notes.append("the runs were evaluated on different examples; no bootstrap")
    elif resamples > 0 and not with_predictions:
        notes.append("no predictions.json on both sides; t-interval only")
    elif resamples > 0:
        notes.append(f"no way to recompute {metric!r} on resampled examples; t-interval only")
    intervals = [interval] + ([boot.interval] if boot else [])
    needed = seeds_needed(mean, sd, boot.example_variance if boot else 0.0, level=level) if sd is not None else None
    if len(common) < 2:
        notes.append("one seed: the seed-to-seed spread is unknown, nothing can be resolved")
    elif needed is None and mean != 0:
        notes.append(
            "the dev set's sampling noise alone is as large as the difference: more seeds will not "
            "resolve it; a larger dev set would"
        )
    return Comparison(
        name_a,
        name_b,
        metric,
        common,
        differences,
        mean,
        sd,
        interval,
        boot.interval if boot else None,
        verdict(intervals, len(common)),
        needed,
        level,
        notes,
    )


def ordering(paper_a: float, paper_b: float, comparison: Comparison) -> str:
    """Whether our runs reproduce the paper's ordering of A and B (the comparison is A − B)."""
    if paper_a == paper_b:
        return "the paper ties them"
    expected = BETTER if paper_a > paper_b else WORSE
    if comparison.verdict == expected:
        return "reproduced"
    if comparison.verdict in (BETTER, WORSE):
        return "contradicted"
    return "not resolved"

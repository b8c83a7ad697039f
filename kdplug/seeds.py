"""``kdplug run --seeds``: one setup over several seeds, on the sweep machinery (:func:`kdplug.sweep.run_each`
skips finished seeds and resumes interrupted ones), with mean ± sample std over the seeds in
``<output>/seeds.json``; the teacher is fine-tuned once, with the base seed, and shared."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from .config import RunConfig
from .engine.rundir import default_output
from .errors import ConfigError, UsageError
from .layout import METRICS_FILE, SEED_DIR_PREFIX, SEEDS_FILE
from .registry import Registry
from .storage import write_atomic
from .sweep import run_each


def parse_seeds(text: str, first: int) -> list[int]:
    """``"5"`` -> five seeds from ``first`` on; ``"1,2,3"`` (or ``[1,2,3]``) -> those seeds."""
    parts = [p.strip() for p in text.strip().strip("[]").split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values:
        raise ConfigError(f"--seeds expects a count (--seeds 5) or a list of integers (--seeds 1,2,3), got {text!r}")
    if len(parts) == 1 and "," not in text:
        if values[0] < 1:
            raise ConfigError(f"--seeds {text}: the number of seeds must be at least 1")
        return list(range(first, first + values[0]))
    if len(set(values)) != len(values):
        raise ConfigError(f"--seeds {text}: a seed is listed twice")
    return values


def seed_configs(config: RunConfig, seeds: list[int]) -> list[RunConfig]:
    """One configuration per seed, identical but for ``seed`` and the output directory. The teacher's
    fine-tuning seed stays the base seed, so every student learns from the same fine-tuned teacher."""
    output = Path(config.output or default_output(config))
    teacher_seed = config.seed if config.teacher_seed is None else config.teacher_seed
    outputs = {seed: str(output / f"{SEED_DIR_PREFIX}{seed}") for seed in seeds}
    return [dataclasses.replace(config, seed=seed, teacher_seed=teacher_seed, output=outputs[seed]) for seed in seeds]


def run_seeds(
    config: RunConfig, seeds: list[int], registry: Registry, *, overwrite: bool = False, echo=print
) -> dict[str, Any]:
    """Run ``config`` once per seed with the sweep machinery (a finished seed with the same
    configuration is not run again, an interrupted one resumes), then write and print mean ± std
    over the seeds."""
    from .engine.preflight import resolve_components

    resolve_components(config, registry)
    configs = seed_configs(config, seeds)
    root = Path(configs[0].output).parent
    foreign = (
        sorted(e.name for e in root.iterdir() if not e.name.startswith(SEED_DIR_PREFIX) and e.name != SEEDS_FILE)
        if root.is_dir()
        else []
    )
    if foreign:
        raise UsageError(
            f"output directory {root} holds files kdplug did not write (e.g. {foreign[0]}); --seeds "
            f"writes {SEED_DIR_PREFIX}<s>/ run directories and {SEEDS_FILE} into a new or empty directory, or one "
            f"it wrote before: choose another --output"
        )
    run_each([(f"seed {c.seed}", c) for c in configs], registry, overwrite=overwrite, echo=echo)
    summary = summarize_seeds(configs)
    write_atomic(root / SEEDS_FILE, json.dumps(summary, indent=2))
    echo(format_seeds(summary))
    echo(f"seeds summary: {root / SEEDS_FILE}; compare methods with 'kdplug report {root} OTHER_RUN_DIR'")
    return summary


def summarize_seeds(configs: list[RunConfig]) -> dict[str, Any]:
    """Per model (student, and the baseline when there is one): each dev metric's values, mean and
    sample standard deviation over the seeds."""
    runs = {c.seed: json.loads((Path(c.output) / METRICS_FILE).read_text(encoding="utf-8")) for c in configs}
    first = next(iter(runs.values()))
    models = {"student": f"{configs[0].student} + {configs[0].projector}"}
    if "baseline" in first:
        models["baseline"] = f"{configs[0].student} + {first['baseline']['projector']}"
    summary: dict[str, Any] = {
        "seeds": list(runs),
        "teacher_seed": configs[0].teacher_seed,
        "main_metric": first["main_metric"],
        "best_checkpoint": configs[0].best_checkpoint,
        "runs": {str(seed): c.output for seed, c in zip(runs, configs)},
        "models": {},
    }
    for key, label in models.items():
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for split, metrics in first[key]["dev"].items():
            for metric in metrics:
                values = [runs[seed][key]["dev"][split][metric] for seed in runs]
                table.setdefault(split, {})[metric] = {
                    "values": values,
                    "mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else None,
                }
        summary["models"][label] = table
    return summary


def format_seeds(summary: dict[str, Any]) -> str:
    """The summary as a table: one line per model, mean ± std (×100) of every dev metric."""
    models = summary["models"]
    columns = [(split, metric) for split, metrics in next(iter(models.values())).items() for metric in metrics]
    header = ["model"] + [f"{split} {metric}" for split, metric in columns]
    body = []
    for label, table in models.items():
        cells = []
        for split, metric in columns:
            cell = table[split][metric]
            spread = f" ± {cell['std'] * 100:.2f}" if cell["std"] is not None else ""
            cells.append(f"{cell['mean'] * 100:.2f}{spread}")
        body.append([label] + cells)
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    seeds = ", ".join(str(s) for s in summary["seeds"])
    return "\n".join(
        [
            f"{len(summary['seeds'])} seeds ({seeds}); mean ± sample std; teacher fine-tuned with seed "
            f"{summary['teacher_seed']}; {summary['best_checkpoint']} checkpoint",
            line(header),
            line(["-" * w for w in widths]),
        ]
        + [line(r) for r in body]
    )

"""The recipe contract: two tiny runs through the engine, the recipe seeing only its
protocol (kdplug.types.RecipeContext)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

from ...registry import Registry
from .harness import ContractReport, Workspace, _begin, _borrowed, _list, _Note, one_thread, require

# --------------------------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------------------------

RECIPE_CHECKS = (
    "name resolves",
    "builds",
    "runs on a tiny setup",
    "records its stages",
    "no NaN",
    "exports the student",
    "deterministic under a seed",
)

#: the tiny run a recipe is checked on: random 4-layer BERT teacher, tiny BiLSTM, 16 SST-2 lines
TINY_RUN: dict[str, Any] = {
    "student": "bilstm",
    "projector": "pkd-skip",
    "task": "sst2",
    "epochs": 1,
    "teacher_epochs": 1,
    "allow_weak_teacher": True,
    "head_epochs": 1,
    "batch_size": 8,
    "student_options": {"embedding_dim": 16, "hidden_size": 16},
}


def _nonfinite_numbers(value: Any, path: str = "") -> list[str]:
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "value"]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _nonfinite_numbers(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _nonfinite_numbers(v, f"{path}[{i}]")]
    return []


@one_thread
def check_recipe(
    name: str,
    *,
    options: Optional[Mapping[str, Any]] = None,
    run: Optional[Mapping[str, Any]] = None,
    registry: Optional[Registry] = None,
    workspace: Optional[Workspace] = None,
) -> ContractReport:
    """The recipe contract: two complete tiny runs through the engine (:data:`TINY_RUN`, updated
    with ``run``), which must finish, record their stages, export a student and agree."""
    from ...config import RunConfig
    from ...engine.pipeline import run as run_pipeline

    registry, report, rec = _begin("recipe", name, registry)
    options = dict(options or {})

    def build() -> None:
        recipe = registry.create("recipe", name, **options)
        require(
            callable(getattr(recipe, "run", None)),
            f"the factory returned a {type(recipe).__name__} without a run(ctx) method",
        )

    rec.run("builds", build, fatal=True)
    with _borrowed(workspace) as workspace:
        results: list[Any] = []

        def one_run(index: int):
            settings = {
                **TINY_RUN,
                "teacher": workspace.tiny_bert,
                "data_dir": workspace.sst2_dir,
                **(run or {}),
                "recipe": name,
                "recipe_options": options,
                "cache_dir": str(workspace.path("cache")),
                "output": str(workspace.path(f"run-{name}-{index}")),
            }
            config = RunConfig(**settings).validate()
            return run_pipeline(config, registry, overwrite=True, echo=lambda line: None)

        rec.run("runs on a tiny setup", lambda: results.append(one_run(1)), fatal=True)
        result = results[0] if results else None

        def stages() -> _Note:
            recorded = result.metrics.get("stages") or {}
            require(recorded, "the run recorded no stage: train the student with ctx.train_stage(...)")
            return _Note("stages: " + ", ".join(recorded))

        rec.run("records its stages", stages)

        def no_nan() -> None:
            bad = _nonfinite_numbers({"stages": result.metrics.get("stages"), "student": result.metrics.get("student")})
            require(not bad, f"non-finite numbers in metrics.json: {_list(bad)}")

        rec.run("no NaN", no_nan)

        def exported() -> None:
            weights = result.run_dir / "student" / "model.safetensors"
            require(weights.is_file(), f"{weights} was not written")

        rec.run("exports the student", exported)

        def deterministic() -> None:
            again = one_run(2)
            require(
                again.metrics["student"]["dev"] == result.metrics["student"]["dev"],
                f"two runs with seed {TINY_RUN.get('seed', 42)} give dev results {result.metrics['student']['dev']}"
                f" and {again.metrics['student']['dev']}",
            )

        rec.run("deterministic under a seed", deterministic)
    report.results += rec.results
    return report

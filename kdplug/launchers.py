"""Where a sweep's points run: here, one after another (``local``), or as submitit jobs
(``submitit``): SLURM on a cluster, submitit's local executor on one machine.

A submitit sweep first fine-tunes and caches the teachers its pending points need, in one job,
then sends the points out as a job array (``--jobs N``; by default one per point on SLURM, one
per CPU core locally), every job reading that cache (put it on a shared file system:
``--set cache_dir=/shared/...``), and waits for them. Each job's failures come back to the table.
Interrupted here, SLURM jobs keep running: ``kdplug sweep --collect DIR`` tabulates them, and the
same sweep command again submits only the points still missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from .config import parse_value
from .errors import ConfigError, UsageError
from .sweep import Results, Sweep, collect

LAUNCHERS = ("local", "submitit")
CLUSTERS = ("auto", "slurm", "local", "debug")  # submitit's executors; auto: SLURM where srun exists
SUBMITIT_DIR = "submitit"  # job scripts, pickles and logs, inside the sweep directory
DEFAULT_TIMEOUT_MIN = 12 * 60  # submitit's own default (local: 2 minutes) ends any real run


def parse_executor_options(items: list[str]) -> dict[str, Any]:
    """``--executor KEY=VALUE`` options -> submitit parameters (values read as YAML)."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--executor expects KEY=VALUE (e.g. --executor slurm_partition=gpu), got {item!r}")
        options[key.strip()] = parse_value(value)
    return options


def make_executor(folder: Path, cluster: str, options: dict[str, Any]) -> Any:
    """A submitit AutoExecutor with kdplug's defaults under the user's ``--executor`` options."""
    try:
        import submitit
    except ImportError:
        raise ConfigError(
            "--launcher submitit needs the submitit package: pip install submitit (kdplug's cluster extra)"
        ) from None
    if cluster not in CLUSTERS:
        raise ConfigError(f"--cluster must be one of {', '.join(CLUSTERS)}, got {cluster!r}")
    try:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster=None if cluster == "auto" else cluster)
        executor.update_parameters(**{"name": "kdplug-sweep", "timeout_min": DEFAULT_TIMEOUT_MIN, **options})
    except (NameError, RuntimeError, ValueError) as exc:  # unknown parameter, no srun, bad value
        raise ConfigError(f"submitit: {exc}".splitlines()[0] + " (see 'kdplug sweep --help')") from None
    return executor


def default_jobs(executor: Any, pending: int) -> int:
    """One job per point on a cluster; on this machine no more jobs than cores, which they share."""
    if executor.cluster in ("local", "debug"):
        return max(1, min(pending, os.cpu_count() or 1))
    return pending


def run_submitit(
    sweep: Sweep,
    registry: Any,
    *,
    cluster: str = "auto",
    jobs: Optional[int] = None,
    options: Optional[dict[str, Any]] = None,
    disabled: tuple[str, ...] = (),
    echo: Callable[[str], None] = print,
) -> Results:
    """Warm the teachers in one job, then run the pending points as a job array; the results table."""
    sweep.checked_configs(registry)  # every point's names and values, before anything is submitted
    sweep.write_spec()  # first: it refuses a directory of the user's files before anything is written there
    executor = make_executor(sweep.directory / SUBMITIT_DIR, cluster, dict(options or {}))
    pending = sweep.pending()
    if not pending:
        echo(f"sweep {sweep.directory}: every point is done already")
        return _tabulate(sweep, {})
    count = jobs or default_jobs(executor, len(pending))
    if count < 1:
        raise ConfigError(f"--jobs must be at least 1, got {count}")
    count = min(count, len(pending))
    spec = (str(sweep.directory), sweep.base, sweep.grid, sweep.zoo, tuple(disabled))
    local = executor.cluster in ("local", "debug")

    echo(
        f"sweep {sweep.directory}: {len(pending)} points to run as {count} {executor.cluster} jobs; first, the "
        f"teachers they need (logs: {sweep.directory / SUBMITIT_DIR})"
    )
    warm = executor.submit(warm_job, spec, pending, None)
    echo(f"    warm-up job {warm.job_id}")
    try:
        echo(f"    {warm.result()} teacher(s) fine-tuned or found, outputs cached")
    except Exception as exc:  # submitit's FailedJobError carries the job's traceback
        raise UsageError(
            f"the teacher warm-up job {warm.job_id} failed, so no point was submitted: "
            f"{_last_line(exc)} (log: {warm.paths.stderr})"
        ) from None

    shares = [pending[index::count] for index in range(count)]
    threads = [max(1, (os.cpu_count() or 1) // count) if local else None] * count
    array = executor.map_array(point_job, [spec] * count, shares, threads)
    echo(
        f"    jobs {', '.join(job.job_id for job in array)} submitted; waiting (Ctrl-C leaves SLURM jobs running: "
        f"'kdplug sweep --collect {sweep.directory}' tabulates them later)"
    )
    failures: dict[str, str] = {}
    for job, share in zip(array, shares):
        try:
            failures.update(job.result())
            echo(f"    job {job.job_id} finished: {', '.join(share)}")
        except Exception as exc:
            reason = f"job {job.job_id} failed: {_last_line(exc)} (log: {job.paths.stderr})"
            failures.update(dict.fromkeys(share, reason))
            echo(f"    {reason}")
    return _tabulate(sweep, failures)


def _tabulate(sweep: Sweep, failures: dict[str, str]) -> Results:
    results = collect(sweep.directory)
    results.failures.update(failures)
    results.write(sweep.directory)
    return results


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


# -- what runs inside a job (pickled by reference: kdplug must be installed where the jobs run) --


def _job_setup(spec: tuple, threads: Optional[int]) -> tuple[Sweep, Any]:
    import torch

    from .plugins import PluginManager

    threads = threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or None
    if threads:  # torch would use every core of the node, not the job's share of them
        torch.set_num_threads(threads)
    directory, base, grid, zoo, disabled = spec
    return Sweep(Path(directory), base, grid, zoo=zoo), PluginManager(disabled=disabled).registry


def warm_job(spec: tuple, point_ids: list[str], threads: Optional[int]) -> int:
    sweep, registry = _job_setup(spec, threads)
    return sweep.warm_teachers(registry, point_ids)


def point_job(spec: tuple, point_ids: list[str], threads: Optional[int]) -> dict[str, str]:
    """Runs ``point_ids`` one after another; returns the failed ones with their errors."""
    sweep, registry = _job_setup(spec, threads)
    return sweep.run(registry, only=point_ids).failures

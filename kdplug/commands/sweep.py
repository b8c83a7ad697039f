"""``kdplug sweep``: a grid over configuration keys, one run per point, and a results table."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..launchers import CLUSTERS, LAUNCHERS
from ..plugins import PluginManager
from . import report_failures

SWEEP_EXAMPLES = """
examples:
  kdplug sweep --zoo alp-kd/table1-sst2-alp --set data_dir=~/glue --grid lr=2e-5,5e-5 --grid seed=1,2,3
  kdplug sweep --zoo alp-kd/table1-sst2-alp --set data_dir=~/glue --paper-grid    # the paper's search
  kdplug sweep --config my.yaml --grid eta=0.2,0.5,0.7 --grid projector=pkd-skip,alp
  kdplug sweep --grid-file sweep.yaml --output sweeps/alp --shard 2/4    # worker 2 of 4, same --output
  kdplug sweep --collect sweeps/alp                                       # rewrite results.md only
  kdplug sweep --grid-file sweep.yaml --output /shared/sweeps/alp --set cache_dir=/shared/kdplug-cache \
      --launcher submitit --executor slurm_partition=gpu --executor gpus_per_node=1 --executor timeout_min=240
  kdplug sweep --grid-file sweep.yaml --output sweeps/alp --prepare-teachers  # only the teachers (before an array)

A grid file: {zoo: NAME (optional), config: {KEY: VALUE}, grid: {KEY: [V1, V2]}}.
Values are read as YAML; lists keep their commas: --grid 'projector_options.layer_map=[1,5,9],[2,6,10]'.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "sweep",
        help="run a grid of configurations and tabulate the dev scores",
        description="Run one configuration per grid point (in this process, or as submitit "
        "jobs on SLURM, sharing the fine-tuned teacher and its cache), then write "
        "results.md and results.json with the best point marked and repeated seeds "
        "as mean ± std.",
        epilog=SWEEP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--zoo", help="start from this zoo entry's configuration")
    parser.add_argument("--config", help="YAML file of configuration keys (the base of every point)")
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a grid axis (repeatable): lr, eta, lam, temperature, seed, projector, student ...",
    )
    parser.add_argument("--grid-file", dest="grid_file", help="YAML file with zoo, config and grid")
    parser.add_argument("--paper-grid", action="store_true", help="add the zoo entry's 'search' grid (the paper's)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a configuration key for every point",
    )
    parser.add_argument("--output", help="sweep directory (default: sweeps/<time>)")
    parser.add_argument("--shard", help="I/N: run only every N-th point, starting at the I-th (1-based)")
    parser.add_argument("--collect", metavar="DIR", help="only (re)write the results table of sweep DIR")
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="local",
        help="local (default): the points one after another in this process; submitit: as jobs "
        "(SLURM, or submitit's local executor), after one job that fine-tunes the teachers",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="submitit: this many jobs share the pending points (default: one per point on SLURM, "
        "one per CPU core on this machine)",
    )
    parser.add_argument(
        "--cluster",
        choices=CLUSTERS,
        default="auto",
        help="submitit's executor: auto (default: SLURM where srun exists, else local), slurm, "
        "local, debug (in this process)",
    )
    parser.add_argument(
        "--executor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a submitit parameter (repeatable): timeout_min (default 720), slurm_partition, "
        "gpus_per_node, cpus_per_task, mem_gb, slurm_array_parallelism, slurm_setup ...",
    )
    parser.add_argument(
        "--prepare-teachers",
        dest="prepare_teachers",
        action="store_true",
        help="only fine-tune and cache the teachers the grid needs, then stop (run it once before "
        "starting --shard workers yourself, e.g. a SLURM job array)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..config import load_yaml, parse_overrides
    from ..errors import ConfigError
    from ..launchers import parse_executor_options, run_submitit
    from ..sweep import Sweep, collect, load_grid_file, parse_grid, parse_shard
    from ..zoo import Zoo

    if args.collect:
        results = collect(Path(args.collect))
        results.write(Path(args.collect))
        print(results.markdown())
        return 0
    base, grid, zoo_name = {}, {}, args.zoo
    if args.grid_file:
        file_base, grid, file_zoo = load_grid_file(args.grid_file)
        zoo_name = zoo_name or file_zoo
    else:
        file_base = {}
    entry = Zoo().get(zoo_name) if zoo_name else None
    if entry is not None:
        base.update(entry.config)
        if args.paper_grid:
            grid.update(entry.search)
    elif args.paper_grid:
        raise ConfigError("--paper-grid needs --zoo NAME (the grid is the entry's 'search')")
    if args.config:
        base.update(load_yaml(args.config))
    base.update(file_base)
    base.update(parse_overrides(args.overrides))
    grid.update(parse_grid(args.grid))
    if not grid:
        raise ConfigError("the sweep has no grid; give --grid KEY=V1,V2 (repeatable), --grid-file or --paper-grid")
    shard = parse_shard(args.shard)
    executor_options = parse_executor_options(args.executor)
    if args.launcher == "submitit":
        if args.shard:
            raise ConfigError(
                "--shard is for workers you start yourself; --launcher submitit starts its own jobs (--jobs N)"
            )
        if args.jobs is not None and args.jobs < 1:
            raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    elif args.jobs is not None or executor_options or args.cluster != "auto":
        raise ConfigError("--jobs, --cluster and --executor configure submitit jobs: add --launcher submitit")
    report_failures(manager)
    output = Path(args.output or Path("sweeps") / time.strftime("%Y%m%d-%H%M%S"))
    sweep = Sweep(output, base, grid, zoo=entry.name if entry else None)
    if args.prepare_teachers:
        sweep.checked_configs(manager.registry)
        sweep.write_spec()
        count = sweep.warm_teachers(manager.registry, sweep.pending())
        print(f"{count} teacher(s) fine-tuned or found and cached in the store; start the workers now")
        return 0
    if args.launcher == "submitit":
        results = run_submitit(
            sweep,
            manager.registry,
            cluster=args.cluster,
            jobs=args.jobs,
            options=executor_options,
            disabled=tuple(args.disabled),
        )
    else:
        results = sweep.run(manager.registry, shard=shard)
    print(results.markdown())
    print(f"results: {output / 'results.md'}")
    return 1 if results.failures else 0

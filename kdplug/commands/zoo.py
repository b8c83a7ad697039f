"""``kdplug zoo list|show|run``: the papers' experiments, one entry per table cell."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..config import parse_overrides
from ..plugins import PluginManager
from . import report_failures

ZOO_EXAMPLES = """
examples:
  kdplug zoo list alp-kd/table1-*            # ALP-KD Table 1, every row and task
  kdplug zoo list sst2 --table 2             # every entry on SST-2 in a Table 2
  kdplug zoo list --paper tang-2019          # Tang et al. 2019: BiLSTM with and without its transfer set
  kdplug zoo show alp-kd/table1-sst2-alp
  kdplug zoo run alp-kd/table1-sst2-alp --data-dir ~/glue
  kdplug zoo run alp-kd/table1-sst2-alp --data-dir ~/glue --teacher ~/models/bert-base-uncased

GLUE data: --data-dir DIR (the GLUE root holding SST-2/, MRPC/ ..., or one task's folder);
without it the task loads the Hugging Face copy (online). Offline teachers: --teacher DIR.
The zoo directory: $KDPLUG_ZOO, else zoo/ beside the kdplug package (docs/zoo.md).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "zoo",
        help="list, show and run the papers' experiments (zoo entries)",
        description="Every row of the reproduced tables (ALP-KD 1-4, Universal-KD 2, 4, 5, 6, "
        "PKD 1) for every task, and Tang et al. 2019 Table 1's two SST-2 rows "
        "(tang-2019), with the paper's hyper-parameters and score.",
        epilog=ZOO_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="zoo_action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="list entries (PATTERN: a glob or a substring of the name)")
    listing.add_argument("pattern", nargs="?", help="e.g. 'alp-kd/table1-*' or 'sst2'")
    listing.add_argument("--paper", help="only this paper (alp-kd, universal-kd, pkd, tang-2019)")
    listing.add_argument("--table", type=int, help="only this table number")
    listing.add_argument("--task", help="only this task")
    show = actions.add_parser("show", help="print an entry: configuration, reported score, notes")
    show.add_argument("name")
    run = actions.add_parser("run", help="run an entry (every seed it lists) and record the entry in the run")
    run.add_argument("name", help="entry name, or a path to an entry file")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any configuration key, e.g. --set data_dir=~/glue --set epochs=1",
    )
    run.add_argument(
        "--data-dir",
        dest="data_dir",
        help="the GLUE root (SST-2/, MRPC/ ...) or one task's folder; same as --set data_dir=DIR",
    )
    run.add_argument(
        "--teacher", help="a local checkpoint directory of the entry's teacher (offline); same as --set teacher=DIR"
    )
    run.add_argument("--cache-dir", dest="cache_dir", help="fine-tuned teachers and teacher outputs")
    run.add_argument("--seed", type=int, help="run this seed instead of the entry's seeds")
    run.add_argument("--output", help="run directory (several seeds: a sweep directory); default runs/zoo/NAME-TIME")
    run.add_argument("--overwrite", action="store_true", help="replace an existing run in --output")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..zoo import Zoo

    zoo = Zoo()
    if args.zoo_action == "list":
        return list_entries(zoo, args)
    if args.zoo_action == "show":
        return show_entry(zoo, args.name, manager)
    return run_entry(zoo, args, manager)


def list_entries(zoo, args) -> int:
    rows = [
        r
        for r in zoo.find(args.pattern)
        if (args.paper in (None, r["paper"]))
        and (args.table in (None, r["table"]))
        and (args.task in (None, r["task"]))
    ]
    if not rows:
        print(f"no zoo entry matches {args.pattern or ''!r} in {', '.join(map(str, zoo.roots))}")
        return 1
    width = max(len(r["name"]) for r in rows)
    current = None
    for row in rows:
        group = (row["paper"], row["table"])
        if group != current:
            current = group
            print(f"{row['paper']} table {row['table']}:")
        print(f"  {row['name'].ljust(width)}  {row['row']}")
    print(f"{len(rows)} entries")
    return 0


def show_entry(zoo, name: str, manager: PluginManager) -> int:
    entry = zoo.get(name)
    split, metric, value = entry.main_score()
    print(f"{entry.name}: {entry.description}")
    print(
        f"paper: {entry.paper}, Table {entry.table}, row {entry.row}; reported ({entry.reported_set}): "
        f"{split} {metric} {value}; measure: {entry.measure}; seeds: {', '.join(map(str, entry.seeds))}"
    )
    if entry.path:
        print(f"file: {entry.path}")
    print(
        "\nevery value it runs with, and where it comes from ('paper:' the paper says so; 'assumed:' the paper "
        "implies it; 'kdplug:' the paper gives none and kdplug chose; 'kdplug default': not set by the entry):"
    )
    rows = entry.provenance()
    width = max(len(key) for key, _, _ in rows)
    shown = max(len(_short(v)) for _, v, _ in rows)
    for key, value, source in rows:
        print(f"  {key.ljust(width)}  {_short(value).ljust(shown)}  {source}")
    if entry.search:
        print("\nthe paper's search grid (kdplug sweep --zoo NAME --paper-grid):")
        for key, values in entry.search.items():
            print(f"  {key}: {values}")
    if entry.notes:
        print("\nnotes:")
        for note in entry.notes:
            print(f"  - {note}")
    missing = list(entry.missing_components(manager.registry))
    if missing:
        print(f"# not runnable yet: {', '.join(missing)} not registered (see 'kdplug plugins')")
    print(f"# run: kdplug zoo run {entry.name} --data-dir GLUE_DIR")
    return 0


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 28 else text[:25] + "..."


def run_entry(zoo, args, manager: PluginManager) -> int:
    from ..engine.pipeline import run
    from ..errors import UsageError
    from ..sweep import Sweep

    entry = zoo.get(args.name)
    missing = entry.missing_components(manager.registry)
    if missing:
        raise UsageError(
            f"zoo entry {entry.name!r} needs {', '.join(missing)}, which no installed plugin "
            f"registers (see 'kdplug plugins' and the entry's notes)"
        )
    report_failures(manager)
    overrides = {
        **{key: getattr(args, key) for key in ("data_dir", "teacher", "cache_dir") if getattr(args, key) is not None},
        **parse_overrides(args.overrides),
    }
    seeds = [args.seed] if args.seed is not None else entry.seeds
    stamp = time.strftime("%Y%m%d-%H%M%S")
    default = Path("runs") / "zoo" / f"{entry.name}-{stamp}"
    if len(seeds) == 1:
        config = entry.run_config({**overrides, "seed": seeds[0]})
        config.output = args.output or config.output or str(default)
        run(config, manager.registry, overwrite=args.overwrite)
        return 0
    base = {**entry.config, **overrides}
    sweep = Sweep(Path(args.output or default), base, {"seed": seeds}, zoo=entry.name)
    results = sweep.run(manager.registry)
    print(results.markdown())
    return 1 if results.failures else 0

"""``kdplug report RUN_DIR ...``: our scores beside the papers', curves, attention and layer plots."""

from __future__ import annotations

import argparse

from ..plugins import PluginManager


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "report",
        help="write a Markdown and HTML report of run directories, with figures",
        description="Tabulate the runs (and, for runs from the zoo, the paper's score beside "
        "ours), compare every pair of methods run on the same seeds (per-seed "
        "differences, 95% intervals, a verdict, seeds needed; docs/comparisons.md), "
        "and draw training curves, attention heatmaps (ALP-KD Fig. 3, "
        "Universal-KD Fig. 3) and the PCA / cosine distance of layer "
        "representations (ALP-KD Fig. 4) as PNG files.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories; a 'kdplug run --seeds' or sweep directory stands for its runs",
    )
    parser.add_argument(
        "--output",
        default="report",
        help="directory for report.md, report.html, comparisons.json and the PNGs (default: ./report)",
    )
    parser.add_argument("--title", default="kdplug report")
    parser.add_argument(
        "--resamples",
        type=int,
        default=2000,
        metavar="N",
        help="paired bootstrap resamples of the comparisons (default: 2000; 0: t-intervals only)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..report import write_report

    if args.resamples < 0:
        from ..errors import ConfigError

        raise ConfigError(f"--resamples must be 0 (no bootstrap) or a positive count, got {args.resamples}")
    registry = manager.registry

    def task_factory(config):  # a run's task again, for metrics kdplug has no weighted form of
        return registry.create(
            "task", str(config.get("task")), data_dir=config.get("data_dir"), **(config.get("task_options") or {})
        )

    files = write_report(args.runs, args.output, title=args.title, resamples=args.resamples, task_factory=task_factory)
    print(f"report: {files['markdown']} and {files['html']}")
    return 0

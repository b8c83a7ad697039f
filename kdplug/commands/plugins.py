"""``kdplug plugins``: every registered component, by kind, with the plugin providing it."""

from __future__ import annotations

import argparse
import json
import sys

from ..plugins import PluginManager
from ..registry import KINDS, PLURALS
from . import report_failures


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plugins",
        help="list every registered component and the plugin providing it",
        description="List teachers, students, layer extractors, projectors, losses, tasks and "
        "recipes with the plugin, distribution and version that provide each, and "
        "any plugin that failed to load.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--kind", choices=list(KINDS), help="only this kind")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    registry = manager.registry
    entries = [e for e in registry if args.kind in (None, e.kind)]
    if args.json:
        print(
            json.dumps(
                {
                    "components": [
                        {
                            "kind": e.kind,
                            "name": e.name,
                            "description": e.description,
                            "plugin": e.plugin,
                            "distribution": e.distribution,
                            "version": e.version,
                        }
                        for e in entries
                    ],
                    "failures": [f.__dict__ for f in manager.failures],
                    "disabled": sorted(manager.disabled),
                },
                indent=2,
            )
        )
        return 0
    for kind in KINDS:
        group = [e for e in entries if e.kind == kind]
        if not group:
            continue
        print(f"{PLURALS[kind]}:")
        width = max(len(e.name) for e in group)
        for e in sorted(group, key=lambda e: e.name):
            origin = f"[{e.plugin}: {e.distribution} {e.version}]".replace(" ]", "]")
            print(f"  {e.name.ljust(width)}  {e.description}  {origin}")
    report_failures(manager, stream=sys.stdout)
    if manager.disabled:
        print(f"disabled plugins: {', '.join(sorted(manager.disabled))}")
    return 0

"""``kdplug check-plugin NAME``: run the plugin contracts on a component (or a whole plugin), no pytest needed."""

from __future__ import annotations

import argparse
import json
import sys

from ..config import parse_overrides
from ..errors import PluginError, UsageError, close_matches
from ..plugins import PluginFailure, PluginManager
from ..registry import Registry
from . import report_failures

EPILOG = """
examples:
  kdplug check-plugin cosine                    # a component name: every kind that has it
  kdplug check-plugin kdplug-cosine             # a distribution (or entry-point) name: all its components
  kdplug check-plugin alp --option attention_temperature=2
  kdplug check-plugin sst2 --data-dir glue/SST-2
exit codes: 0 every check passed, 1 a check failed, nothing could be checked, or the plugin failed to load;
  2 unknown name
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..registry import CONTRACT_KINDS  # not kdplug.testing: `kdplug --help` does not load torch

    parser = sub.add_parser(
        "check-plugin",
        help="check that a plugin's components meet their contracts (no pytest needed)",
        description="Build each component through the registry, exactly as 'kdplug run' does, and run its "
        "contract on tiny offline inputs: projectors on a grid of teacher/student layer shapes, "
        "students and teachers on tiny tasks, losses, tasks, and recipes on a tiny run. Prints one "
        "line per check and a verdict.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", metavar="NAME", help="a component name, or a plugin's entry-point or distribution name")
    parser.add_argument("--kind", choices=CONTRACT_KINDS, help="only components of this kind")
    parser.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option for the component's factory (repeatable), e.g. --option layer_map=[1,5,9]",
    )
    parser.add_argument("--data-dir", dest="data_dir", help="data directory for a task that reads files")
    parser.add_argument("--details", action="store_true", help="show every failing case and notes of passed checks")
    parser.add_argument("--json", action="store_true", help="machine-readable results")
    parser.set_defaults(handler=handle)


def parse_options(pairs: list[str]) -> dict:
    return parse_overrides(pairs, flag="--option")


def find_targets(registry: Registry, name: str, kind: str | None = None) -> list[tuple[str, str]]:
    """(kind, name) of every component ``name`` designates: a component of that name in any kind
    with a contract, else every component of the plugin or distribution called ``name``."""
    from ..testing.contracts import CONTRACT_KINDS, concrete_name

    kinds = [kind] if kind else list(CONTRACT_KINDS)
    targets = []
    for each in kinds:
        try:
            registry.resolve(each, name)
        except UsageError:
            continue
        targets.append((each, name))
    if targets:
        return targets
    lowered = name.lower()
    for entry in registry:
        if entry.kind in kinds and lowered in (entry.plugin.lower(), entry.distribution.lower()):
            targets.append((entry.kind, concrete_name(entry)))
    if targets:
        return targets
    if any(entry.kind == "layer_extractor" and entry.name == name for entry in registry) and not kind:
        raise UsageError(
            f"{name!r} is a layer extractor; extractors are checked through the student contract: "
            f"run kdplug check-plugin on the student it supports"
        )
    known = sorted(
        {e.name for e in registry if e.kind in kinds}
        | {e.plugin for e in registry}
        | {e.distribution for e in registry if e.distribution}
    )
    close = close_matches(name, known)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    where = f"{kind} " if kind else ""
    raise UsageError(
        f"no {where}component, plugin or distribution is called {name!r}.{hint} "
        f"Run 'kdplug plugins' to see every component and the plugin that provides it."
    )


def targets_or_why_not(manager: PluginManager, name: str, kind: str | None = None) -> list[tuple[str, str]]:
    """:func:`find_targets`; where nothing has the name, why: a plugin of that name was found but
    failed to load (:class:`PluginError`, exit 1), or was disabled, or plugins that failed to load
    might have provided it."""
    try:
        return find_targets(manager.registry, name, kind)
    except UsageError as unknown:
        lowered = name.lower()
        failed = [f for f in manager.failures if f.stage != "duplicate name"]
        for failure in failed:
            if lowered in (failure.name.lower(), failure.distribution.lower()):
                raise PluginError(failed_to_load(failure)) from None
        if name in manager.disabled:
            raise UsageError(
                f"plugin {name!r} is disabled (--disable-plugin or KDPLUG_DISABLE_PLUGINS): enable it to check it"
            ) from None
        if failed:
            names = ", ".join(sorted({repr(f.name) for f in failed}))
            raise UsageError(
                f"{unknown} Plugins that failed to load may provide it: {names} ('kdplug plugins' says why)"
            ) from None
        raise


def failed_to_load(failure: PluginFailure) -> str:
    """A plugin that was found but did not load: where it was found, the error and where it was raised."""
    found = f"entry point '{failure.entry_point}'" if failure.entry_point else "its plugin object"
    distribution = failure.distribution or "an unknown distribution"
    origin = f"plugin {failure.name!r} ({found} of {distribution})"
    if failure.stage == "import":
        advice = (
            f"install the package that provides the missing module (a dependency of {distribution})"
            if failure.error.startswith(("ModuleNotFoundError", "ImportError"))
            else "fix the error at that line"
        )
        return f"{origin} was found but failed to import: {failure.error}. To check it, {advice}"
    if failure.stage == "version":
        return f"{origin} was found but not loaded: {failure.error}"
    return f"{origin} was imported but failed to register its components: {failure.error}"


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..testing.contracts import Workspace, check_component

    registry = manager.registry
    targets = targets_or_why_not(manager, args.name, args.kind)
    options = parse_options(args.options)
    report_failures(manager)
    reports = []
    with Workspace() as workspace:
        for kind, name in targets:
            if not args.json:
                print(f"checking {kind} {name!r} ...", file=sys.stderr, flush=True)
            report = check_component(
                kind, name, options=options or None, registry=registry, workspace=workspace, data_dir=args.data_dir
            )
            reports.append(report)
            if not args.json:
                print(report.format(verbose=args.details))
                print()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "kind": r.kind,
                        "name": r.name,
                        "provider": r.provider,
                        "ok": r.ok,
                        "not_checked": r.not_checked,
                        "results": [vars(x) for x in r.results],
                    }
                    for r in reports
                ],
                indent=2,
            )
        )
    failed = [r for r in reports if not r.ok]
    unchecked = [r for r in reports if r.ok and r.not_checked]
    if not args.json and len(reports) > 1:
        print(
            f"{len(reports)} components: {len(reports) - len(failed) - len(unchecked)} passed, {len(failed)} failed"
            + (f", {len(unchecked)} not checked" if unchecked else "")
        )
    return 1 if failed or unchecked else 0

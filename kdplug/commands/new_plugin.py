"""``kdplug new-plugin NAME --kind projector``: a ready-to-publish plugin distribution whose tests pass at once."""

from __future__ import annotations

import argparse
import re
from importlib import resources
from pathlib import Path
from string import Template

from .. import __version__
from ..errors import UsageError
from ..plugins import PluginManager

#: kinds with a skeleton (kdplug/testing/skeleton/<kind>/)
KINDS = ("projector",)
NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "new-plugin", help="write a new plugin distribution (pyproject, module, contract tests, README)",
        description="Write a package skeleton for a new component: pyproject.toml declaring the kdplug entry "
                    "point, a working module to edit, contract tests through kdplug.testing, and a README that "
                    "walks to a PyPI release. Its tests pass right away: cd into it and run pytest.",
        epilog="example:\n  kdplug new-plugin my-proj --kind projector && cd kdplug-my-proj && "
               "pip install -e . && pytest\nTutorial: docs/writing-a-plugin.md",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", metavar="NAME", help="the component's registry name: lowercase words joined by "
                                                     "dashes, e.g. cosine-last")
    parser.add_argument("--kind", choices=KINDS, default="projector", help="what the plugin provides")
    parser.add_argument("--output", help="the directory to write (default: ./kdplug-NAME)")
    parser.add_argument("--force", action="store_true", help="write into a directory that is not empty")
    parser.set_defaults(handler=handle)


def names(name: str) -> dict[str, str]:
    """Every spelling of ``name`` the templates use."""
    return {
        "name": name,
        "dist": f"kdplug-{name}",
        "module": "kdplug_" + name.replace("-", "_"),
        "cls": "".join(part.capitalize() for part in name.split("-")),
        "kdplug_version": __version__,
        "major_minor": ".".join(__version__.split(".")[:2]),
    }


def render(kind: str, values: dict[str, str], output: Path) -> list[Path]:
    """Copy ``skeleton/<kind>/`` to ``output``: ``__module__`` in paths and ``${...}`` in files filled in,
    ``.tmpl`` suffixes dropped."""
    root = resources.files("kdplug.testing").joinpath("skeleton", kind)
    written = []

    def walk(node, relative: Path) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name == "__pycache__":
                continue
            target = relative / child.name.replace("__module__", values["module"]).removesuffix(".tmpl")
            if child.is_dir():
                walk(child, target)
                continue
            path = output / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(child.read_text(encoding="utf-8")).substitute(values), encoding="utf-8")
            written.append(path)

    walk(root, Path())
    return written


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    if not NAME.fullmatch(args.name):
        raise UsageError(f"plugin name {args.name!r}: use lowercase letters and digits, words joined by dashes "
                         f"(e.g. cosine-last); it becomes the registry name, kdplug-{args.name} the distribution")
    taken = manager.registry.names(args.kind)
    if args.name in taken:
        entry = manager.registry.resolve(args.kind, args.name)[0]
        raise UsageError(f"a {args.kind} named {args.name!r} is already registered by {entry.provider()}; "
                         f"pick another name (two plugins may not register one name)")
    values = names(args.name)
    output = Path(args.output or values["dist"])
    if output.exists() and any(output.iterdir()) and not args.force:
        raise UsageError(f"{output} exists and is not empty; choose another --output or pass --force")
    written = render(args.kind, values, output)
    print(f"wrote {len(written)} files to {output}/:")
    for path in written:
        print(f"  {path.relative_to(output)}")
    print(f"\nnext:\n  cd {output}\n  pip install -e .        # registers the entry point '{args.name}'\n"
          f"  pytest                  # the {args.kind} contract: passes as generated\n"
          f"  kdplug check-plugin {args.name}\n  kdplug run --projector {args.name} ...\n"
          f"then edit src/{values['module']}/{args.kind}.py; docs/writing-a-plugin.md shows the way to PyPI.")
    return 0

"""``kdplug new-plugin NAME --kind KIND``: a ready-to-publish plugin distribution whose tests pass at once.

Templates live in ``kdplug/testing/skeleton/``: ``common/`` (pyproject, README, package, conftest)
and one folder per kind (the component module and its tests), rendered with :class:`string.Template`.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from ..errors import UsageError
from ..plugins import PluginManager
from ..version import __version__


@dataclass(frozen=True)
class Kind:
    """What the common templates say about one kind."""

    usage: str  # the README's line that uses the component
    contract: str  # what its contract checks
    check_options: str = ""  # extra arguments of 'kdplug check-plugin'
    extra_entry_points: str = ""  # more pyproject.toml entry points


#: kinds with a skeleton (kdplug/testing/skeleton/<kind>/)
KINDS = {
    "projector": Kind(
        "kdplug run --teacher bert-base --student bert-6 --projector ${name} --task sst2 --data-dir glue",
        "name resolves, outputs fit the loss, gradients reach every parameter, no NaN, state_dict "
        "round-trips, deterministic under a seed, CPU and CUDA, on a grid of layer shapes",
    ),
    "loss": Kind(
        "kdplug run --teacher bert-base --student bert-6 --projector pkd-skip --set ild_loss=${name}",
        "a finite scalar >= 0, gradients reach the student, zero for identical pairs, weights honoured, "
        "deterministic, CUDA",
    ),
    "student": Kind(
        "kdplug run --teacher bert-base --student ${name} --projector universal-ca --task sst2 --data-dir glue",
        "builds for classification, pairs and regression, a layer extractor supports it, logits (B, C), "
        "layer specs match, gradients reach every parameter, padding changes nothing, deterministic, "
        "state_dict round-trips, CUDA",
        extra_entry_points="\n# Lets transformers' Auto classes (and kdplug predict) load a saved student.\n"
        '[project.entry-points."kdplug.model_types"]\n'
        '${name} = "${module}.student:register_model_types"\n',
    ),
    "teacher": Kind(
        "kdplug run --teacher ${name} --student bilstm --projector universal-ca --task sst2 --data-dir glue",
        "loads a tiny checkpoint through source, a layer extractor supports it, logits (B, C), layer "
        "specs match, gradients reach every parameter, deterministic, save_pretrained round-trips, CUDA",
    ),
    "task": Kind(
        "kdplug run --teacher bert-base --student bilstm --projector rkd --task ${name} --data-dir DIR",
        "builds, declares its attributes, every split loads, labels in range, the main metric is "
        "higher-is-better, deterministic",
        check_options=" --data-dir tests/data",
    ),
    "recipe": Kind(
        "kdplug run --teacher bert-base --student bilstm --projector alp --recipe ${name} --task sst2 --data-dir glue",
        "two complete tiny runs through the engine: they finish, record their stages, export the "
        "student, agree under one seed",
    ),
    "augmenter": Kind(
        "kdplug run --teacher bert-base --student bilstm --projector rkd --augment ${name} --task sst2 --data-dir glue",
        "builds from a tiny teacher, prepares on training sentences, returns text, deterministic "
        "under a seed, varies with the seed, keeps an empty text empty",
    ),
}
NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "new-plugin",
        help="write a new plugin distribution (pyproject, module, contract tests, README)",
        description="Write a package skeleton for a new component: pyproject.toml declaring the kdplug entry "
        "point, a working module to edit, contract tests through kdplug.testing, and a README that "
        "walks to a PyPI release. Its tests pass right away: cd into it and run pytest.",
        epilog="example:\n  kdplug new-plugin my-proj --kind projector && cd kdplug-my-proj && "
        "pip install -e . && pytest\nTutorial: docs/writing-a-plugin.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "name", metavar="NAME", help="the component's registry name: lowercase words joined by dashes, e.g. cosine-last"
    )
    parser.add_argument("--kind", choices=KINDS, default="projector", help="what the plugin provides")
    parser.add_argument("--output", help="the directory to write (default: ./kdplug-NAME)")
    parser.add_argument("--force", action="store_true", help="write into a directory that is not empty")
    parser.set_defaults(handler=handle)


def names(name: str, kind: str = "projector") -> dict[str, str]:
    """Every spelling of ``name`` (and what is said of ``kind``) the templates use."""
    values = {
        "name": name,
        "kind": kind,
        "dist": f"kdplug-{name}",
        "module": "kdplug_" + name.replace("-", "_"),
        "cls": "".join(part.capitalize() for part in name.split("-")),
        "func": name.replace("-", "_"),
        "kdplug_version": __version__,
        "major_minor": ".".join(__version__.split(".")[:2]),
    }
    about = KINDS[kind]
    for key in ("usage", "contract", "check_options", "extra_entry_points"):
        values[key] = Template(getattr(about, key)).substitute(values)
    return values


def render(kind: str, values: dict[str, str], output: Path) -> list[Path]:
    """Copy ``skeleton/common/`` then ``skeleton/<kind>/`` to ``output``: ``__module__`` in paths and
    ``${...}`` in files filled in, ``.tmpl`` suffixes dropped."""
    written: list[Path] = []

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
            if path not in written:
                written.append(path)

    for part in ("common", kind):
        walk(resources.files("kdplug.testing").joinpath("skeleton", part), Path())
    return written


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    if not NAME.fullmatch(args.name):
        raise UsageError(
            f"plugin name {args.name!r}: use lowercase letters and digits, words joined by dashes "
            f"(e.g. cosine-last); it becomes the registry name, kdplug-{args.name} the distribution"
        )
    taken = manager.registry.names(args.kind)
    if args.name in taken:
        entry = manager.registry.resolve(args.kind, args.name)[0]
        raise UsageError(
            f"a {args.kind} named {args.name!r} is already registered by {entry.provider()}; "
            f"pick another name (two plugins may not register one name)"
        )
    values = names(args.name, args.kind)
    output = Path(args.output or values["dist"])
    if output.exists() and any(output.iterdir()) and not args.force:
        raise UsageError(f"{output} exists and is not empty; choose another --output or pass --force")
    written = render(args.kind, values, output)
    print(f"wrote {len(written)} files to {output}/:")
    for path in written:
        print(f"  {path.relative_to(output)}")
    print(
        f"\nnext:\n  cd {output}\n  pip install -e .        # registers the entry point '{args.name}'\n"
        f"  pytest                  # the {args.kind} contract and the {args.kind}'s own tests: pass as generated\n"
        f"  kdplug check-plugin {args.name}{values['check_options']}\n  {values['usage']}\n"
        f"then edit src/{values['module']}/{args.kind}.py; docs/writing-a-plugin.md shows the way to PyPI."
    )
    return 0

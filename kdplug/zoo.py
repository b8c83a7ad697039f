"""The zoo: one YAML file per published experiment, with its configuration and reported score.

An entry (``zoo/<paper>/<name>.yaml``) is data, not code::

    name: alp-kd/table1-sst2-alp          # = its path under the zoo root, without .yaml
    paper: alp-kd                         # a key of PAPERS
    table: 1
    row: S_ALP                            # the row label, as the paper prints it
    description: ALP-KD Table 1 (...), row S_ALP, SST-2
    measure: student                      # student | teacher: whose score the paper's cell is
    reported:
      set: dev                            # dev | test (GLUE server): where the paper measured
      scores: {dev: {accuracy: 90.37}}    # our split -> our metric -> value in %, as printed
    seeds: [42]                           # the seeds a reproduction runs
    config: {teacher: bert-base, ...}     # RunConfig keys (kdplug/config.py)
    sources: {lr: "paper: ALP-KD Table 10", ...}   # where each config value comes from ('paper:',
                                          # 'assumed:' or 'kdplug:'); unset keys are kdplug defaults
    search: {lr: [1e-5, 2e-5, 5e-5]}      # optional: the paper's grid, for 'kdplug sweep --zoo'
    requires: [projector mhkd]            # optional: components kdplug does not register yet
    notes: [...]                          # where a value comes from, or that the paper gives none

The zoo is found in ``$KDPLUG_ZOO`` (one or more directories, separated by ``os.pathsep``),
else in the ``zoo/`` directory next to the ``kdplug`` package (a source checkout or an
editable install). ``index.yaml`` in a root lists its entries for a fast ``kdplug zoo list``;
a root without one is scanned.
"""

from __future__ import annotations

import fnmatch
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .config import FIELDS, RunConfig, apply, parse_yaml
from .errors import ConfigError, UnknownComponentError, UsageError, close_matches
from .registry import Registry

ZOO_ENV = "KDPLUG_ZOO"
INDEX_FILE = "index.yaml"

#: the papers the first-party zoo reproduces (an entry may name another paper: it is then shown as is)
PAPERS: dict[str, str] = {
    "alp-kd": "Passban et al. 2021, ALP-KD: Attention-Based Layer Projection for Knowledge Distillation (AAAI)",
    "universal-kd": "Wu et al. 2021, Universal-KD: Attention-based Output-Grounded Intermediate Layer Knowledge "
    "Distillation (EMNLP)",
    "pkd": "Sun et al. 2019, Patient Knowledge Distillation for BERT Model Compression (EMNLP)",
    "tang-2019": "Tang et al. 2019, Distilling Task-Specific Knowledge from BERT into Simple Neural Networks (arXiv)",
    "yu-2025": "Yu, Wen and Mou 2025, Revisiting Intermediate-Layer Matching in Knowledge Distillation: "
    "Layer-Selection Strategy Doesn't Matter (Much) (Findings of IJCNLP-AACL)",
}

REQUIRED = ("name", "paper", "table", "row", "description", "measure", "reported", "seeds", "config")
OPTIONAL = ("sources", "search", "requires", "notes")
#: how a source says where a value comes from
SOURCE_KINDS = ("paper:", "assumed:", "kdplug:")
MEASURES = ("student", "teacher")
REPORTED_SETS = ("dev", "test")
#: component keys of a RunConfig, and the kind each names (the teacher may also be a directory)
COMPONENTS = {
    "teacher": "teacher",
    "student": "student",
    "projector": "projector",
    "task": "task",
    "recipe": "recipe",
    "baseline": "projector",
}
#: how many positional arguments each kind's factory receives before its options
_POSITIONAL = {"teacher": 1, "student": 2, "projector": 1, "task": 0, "recipe": 0}


@dataclass(frozen=True)
class ZooEntry:
    name: str
    paper: str
    table: int
    row: str
    description: str
    measure: str
    reported: dict[str, Any]
    seeds: list[int]
    config: dict[str, Any]
    search: dict[str, list] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    path: Optional[Path] = None
    sources: dict[str, str] = field(default_factory=dict)

    def provenance(self) -> list[tuple[str, Any, str]]:
        """Every value the entry runs with (its own and kdplug's defaults), with where it comes from."""
        config = self.run_config()
        rows = []
        for key in FIELDS:
            if key in ("output", "cache_dir", "zoo"):
                continue
            value = getattr(config, key)
            if isinstance(value, dict):
                for option, item in value.items():
                    rows.append((f"{key}.{option}", item, self.sources.get(f"{key}.{option}", "kdplug: not sourced")))
                continue
            default = "kdplug default (the entry does not set it)"
            rows.append(
                (key, value, self.sources.get(key, default if key not in self.config else "kdplug: not sourced"))
            )
        return rows

    @property
    def task(self) -> str:
        return str(self.config.get("task", RunConfig.task))

    @property
    def reported_set(self) -> str:
        return self.reported["set"]

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        return self.reported["scores"]

    def main_score(self) -> tuple[str, str, float]:
        """(split, metric, value): the first score the paper prints for this cell."""
        split, metrics = next(iter(self.scores.items()))
        metric, value = next(iter(metrics.items()))
        return split, metric, float(value)

    def run_config(self, overrides: Optional[dict[str, Any]] = None) -> RunConfig:
        """The entry's RunConfig, with ``overrides`` applied and ``zoo`` recording the entry."""
        config = RunConfig()
        apply(config, self.config, source=self.where())
        if overrides:
            apply(config, overrides, source="--set")
        config.zoo = self.name
        return config.validate()

    def where(self) -> str:
        return f"zoo entry {self.name!r}" + (f" ({self.path})" if self.path else "")

    def missing_components(self, registry: Registry) -> list[str]:
        """``"kind name"`` for every component of the config the registry does not know."""
        missing = []
        for key, kind in COMPONENTS.items():
            name = self.config.get(key)
            if name is None or (key == "teacher" and Path(str(name)).is_dir()):
                continue
            try:
                registry.resolve(kind, str(name))
            except UnknownComponentError:
                missing.append(f"{kind} {name}")
        return missing


# -- reading and validating ------------------------------------------------------------------


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def parse_entry(data: Any, *, path: Optional[Path] = None, expected_name: Optional[str] = None) -> ZooEntry:
    """Check the schema of one entry (not the registry: see :func:`check_entry`)."""
    where = f"zoo entry {path}" if path else "zoo entry"
    if not isinstance(data, dict):
        raise _fail(where, f"expected a mapping with keys {', '.join(REQUIRED)}, got {type(data).__name__}")
    for key in data:
        if key not in REQUIRED + OPTIONAL:
            close = close_matches(key, REQUIRED + OPTIONAL)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise _fail(where, f"unknown key {key!r}.{hint} Valid keys: {', '.join(REQUIRED + OPTIONAL)}")
    for key in REQUIRED:
        if key not in data:
            raise _fail(where, f"missing key {key!r} (every entry has {', '.join(REQUIRED)})")
    if expected_name is not None and data["name"] != expected_name:
        raise _fail(
            where,
            f"name {data['name']!r} does not match its file; it must be {expected_name!r} "
            f"(the path under the zoo root, without .yaml)",
        )
    for key in ("name", "paper", "row", "description"):
        if not isinstance(data[key], str) or not data[key]:
            raise _fail(where, f"{key} must be a non-empty string, got {data[key]!r}")
    if not isinstance(data["table"], int) or isinstance(data["table"], bool):
        raise _fail(where, f"table must be the table's number, got {data['table']!r}")
    if data["measure"] not in MEASURES:
        raise _fail(where, f"measure must be one of {', '.join(MEASURES)}, got {data['measure']!r}")
    _check_reported(where, data["reported"])
    seeds = data["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise _fail(where, f"seeds must be a non-empty list of integers, got {seeds!r}")
    config = data["config"]
    if not isinstance(config, dict):
        raise _fail(where, f"config must be a mapping of RunConfig keys, got {type(config).__name__}")
    for key in ("teacher", "student", "projector", "task"):
        if key not in config:
            raise _fail(where, f"config must name the {key} (the entry would otherwise run the default {key})")
    apply(RunConfig(), config, source=f"{where}, config").validate()  # unknown keys, wrong types, bad values
    search = data.get("search") or {}
    if not isinstance(search, dict):
        raise _fail(where, "search must map configuration keys to lists of values")
    for key, values in search.items():
        if not isinstance(values, list) or not values:
            raise _fail(where, f"search.{key} must be a non-empty list, got {values!r}")
        apply(RunConfig(), {key: values[0]}, source=f"{where}, search")
    requires = data.get("requires") or []
    if not isinstance(requires, list) or not all(isinstance(r, str) and len(r.split()) == 2 for r in requires):
        raise _fail(where, f"requires must be a list of 'KIND NAME' strings, e.g. 'projector mhkd', got {requires!r}")
    notes = data.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _fail(where, "notes must be a list of strings")
    sources = data.get("sources") or {}
    if not isinstance(sources, dict):
        raise _fail(where, "sources must map configuration keys to where each value comes from")
    for key, source in sources.items():
        head, _, option = str(key).partition(".")
        if head not in FIELDS or (option and not isinstance(config.get(head), dict)):
            raise _fail(where, f"sources.{key}: not a configuration key of this entry")
        if not isinstance(source, str) or not source.startswith(SOURCE_KINDS):
            raise _fail(where, f"sources.{key} must start with {', '.join(SOURCE_KINDS)} and say where, got {source!r}")
    return ZooEntry(
        name=data["name"],
        paper=data["paper"],
        table=data["table"],
        row=data["row"],
        description=data["description"],
        measure=data["measure"],
        reported=data["reported"],
        seeds=list(seeds),
        config=dict(config),
        search=dict(search),
        requires=list(requires),
        notes=list(notes),
        path=path,
        sources=dict(sources),
    )


def _check_reported(where: str, reported: Any) -> None:
    if not isinstance(reported, dict) or set(reported) != {"set", "scores"}:
        raise _fail(where, "reported must be {set: dev|test, scores: {SPLIT: {METRIC: VALUE}}}")
    if reported["set"] not in REPORTED_SETS:
        raise _fail(where, f"reported.set must be one of {', '.join(REPORTED_SETS)}, got {reported['set']!r}")
    scores = reported["scores"]
    if not isinstance(scores, dict) or not scores:
        raise _fail(where, "reported.scores must map a split (dev, dev_matched ...) to {METRIC: VALUE}")
    for split, metrics in scores.items():
        if not isinstance(metrics, dict) or not metrics:
            raise _fail(where, f"reported.scores.{split} must map metric names to values")
        for metric, value in metrics.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _fail(where, f"reported.scores.{split}.{metric} must be a number (in %), got {value!r}")


def check_entry(entry: ZooEntry, registry: Registry) -> None:
    """Every component the entry names is registered (or declared in ``requires``), and every
    component option is one its factory accepts."""
    missing = set(entry.missing_components(registry))
    undeclared = sorted(missing - set(entry.requires))
    if undeclared:
        raise _fail(
            entry.where(),
            f"names unregistered components: {', '.join(undeclared)} "
            f"(see 'kdplug plugins'; or declare them under 'requires')",
        )
    config = entry.run_config()
    for key, kind in COMPONENTS.items():
        if key == "baseline" or f"{kind} {getattr(config, key)}" in missing:
            continue
        name = getattr(config, key)
        options = dict(getattr(config, f"{key}_options"))
        if kind in ("teacher", "student"):
            name, source = registry.model_reference(kind, name)
            options.update(source)
        registry_entry, implied = registry.resolve(kind, name)
        try:
            signature = inspect.signature(registry_entry.factory)
        except (TypeError, ValueError):
            continue
        try:
            signature.bind(*([None] * _POSITIONAL[kind]), **implied, **options)
        except TypeError as exc:
            raise _fail(entry.where(), f"{key}_options for {kind} {name!r}: {exc}") from None


# -- finding the zoo -------------------------------------------------------------------------


def default_roots() -> list[Path]:
    """``$KDPLUG_ZOO`` (os.pathsep-separated), else the ``zoo/`` directory beside the package."""
    configured = os.environ.get(ZOO_ENV)
    if configured:
        return [Path(p).expanduser() for p in configured.split(os.pathsep) if p]
    return [Path(__file__).resolve().parent.parent / "zoo"]


class Zoo:
    """The entries under one or more root directories; a name is unique across them."""

    def __init__(self, roots: Optional[list[Path]] = None) -> None:
        self.roots = [Path(r) for r in (roots if roots is not None else default_roots())]
        missing = [r for r in self.roots if not r.is_dir()]
        if missing:
            raise UsageError(
                f"zoo directory {missing[0]} does not exist. Point ${ZOO_ENV} at a directory of zoo entries "
                f"(e.g. the zoo/ folder of a kdplug checkout), or install kdplug from its repository "
                f"('pip install -e .'), which finds zoo/ beside the package"
            )

    def index(self) -> list[dict[str, Any]]:
        """One row per entry (name, file, paper, table, row, task), from index.yaml or a scan."""
        rows = []
        for root in self.roots:
            index_file = root / INDEX_FILE
            if index_file.is_file():
                data = parse_yaml(index_file.read_text(encoding="utf-8"), str(index_file)) or {}
                rows += [{**row, "root": root} for row in data.get("entries", [])]
            else:
                for entry in self._scan(root):
                    rows.append(
                        {
                            "name": entry.name,
                            "file": str(entry.path.relative_to(root)),
                            "paper": entry.paper,
                            "table": entry.table,
                            "row": entry.row,
                            "task": entry.task,
                            "root": root,
                        }
                    )
        return rows

    def names(self) -> list[str]:
        return [row["name"] for row in self.index()]

    def find(self, pattern: Optional[str] = None) -> list[dict[str, Any]]:
        """Index rows whose name matches ``pattern``: a glob (``alp-kd/table1-*``) or a substring."""
        rows = self.index()
        if not pattern:
            return rows
        glob = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
        return [row for row in rows if fnmatch.fnmatchcase(row["name"], glob)]

    def get(self, name: str) -> ZooEntry:
        """The entry called ``name`` (or a path to an entry file)."""
        if name.endswith((".yaml", ".yml")) and Path(name).is_file():
            return load_entry(Path(name))
        for root in self.roots:
            path = root / f"{name}.yaml"
            if path.is_file():
                return load_entry(path, expected_name=name)
        names = self.names()
        close = close_matches(name, names) or [n for n in names if name in n][:3]
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UsageError(
            f"no zoo entry {name!r} in {', '.join(map(str, self.roots))}.{hint} "
            f"List them with 'kdplug zoo list [PATTERN]'"
        )

    def entries(self) -> Iterator[ZooEntry]:
        """Every entry file under the roots, parsed (scans the files, not the index)."""
        for root in self.roots:
            yield from self._scan(root)

    @staticmethod
    def _scan(root: Path) -> Iterator[ZooEntry]:
        for path in sorted(root.rglob("*.yaml")):
            if path.name == INDEX_FILE and path.parent == root:
                continue
            yield load_entry(path, expected_name=path.relative_to(root).with_suffix("").as_posix())


def load_entry(path: Path, *, expected_name: Optional[str] = None) -> ZooEntry:
    data = parse_yaml(path.read_text(encoding="utf-8"), f"zoo entry {path}")
    return parse_entry(data, path=path, expected_name=expected_name)

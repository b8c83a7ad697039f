"""The plugin manager: entry-point loading, error isolation, block list, version checks.

First-party plugins are found exactly like third-party ones, through the ``kdplug`` entry-point
group. A plugin that fails to import (or whose registration hook raises) is reported with its
name, distribution and error, and skipped: everything else keeps working.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

import pluggy
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from . import hookspecs, model_types
from .registry import KINDS, Registry

ENTRY_POINT_GROUP = "kdplug"
DISABLE_ENV = "KDPLUG_DISABLE_PLUGINS"

hookimpl = pluggy.HookimplMarker(hookspecs.PROJECT_NAME)


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str
    version: str
    module: str


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that was skipped, and why."""

    name: str
    distribution: str
    error: str
    stage: str  # "import", "register", "version", "duplicate name"
    entry_point: str = ""  # "name = module:object": where it was found (an entry point that failed to load)

    def message(self) -> str:
        origin = f"plugin {self.name!r} from {self.distribution or 'an unknown distribution'}"
        if self.stage == "duplicate name":  # only the one name was skipped, the plugin's others work
            return f"{origin}: {self.error}"
        return f"{origin} was skipped ({self.stage} failed): {self.error}"


def _kdplug_version() -> str:
    try:
        return metadata.version("kdplug")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0.0.0"


def _disabled_from_env() -> set[str]:
    return {name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()}


def _check_kdplug_requirement(dist: Optional[metadata.Distribution]) -> Optional[str]:
    """Why ``dist`` cannot run with this kdplug, or None when it can."""
    if dist is None or dist.metadata["Name"].lower() == "kdplug":
        return None
    for line in dist.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower() != "kdplug" or requirement.marker is not None:
            continue
        installed = _kdplug_version()
        if not requirement.specifier.contains(Version(installed), prereleases=True):
            return (
                f"it needs kdplug{requirement.specifier}, but kdplug {installed} is installed; "
                f"upgrade one of them (pip install -U kdplug {dist.metadata['Name']})"
            )
    return None


class PluginManager:
    """Loads plugins and fills a :class:`Registry` from their registration hooks.

    With ``lazy=True`` the entry points are loaded on first use (``registry``, ``infos``,
    ``failures``), so a command that fails on its own arguments never imports a plugin.
    """

    def __init__(self, *, disabled: Iterable[str] = (), load_entry_points: bool = True, lazy: bool = False) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.disabled = set(disabled) | _disabled_from_env()
        self._infos: dict[str, PluginInfo] = {}
        self._failures: list[PluginFailure] = []
        self._registry: Optional[Registry] = None
        self._pending = load_entry_points and lazy
        if load_entry_points and not lazy:
            self.load_entry_points()

    def _load_pending(self) -> None:
        if self._pending:
            self._pending = False
            self.load_entry_points()

    @property
    def infos(self) -> dict[str, PluginInfo]:
        self._load_pending()
        return self._infos

    @property
    def failures(self) -> list[PluginFailure]:
        self._load_pending()
        return self._failures

    # -- loading ----------------------------------------------------------------------------
    def load_entry_points(self) -> None:
        for entry_point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
            if entry_point.name in self.disabled or entry_point.name in self._infos:
                continue
            dist = getattr(entry_point, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else ""
            dist_version = dist.version if dist is not None else ""
            found = f"{entry_point.name} = {entry_point.value}"
            incompatible = _check_kdplug_requirement(dist)
            if incompatible:
                self._failures.append(PluginFailure(entry_point.name, dist_name, incompatible, "version", found))
                continue
            try:
                plugin = entry_point.load()
            except Exception as exc:  # a broken plugin must not take the others down
                self._failures.append(PluginFailure(entry_point.name, dist_name, _describe(exc), "import", found))
                continue
            self.register(plugin, entry_point.name, distribution=dist_name, version=dist_version)
        # a plugin module that imported transformers' Auto classes registered its model types only now
        model_types.register_pending()

    def register(self, plugin: Any, name: str, *, distribution: str = "", version: str = "") -> None:
        """Register a plugin object or module by hand (tests, notebooks, ``kdplug.testing``)."""
        if name in self.disabled:
            return
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:  # e.g. a hookimpl whose arguments are not in the spec
            self._failures.append(PluginFailure(name, distribution, _describe(exc), "register"))
            return
        module = getattr(plugin, "__name__", type(plugin).__name__)
        self._infos[name] = PluginInfo(name, distribution, version, module)
        self._registry = None

    def copy(self) -> PluginManager:
        """A manager holding the same plugins, to add one to (``kdplug.distill``'s in-memory
        components) without changing this one."""
        self._load_pending()
        other = PluginManager(disabled=self.disabled, load_entry_points=False)
        for name, info in self._infos.items():
            other.register(self.pm.get_plugin(name), name, distribution=info.distribution, version=info.version)
        other._failures = [f for f in self._failures if f.stage in ("import", "version")]  # not re-collected
        return other

    # -- the registry -----------------------------------------------------------------------
    @property
    def registry(self) -> Registry:
        self._load_pending()
        if self._registry is None:
            self._registry = self._collect()
        return self._registry

    def _collect(self) -> Registry:
        registry = Registry()
        for kind, hook_name in KINDS.items():
            hook = getattr(self.pm.hook, hook_name)
            # Called one plugin at a time so that each name is tied to its plugin, and a
            # registration that raises only removes that plugin's contribution.
            for impl in reversed(hook.get_hookimpls()):
                info = self._infos.get(impl.plugin_name, PluginInfo(impl.plugin_name, "", "", ""))

                def register(name: str, factory: Any, description: str = "", *, _kind=kind, _info=info) -> None:
                    registry.add(
                        _kind,
                        name,
                        factory,
                        description=description,
                        plugin=_info.name,
                        distribution=_info.distribution,
                        version=_info.version,
                    )

                try:
                    impl.function(register=register)
                except Exception as exc:
                    self._failures.append(PluginFailure(info.name, info.distribution, _describe(exc), "register"))
        for shadowed in registry.shadowed:
            entry = shadowed.entry
            self._failures.append(PluginFailure(entry.plugin, entry.distribution, shadowed.message(), "duplicate name"))
        for (kind, name), rivals in registry.conflicts().items():
            for entry in rivals:
                others = ", ".join(e.provider() for e in rivals if e is not entry)
                self._failures.append(
                    PluginFailure(
                        entry.plugin,
                        entry.distribution,
                        f"{kind} {name!r} is also registered by {others}; neither can be used until one is disabled",
                        "duplicate name",
                    )
                )
        return registry


def _describe(exc: BaseException) -> str:
    """The exception and where it was raised: for a syntax error the offending line of the plugin's
    file (its traceback ends in the import machinery), else the innermost frame."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} (at {exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


_default: Optional[PluginManager] = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created on first use."""
    global _default
    if _default is None:
        _default = PluginManager()
    return _default


def set_plugin_manager(manager: Optional[PluginManager]) -> None:
    """Replace (or with None, reset) the process-wide plugin manager."""
    global _default
    _default = manager

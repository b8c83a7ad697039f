"""Named components per kind, collected from the plugins' registration hooks.

``create_projector("alp", request)``, ``list_projectors("alp*")``: the registry is the one place
that maps a name to a factory, so unknown names fail here with close matches, and every entry
knows the plugin and distribution that provided it.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .capabilities import CAPABILITIES, capabilities
from .errors import AmbiguousNameError, ConfigError, PluginError, UnknownComponentError
from .hub import is_hub_id
from .options import check_option_values

if TYPE_CHECKING:
    from .types import ModelShape

#: kind -> the registration hook that fills it
KINDS: dict[str, str] = {
    "teacher": "kdplug_register_teachers",
    "student": "kdplug_register_students",
    "layer_extractor": "kdplug_register_layer_extractors",
    "projector": "kdplug_register_projectors",
    "loss": "kdplug_register_losses",
    "task": "kdplug_register_tasks",
    "recipe": "kdplug_register_recipes",
    "augmenter": "kdplug_register_augmenters",
}

#: the kinds kdplug.testing has a contract for (``kdplug check-plugin --kind``)
CONTRACT_KINDS = ("teacher", "student", "projector", "loss", "task", "recipe", "augmenter")

#: kind -> its plural, for headings ("losses", not "losss")
PLURALS = {kind: kind + ("es" if kind.endswith("s") else "s") for kind in KINDS}

_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Entry:
    """One registered component."""

    kind: str
    name: str
    factory: Any
    description: str = ""
    plugin: str = ""
    distribution: str = ""
    version: str = ""
    _pattern: Optional[re.Pattern] = field(default=None, compare=False, repr=False)
    _field: Optional[str] = field(default=None, compare=False, repr=False)
    _text: bool = field(default=False, compare=False, repr=False)

    def match(self, name: str) -> Optional[dict[str, Any]]:
        """Options implied by ``name`` if it names this entry (``bert-4`` -> ``{layers: 4}``,
        ``served:qwen`` -> ``{model: "qwen"}`` where the factory's ``model`` is a ``str``)."""
        if self._pattern is None:
            return {} if name == self.name else None
        found = self._pattern.fullmatch(name)
        if not found:
            return None
        return {self._field: found.group(1) if self._text else int(found.group(1))}

    def provider(self) -> str:
        dist = f"{self.distribution} {self.version}".strip()
        return f"plugin {self.plugin!r} ({dist})" if dist else f"plugin {self.plugin!r}"


def _compile(name: str, factory: Any) -> tuple[Optional[re.Pattern], Optional[str], bool]:
    """The pattern of a name with a ``{field}``, the field, and whether it is text: a field is a whole
    number unless the factory's parameter of that name is annotated ``str`` (any non-empty text)."""
    fields = _FIELD.findall(name)
    if not fields:
        return None, None, False
    if len(fields) > 1:
        raise PluginError(f"component name {name!r} may hold at most one {{field}}")
    text = _annotated_str(factory, fields[0])
    prefix, suffix = _FIELD.split(name)[0], _FIELD.split(name)[-1]
    return re.compile(re.escape(prefix) + (r"(.+)" if text else r"(\d+)") + re.escape(suffix)), fields[0], text


def _annotated_str(factory: Any, name: str) -> bool:
    """Whether ``factory``'s parameter ``name`` is declared ``str`` (written as a string under
    ``from __future__ import annotations``)."""
    try:
        parameter = inspect.signature(factory).parameters.get(name)
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.annotation in (str, "str")


#: the distribution whose components are the built-ins
BUILTIN_DISTRIBUTION = "kdplug"


@dataclass(frozen=True)
class Shadowed:
    """A registration that was skipped because another plugin has the name (see ``Registry.add``)."""

    entry: Entry
    kept: Entry

    def message(self) -> str:
        return (
            f"{self.entry.kind} {self.entry.name!r} of {self.entry.provider()} was skipped: the built-in "
            f"{self.kept.kind} of that name ({self.kept.provider()}) keeps it; register it under another "
            f"name, or disable the plugin (--disable-plugin {self.entry.plugin})"
        )


class Registry:
    """Entries per kind, filled by :class:`kdplug.plugins.PluginManager`.

    Two plugins registering one name: a built-in keeps it and the other registration is skipped
    and reported (``shadowed``); between two third-party plugins the name is unusable until one
    is disabled, and only a run that asks for it fails. Every other name keeps working.
    """

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
        self._conflicts: dict[tuple[str, str], list[Entry]] = {}
        self.shadowed: list[Shadowed] = []

    def add(
        self,
        kind: str,
        name: str,
        factory: Callable[..., Any],
        *,
        description: str = "",
        plugin: str = "",
        distribution: str = "",
        version: str = "",
    ) -> Entry:
        if kind not in KINDS:
            raise PluginError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {plugin!r} registered a {kind} with an invalid name {name!r}")
        if not callable(factory):
            raise PluginError(f"plugin {plugin!r} registered {kind} {name!r} with a non-callable {factory!r}")
        pattern, field_name, text = _compile(name, factory)
        entry = Entry(kind, name, factory, description, plugin, distribution, version, pattern, field_name, text)
        existing = self._entries[kind].get(name) or next((e for e in self._conflicts.get((kind, name), [])), None)
        if existing is None:
            self._entries[kind][name] = entry
            return entry
        builtin = [e for e in (existing, entry) if e.distribution == BUILTIN_DISTRIBUTION]
        if builtin and (kind, name) not in self._conflicts:
            kept = builtin[0]
            self._entries[kind][name] = kept
            self.shadowed.append(Shadowed(entry if kept is existing else existing, kept))
            return kept
        # two third-party plugins: neither wins; a run that asks for the name is told to choose
        self._conflicts.setdefault((kind, name), [existing]).append(entry)
        self._entries[kind].pop(name, None)
        return entry

    def entries(self, kind: str) -> list[Entry]:
        return list(self._entries[kind].values())

    def names(self, kind: str, pattern: str = "*") -> list[str]:
        return [name for name in self._entries[kind] if fnmatch.fnmatchcase(name, pattern)]

    def __iter__(self) -> Iterator[Entry]:
        for kind in KINDS:
            yield from self._entries[kind].values()

    def resolve(self, kind: str, name: str) -> tuple[Entry, dict[str, Any]]:
        """The entry for ``name`` and the options its name implies."""
        rivals = self._conflicts.get((kind, name))
        if rivals:
            providers = " and ".join(e.provider() for e in rivals)
            raise AmbiguousNameError(
                f"{kind} {name!r} is registered by {providers}: kdplug cannot tell which one you mean. "
                f"Uninstall or disable all but one of them (--disable-plugin NAME or KDPLUG_DISABLE_PLUGINS=NAME)."
            )
        entry = self._entries[kind].get(name)
        if entry is not None and entry._pattern is None:
            return entry, {}
        for entry in self._entries[kind].values():
            implied = entry.match(name)
            if implied is not None:
                return entry, implied
        raise UnknownComponentError(kind.replace("_", " "), name, self._listing(kind))

    def _listing(self, kind: str) -> list[str]:
        return list(self._entries[kind])  # registration order: the first of equally close names wins

    def checkpoint_loader(self, kind: str) -> Optional[str]:
        """The name of the first ``kind`` factory that loads any checkpoint given as ``source`` (it
        says so with a ``loads_checkpoints = True`` attribute), or None."""
        return next(
            (
                e.name
                for e in self._entries[kind].values()
                if capabilities(CAPABILITIES[kind], e.factory).loads_checkpoints
            ),
            None,
        )

    def model_reference(self, kind: str, name: str) -> tuple[str, dict[str, Any]]:
        """What ``--teacher NAME`` or ``--student NAME`` names: the registered component, else a
        checkpoint directory or a hub id, given as ``source`` to the kind's checkpoint loader."""
        if (
            (kind, name) in self._conflicts
            or name in self._entries[kind]
            or any(e.match(name) is not None for e in self._entries[kind].values())
        ):
            return name, {}
        loader = self.checkpoint_loader(kind)
        directory = Path(name).expanduser()
        if loader is not None and directory.is_dir():
            return loader, {"source": str(directory)}
        if loader is not None and is_hub_id(name):
            return loader, {"source": name}
        self.resolve(kind, name)  # an unknown name, with the close ones
        raise AssertionError("unreachable")

    def model_shape(self, kind: str, name: str, *args: Any, **options: Any) -> Optional[ModelShape]:
        """What the teacher or student ``name`` will be (:class:`~kdplug.types.ModelShape`), from its
        factory's optional ``shape`` attribute, called as the factory would be; None where it has none."""
        entry, implied = self.resolve(kind, name)
        factory, bound = entry.factory, {}
        if isinstance(factory, functools.partial):  # a name registered with options bound (a hub id's teacher)
            factory, bound = factory.func, dict(factory.keywords)
        shape = capabilities(CAPABILITIES[kind], factory).shape
        return None if shape is None else shape(*args, **{**bound, **implied, **options})

    def find_layer_extractor(self, model: Any) -> Any:
        """The first registered layer extractor that supports ``model``."""
        return self.layer_extractor_entry(model).factory

    def layer_extractor_entry(self, model: Any) -> Entry:
        """The registration (name, description) of the first layer extractor that supports ``model``."""
        for entry in self._entries["layer_extractor"].values():
            if entry.factory.supports(model):
                return entry
        names = ", ".join(self._entries["layer_extractor"]) or "(none registered)"
        raise PluginError(
            f"no layer extractor supports a {type(model).__name__}; registered extractors: {names}. "
            f"A plugin that adds this model must also register a layer extractor for it."
        )

    def conflicts(self) -> dict[tuple[str, str], list[Entry]]:
        """Names that two third-party plugins both registered, with the rivals."""
        return dict(self._conflicts)

    def create(self, kind: str, name: str, *args: Any, **options: Any) -> Any:
        entry, implied = self.resolve(kind, name)
        options = {**implied, **options}
        _check_options(entry, name, args, options)
        return entry.factory(*args, **options)

    def check_options(self, kind: str, name: str, *args: Any, option_key: Optional[str] = None, **options: Any) -> None:
        """Fail now, with the valid options, where ``create`` would reject ``options`` later.

        The factory's signature catches unknown names; a factory that takes ``**options`` (e.g.
        attributes of a model config) may add a ``check_options(*args, **options)`` attribute
        that raises :class:`~kdplug.errors.UsageError` without building anything. Positional
        arguments may be placeholders (None) when only the signature is checked.
        """
        entry, implied = self.resolve(kind, name)
        options = {**implied, **options}
        _check_options(entry, name, args, options, option_key)
        checker = capabilities(CAPABILITIES[kind], entry.factory).check_options
        # a checker of the options alone (placeholders = True) runs before the run directory is made, too
        if checker is not None and (getattr(checker, "placeholders", False) or all(arg is not None for arg in args)):
            checker(*args, **options)


#: the run key that holds each kind's options, where it is not KIND_options
OPTION_KEYS = {"augmenter": "augment_options", "loss": "ild_loss_options"}


def _check_options(
    entry: Entry, name: str, args: tuple, options: dict[str, Any], option_key: Optional[str] = None
) -> None:
    """Unknown or missing options fail with the factory's valid options, not a bare TypeError; a value
    that is not of its option's declared type or range fails naming both (kdplug/options.py)."""
    section = option_key or OPTION_KEYS.get(entry.kind, f"{entry.kind}_options")
    try:
        signature = inspect.signature(entry.factory)
    except (TypeError, ValueError):  # builtins and some C types have no signature
        return
    try:
        bound = signature.bind(*args, **options)
    except TypeError as exc:
        valid = [
            p.name
            for p in list(signature.parameters.values())[len(args) :]
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise ConfigError(
            f"{entry.kind} {name!r} ({entry.provider()}): {exc}. Its options are: {', '.join(valid) or '(none)'}; "
            f"set them with --set {section}.NAME=VALUE"
        ) from None
    named = {option: value for option, value in options.items() if option in bound.arguments}  # not **overrides
    check_option_values(entry.factory, named, section=section, owner=f"{entry.kind} {name!r}")

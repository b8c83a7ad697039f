"""The run's settings as a recipe reads them (``ctx.settings``): re-exported by :mod:`kdplug.types`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any


class Settings(Mapping[str, Any]):
    """A read-only view of the run's settings (every ``kdplug run`` configuration key):
    ``ctx.settings.epochs`` or ``ctx.settings["epochs"]``. Values are copies: changing one
    changes nothing in the run."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        import copy

        object.__setattr__(self, "_values", MappingProxyType(copy.deepcopy(dict(values))))

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            from .errors import close_matches

            close = close_matches(name, list(self._values))
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AttributeError(f"the run has no setting {name!r}{hint}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the run's settings are read-only")

    def __repr__(self) -> str:
        return f"Settings({dict(self._values)!r})"

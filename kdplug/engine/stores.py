"""The folders kdplug keeps under its cache root: the engine's own and those components declare
(``stores``), which ``kdplug cache`` lists and clears and the preflight checks are writable."""

from __future__ import annotations

from ..capabilities import Capabilities, capabilities
from ..registry import Registry

#: what the engine keeps under the cache root: folder -> title
SECTIONS = {
    "teachers": "fine-tuned teachers",
    "teacher-cache": "teacher outputs",
    "heads": "teacher heads",
    "transfer": "transfer sets (texts and token ids; their teacher outputs are under teacher outputs)",
}


def sections(registry: Registry) -> dict[str, str]:
    """The engine's folders, then those the registered components declare they keep there
    (``stores = {folder: title}`` on the factory, as a recipe's ``ctx.store_directory(folder, key)``
    writes them): the folders ``kdplug cache`` lists and clears, and no other."""
    found = dict(SECTIONS)
    for entry in registry:
        factory = getattr(entry.factory, "func", entry.factory)  # functools.partial
        for folder, title in (capabilities(Capabilities, factory).stores or {}).items():
            found.setdefault(folder, title)
    return found

"""An import-linter contract that is an allow-list: plugins import only kdplug's public modules.

A deny-list drifts: a module added to kdplug is importable by plugins until someone remembers to
forbid it. This contract names what is allowed instead, so a new module is private until it is
made public (added to :data:`kdplug.api.PUBLIC_MODULES`). kdplug checks its own plugins with it
(pyproject.toml), and a plugin author can check theirs the same way::

    [tool.importlinter]
    root_packages = ["kdplug", "my_plugin"]
    contract_types = ["public_api: kdplug.testing.import_contract.PublicApiContract"]

    [[tool.importlinter.contracts]]
    name = "my_plugin uses only kdplug's public API"
    type = "public_api"
    source_modules = ["my_plugin"]
    public_modules = ["kdplug", "kdplug.api", "kdplug.types", "kdplug.errors", ...]

``public_modules`` entries are exact module names; ``pkg.**`` also allows every module below
``pkg``. Only direct imports count: a public module may itself use private ones.
"""

from __future__ import annotations

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _allowed(module: str, public: list[str]) -> bool:
    for entry in public:
        if entry.endswith(".**"):
            package = entry[:-3]
            if module == package or module.startswith(package + "."):
                return True
        elif module == entry:
            return True
    return False


class PublicApiContract(Contract):
    """Modules in ``source_modules`` (and below) import, of the package that ``public_modules``
    belong to, only the modules that ``public_modules`` names."""

    type_name = "public_api"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    public_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        public = [str(entry) for entry in self.public_modules]  # type: ignore[attr-defined]
        roots = {entry.split(".")[0] for entry in public}
        illegal = []
        for source in self.source_modules:  # type: ignore[attr-defined]
            for importer in sorted({source.name} | graph.find_descendants(source.name)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if imported.split(".")[0] in roots and not _allowed(imported, public):
                        lines = [
                            d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)
                        ]
                        illegal.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not illegal, metadata={"illegal": illegal, "public": public})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for link in check.metadata["illegal"]:
            lines = ", ".join(map(str, link["lines"]))
            output.print_error(
                f"- {link['importer']} -> {link['imported']} (l.{lines}): not a public module", bold=False
            )
            output.new_line()
        output.print_error(
            f"Public modules: {', '.join(check.metadata['public'])}. Use kdplug.api, or make the "
            f"module public on purpose (kdplug.api.PUBLIC_MODULES).",
            bold=False,
        )
        output.new_line()

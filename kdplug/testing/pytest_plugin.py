"""kdplug's testing kit for plugin authors, as a pytest plugin you opt into.

In your distribution's ``tests/conftest.py``::

    pytest_plugins = ["kdplug.testing.pytest_plugin"]

and in a test module, one class per component, each check a test of its own::

    from kdplug.testing.pytest_plugin import ProjectorContract

    class TestCosine(ProjectorContract):
        name = "cosine"                   # the registered name
        plugin = "cosine"                 # its entry point (or module path, e.g. "kdplug_cosine.cosine")
        options = {}                      # projector options, if any

Each class runs the checks of :mod:`kdplug.testing.contracts` (a projector on a grid of teacher
and student layer shapes) with a plugin manager that holds only ``plugin`` plus kdplug's
built-ins, offline, on tiny random models. A failing check names itself and says why.

Fixtures (usable in your own tests too): ``kdplug_plugin_manager`` (the isolated manager, also
made the process-wide one, so ``kdplug.create_projector`` sees it), ``kdplug_plugin_under_test``
(override it in a conftest to pick the plugin for tests outside a contract class),
``kdplug_workspace``, ``kdplug_tiny_bert`` (a random 4-layer BERT checkpoint directory),
``kdplug_sst2_dir`` (a 16-line SST-2 directory), ``kdplug_tiny_task`` and ``kdplug_tiny_teacher``.

It is not registered as a ``pytest11`` entry point on purpose: only projects that ask load it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import pytest

from .. import plugins as _plugins
from . import contracts
from .contracts import LayerShapes, TaskShape, Workspace

# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def kdplug_plugin_under_test() -> Any:
    """The plugin your tests exercise: an entry-point name, a module path or a plugin object.
    None (the default) means every installed plugin. Override it in your conftest.py."""
    return None


@pytest.fixture
def kdplug_plugin_manager(request, kdplug_plugin_under_test):
    """A plugin manager with kdplug's built-ins plus only the plugin under test (a contract
    class's ``plugin`` attribute wins over the fixture), set as the process-wide manager."""
    plugin = getattr(request.cls, "plugin", None) if request.cls is not None else None
    manager = contracts.isolated_manager(plugin if plugin is not None else kdplug_plugin_under_test)
    previous = _plugins._default
    _plugins.set_plugin_manager(manager)
    yield manager
    _plugins.set_plugin_manager(previous)


@pytest.fixture(scope="session")
def kdplug_workspace(tmp_path_factory) -> Workspace:
    """Tiny resources made on first use and shared by the session."""
    return Workspace(tmp_path_factory.mktemp("kdplug-workspace"))


@pytest.fixture(scope="session")
def kdplug_tiny_bert(kdplug_workspace) -> str:
    return kdplug_workspace.tiny_bert


@pytest.fixture(scope="session")
def kdplug_sst2_dir(kdplug_workspace) -> str:
    return kdplug_workspace.sst2_dir


@pytest.fixture
def kdplug_tiny_task():
    from .tiny import TinyTask

    return TinyTask()


@pytest.fixture
def kdplug_tiny_teacher(kdplug_plugin_manager, kdplug_tiny_bert, kdplug_tiny_task):
    return kdplug_plugin_manager.registry.create("teacher", "hf", kdplug_tiny_task, source=kdplug_tiny_bert)


@pytest.fixture
def kdplug_offline(monkeypatch, tmp_path):
    """No hub access and a private kdplug cache for the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("KDPLUG_CACHE", str(tmp_path / "kdplug-cache"))


# -- contract classes ----------------------------------------------------------------------------

#: (class, case) -> results, so that the checks of one case share one computation
_RESULTS: dict[tuple[type, str], list[contracts.CheckResult]] = {}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


class _Contract:
    """Base of the contract classes: set ``name`` (and ``plugin``, ``options``) in a subclass."""

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    plugin: ClassVar[Any] = None
    options: ClassVar[Optional[Mapping[str, Any]]] = None

    @classmethod
    def contract_cases(cls) -> list[str]:
        return [""]

    @classmethod
    def contract_items(cls) -> list[tuple[str, str]]:
        checks = [c for c in contracts.CHECKS[cls.kind] if c != "name resolves"]
        return [(case, check) for case in cls.contract_cases() for check in checks]

    def run_contract(self, case: str, registry, workspace: Workspace) -> contracts.ContractReport:
        raise NotImplementedError

    def _report_problem(self) -> None:
        if not self.name:
            pytest.fail(
                f"{type(self).__name__} sets no `name`: the registered {self.kind} name to check", pytrace=False
            )

    def test_name_resolves(self, kdplug_plugin_manager) -> None:
        self._report_problem()
        registry = kdplug_plugin_manager.registry
        try:
            entry, _ = registry.resolve(self.kind, self.name)
        except Exception as exc:
            pytest.fail(f"{self.kind} {self.name!r} failed the check 'name resolves': {exc}", pytrace=False)
        assert entry.kind == self.kind

    def test_contract(self, kdplug_contract_item, kdplug_plugin_manager, kdplug_workspace, kdplug_offline) -> None:
        self._report_problem()
        case, check = kdplug_contract_item
        key = (type(self), case)
        if key not in _RESULTS:
            _RESULTS[key] = self.run_contract(case, kdplug_plugin_manager.registry, kdplug_workspace).results
        result = next(
            (r for r in _RESULTS[key] if r.check == check and r.case == case),
            contracts.CheckResult(check, contracts.SKIPPED, "not reached", case),
        )
        where = f" on {case}" if case else ""
        if result.failed:
            pytest.fail(f"{self.kind} {self.name!r} failed the check '{check}'{where}: {result.detail}", pytrace=False)
        if result.status == contracts.SKIPPED:
            pytest.skip(result.detail)


class ProjectorContract(_Contract):
    """The projector contract on ``shapes`` (default :data:`contracts.PROJECTOR_GRID`)."""

    kind = "projector"
    shapes: ClassVar[Sequence[LayerShapes]] = contracts.PROJECTOR_GRID

    @classmethod
    def contract_cases(cls) -> list[str]:
        return [shape.id for shape in cls.shapes]

    def run_contract(self, case, registry, workspace):
        return contracts.check_projector(
            self.name, options=self.options, shapes=self.shapes, cases=[case], registry=registry
        )


class _ModelContract(_Contract):
    tasks: ClassVar[Sequence[TaskShape]] = contracts.MODEL_CASES

    @classmethod
    def contract_cases(cls) -> list[str]:
        return [shape.id for shape in cls.tasks]

    def _shape(self, case: str) -> TaskShape:
        return next(shape for shape in self.tasks if shape.id == case)


class StudentContract(_ModelContract):
    """The student contract on tiny tasks (``tasks``), distilled from ``teacher`` (default: a
    random tiny BERT; or a callable ``task -> Teacher``)."""

    kind = "student"
    teacher: ClassVar[Any] = None

    def run_contract(self, case, registry, workspace):
        return contracts.check_student(
            self.name,
            options=self.options,
            teacher=type(self).teacher,
            cases=[self._shape(case)],
            registry=registry,
            workspace=workspace,
        )


class TeacherContract(_ModelContract):
    """The teacher contract; ``options`` default to ``{"source": <tiny BERT directory>}``."""

    kind = "teacher"

    def run_contract(self, case, registry, workspace):
        return contracts.check_teacher(
            self.name, options=self.options, cases=[self._shape(case)], registry=registry, workspace=workspace
        )


class LossContract(_Contract):
    kind = "loss"

    def run_contract(self, case, registry, workspace):
        return contracts.check_loss(self.name, options=self.options, registry=registry)


class TaskContract(_Contract):
    """The task contract; set ``data_dir`` when the task reads files."""

    kind = "task"
    data_dir: ClassVar[Optional[str]] = None

    def run_contract(self, case, registry, workspace):
        return contracts.check_task(self.name, data_dir=self.data_dir, options=self.options, registry=registry)


class RecipeContract(_Contract):
    """The recipe contract: two tiny runs through the engine; ``run`` updates :data:`contracts.TINY_RUN`."""

    kind = "recipe"
    run: ClassVar[Optional[Mapping[str, Any]]] = None

    def run_contract(self, case, registry, workspace):
        return contracts.check_recipe(
            self.name, options=self.options, run=self.run, registry=registry, workspace=workspace
        )


class AugmenterContract(_Contract):
    """The augmenter contract: built from a tiny teacher, deterministic under a seed, varied across seeds."""

    kind = "augmenter"

    def run_contract(self, case, registry, workspace):
        return contracts.check_augmenter(self.name, options=self.options, registry=registry, workspace=workspace)


def pytest_generate_tests(metafunc) -> None:
    """One test per (case, check) of a contract class: ``test_contract[12x768-4x384-no-nan]``."""
    if "kdplug_contract_item" not in metafunc.fixturenames:
        return
    cls = metafunc.cls
    items = cls.contract_items() if cls is not None and issubclass(cls, _Contract) and cls.kind else []
    ids = [f"{case}-{_slug(check)}" if case else _slug(check) for case, check in items]
    metafunc.parametrize("kdplug_contract_item", items, ids=ids)


__all__ = [
    "AugmenterContract",
    "LossContract",
    "ProjectorContract",
    "RecipeContract",
    "StudentContract",
    "TaskContract",
    "TeacherContract",
]

"""The contracts' shared harness: results and reports, the check recorder, isolated plugin
managers, the tiny offline workspace, and helpers every contract uses."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import io
import os
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, wraps
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ...components import process_registry
from ...errors import PluginError, UsageError
from ...plugins import ENTRY_POINT_GROUP, PluginManager
from ...registry import CONTRACT_KINDS, Entry, Registry  # noqa: F401  CONTRACT_KINDS: re-exported by contracts

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

#: the kinds that have a contract (layer extractors are checked through the student contract)

BATCH = 3


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    """One check on one case: ``status`` is ``"passed"``, ``"failed"`` or ``"skipped"``; ``detail``
    says why it failed or was skipped (or, for a pass, anything worth knowing)."""

    check: str
    status: str
    detail: str = ""
    case: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def describe(self) -> str:
        where = f" [{self.case}]" if self.case else ""
        return f"{self.check}{where}: {self.detail}" if self.detail else f"{self.check}{where}"


@dataclass
class ContractReport:
    """Every check of one component, with the plugin and distribution that provide it."""

    kind: str
    name: str
    provider: str = ""
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check failed (skipped checks, e.g. CUDA on a CPU machine, do not count)."""
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [result for result in self.results if result.failed]

    @property
    def checks(self) -> list[str]:
        """The check names, in the order they ran."""
        return list(dict.fromkeys(result.check for result in self.results))

    @property
    def not_checked(self) -> str:
        """Why nothing beyond the name could be checked (e.g. a task without its data), or ""."""
        ran = [r for r in self.results if r.check != "name resolves" and r.status != SKIPPED]
        skipped = [r for r in self.results if r.status == SKIPPED and not r.detail.startswith("not run")]
        return skipped[0].detail if not ran and skipped and not self.failures else ""

    def result(self, check: str, case: str = "") -> CheckResult:
        """The result of ``check`` on ``case`` (a check that was never reached counts as skipped)."""
        for result in self.results:
            if result.check == check and result.case == case:
                return result
        return CheckResult(check, SKIPPED, "not reached", case)

    def title(self) -> str:
        return f"{self.kind} {self.name!r}" + (f" ({self.provider})" if self.provider else "")

    def failure_message(self) -> str:
        """Which checks failed and why, one per line (empty when none did)."""
        return "\n".join(
            f"{self.title()} failed the check '{r.check}'" + (f" on {r.case}" if r.case else "") + f": {r.detail}"
            for r in self.failures
        )

    def format(self, verbose: bool = False) -> str:
        """A readable verdict: one line per check over all cases, then the failures in full."""
        lines = [self.title()]
        width = max((len(check) for check in self.checks), default=0)
        for check in self.checks:
            group = [r for r in self.results if r.check == check]
            failed = [r for r in group if r.failed]
            ran = [r for r in group if r.status != SKIPPED]
            if failed:
                mark, note = "FAIL", f"{len(failed)} of {len(group)} case(s): {_first_line(failed[0].describe())}"
            elif ran:
                mark = "PASS"
                note = f"{len(ran)} case(s)" if len(group) > 1 else (group[0].detail if verbose else "")
                if len(ran) < len(group):
                    note += f", {len(group) - len(ran)} skipped"
            else:
                mark, note = "SKIP", group[0].detail
            lines.append(f"  {mark}  {check.ljust(width)}  {note}".rstrip())
            if failed and (verbose or len(failed) > 1):
                lines.extend(f"          {r.case or 'case'}: {_first_line(r.detail)}" for r in failed[1:])
        failed_checks = list(dict.fromkeys(r.check for r in self.failures))
        if self.not_checked:
            lines.append(f"verdict: NOT CHECKED, {self.not_checked}")
        elif failed_checks:
            lines.append(
                f"verdict: FAILED, {len(failed_checks)} of {len(self.checks)} checks failed: "
                + ", ".join(failed_checks)
            )
        else:
            lines.append(f"verdict: PASSED, {len(self.checks)} checks")
        return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


class ContractFailure(Exception):
    """Raised inside a check to fail it with a reason."""


class _Skip(Exception):
    """Raised inside a check to skip it with a reason."""


def require(condition: Any, reason: str) -> None:
    if not condition:
        raise ContractFailure(reason)


def _describe_exception(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"raised {type(exc).__name__}: {exc}{where}"


class _Recorder:
    """Runs checks in order; after a failed *fatal* check (one later checks build on), the rest
    of the case is skipped with a pointer to it."""

    def __init__(self, case: str = "") -> None:
        self.case = case
        self.results: list[CheckResult] = []
        self.blocked_by: Optional[str] = None

    def run(self, check: str, fn: Callable[[], Any], *, fatal: bool = False) -> Any:
        if self.blocked_by is not None:
            self.results.append(CheckResult(check, SKIPPED, f"not run: '{self.blocked_by}' failed", self.case))
            return None
        try:
            value = fn()
        except _Skip as skip:
            self.results.append(CheckResult(check, SKIPPED, str(skip), self.case))
            if fatal:
                self.blocked_by = check
            return None
        except ContractFailure as failure:
            self.results.append(CheckResult(check, FAILED, str(failure), self.case))
        except Exception as exc:  # the component itself raised: that is the finding
            self.results.append(CheckResult(check, FAILED, _describe_exception(exc), self.case))
        else:
            note = value if isinstance(value, _Note) else ""
            self.results.append(CheckResult(check, PASSED, str(note), self.case))
            return value.value if isinstance(value, _Note) else value
        if fatal:
            self.blocked_by = check
        return None


@dataclass
class _Note:
    """A check's return value plus a remark for its passed result."""

    text: str
    value: Any = None

    def __str__(self) -> str:
        return self.text


# --------------------------------------------------------------------------------------------
# Plugin managers and the tiny workspace
# --------------------------------------------------------------------------------------------


def isolated_manager(plugin: Any = None) -> PluginManager:
    """A plugin manager with kdplug's built-in plugins plus only ``plugin``.

    ``plugin``: an entry-point name of the ``kdplug`` group, a module path (``"kdplug_cosine.cosine"``,
    importable without being installed) or a plugin object; None loads every installed plugin.
    Other third-party plugins are left out, so a check sees exactly the plugin under test.
    """
    if plugin is None:
        return PluginManager()
    manager = PluginManager(load_entry_points=False)
    entry_points = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)

    def dist_of(entry_point) -> tuple[str, str]:
        dist = getattr(entry_point, "dist", None)
        return (dist.metadata["Name"], dist.version) if dist is not None else ("", "")

    for entry_point in entry_points:
        name, version = dist_of(entry_point)
        if name.lower() == "kdplug":
            manager.register(entry_point.load(), entry_point.name, distribution=name, version=version)
    if not isinstance(plugin, str):
        name = getattr(plugin, "__name__", type(plugin).__name__)
        if name not in manager.infos:
            manager.register(plugin, name)
        return _raise_on_failure(manager, name)
    match = next((ep for ep in entry_points if plugin in (ep.name, ep.value)), None)
    if match is not None:
        if match.name not in manager.infos:
            name, version = dist_of(match)
            try:
                loaded = match.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {match.name!r} ({name}) failed to import: {_describe_exception(exc)}"
                ) from exc
            manager.register(loaded, match.name, distribution=name, version=version)
        return _raise_on_failure(manager, match.name)
    try:
        module = importlib.import_module(plugin)
    except ImportError as exc:
        raise UsageError(
            f"cannot load the plugin under test {plugin!r}: it is neither an entry point of the "
            f"'{ENTRY_POINT_GROUP}' group nor an importable module ({exc}). Install the distribution "
            f"(pip install -e .) or put its module on sys.path."
        ) from exc
    if plugin not in manager.infos:
        manager.register(module, plugin)
    return _raise_on_failure(manager, plugin)


def _raise_on_failure(manager: PluginManager, name: str) -> PluginManager:
    _ = manager.registry  # collect now, so a registration error surfaces here
    failure = next((f for f in manager.failures if f.name == name), None)
    if failure is not None:
        raise PluginError(failure.message())
    return manager


def _begin(kind: str, name: str, registry: Optional[Registry]) -> tuple[Registry, ContractReport, _Recorder]:
    """Every contract starts alike: a report for the component and the check that its name resolves."""
    registry = _registry(registry)
    report = ContractReport(kind, name, _provider(registry, kind, name))
    rec = _Recorder()
    rec.run("name resolves", lambda: _resolve(registry, kind, name), fatal=True)
    return registry, report, rec


@contextmanager
def _borrowed(workspace: Optional[Workspace]) -> Iterator[Workspace]:
    """The caller's workspace, or a temporary one removed afterwards."""
    if workspace is not None:
        yield workspace
        return
    own = Workspace()
    try:
        yield own
    finally:
        own.cleanup()


def _registry(registry: Optional[Registry]) -> Registry:
    return registry if registry is not None else process_registry()


TINY_SST2_TRAIN = [
    ("the movie was very good .", 1),
    ("i loved this film , it is great .", 1),
    ("the acting was fun", 1),
    ("we enjoyed the story and the music", 1),
    ("a nice film", 1),
    ("the ending was great !", 1),
    ("the film was really bad !", 0),
    ("we hated the plot", 0),
    ("the music was dull", 0),
    ("the acting was awful and boring", 0),
    ("a poor story", 0),
    ("it was not fun", 0),
]
TINY_SST2_DEV = [("the story was good", 1), ("the plot was boring", 0), ("i loved the music", 1), ("a bad film", 0)]


def write_tiny_sst2(
    directory: str | os.PathLike,
    train: Sequence[tuple[str, int]] = TINY_SST2_TRAIN,
    dev: Sequence[tuple[str, int]] = TINY_SST2_DEV,
) -> str:
    """A directory in the GLUE SST-2 layout (``sentence<TAB>label``, with a header); by default 12 + 4 lines."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for file, rows in (("train.tsv", train), ("dev.tsv", dev)):
        lines = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in rows]
        (directory / file).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(directory)


class Workspace:
    """Tiny offline resources, made on first use in ``directory`` (a temporary one by default):
    a random 4-layer BERT checkpoint, a tiny SST-2 directory, a teacher cache."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="kdplug-contract-") if directory is None else None
        self.root = Path(self._tmp.name if self._tmp else directory)
        self.root.mkdir(parents=True, exist_ok=True)

    @cached_property
    def tiny_bert(self) -> str:
        from ..tiny import make_tiny_bert

        return make_tiny_bert(self.root / "tiny-bert", num_layers=4, hidden=32)

    @cached_property
    def sst2_dir(self) -> str:
        return write_tiny_sst2(self.root / "SST-2")

    def path(self, name: str) -> Path:
        return self.root / name

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


def one_thread(check: Callable) -> Callable:
    """Run ``check`` with one intra-op thread: on the contracts' tiny tensors, thread start-up and
    synchronisation cost more than the work (10x more on a busy machine)."""

    @wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _threads(1):
            return check(*args, **kwargs)

    return wrapper


@contextmanager
def _threads(count: int):
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def concrete_name(entry: Entry, value: int = 2) -> str:
    """A usable name for ``entry``: ``bert-{layers}`` -> ``bert-2``."""
    if entry._field is None:
        return entry.name
    return entry.name.replace("{" + entry._field + "}", str(value))


def _resolve(registry: Registry, kind: str, name: str) -> _Note:
    entry, implied = registry.resolve(kind, name)
    return _Note(entry.provider() + (f", options {implied}" if implied else ""), entry)


def _provider(registry: Registry, kind: str, name: str) -> str:
    try:
        entry, _ = registry.resolve(kind, name)
    except UsageError:
        return ""
    return entry.provider()


def _state_bytes(module: nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    return buffer.getvalue()


def _load_state(module: nn.Module, data: bytes) -> None:
    module.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))


def _same_state(a: nn.Module, b: nn.Module) -> Optional[str]:
    """Why two modules' state_dicts differ, or None."""
    first, second = a.state_dict(), b.state_dict()
    if first.keys() != second.keys():
        return f"state_dict keys differ: {sorted(set(first) ^ set(second))[:5]}"
    for key in first:
        if not torch.equal(first[key], second[key]):
            return f"state_dict entry {key!r} differs"
    return None


def _nonfinite(named: Iterable[tuple[str, Optional[torch.Tensor]]]) -> list[str]:
    return [
        name
        for name, tensor in named
        if tensor is not None and tensor.is_floating_point() and not torch.isfinite(tensor).all()
    ]


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def _gradient_gaps(module: nn.Module) -> list[str]:
    """Trainable parameters that got no gradient, or an all-zero or non-finite one."""
    gaps = []
    for name, param in _trainable(module):
        if param.grad is None:
            gaps.append(f"{name} (no gradient)")
        elif not torch.isfinite(param.grad).all():
            gaps.append(f"{name} (non-finite gradient)")
        elif not param.grad.abs().sum() > 0:
            gaps.append(f"{name} (gradient exactly zero)")
    return gaps


def _list(items: Sequence[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")

"""The plugin contracts: what every teacher, student, projector, loss, task and recipe must do.

Each ``check_<kind>(name, ...)`` builds the component through the registry, exactly as
``kdplug run`` does, runs it on tiny offline inputs and returns a :class:`ContractReport`: one
:class:`CheckResult` per check and case (a projector is checked on a grid of teacher and student
layer shapes), each passed, failed with the reason, or skipped with the reason. Nothing here needs
pytest: ``kdplug check-plugin`` prints these reports, and :mod:`kdplug.testing.pytest_plugin`
turns each check into a test.

    from kdplug.testing.contracts import check_projector
    report = check_projector("cosine")
    print(report.format())          # one line per check, and the verdict
    assert report.ok, report.failure_message()
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import io
import math
import os
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, wraps
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch
from torch import nn

from ..errors import OfflineError, PluginError, UsageError
from ..plugins import ENTRY_POINT_GROUP, PluginManager, get_plugin_manager
from ..registry import Entry, Registry
from ..types import DistillInputs, Example, LayerSpec, ProjectionRequest, Teacher, matchable_layers, num_outputs

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

#: the kinds that have a contract (layer extractors are checked through the student contract)
CONTRACT_KINDS = ("teacher", "student", "projector", "loss", "task", "recipe", "augmenter")

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
        return "\n".join(f"{self.title()} failed the check '{r.check}'"
                         + (f" on {r.case}" if r.case else "") + f": {r.detail}" for r in self.failures)

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
            lines.append(f"verdict: FAILED, {len(failed_checks)} of {len(self.checks)} checks failed: "
                         + ", ".join(failed_checks))
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
                raise PluginError(f"plugin {match.name!r} ({name}) failed to import: {_describe_exception(exc)}") from exc
            manager.register(loaded, match.name, distribution=name, version=version)
        return _raise_on_failure(manager, match.name)
    try:
        module = importlib.import_module(plugin)
    except ImportError as exc:
        raise UsageError(f"cannot load the plugin under test {plugin!r}: it is neither an entry point of the "
                         f"'{ENTRY_POINT_GROUP}' group nor an importable module ({exc}). Install the distribution "
                         f"(pip install -e .) or put its module on sys.path.") from exc
    if plugin not in manager.infos:
        manager.register(module, plugin)
    return _raise_on_failure(manager, plugin)


def _raise_on_failure(manager: PluginManager, name: str) -> PluginManager:
    _ = manager.registry  # collect now, so a registration error surfaces here
    failure = next((f for f in manager.failures if f.name == name), None)
    if failure is not None:
        raise PluginError(failure.message())
    return manager


def _begin(kind: str, name: str, registry: Optional[Registry]) -> tuple[Registry, ContractReport, "_Recorder"]:
    """Every contract starts alike: a report for the component and the check that its name resolves."""
    registry = _registry(registry)
    report = ContractReport(kind, name, _provider(registry, kind, name))
    rec = _Recorder()
    rec.run("name resolves", lambda: _resolve(registry, kind, name), fatal=True)
    return registry, report, rec


@contextmanager
def _borrowed(workspace: Optional["Workspace"]) -> Iterator["Workspace"]:
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
    return registry if registry is not None else get_plugin_manager().registry


TINY_SST2_TRAIN = [
    ("the movie was very good .", 1), ("i loved this film , it is great .", 1), ("the acting was fun", 1),
    ("we enjoyed the story and the music", 1), ("a nice film", 1), ("the ending was great !", 1),
    ("the film was really bad !", 0), ("we hated the plot", 0), ("the music was dull", 0),
    ("the acting was awful and boring", 0), ("a poor story", 0), ("it was not fun", 0),
]
TINY_SST2_DEV = [("the story was good", 1), ("the plot was boring", 0), ("i loved the music", 1), ("a bad film", 0)]


def write_tiny_sst2(directory: str | os.PathLike, train: Sequence[tuple[str, int]] = TINY_SST2_TRAIN,
                    dev: Sequence[tuple[str, int]] = TINY_SST2_DEV) -> str:
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
        from .tiny import make_tiny_bert

        return make_tiny_bert(self.root / "tiny-bert", num_layers=4, hidden=32)

    @cached_property
    def sst2_dir(self) -> str:
        return write_tiny_sst2(self.root / "SST-2")

    def path(self, name: str) -> Path:
        return self.root / name

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "Workspace":
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
    return [name for name, tensor in named
            if tensor is not None and tensor.is_floating_point() and not torch.isfinite(tensor).all()]


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


# --------------------------------------------------------------------------------------------
# Projectors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerShapes:
    """One point of the projector grid: n teacher layers of one width, m student layers of another."""

    teacher_layers: int
    teacher_width: int
    student_layers: int
    student_width: int
    num_outputs: int = 3
    is_regression: bool = False
    student_kind: str = "transformer"

    @property
    def id(self) -> str:
        base = f"{self.teacher_layers}x{self.teacher_width}-{self.student_layers}x{self.student_width}"
        return base + ("-regression" if self.is_regression else "")

    def request(self) -> ProjectionRequest:
        return ProjectionRequest(
            teacher_layers=tuple(LayerSpec(i, self.teacher_width, "transformer")
                                 for i in range(1, self.teacher_layers + 1)),
            student_layers=tuple(LayerSpec(i, self.student_width, self.student_kind)
                                 for i in range(1, self.student_layers + 1)),
            num_outputs=self.num_outputs, is_regression=self.is_regression)


#: BERT-base -> BERT-6 and -> a narrower BERT-4, MiniLM -> a BiLSTM, and two tiny models (also as regression)
PROJECTOR_GRID: tuple[LayerShapes, ...] = (
    LayerShapes(12, 768, 6, 768),
    LayerShapes(12, 768, 4, 384),
    LayerShapes(6, 384, 3, 64, student_kind="lstm"),
    LayerShapes(4, 32, 2, 32),
    LayerShapes(4, 32, 2, 32, num_outputs=1, is_regression=True),
)

PROJECTOR_CHECKS = (
    "name resolves", "builds for the layer shapes", "declares ild_loss, needs_teacher_heads, default_weights",
    "outputs fit the loss", "no NaN", "gradients reach every parameter", "gradients reach the student side",
    "teacher tensors get no gradient", "deterministic under a seed", "state_dict round-trips", "runs on CUDA",
)


def make_distill_inputs(request: ProjectionRequest, batch: int = BATCH, *, seed: int = 0,
                        teacher_heads: bool = True, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> DistillInputs:
    """Random :class:`DistillInputs` for ``request``. Every tensor is a leaf that requires grad,
    so a gradient leaking to the teacher side is visible; ``teacher_head_logits`` is ``(B, n, C)``."""
    generator = torch.Generator().manual_seed(seed)

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device).requires_grad_()

    n, c = len(request.teacher_layers), request.num_outputs
    return DistillInputs(
        teacher_layers=[leaf(batch, spec.width) for spec in request.teacher_layers],
        student_layers=[leaf(batch, spec.width) for spec in request.student_layers],
        teacher_logits=leaf(batch, c), student_logits=leaf(batch, c),
        teacher_head_logits=leaf(batch, n, c) if teacher_heads else None)


def _check_projector_attributes(registry: Registry, projector: nn.Module) -> None:
    require(isinstance(projector, nn.Module), f"the factory returned a {type(projector).__name__}, not an nn.Module "
                                              f"(its parameters must train with the student's)")
    ild = getattr(projector, "ild_loss", None)
    require(isinstance(ild, str), "the projector has no ild_loss attribute naming a registered loss (e.g. 'mse')")
    losses = registry.names("loss")
    require(ild in losses, f"ild_loss {ild!r} is not a registered loss; registered: {', '.join(losses)}")
    require(isinstance(getattr(projector, "needs_teacher_heads", None), bool),
            "needs_teacher_heads must be a class attribute True or False")
    weights = getattr(projector, "default_weights", None)
    require(isinstance(weights, Mapping) and {"eta", "lam"} <= set(weights),
            f"default_weights must be a mapping with 'eta' and 'lam', got {weights!r}")
    eta, lam = float(weights["eta"]), float(weights["lam"])
    require(0 <= eta <= 1 and 0 <= lam <= 1 and eta + lam <= 1 + 1e-9,
            f"default_weights eta={eta}, lam={lam}: each must lie in [0, 1] and eta + lam <= 1 "
            f"(the CE weight is 1 - eta - lam)")
    require(float(weights.get("temperature", 1.0)) > 0, "default_weights temperature must be positive")


def _check_pairs(pairs: Any, request: ProjectionRequest, batch: int) -> None:
    for attribute in ("student", "teacher"):
        require(isinstance(getattr(pairs, attribute, None), torch.Tensor),
                f"forward returned a {type(pairs).__name__}; it must return ProjectedPairs (or None for a "
                f"logit-only method)")
    student, teacher = pairs.student, pairs.teacher
    require(student.dim() == 3 and student.shape == teacher.shape,
            f"pairs.student {tuple(student.shape)} and pairs.teacher {tuple(teacher.shape)} must be (batch, P, D) "
            f"of one shape")
    require(student.shape[0] == batch, f"pairs are {tuple(student.shape)}: the first dimension must be the batch "
                                       f"({batch})")
    if getattr(pairs, "weights", None) is not None:
        require(tuple(pairs.weights.shape) == tuple(student.shape[:2]),
                f"pairs.weights is {tuple(pairs.weights.shape)}, expected (batch, P) = {tuple(student.shape[:2])}")
    if getattr(pairs, "attention", None) is not None:
        expected = (*student.shape[:2], len(request.teacher_layers))
        require(tuple(pairs.attention.shape) == expected,
                f"pairs.attention is {tuple(pairs.attention.shape)}, expected (batch, P, n) = {expected}")


def _pair_tensors(pairs: Any) -> list[tuple[str, Optional[torch.Tensor]]]:
    if pairs is None:
        return []
    return [(f"pairs.{a}", getattr(pairs, a, None)) for a in ("student", "teacher", "weights", "attention")]


def _projector_case(registry: Registry, name: str, shapes: LayerShapes, options: Mapping[str, Any]) -> list[CheckResult]:
    rec = _Recorder(shapes.id)
    request = shapes.request()

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return registry.create("projector", name, request, **options)

    projector = rec.run("builds for the layer shapes", lambda: build(0), fatal=True)
    rec.run("declares ild_loss, needs_teacher_heads, default_weights",
            lambda: _check_projector_attributes(registry, projector), fatal=True)
    heads = bool(getattr(projector, "needs_teacher_heads", False))
    state: dict[str, Any] = {}

    def forward(module: nn.Module, inputs: DistillInputs, seed: int = 1) -> Any:
        torch.manual_seed(seed)  # dropout inside the projector draws the same masks
        return module(inputs)

    def fits_the_loss() -> _Note:
        inputs = make_distill_inputs(request, teacher_heads=heads)
        pairs = forward(projector, inputs)
        state.update(inputs=inputs, pairs=pairs)
        if pairs is None:
            return _Note("forward returned None: a logit-only method (no pairs to compare)")
        _check_pairs(pairs, request, BATCH)
        loss_fn = registry.create("loss", projector.ild_loss)
        loss = loss_fn(pairs.student, pairs.teacher, pairs.weights)
        require(isinstance(loss, torch.Tensor) and loss.dim() == 0,
                f"loss {projector.ild_loss!r} on the pairs gave {loss!r}, not a scalar tensor")
        state["loss"] = loss
        loss.backward()
        return _Note(f"{tuple(pairs.student.shape[1:])} pairs per example, loss {projector.ild_loss!r}")

    rec.run("outputs fit the loss", fits_the_loss, fatal=True)

    def no_nan() -> None:
        bad = _nonfinite([*_pair_tensors(state["pairs"]), ("loss", state.get("loss"))])
        bad += _nonfinite((f"grad of {n}", p.grad) for n, p in projector.named_parameters())
        require(not bad, f"non-finite values in {_list(bad)}")

    rec.run("no NaN", no_nan)

    def every_parameter() -> Optional[_Note]:
        params = _trainable(projector)
        if state["pairs"] is None:
            require(not params, f"forward returns None, so its {len(params)} parameter(s) "
                                f"({_list([n for n, _ in params])}) can never train")
            return _Note("no parameters (logit-only)")
        gaps = _gradient_gaps(projector)
        require(not gaps, f"{len(gaps)} of {len(params)} parameters got no useful gradient from the ILD loss: "
                          f"{_list(gaps)}; every parameter must be trained by the loss (or not exist)")
        return _Note(f"{len(params)} parameter tensors" if params else "no parameters")

    rec.run("gradients reach every parameter", every_parameter)

    def student_side() -> Optional[_Note]:
        inputs = state["inputs"]
        if state["pairs"] is None:
            return _Note("logit-only: the KD and CE terms train the student")
        named = [*(f"student_layers[{i}]" for i in range(len(inputs.student_layers))), "student_logits"]
        tensors = [*inputs.student_layers, inputs.student_logits]
        reached = [n for n, t in zip(named, tensors) if t.grad is not None and t.grad.abs().sum() > 0]
        require(reached, "the ILD loss sends no gradient to any student tensor (student_layers, student_logits): "
                         "the pairs' student side must be computed from inputs.student_layers or student_logits, "
                         "without detach()")
        return _Note("reached " + _list(reached))

    rec.run("gradients reach the student side", student_side)

    def teacher_side() -> None:
        inputs = state["inputs"]
        named = [(f"teacher_layers[{i}]", t) for i, t in enumerate(inputs.teacher_layers)]
        named += [("teacher_logits", inputs.teacher_logits), ("teacher_head_logits", inputs.teacher_head_logits)]
        leaked = [n for n, t in named if t is not None and t.grad is not None and t.grad.abs().sum() > 0]
        require(not leaked, f"gradient reached {_list(leaked)}: the teacher is frozen, detach() teacher tensors "
                            f"before using them")

    rec.run("teacher tensors get no gradient", teacher_side)

    def compare(first: Any, second: Any, what: str) -> None:
        if first is None or second is None:
            require(first is None and second is None, f"{what}: one forward returned None and the other did not")
            return
        for attribute in ("student", "teacher", "weights", "attention"):
            a, b = getattr(first, attribute, None), getattr(second, attribute, None)
            require((a is None) == (b is None) and (a is None or torch.equal(a, b)),
                    f"{what}: pairs.{attribute} differs")

    def deterministic() -> None:
        again = build(0)  # the projector built first had no optimizer step: still its initial state
        difference = _same_state(projector, again)
        require(difference is None, f"two builds under torch.manual_seed(0) differ: {difference}")
        inputs = make_distill_inputs(request, teacher_heads=heads)
        compare(forward(projector, inputs), forward(again, inputs), "two builds under one seed, same inputs")

    rec.run("deterministic under a seed", deterministic)

    def round_trip() -> None:
        original, other = projector, build(1)
        _load_state(other, _state_bytes(original))
        inputs = make_distill_inputs(request, teacher_heads=heads)
        compare(forward(original, inputs), forward(other, inputs),
                "after load_state_dict(torch.save'd state_dict) the outputs")

    rec.run("state_dict round-trips", round_trip)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        module = build(0).to("cuda")
        inputs = make_distill_inputs(request, teacher_heads=heads, device="cuda")
        pairs = forward(module, inputs)
        if pairs is not None:
            loss = registry.create("loss", module.ild_loss)(pairs.student, pairs.teacher, pairs.weights)
            require(torch.isfinite(loss), f"loss on CUDA is {loss.item()}")
            loss.backward()

    rec.run("runs on CUDA", on_cuda)
    return rec.results


@one_thread
def check_projector(name: str, *, options: Optional[Mapping[str, Any]] = None,
                    shapes: Sequence[LayerShapes] = PROJECTOR_GRID, registry: Optional[Registry] = None,
                    cases: Optional[Sequence[str]] = None) -> ContractReport:
    """The projector contract on every point of ``shapes`` (``cases``: only these shape ids)."""
    registry, report, rec = _begin("projector", name, registry)
    report.results += rec.results
    if rec.blocked_by:
        return report
    for point in shapes:
        if cases is None or point.id in cases:
            report.results += _projector_case(registry, name, point, options or {})
    return report


# --------------------------------------------------------------------------------------------
# Models: students and teachers
# --------------------------------------------------------------------------------------------

SENTENCES = [("the movie was very good .", "a nice film"), ("bad", "the plot was dull and the acting awful"),
             ("i loved this book , it is great and fun .", "we hated it")]


@dataclass(frozen=True)
class TaskShape:
    """A model case: the tiny task the model is built for."""

    id: str
    labels: tuple[str, ...] = ("negative", "positive")
    is_pair: bool = False

    def task(self):
        from .tiny import TinyTask

        return TinyTask(labels=self.labels, is_pair=self.is_pair)


MODEL_CASES: tuple[TaskShape, ...] = (
    TaskShape("classification"),
    TaskShape("3-class-pairs", labels=("entailment", "neutral", "contradiction"), is_pair=True),
    TaskShape("regression", labels=()),
)

STUDENT_CHECKS = (
    "name resolves", "builds for the task", "a layer extractor supports it", "forward gives logits (B, C)",
    "layer specs match the extracted tensors", "no NaN", "gradients reach every parameter",
    "right-padded batches give the unpadded result", "deterministic under a seed", "state_dict round-trips",
    "runs on CUDA",
)

TEACHER_CHECKS = (
    "name resolves", "loads the tiny checkpoint", "a layer extractor supports it", "forward gives logits (B, C)",
    "layer specs match the extracted tensors", "no NaN", "gradients reach every parameter",
    "deterministic under a seed", "save_pretrained round-trips", "runs on CUDA",
)


def find_extractor(registry: Registry, model: nn.Module):
    """The first registered layer extractor that supports ``model`` (as the engine picks it)."""
    for entry in registry.entries("layer_extractor"):
        if entry.factory.supports(model):
            return entry.factory
    raise ContractFailure(f"no registered layer extractor supports a {type(model).__name__} "
                          f"(registered: {', '.join(registry.names('layer_extractor')) or 'none'}); the plugin "
                          f"that adds this model must also register a layer extractor for it")


def tiny_batch(task, tokenizer, device: str = "cpu", rows: Optional[Sequence[int]] = None) -> dict[str, torch.Tensor]:
    """A right-padded batch as the engine's collator builds it, from three short sentences."""
    from ..engine.data import Collator, encode

    examples = [Example(text_a=a, text_b=b if task.is_pair else None, label=0.5 if task.is_regression else i % len(task.labels))
                for i, (a, b) in enumerate(SENTENCES)]
    if rows is not None:
        examples = [examples[i] for i in rows]
    split = encode(examples, tokenizer, 64, is_regression=task.is_regression)
    batch = Collator(split.pad_id, task.is_regression)([split[i] for i in range(len(split))])
    return {key: value.to(device) for key, value in batch.items()}


def _forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    from ..engine.objective import model_forward

    return model_forward(model, batch)


def _check_logits(outputs: Any, task, batch: int) -> torch.Tensor:
    logits = getattr(outputs, "logits", None)
    require(isinstance(logits, torch.Tensor), f"forward returned a {type(outputs).__name__} without a .logits tensor")
    expected = (batch, num_outputs(task))
    require(tuple(logits.shape) == expected, f"logits are {tuple(logits.shape)}, expected (batch, C) = {expected}")
    return logits


def _check_specs(extractor: Any, model: nn.Module, outputs: Any, batch: int) -> _Note:
    specs = extractor.layer_specs(model)
    tensors = extractor(model, outputs)
    require(all(isinstance(spec, LayerSpec) for spec in specs), "layer_specs must return LayerSpec objects")
    require(len(specs) == len(tensors), f"layer_specs lists {len(specs)} layers but the extractor returned "
                                        f"{len(tensors)} tensors")
    for spec, tensor in zip(specs, tensors):
        require(tuple(tensor.shape) == (batch, spec.width),
                f"layer {spec.index}: tensor {tuple(tensor.shape)}, but its spec says (batch, {spec.width})")
    require(matchable_layers(specs), "no matchable layer (all are kind 'embedding'): nothing to distil into")
    indices = [spec.index for spec in specs]
    require(indices == sorted(set(indices)), f"layer indices must increase without repeats, got {indices}")
    return _Note(f"{len(specs)} layers: " + ", ".join(f"{s.index}:{s.kind}/{s.width}" for s in specs))


def _task_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor], regression: bool) -> torch.Tensor:
    if regression:
        return torch.nn.functional.mse_loss(logits.squeeze(-1), batch["labels"].float())
    return torch.nn.functional.cross_entropy(logits, batch["labels"])


def _model_gradients(registry: Registry, model: nn.Module, task, tokenizer) -> _Note:
    """Task loss plus every matchable layer's squared mean, as distillation trains them."""
    model.train()
    model.zero_grad(set_to_none=True)
    batch = tiny_batch(task, tokenizer)
    outputs = _forward(model, batch)
    extractor = find_extractor(registry, model)
    specs = extractor.layer_specs(model)
    layers = [t for s, t in zip(specs, extractor(model, outputs)) if s.matchable]
    loss = _task_loss(outputs.logits, batch, task.is_regression) + sum(t.pow(2).mean() for t in layers)
    loss.backward()
    params = _trainable(model)
    gaps = [g for g in _gradient_gaps(model) if "exactly zero" not in g]
    require(not gaps, f"{len(gaps)} of {len(params)} trainable parameters got no gradient from the task loss and "
                      f"the layer vectors: {_list(gaps)}")
    return _Note(f"{len(params)} parameter tensors")


def _eval_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return _forward(model, batch).logits


def _student_case(registry: Registry, name: str, shape: TaskShape, teacher_for: Callable[[Any], Teacher],
                  options: Mapping[str, Any]) -> list[CheckResult]:
    rec = _Recorder(shape.id)
    task = shape.task()
    teacher = teacher_for(task)

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return registry.create("student", name, task, teacher, **options)

    def built() -> nn.Module:
        student = build(0)
        require(isinstance(student, nn.Module), f"the factory returned a {type(student).__name__}, not an nn.Module")
        return student

    student = rec.run("builds for the task", built, fatal=True)
    tokenizer = getattr(student, "tokenizer", None) or teacher.tokenizer
    extractor = rec.run("a layer extractor supports it", lambda: find_extractor(registry, student), fatal=True)
    state: dict[str, Any] = {}

    def logits() -> None:
        student.eval()
        batch = tiny_batch(task, tokenizer)
        with torch.no_grad():
            state["outputs"] = _forward(student, batch)
        state["logits"] = _check_logits(state["outputs"], task, len(SENTENCES))

    rec.run("forward gives logits (B, C)", logits, fatal=True)
    rec.run("layer specs match the extracted tensors", lambda: _check_specs(extractor, student, state["outputs"],
                                                                             len(SENTENCES)))

    def no_nan() -> None:
        named = [("logits", state["logits"])]
        named += [(f"layer {i}", t) for i, t in enumerate(extractor(student, state["outputs"]))]
        bad = _nonfinite(named)
        require(not bad, f"non-finite values in {_list(bad)}")

    rec.run("no NaN", no_nan)
    rec.run("gradients reach every parameter", lambda: _model_gradients(registry, student, task, tokenizer))

    def padding() -> None:
        batch = tiny_batch(task, tokenizer)
        lengths = batch["attention_mask"].sum(dim=1)
        require(bool((lengths < batch["attention_mask"].shape[1]).any()), "the test batch has no padding")
        together = _eval_logits(student, batch)
        for row in range(len(SENTENCES)):
            alone = _eval_logits(student, tiny_batch(task, tokenizer, rows=[row]))
            require(torch.allclose(together[row], alone[0], atol=1e-4, rtol=1e-4),
                    f"example {row} gives logits {together[row].tolist()} in a right-padded batch but "
                    f"{alone[0].tolist()} alone: padding must not change the result (use the attention_mask)")

    rec.run("right-padded batches give the unpadded result", padding)

    def deterministic() -> None:
        first, second = build(0), build(0)
        difference = _same_state(first, second)
        require(difference is None, f"two builds under torch.manual_seed(0) differ: {difference}")
        batch = tiny_batch(task, tokenizer)
        require(torch.equal(_eval_logits(first, batch), _eval_logits(second, batch)),
                "two builds under one seed give different logits")

    rec.run("deterministic under a seed", deterministic)

    def round_trip() -> None:
        original, other = build(0), build(1)
        _load_state(other, _state_bytes(original))
        batch = tiny_batch(task, tokenizer)
        require(torch.equal(_eval_logits(original, batch), _eval_logits(other, batch)),
                "after load_state_dict(torch.save'd state_dict) the logits differ")

    rec.run("state_dict round-trips", round_trip)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        model = build(0).to("cuda")
        _check_logits(_forward(model, tiny_batch(task, tokenizer, "cuda")), task, len(SENTENCES))

    rec.run("runs on CUDA", on_cuda)
    return rec.results


def _tiny_teacher_factory(registry: Registry, workspace: Workspace) -> Callable[[Any], Teacher]:
    cache: dict[tuple, Teacher] = {}

    def teacher_for(task) -> Teacher:
        key = (task.labels, task.is_pair)
        if key not in cache:
            cache[key] = registry.create("teacher", "hf", task, source=workspace.tiny_bert)
        return cache[key]

    return teacher_for


@one_thread
def check_student(name: str, *, options: Optional[Mapping[str, Any]] = None, teacher: Any = None,
                  cases: Sequence[TaskShape] = MODEL_CASES, registry: Optional[Registry] = None,
                  workspace: Optional[Workspace] = None) -> ContractReport:
    """The student contract for each tiny task in ``cases``.

    ``teacher``: a :class:`Teacher`, or a callable ``task -> Teacher``; default: a random tiny
    BERT through the ``hf`` teacher. ``options``: the student's options (e.g. small widths).
    """
    registry, report, rec = _begin("student", name, registry)
    report.results += rec.results
    if rec.blocked_by:
        return report
    with _borrowed(workspace) as workspace:
        if teacher is None:
            teacher_for = _tiny_teacher_factory(registry, workspace)
        else:
            teacher_for = teacher if callable(teacher) and not isinstance(teacher, Teacher) else (lambda task: teacher)
        for shape in cases:
            report.results += _student_case(registry, name, shape, teacher_for, options or {})
    return report


def _teacher_case(registry: Registry, name: str, shape: TaskShape, options: Mapping[str, Any],
                  workspace: Workspace) -> list[CheckResult]:
    rec = _Recorder(shape.id)
    task = shape.task()

    def build(seed: int, **extra: Any) -> Teacher:
        torch.manual_seed(seed)
        return registry.create("teacher", name, task, **{**options, **extra})

    def loads() -> Teacher:
        teacher = build(0)
        require(isinstance(teacher, Teacher), f"the factory returned a {type(teacher).__name__}, not a "
                                              f"kdplug.types.Teacher")
        require(isinstance(teacher.model, nn.Module), "Teacher.model must be an nn.Module")
        require(callable(teacher.tokenizer), "Teacher.tokenizer must be a callable (Hugging Face) tokenizer")
        return teacher

    teacher = rec.run("loads the tiny checkpoint", loads, fatal=True)
    model = teacher.model if teacher is not None else None
    extractor = rec.run("a layer extractor supports it", lambda: find_extractor(registry, model), fatal=True)
    state: dict[str, Any] = {}

    def logits() -> None:
        model.eval()
        with torch.no_grad():
            state["outputs"] = _forward(model, tiny_batch(task, teacher.tokenizer))
        state["logits"] = _check_logits(state["outputs"], task, len(SENTENCES))

    rec.run("forward gives logits (B, C)", logits, fatal=True)
    rec.run("layer specs match the extracted tensors",
            lambda: _check_specs(extractor, model, state["outputs"], len(SENTENCES)))

    def no_nan() -> None:
        named = [("logits", state["logits"])] + [(f"layer {i}", t) for i, t in enumerate(extractor(model, state["outputs"]))]
        bad = _nonfinite(named)
        require(not bad, f"non-finite values in {_list(bad)}")

    rec.run("no NaN", no_nan)
    # a teacher that is not fine-tuned yet is trained by the engine first: every weight must learn
    rec.run("gradients reach every parameter", lambda: _model_gradients(registry, model, task, teacher.tokenizer))

    def deterministic() -> None:
        batch = tiny_batch(task, teacher.tokenizer)
        first, second = _eval_logits(build(0).model, batch), _eval_logits(build(0).model, batch)
        require(torch.equal(first, second), "two loads under torch.manual_seed(0) give different logits")

    rec.run("deterministic under a seed", deterministic)

    def round_trip() -> Optional[_Note]:
        if teacher.save_pretrained is None:
            raise _Skip("Teacher.save_pretrained is None: the engine cannot store a fine-tuned copy")
        original = build(0)
        directory = workspace.path(f"saved-teacher-{name}-{shape.id}")
        original.save_pretrained(str(directory))
        reloaded = build(1, source=str(directory))
        batch = tiny_batch(task, original.tokenizer)
        require(torch.allclose(_eval_logits(original.model, batch), _eval_logits(reloaded.model, batch), atol=1e-6),
                f"the teacher saved to {directory} and loaded back with source={str(directory)!r} gives different "
                f"logits")
        return _Note(f"reloaded with source={directory.name}, finetuned={reloaded.finetuned}")

    rec.run("save_pretrained round-trips", round_trip)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        _check_logits(_forward(build(0).model.to("cuda"), tiny_batch(task, teacher.tokenizer, "cuda")), task,
                      len(SENTENCES))

    rec.run("runs on CUDA", on_cuda)
    return rec.results


@one_thread
def check_teacher(name: str, *, options: Optional[Mapping[str, Any]] = None, cases: Sequence[TaskShape] = MODEL_CASES,
                  registry: Optional[Registry] = None, workspace: Optional[Workspace] = None) -> ContractReport:
    """The teacher contract; by default loads a random tiny BERT through ``source`` (every teacher
    factory accepts it, see the teacher hook). ``options`` replaces that default."""
    registry, report, rec = _begin("teacher", name, registry)
    report.results += rec.results
    if rec.blocked_by:
        return report
    with _borrowed(workspace) as workspace:
        opts = dict(options) if options is not None else {"source": workspace.tiny_bert}
        for shape in cases:
            report.results += _teacher_case(registry, name, shape, opts, workspace)
    return report


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------

LOSS_CHECKS = (
    "name resolves", "builds", "accepts pairs or logits", "finite scalar", "gradient flows to the student",
    "zero for identical inputs", "weights scale each term", "deterministic under a seed", "runs on CUDA",
)


def _loss_inputs(form: str, device: str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, target): probability pairs ``(3, 4, 5)`` for pair losses (valid for MSE and KL
    alike), or logits ``(3, 4)`` and labels ``(3,)`` for label losses."""
    generator = torch.Generator().manual_seed(seed)
    if form == "pairs":
        student = torch.randn(BATCH, 4, 5, generator=generator).softmax(-1)
        target = torch.randn(BATCH, 4, 5, generator=generator).softmax(-1)
    else:
        student = torch.randn(BATCH, 4, generator=generator)
        target = torch.tensor([0, 3, 1])
    return student.to(device).requires_grad_(), target.to(device)


def _detect_form(loss_fn: Callable) -> tuple[str, torch.Tensor]:
    errors = []
    for form in ("pairs", "labels"):
        student, target = _loss_inputs(form)
        try:
            value = loss_fn(student, target)
        except Exception as exc:
            errors.append(f"{form}: {_describe_exception(exc)}")
            continue
        return form, value
    raise ContractFailure("the loss accepts neither pairs (student, target of shape (batch, P, D)) nor logits "
                          "(batch, C) with integer labels (batch,); " + "; ".join(errors))


@one_thread
def check_loss(name: str, *, options: Optional[Mapping[str, Any]] = None,
               registry: Optional[Registry] = None) -> ContractReport:
    """The loss contract: a finite scalar that trains the student side, zero for identical pairs,
    ``weights`` honoured; pair losses and label losses (CE) are told apart by what they accept."""
    registry, report, rec = _begin("loss", name, registry)
    options = dict(options or {})
    loss_fn = rec.run("builds", lambda: registry.create("loss", name, **options), fatal=True)
    def accepts() -> _Note:
        form, _ = _detect_form(loss_fn)
        return _Note(f"form: {form}", form)

    form = rec.run("accepts pairs or logits", accepts, fatal=True) or "pairs"

    def scalar() -> None:
        student, target = _loss_inputs(form)
        value = loss_fn(student, target)
        require(isinstance(value, torch.Tensor) and value.dim() == 0, f"returned {value!r}, not a scalar tensor")
        require(torch.isfinite(value), f"returned {value.item()}")
        require(value.item() >= 0, f"returned {value.item()} < 0: a loss to minimise must be bounded below by 0")

    rec.run("finite scalar", scalar)

    def gradient() -> None:
        student, target = _loss_inputs(form)
        loss_fn(student, target).backward()
        require(student.grad is not None and student.grad.abs().sum() > 0,
                "no gradient reaches the student input (is it detached?)")
        require(torch.isfinite(student.grad).all(), "non-finite gradient on the student input")

    rec.run("gradient flows to the student", gradient)

    def identical() -> Optional[_Note]:
        if form != "pairs":
            raise _Skip("a label loss: identical inputs do not apply")
        student, _ = _loss_inputs(form)
        value = loss_fn(student, student.detach().clone())
        require(abs(value.item()) < 1e-5, f"loss(x, x) = {value.item():.6g}, expected 0 for identical pairs")

    rec.run("zero for identical inputs", identical)

    def weights() -> None:
        student, target = _loss_inputs(form)
        shape = student.shape[:2] if form == "pairs" else student.shape[:1]
        plain = loss_fn(student, target)
        ones = loss_fn(student, target, torch.ones(shape))
        zeros = loss_fn(student, target, torch.zeros(shape))
        require(torch.allclose(plain, ones, atol=1e-6), f"weights of 1 give {ones.item():.6g}, no weights "
                                                        f"{plain.item():.6g}: they must agree")
        require(abs(zeros.item()) < 1e-6, f"weights of 0 give {zeros.item():.6g}, expected 0")

    rec.run("weights scale each term", weights)

    def deterministic() -> None:
        first, second = (registry.create("loss", name, **options) for _ in range(2))
        student, target = _loss_inputs(form)
        require(torch.equal(first(student, target), second(student, target)), "two builds give different values")

    rec.run("deterministic under a seed", deterministic)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        fn = registry.create("loss", name, **options)
        if isinstance(fn, nn.Module):
            fn = fn.to("cuda")
        student, target = _loss_inputs(form, "cuda")
        require(torch.isfinite(fn(student, target)), "non-finite on CUDA")

    rec.run("runs on CUDA", on_cuda)
    report.results += rec.results
    return report


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------

TASK_CHECKS = (
    "name resolves", "builds", "declares its attributes", "every split loads", "labels in range",
    "compute_metrics returns the main metric", "deterministic under a seed",
)


@one_thread
def check_task(name: str, *, data_dir: Optional[str] = None, options: Optional[Mapping[str, Any]] = None,
               registry: Optional[Registry] = None) -> ContractReport:
    """The task contract. A task that needs files it was not given (or a hub it cannot reach)
    is skipped with its own message: pass ``data_dir`` (and ``options``) to check it."""
    registry, report, rec = _begin("task", name, registry)
    options = dict(options or {})

    def build():
        try:
            return registry.create("task", name, data_dir=data_dir, **options)
        except (OfflineError, UsageError) as exc:
            if data_dir is None:
                raise _Skip(f"needs data: {exc} (pass a data directory to check it)") from exc
            raise

    task = rec.run("builds", build, fatal=True)

    def attributes() -> None:
        require(isinstance(task.name, str) and task.name, "name must be a non-empty string")
        require(isinstance(task.labels, tuple), f"labels must be a tuple, got {type(task.labels).__name__}")
        require(task.is_regression == (not task.labels),
                f"is_regression={task.is_regression} but labels={task.labels!r}: a regression task has no labels, "
                f"a classification task at least two")
        require(task.is_regression or len(task.labels) >= 2, f"a classification task needs >= 2 labels, got "
                                                               f"{task.labels!r}")
        require(isinstance(task.dev_splits, tuple) and task.dev_splits, "dev_splits must be a non-empty tuple")
        require(isinstance(task.main_metric, str) and task.main_metric, "main_metric must name a metric")

    rec.run("declares its attributes", attributes, fatal=True)
    splits: dict[str, list] = {}

    def load() -> _Note:
        for split in ("train", *task.dev_splits):
            examples = task.load_split(split)
            require(isinstance(examples, list) and examples, f"load_split({split!r}) returned no examples")
            bad = next((e for e in examples if not isinstance(e, Example)), None)
            require(bad is None, f"load_split({split!r}) returned a {type(bad).__name__}, not kdplug.types.Example")
            for e in examples:
                require(isinstance(e.text_a, str) and e.text_a, f"{split}: an example with an empty text_a: {e!r}")
                require((e.text_b is not None) == task.is_pair,
                        f"{split}: is_pair={task.is_pair} but an example has text_b={e.text_b!r}")
            splits[split] = examples
        return _Note(", ".join(f"{s}: {len(e)}" for s, e in splits.items()))

    rec.run("every split loads", load, fatal=True)

    def labels() -> None:
        for split, examples in splits.items():
            for index, e in enumerate(examples):
                if task.is_regression:
                    require(isinstance(e.label, (int, float)) and not isinstance(e.label, bool)
                            and math.isfinite(e.label), f"{split} example {index}: label {e.label!r} is not a finite number")
                else:
                    require(isinstance(e.label, int) and not isinstance(e.label, bool)
                            and 0 <= e.label < len(task.labels),
                            f"{split} example {index}: label {e.label!r} is not a class index in "
                            f"0..{len(task.labels) - 1}")

    rec.run("labels in range", labels)

    def metrics() -> _Note:
        references = [float(e.label) if task.is_regression else e.label for e in splits[task.dev_splits[0]]]
        if task.is_regression:
            wrong = [-r for r in references]
        else:
            wrong = [(r + 1) % len(task.labels) for r in references]
        perfect = task.compute_metrics(list(references), list(references))
        worse = task.compute_metrics(wrong, list(references))
        for result in (perfect, worse):
            require(isinstance(result, Mapping) and task.main_metric in result,
                    f"compute_metrics returned {result!r}, without the main metric {task.main_metric!r}")
            bad = [k for k, v in result.items() if not (isinstance(v, (int, float)) and math.isfinite(v))]
            require(not bad, f"compute_metrics gave non-finite or non-numeric values for {_list(bad)}")
        require(perfect[task.main_metric] >= worse[task.main_metric],
                f"{task.main_metric} of perfect predictions ({perfect[task.main_metric]:.4g}) is below that of wrong "
                f"ones ({worse[task.main_metric]:.4g}): the main metric must be higher-is-better")
        return _Note(f"{task.main_metric}: perfect {perfect[task.main_metric]:.3g}, wrong {worse[task.main_metric]:.3g}")

    rec.run("compute_metrics returns the main metric", metrics)

    def deterministic() -> None:
        again = registry.create("task", name, data_dir=data_dir, **options)
        for split, examples in splits.items():
            require(again.load_split(split) == examples, f"a second build loads a different {split} split")

    rec.run("deterministic under a seed", deterministic)
    report.results += rec.results
    return report


# --------------------------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------------------------

RECIPE_CHECKS = (
    "name resolves", "builds", "runs on a tiny setup", "records its stages", "no NaN", "exports the student",
    "deterministic under a seed",
)

#: the tiny run a recipe is checked on: random 4-layer BERT teacher, tiny BiLSTM, 16 SST-2 lines
TINY_RUN: dict[str, Any] = {
    "student": "bilstm", "projector": "pkd-skip", "task": "sst2", "epochs": 1, "teacher_epochs": 1, "allow_weak_teacher": True,
    "head_epochs": 1, "batch_size": 8, "student_options": {"embedding_dim": 16, "hidden_size": 16},
}


def _nonfinite_numbers(value: Any, path: str = "") -> list[str]:
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "value"]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _nonfinite_numbers(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _nonfinite_numbers(v, f"{path}[{i}]")]
    return []


@one_thread
def check_recipe(name: str, *, options: Optional[Mapping[str, Any]] = None, run: Optional[Mapping[str, Any]] = None,
                 registry: Optional[Registry] = None, workspace: Optional[Workspace] = None) -> ContractReport:
    """The recipe contract: two complete tiny runs through the engine (:data:`TINY_RUN`, updated
    with ``run``), which must finish, record their stages, export a student and agree."""
    from ..config import RunConfig
    from ..engine.pipeline import run as run_pipeline

    registry, report, rec = _begin("recipe", name, registry)
    options = dict(options or {})

    def build() -> None:
        recipe = registry.create("recipe", name, **options)
        require(callable(getattr(recipe, "run", None)), f"the factory returned a {type(recipe).__name__} without "
                                                       f"a run(ctx) method")

    rec.run("builds", build, fatal=True)
    with _borrowed(workspace) as workspace:
        results: list[Any] = []

        def one_run(index: int):
            settings = {**TINY_RUN, "teacher": workspace.tiny_bert, "data_dir": workspace.sst2_dir, **(run or {}),
                        "recipe": name, "recipe_options": options, "cache_dir": str(workspace.path("cache")),
                        "output": str(workspace.path(f"run-{name}-{index}"))}
            config = RunConfig(**settings).validate()
            return run_pipeline(config, registry, overwrite=True, echo=lambda line: None)

        rec.run("runs on a tiny setup", lambda: results.append(one_run(1)), fatal=True)
        result = results[0] if results else None

        def stages() -> _Note:
            recorded = result.metrics.get("stages") or {}
            require(recorded, "the run recorded no stage: train the student with ctx.train_stage(...)")
            return _Note("stages: " + ", ".join(recorded))

        rec.run("records its stages", stages)

        def no_nan() -> None:
            bad = _nonfinite_numbers({"stages": result.metrics.get("stages"), "student": result.metrics.get("student")})
            require(not bad, f"non-finite numbers in metrics.json: {_list(bad)}")

        rec.run("no NaN", no_nan)

        def exported() -> None:
            weights = result.run_dir / "student" / "model.safetensors"
            require(weights.is_file(), f"{weights} was not written")

        rec.run("exports the student", exported)

        def deterministic() -> None:
            again = one_run(2)
            require(again.metrics["student"]["dev"] == result.metrics["student"]["dev"],
                    f"two runs with seed {TINY_RUN.get('seed', 42)} give dev results {result.metrics['student']['dev']}"
                    f" and {again.metrics['student']['dev']}")

        rec.run("deterministic under a seed", deterministic)
    report.results += rec.results
    return report


# --------------------------------------------------------------------------------------------
# One entry point for every kind
# --------------------------------------------------------------------------------------------
# Augmenters
# --------------------------------------------------------------------------------------------

AUGMENTER_CHECKS = (
    "name resolves", "builds", "prepares on training sentences", "returns text", "deterministic under a seed",
    "varies with the seed", "keeps an empty text empty",
)

#: training sentences an augmenter is prepared on, and the one it augments
AUGMENTER_SENTENCES = [a for a, _ in TINY_SST2_TRAIN]
AUGMENTER_SENTENCE = "the movie was very good but the ending was really dull and the acting was bad ."


def check_augmenter(name: str, *, options: Optional[Mapping[str, Any]] = None, registry: Optional[Registry] = None,
                    workspace: Optional[Workspace] = None) -> ContractReport:
    """The augmenter contract: built from a tiny teacher, it returns a string for a sentence,
    the same one for the same ``random.Random`` seed, different ones across seeds."""
    import random

    registry, report, rec = _begin("augmenter", name, registry)
    options = dict(options or {})
    with _borrowed(workspace) as workspace:
        from .tiny import TinyTask

        teacher = registry.create("teacher", "hf", TinyTask(), source=workspace.tiny_bert)
        augmenter = rec.run("builds", lambda: registry.create("augmenter", name, teacher, **options), fatal=True)

        def prepare() -> Optional[_Note]:
            if not hasattr(augmenter, "prepare"):
                raise _Skip("no prepare(sentences): nothing to learn from the training set")
            augmenter.prepare(AUGMENTER_SENTENCES + [AUGMENTER_SENTENCE])

        rec.run("prepares on training sentences", prepare)

        def returns_text() -> None:
            out = augmenter(AUGMENTER_SENTENCE, random.Random(0))
            require(isinstance(out, str), f"returned {type(out).__name__}, not str")

        rec.run("returns text", returns_text)

        def deterministic() -> None:
            first, second = (augmenter(AUGMENTER_SENTENCE, random.Random(7)) for _ in range(2))
            require(first == second, f"two calls with Random(7) gave {first!r} and {second!r}: draw every random "
                                     f"choice from the rng argument")

        rec.run("deterministic under a seed", deterministic)

        def varies() -> None:
            outputs = {augmenter(AUGMENTER_SENTENCE, random.Random(seed)) for seed in range(20)}
            require(len(outputs) > 1, "20 seeds gave one output: the augmenter does not augment")

        rec.run("varies with the seed", varies)

        def empty() -> None:
            out = augmenter("", random.Random(0))
            require(out.strip() == "", f"an empty text became {out!r}")

        rec.run("keeps an empty text empty", empty)
    report.results += rec.results
    return report


# --------------------------------------------------------------------------------------------

CHECKS: dict[str, tuple[str, ...]] = {
    "teacher": TEACHER_CHECKS, "student": STUDENT_CHECKS, "projector": PROJECTOR_CHECKS, "loss": LOSS_CHECKS,
    "task": TASK_CHECKS, "recipe": RECIPE_CHECKS, "augmenter": AUGMENTER_CHECKS,
}


def check_component(kind: str, name: str, *, options: Optional[Mapping[str, Any]] = None,
                    registry: Optional[Registry] = None, workspace: Optional[Workspace] = None,
                    data_dir: Optional[str] = None) -> ContractReport:
    """Run the contract of ``kind`` on component ``name`` with default settings."""
    if kind == "projector":
        return check_projector(name, options=options, registry=registry)
    if kind == "student":
        return check_student(name, options=options, registry=registry, workspace=workspace)
    if kind == "teacher":
        return check_teacher(name, options=options, registry=registry, workspace=workspace)
    if kind == "loss":
        return check_loss(name, options=options, registry=registry)
    if kind == "task":
        return check_task(name, data_dir=data_dir, options=options, registry=registry)
    if kind == "recipe":
        return check_recipe(name, options=options, registry=registry, workspace=workspace)
    if kind == "augmenter":
        return check_augmenter(name, options=options, registry=registry, workspace=workspace)
    raise UsageError(f"no contract for kind {kind!r}; kinds with a contract: {', '.join(CONTRACT_KINDS)} "
                     f"(layer extractors are checked through the student contract)")

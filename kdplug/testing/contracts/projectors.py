"""The projector contract, on a grid of teacher and student layer shapes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ...errors import UsageError
from ...registry import Registry
from ...types import (
    DistillInputs,
    LayerSpec,
    ProjectionRequest,
    ProjectorCapabilities,
    TokenSignals,
    TokenSpec,
    capabilities,
)
from .harness import (
    BATCH,
    CheckResult,
    ContractReport,
    _begin,
    _gradient_gaps,
    _list,
    _load_state,
    _nonfinite,
    _Note,
    _Recorder,
    _same_state,
    _Skip,
    _state_bytes,
    _trainable,
    one_thread,
    require,
)

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

    @property
    def heads(self) -> tuple[int, int]:
        """Attention heads of the teacher and a Transformer student: 12 where the width allows."""
        return tuple(12 if width % 12 == 0 else 2 for width in (self.teacher_width, self.student_width))

    def request(self) -> ProjectionRequest:
        teacher_heads, student_heads = self.heads
        return ProjectionRequest(
            teacher_layers=tuple(
                LayerSpec(i, self.teacher_width, "transformer") for i in range(1, self.teacher_layers + 1)
            ),
            student_layers=tuple(
                LayerSpec(i, self.student_width, self.student_kind) for i in range(1, self.student_layers + 1)
            ),
            num_outputs=self.num_outputs,
            is_regression=self.is_regression,
            teacher_tokens=TokenSpec(self.teacher_layers, self.teacher_width, teacher_heads),
            student_tokens=(
                TokenSpec(self.student_layers, self.student_width, student_heads)
                if self.student_kind == "transformer"
                else None
            ),
        )


#: BERT-base -> BERT-6 and -> a narrower BERT-4, MiniLM -> a BiLSTM, and two tiny models (also as regression)
PROJECTOR_GRID: tuple[LayerShapes, ...] = (
    LayerShapes(12, 768, 6, 768),
    LayerShapes(12, 768, 4, 384),
    LayerShapes(6, 384, 3, 64, student_kind="lstm"),
    LayerShapes(4, 32, 2, 32),
    LayerShapes(4, 32, 2, 32, num_outputs=1, is_regression=True),
)

PROJECTOR_CHECKS = (
    "name resolves",
    "builds for the layer shapes",
    "declares ild_loss, needs_teacher_heads, default_weights",
    "outputs fit the loss",
    "no NaN",
    "gradients reach every parameter",
    "gradients reach the student side",
    "teacher tensors get no gradient",
    "deterministic under a seed",
    "state_dict round-trips",
    "runs on CUDA",
)


def make_distill_inputs(
    request: ProjectionRequest,
    batch: int = BATCH,
    *,
    seed: int = 0,
    teacher_heads: bool = True,
    tokens: bool = False,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DistillInputs:
    """Random :class:`DistillInputs` for ``request``. Every tensor is a leaf that requires grad,
    so a gradient leaking to the teacher side is visible; ``teacher_head_logits`` is ``(B, n, C)``;
    with ``tokens``, both models' token signals over ``TOKENS`` positions (the last example padded)."""
    generator = torch.Generator().manual_seed(seed)

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device).requires_grad_()

    n, c = len(request.teacher_layers), request.num_outputs
    mask = torch.ones(batch, TOKENS, dtype=torch.bool, device=device)
    mask[-1, TOKENS - 2 :] = False  # the last example is padded

    def signals(spec: Optional[TokenSpec]) -> Optional[TokenSignals]:
        if spec is None or not tokens:
            return None
        per_block = lambda: [leaf(batch, TOKENS, spec.width) for _ in range(spec.layers)]  # noqa: E731
        hidden = [leaf(batch, TOKENS, spec.width) for _ in range(spec.layers + 1)]
        return TokenSignals(mask, hidden, per_block(), per_block(), per_block(), spec.heads)

    return DistillInputs(
        teacher_layers=[leaf(batch, spec.width) for spec in request.teacher_layers],
        student_layers=[leaf(batch, spec.width) for spec in request.student_layers],
        teacher_logits=leaf(batch, c),
        student_logits=leaf(batch, c),
        teacher_head_logits=leaf(batch, n, c) if teacher_heads else None,
        teacher_tokens=signals(request.teacher_tokens),
        student_tokens=signals(request.student_tokens),
    )


def token_tensors(signals: Optional[TokenSignals], side: str) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a model's token signals, named for a finding."""
    if signals is None:
        return []
    fields = ("hidden", "queries", "keys", "values")
    return [(f"{side}_tokens.{f}[{i}]", t) for f in fields for i, t in enumerate(getattr(signals, f))]


#: token positions of the random per-token signals
TOKENS = 5


def _check_projector_attributes(registry: Registry, projector: nn.Module) -> None:
    require(
        isinstance(projector, nn.Module),
        f"the factory returned a {type(projector).__name__}, not an nn.Module "
        f"(its parameters must train with the student's)",
    )
    # not through capabilities(): the contract checks what the projector itself declares, not the defaults
    ild = getattr(projector, "ild_loss", "missing")
    require(
        isinstance(ild, str) or (ild is None and hasattr(projector, "ild_loss")),  # not through capabilities(): above
        "the projector has no ild_loss attribute naming a registered loss (e.g. 'mse'; None when it returns "
        "ProjectedPairs.terms)",
    )
    losses = registry.names("loss")
    require(ild is None or ild in losses, f"ild_loss {ild!r} is not a registered loss; registered: {', '.join(losses)}")
    require(
        isinstance(getattr(projector, "needs_teacher_heads", None), bool),  # not through capabilities(): as above
        "needs_teacher_heads must be a class attribute True or False",
    )
    weights = getattr(projector, "default_weights", None)  # not through capabilities(): as above
    require(
        isinstance(weights, Mapping) and {"eta", "lam"} <= set(weights),
        f"default_weights must be a mapping with 'eta' and 'lam', got {weights!r}",
    )
    eta, lam = float(weights["eta"]), float(weights["lam"])
    require(
        0 <= eta <= 1 and 0 <= lam <= 1 and eta + lam <= 1 + 1e-9,
        f"default_weights eta={eta}, lam={lam}: each must lie in [0, 1] and eta + lam <= 1 "
        f"(the CE weight is 1 - eta - lam)",
    )
    require(float(weights.get("temperature", 1.0)) > 0, "default_weights temperature must be positive")


def _check_terms(pairs: Any, batch: int) -> None:
    terms = pairs.terms
    require(
        terms.dim() == 2 and terms.shape[0] == batch,
        f"pairs.terms is {tuple(terms.shape)}, expected (batch, P) with batch {batch}",
    )
    if getattr(pairs, "weights", None) is not None:
        require(tuple(pairs.weights.shape) == tuple(terms.shape), "pairs.weights must have the shape of pairs.terms")


def pair_loss(registry: Registry, projector: nn.Module, pairs: Any) -> torch.Tensor:
    """The ILD term as the engine computes it: the projector's loss on the pairs, or its own terms."""
    from ...engine.objective import pair_loss as engine_pair_loss

    require(
        projector.ild_loss is not None or getattr(pairs, "terms", None) is not None,
        "the projector names no ild_loss and returned no pairs.terms",
    )
    return engine_pair_loss(registry.create("loss", projector.ild_loss) if projector.ild_loss else None, pairs)


def _check_pairs(pairs: Any, request: ProjectionRequest, batch: int) -> None:
    if getattr(pairs, "terms", None) is not None:
        _check_terms(pairs, batch)
        return
    for attribute in ("student", "teacher"):
        require(
            isinstance(getattr(pairs, attribute, None), torch.Tensor),
            f"forward returned a {type(pairs).__name__}; it must return ProjectedPairs (or None for a "
            f"logit-only method)",
        )
    student, teacher = pairs.student, pairs.teacher
    require(
        student.dim() == 3 and student.shape == teacher.shape,
        f"pairs.student {tuple(student.shape)} and pairs.teacher {tuple(teacher.shape)} must be (batch, P, D) "
        f"of one shape",
    )
    require(
        student.shape[0] == batch, f"pairs are {tuple(student.shape)}: the first dimension must be the batch ({batch})"
    )
    if getattr(pairs, "weights", None) is not None:
        require(
            tuple(pairs.weights.shape) == tuple(student.shape[:2]),
            f"pairs.weights is {tuple(pairs.weights.shape)}, expected (batch, P) = {tuple(student.shape[:2])}",
        )
    if getattr(pairs, "attention", None) is not None:
        expected = (*student.shape[:2], len(request.teacher_layers))
        require(
            tuple(pairs.attention.shape) == expected,
            f"pairs.attention is {tuple(pairs.attention.shape)}, expected (batch, P, n) = {expected}",
        )


def _pair_tensors(pairs: Any) -> list[tuple[str, Optional[torch.Tensor]]]:
    if pairs is None:
        return []
    return [(f"pairs.{a}", getattr(pairs, a, None)) for a in ("student", "teacher", "weights", "attention", "terms")]


def _projector_case(
    registry: Registry, name: str, shapes: LayerShapes, options: Mapping[str, Any]
) -> list[CheckResult]:
    rec = _Recorder(shapes.id)
    request = shapes.request()

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return registry.create("projector", name, request, **options)

    def first_build() -> nn.Module:
        from ...engine.preflight import declared

        if request.student_tokens is None and declared(registry, ProjectorCapabilities, name).needs_tokens:
            try:
                build(0)
            except UsageError:
                raise _Skip("a token-level method refuses a pooled student with a usage error, as it should") from None
            require(False, "a token-level method (needs_tokens) built for a student without tokens (a BiLSTM)")
        return build(0)

    projector = rec.run("builds for the layer shapes", first_build, fatal=True)
    rec.run(
        "declares ild_loss, needs_teacher_heads, default_weights",
        lambda: _check_projector_attributes(registry, projector),
        fatal=True,
    )
    case = _ProjectorCase(
        registry,
        projector,
        request,
        heads=bool(capabilities(ProjectorCapabilities, projector).needs_teacher_heads),
        tokens=bool(capabilities(ProjectorCapabilities, projector).needs_tokens),
    )
    state: dict[str, Any] = {}
    _check_projector_loss(rec, case, state)
    _check_projector_gradients(rec, case, state)
    _check_projector_builds(rec, case, build)
    return rec.results


@dataclass
class _ProjectorCase:
    """A projector built for one case's layer shapes, and what its inputs need."""

    registry: Registry
    projector: nn.Module
    request: ProjectionRequest
    heads: bool
    tokens: bool

    def inputs(self, **device: str) -> DistillInputs:
        return make_distill_inputs(self.request, teacher_heads=self.heads, tokens=self.tokens, **device)


def _seeded_forward(module: nn.Module, inputs: DistillInputs, seed: int = 1) -> Any:
    torch.manual_seed(seed)  # dropout inside the projector draws the same masks
    return module(inputs)


def _compare_pairs(first: Any, second: Any, what: str) -> None:
    if first is None or second is None:
        require(first is None and second is None, f"{what}: one forward returned None and the other did not")
        return
    for attribute in ("student", "teacher", "weights", "attention", "terms"):
        a, b = getattr(first, attribute, None), getattr(second, attribute, None)
        require((a is None) == (b is None) and (a is None or torch.equal(a, b)), f"{what}: pairs.{attribute} differs")


def _check_projector_loss(rec: _Recorder, case: _ProjectorCase, state: dict[str, Any]) -> None:
    """One forward and backward: pairs that fit the loss, finite, and every parameter trained;
    keeps the inputs, pairs and loss in ``state`` for the gradient checks."""
    projector, request, registry = case.projector, case.request, case.registry

    def fits_the_loss() -> _Note:
        inputs = case.inputs()
        pairs = _seeded_forward(projector, inputs)
        state.update(inputs=inputs, pairs=pairs)
        if pairs is None:
            return _Note("forward returned None: a logit-only method (no pairs to compare)")
        _check_pairs(pairs, request, BATCH)
        loss = pair_loss(registry, projector, pairs)
        require(
            isinstance(loss, torch.Tensor) and loss.dim() == 0,
            f"loss {projector.ild_loss!r} on the pairs gave {loss!r}, not a scalar tensor",
        )
        state["loss"] = loss
        loss.backward()
        if pairs.terms is not None:
            return _Note(f"{pairs.terms.shape[1]} terms per example, computed by the projector")
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
            require(
                not params,
                f"forward returns None, so its {len(params)} parameter(s) "
                f"({_list([n for n, _ in params])}) can never train",
            )
            return _Note("no parameters (logit-only)")
        gaps = _gradient_gaps(projector)
        require(
            not gaps,
            f"{len(gaps)} of {len(params)} parameters got no useful gradient from the ILD loss: "
            f"{_list(gaps)}; every parameter must be trained by the loss (or not exist)",
        )
        return _Note(f"{len(params)} parameter tensors" if params else "no parameters")

    rec.run("gradients reach every parameter", every_parameter)


def _check_projector_gradients(rec: _Recorder, case: _ProjectorCase, state: dict[str, Any]) -> None:
    """Where the loss's gradient went: into the student's tensors, never the teacher's."""

    def student_side() -> Optional[_Note]:
        inputs = state["inputs"]
        if state["pairs"] is None:
            return _Note("logit-only: the KD and CE terms train the student")
        student_tokens = token_tensors(inputs.student_tokens, "student")
        named = [*(f"student_layers[{i}]" for i in range(len(inputs.student_layers))), "student_logits"]
        named += [n for n, _ in student_tokens]
        tensors = [*inputs.student_layers, inputs.student_logits, *(t for _, t in student_tokens)]
        reached = [n for n, t in zip(named, tensors) if t.grad is not None and t.grad.abs().sum() > 0]
        require(
            reached,
            "the ILD loss sends no gradient to any student tensor (student_layers, student_logits): "
            "the pairs' student side must be computed from inputs.student_layers or student_logits, "
            "without detach()",
        )
        return _Note("reached " + _list(reached))

    rec.run("gradients reach the student side", student_side)

    def teacher_side() -> None:
        inputs = state["inputs"]
        named = [(f"teacher_layers[{i}]", t) for i, t in enumerate(inputs.teacher_layers)]
        named += [("teacher_logits", inputs.teacher_logits), ("teacher_head_logits", inputs.teacher_head_logits)]
        named += token_tensors(inputs.teacher_tokens, "teacher")
        leaked = [n for n, t in named if t is not None and t.grad is not None and t.grad.abs().sum() > 0]
        require(
            not leaked,
            f"gradient reached {_list(leaked)}: the teacher is frozen, detach() teacher tensors before using them",
        )

    rec.run("teacher tensors get no gradient", teacher_side)


def _check_projector_builds(rec: _Recorder, case: _ProjectorCase, build: Callable[[int], nn.Module]) -> None:
    """Fresh builds: the same under one seed, through a saved state, and on CUDA."""
    projector = case.projector

    def deterministic() -> None:
        again = build(0)  # the projector built first had no optimizer step: still its initial state
        difference = _same_state(projector, again)
        require(difference is None, f"two builds under torch.manual_seed(0) differ: {difference}")
        inputs = case.inputs()
        _compare_pairs(
            _seeded_forward(projector, inputs), _seeded_forward(again, inputs), "two builds under one seed, same inputs"
        )

    rec.run("deterministic under a seed", deterministic)

    def round_trip() -> None:
        original, other = projector, build(1)
        _load_state(other, _state_bytes(original))
        inputs = case.inputs()
        _compare_pairs(
            _seeded_forward(original, inputs),
            _seeded_forward(other, inputs),
            "after load_state_dict(torch.save'd state_dict) the outputs",
        )

    rec.run("state_dict round-trips", round_trip)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        module = build(0).to("cuda")
        pairs = _seeded_forward(module, case.inputs(device="cuda"))
        if pairs is not None:
            loss = pair_loss(case.registry, module, pairs)
            require(torch.isfinite(loss), f"loss on CUDA is {loss.item()}")
            loss.backward()

    rec.run("runs on CUDA", on_cuda)


@one_thread
def check_projector(
    name: str,
    *,
    options: Optional[Mapping[str, Any]] = None,
    shapes: Sequence[LayerShapes] = PROJECTOR_GRID,
    registry: Optional[Registry] = None,
    cases: Optional[Sequence[str]] = None,
) -> ContractReport:
    """The projector contract on every point of ``shapes`` (``cases``: only these shape ids)."""
    registry, report, rec = _begin("projector", name, registry)
    report.results += rec.results
    if rec.blocked_by:
        return report
    for point in shapes:
        if cases is None or point.id in cases:
            report.results += _projector_case(registry, name, point, options or {})
    return report

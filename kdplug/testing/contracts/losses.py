"""The loss contract: pair losses and label losses, told apart by what they accept."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional

import torch
from torch import nn

from ...registry import Registry
from .harness import (
    BATCH,
    ContractFailure,
    ContractReport,
    _begin,
    _describe_exception,
    _Note,
    _Skip,
    one_thread,
    require,
)

# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------

LOSS_CHECKS = (
    "name resolves",
    "builds",
    "accepts pairs or logits",
    "finite scalar",
    "gradient flows to the student",
    "zero for identical inputs",
    "weights scale each term",
    "deterministic under a seed",
    "runs on CUDA",
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
    raise ContractFailure(
        "the loss accepts neither pairs (student, target of shape (batch, P, D)) nor logits "
        "(batch, C) with integer labels (batch,); " + "; ".join(errors)
    )


@one_thread
def check_loss(
    name: str, *, options: Optional[Mapping[str, Any]] = None, registry: Optional[Registry] = None
) -> ContractReport:
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
        require(
            student.grad is not None and student.grad.abs().sum() > 0,
            "no gradient reaches the student input (is it detached?)",
        )
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
        require(
            torch.allclose(plain, ones, atol=1e-6),
            f"weights of 1 give {ones.item():.6g}, no weights {plain.item():.6g}: they must agree",
        )
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

"""The student and teacher contracts (layer extractors are checked through the student's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ...registry import Registry
from ...types import (
    Example,
    LayerSpec,
    StudentCapabilities,
    Teacher,
    TeacherCapabilities,
    capabilities,
    matchable_layers,
    num_outputs,
)
from .harness import (
    CheckResult,
    ContractFailure,
    ContractReport,
    Workspace,
    _begin,
    _borrowed,
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
# Models: students and teachers
# --------------------------------------------------------------------------------------------

SENTENCES = [
    ("the movie was very good .", "a nice film"),
    ("bad", "the plot was dull and the acting awful"),
    ("i loved this book , it is great and fun .", "we hated it"),
]


@dataclass(frozen=True)
class TaskShape:
    """A model case: the tiny task the model is built for."""

    id: str
    labels: tuple[str, ...] = ("negative", "positive")
    is_pair: bool = False

    def task(self):
        from ..tiny import TinyTask

        return TinyTask(labels=self.labels, is_pair=self.is_pair)


MODEL_CASES: tuple[TaskShape, ...] = (
    TaskShape("classification"),
    TaskShape("3-class-pairs", labels=("entailment", "neutral", "contradiction"), is_pair=True),
    TaskShape("regression", labels=()),
)

STUDENT_CHECKS = (
    "name resolves",
    "builds for the task",
    "a layer extractor supports it",
    "forward gives logits (B, C)",
    "layer specs match the extracted tensors",
    "no NaN",
    "gradients reach every parameter",
    "right-padded batches give the unpadded result",
    "deterministic under a seed",
    "state_dict round-trips",
    "runs on CUDA",
)

TEACHER_CHECKS = (
    "name resolves",
    "loads the tiny checkpoint",
    "a layer extractor supports it",
    "forward gives logits (B, C)",
    "layer specs match the extracted tensors",
    "no NaN",
    "gradients reach every parameter",
    "deterministic under a seed",
    "save_pretrained round-trips",
    "runs on CUDA",
)


def find_extractor(registry: Registry, model: nn.Module):
    """The first registered layer extractor that supports ``model`` (as the engine picks it)."""
    for entry in registry.entries("layer_extractor"):
        if entry.factory.supports(model):
            return entry.factory
    raise ContractFailure(
        f"no registered layer extractor supports a {type(model).__name__} "
        f"(registered: {', '.join(registry.names('layer_extractor')) or 'none'}); the plugin "
        f"that adds this model must also register a layer extractor for it"
    )


def tiny_batch(task, tokenizer, device: str = "cpu", rows: Optional[Sequence[int]] = None) -> dict[str, torch.Tensor]:
    """A right-padded batch as the engine's collator builds it, from three short sentences."""
    from ...engine.data import Collator, encode

    examples = [
        Example(text_a=a, text_b=b if task.is_pair else None, label=0.5 if task.is_regression else i % len(task.labels))
        for i, (a, b) in enumerate(SENTENCES)
    ]
    if rows is not None:
        examples = [examples[i] for i in rows]
    split = encode(examples, tokenizer, 64, is_regression=task.is_regression)
    batch = Collator(split.pad_id, task.is_regression)([split[i] for i in range(len(split))])
    return {key: value.to(device) for key, value in batch.items()}


def _forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
    from ...engine.objective import model_forward

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
    require(
        len(specs) == len(tensors),
        f"layer_specs lists {len(specs)} layers but the extractor returned {len(tensors)} tensors",
    )
    for spec, tensor in zip(specs, tensors):
        require(
            tuple(tensor.shape) == (batch, spec.width),
            f"layer {spec.index}: tensor {tuple(tensor.shape)}, but its spec says (batch, {spec.width})",
        )
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
    require(
        not gaps,
        f"{len(gaps)} of {len(params)} trainable parameters got no gradient from the task loss and "
        f"the layer vectors: {_list(gaps)}",
    )
    return _Note(f"{len(params)} parameter tensors")


def _eval_logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return _forward(model, batch).logits


def _student_case(
    registry: Registry, name: str, shape: TaskShape, teacher_for: Callable[[Any], Teacher], options: Mapping[str, Any]
) -> list[CheckResult]:
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
    tokenizer = capabilities(StudentCapabilities, student).tokenizer or teacher.tokenizer
    extractor = rec.run("a layer extractor supports it", lambda: find_extractor(registry, student), fatal=True)
    _check_student_outputs(rec, registry, student, task, tokenizer, extractor)
    _check_student_builds(rec, build, task, tokenizer)
    return rec.results


def _check_student_outputs(
    rec: _Recorder, registry: Registry, student: nn.Module, task: Any, tokenizer: Any, extractor: Any
) -> None:
    """The built student's forward: its logits and layers, finite, trainable, blind to padding."""
    state: dict[str, Any] = {}

    def logits() -> None:
        student.eval()
        batch = tiny_batch(task, tokenizer)
        with torch.no_grad():
            state["outputs"] = _forward(student, batch)
        state["logits"] = _check_logits(state["outputs"], task, len(SENTENCES))

    rec.run("forward gives logits (B, C)", logits, fatal=True)
    rec.run(
        "layer specs match the extracted tensors",
        lambda: _check_specs(extractor, student, state["outputs"], len(SENTENCES)),
    )

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
            require(
                torch.allclose(together[row], alone[0], atol=1e-4, rtol=1e-4),
                f"example {row} gives logits {together[row].tolist()} in a right-padded batch but "
                f"{alone[0].tolist()} alone: padding must not change the result (use the attention_mask)",
            )

    rec.run("right-padded batches give the unpadded result", padding)


def _check_student_builds(rec: _Recorder, build: Callable[[int], nn.Module], task: Any, tokenizer: Any) -> None:
    """Fresh builds: the same under one seed, through a saved state, and on CUDA."""

    def deterministic() -> None:
        first, second = build(0), build(0)
        difference = _same_state(first, second)
        require(difference is None, f"two builds under torch.manual_seed(0) differ: {difference}")
        batch = tiny_batch(task, tokenizer)
        require(
            torch.equal(_eval_logits(first, batch), _eval_logits(second, batch)),
            "two builds under one seed give different logits",
        )

    rec.run("deterministic under a seed", deterministic)

    def round_trip() -> None:
        original, other = build(0), build(1)
        _load_state(other, _state_bytes(original))
        batch = tiny_batch(task, tokenizer)
        require(
            torch.equal(_eval_logits(original, batch), _eval_logits(other, batch)),
            "after load_state_dict(torch.save'd state_dict) the logits differ",
        )

    rec.run("state_dict round-trips", round_trip)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        model = build(0).to("cuda")
        _check_logits(_forward(model, tiny_batch(task, tokenizer, "cuda")), task, len(SENTENCES))

    rec.run("runs on CUDA", on_cuda)


def _tiny_teacher_factory(registry: Registry, workspace: Workspace) -> Callable[[Any], Teacher]:
    cache: dict[tuple, Teacher] = {}

    def teacher_for(task) -> Teacher:
        key = (task.labels, task.is_pair)
        if key not in cache:
            cache[key] = registry.create("teacher", "hf", task, source=workspace.tiny_bert)
        return cache[key]

    return teacher_for


@one_thread
def check_student(
    name: str,
    *,
    options: Optional[Mapping[str, Any]] = None,
    teacher: Any = None,
    cases: Sequence[TaskShape] = MODEL_CASES,
    registry: Optional[Registry] = None,
    workspace: Optional[Workspace] = None,
) -> ContractReport:
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


def _teacher_case(
    registry: Registry, name: str, shape: TaskShape, options: Mapping[str, Any], workspace: Workspace
) -> list[CheckResult]:
    rec = _Recorder(shape.id)
    task = shape.task()

    def build(seed: int, **extra: Any) -> Teacher:
        torch.manual_seed(seed)
        return registry.create("teacher", name, task, **{**options, **extra})

    def loads() -> Teacher:
        teacher = build(0)
        require(
            isinstance(teacher, Teacher), f"the factory returned a {type(teacher).__name__}, not a kdplug.types.Teacher"
        )
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
    rec.run(
        "layer specs match the extracted tensors",
        lambda: _check_teacher_specs(registry, name, extractor, model, state["outputs"]),
    )

    def no_nan() -> None:
        named = [("logits", state["logits"])] + [
            (f"layer {i}", t) for i, t in enumerate(extractor(model, state["outputs"]))
        ]
        bad = _nonfinite(named)
        require(not bad, f"non-finite values in {_list(bad)}")

    rec.run("no NaN", no_nan)

    rec.run("gradients reach every parameter", lambda: _teacher_gradients(registry, model, task, teacher.tokenizer))

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
        require(
            torch.allclose(_eval_logits(original.model, batch), _eval_logits(reloaded.model, batch), atol=1e-6),
            f"the teacher saved to {directory} and loaded back with source={str(directory)!r} gives different logits",
        )
        return _Note(f"reloaded with source={directory.name}, finetuned={reloaded.finetuned}")

    rec.run("save_pretrained round-trips", round_trip)

    def on_cuda() -> None:
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device")
        _check_logits(
            _forward(build(0).model.to("cuda"), tiny_batch(task, teacher.tokenizer, "cuda")), task, len(SENTENCES)
        )

    rec.run("runs on CUDA", on_cuda)
    return rec.results


@one_thread
def _check_teacher_specs(registry: Registry, name: str, extractor: Any, model: nn.Module, outputs: Any) -> None:
    factory = registry.resolve("teacher", name)[0].factory
    if capabilities(TeacherCapabilities, getattr(factory, "func", factory)).has_layers is False:
        raise _Skip("the teacher declares has_layers = False: no method reads its layers")  # a served model
    _check_specs(extractor, model, outputs, len(SENTENCES))


def _teacher_gradients(registry: Registry, model: nn.Module, task: Any, tokenizer: Any) -> None:
    # a teacher that is not fine-tuned yet is trained by the engine first: every weight must learn
    if not any(parameter.requires_grad for parameter in model.parameters()):
        raise _Skip("no trainable parameter (a served model): the engine never fine-tunes it")
    _model_gradients(registry, model, task, tokenizer)


def check_teacher(
    name: str,
    *,
    options: Optional[Mapping[str, Any]] = None,
    cases: Sequence[TaskShape] = MODEL_CASES,
    registry: Optional[Registry] = None,
    workspace: Optional[Workspace] = None,
) -> ContractReport:
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

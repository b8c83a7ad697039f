"""The Python API: ``kdplug.distill(...)`` runs exactly what ``kdplug run`` runs.

Components are names (as on the command line) or objects already in memory: a Hugging Face model
and its tokenizer as the teacher (``(model, tokenizer)`` or a :class:`kdplug.types.Teacher`), a
built student module, a task object or a ``datasets.DatasetDict``. Objects are handed to the
engine through a plugin registered for this call only, so they take exactly the path a named
component takes; the run directory records them as ``python:teacher`` (and so on), and such a
run cannot be resumed from the command line, the objects being gone.
"""

from __future__ import annotations

import copy
import functools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from torch import nn

from .components import process_manager
from .config import RunConfig, apply, load_yaml
from .errors import ArgumentError, UsageError
from .plugins import PluginManager, hookimpl
from .types import Task, Teacher, num_outputs

IN_MEMORY = "python:{kind}"


@dataclass
class DistillResult:
    """What a run produced: its directory, metrics, and the trained student (eval mode)."""

    run_dir: Path
    metrics: dict[str, Any]
    student: Any  # kdplug.LoadedStudent: .model, .tokenizer, .labels, .predict(...)

    @property
    def model(self) -> nn.Module:
        return self.student.model

    @property
    def tokenizer(self) -> Any:
        return self.student.tokenizer

    @property
    def dev(self) -> dict[str, dict[str, float]]:
        """The student's final dev metrics, per dev split."""
        return self.metrics["student"]["dev"]

    def predict(self, texts, **options: Any):
        return self.student.predict(texts, **options)


def distill(
    teacher: Any = None,
    student: Any = None,
    projector: Optional[str] = None,
    task: Any = None,
    *,
    data_dir: Optional[str] = None,
    recipe: Optional[str] = None,
    config: Union[RunConfig, dict, str, Path, None] = None,
    output: Optional[str] = None,
    overwrite: bool = False,
    teacher_finetuned: bool = False,
    teacher_weights: Optional[Sequence[float]] = None,
    echo: Optional[Callable[[str], None]] = print,
    **settings: Any,
) -> DistillResult:
    """Distil ``student`` from ``teacher`` on ``task`` with ``projector``; returns the result.

    ``config``: a :class:`RunConfig`, a dict of its keys or a YAML file, applied first; then the
    components and ``settings`` (any RunConfig key: ``epochs=3``, ``lr=2e-5``,
    ``student_options={"hidden_size": 256}``). ``teacher_finetuned``: the in-memory teacher is
    already fine-tuned on the task (otherwise kdplug fine-tunes a copy of it first; your object
    is never modified). ``echo``: where the run's lines go (``None``: nowhere).

    An ensemble: ``teacher`` a list (names, directories, hub ids or in-memory teachers), with
    ``teacher_weights`` one positive number each; or ``teachers=[{"teacher": NAME, "teacher_options": {...},
    "weight": W}, ...]`` as in a configuration file.
    """
    from .engine.pipeline import run

    run_config, manager = _prepare(
        teacher,
        student,
        projector,
        task,
        data_dir,
        recipe,
        config,
        output,
        teacher_finetuned,
        teacher_weights,
        settings,
    )
    for name, value in (("overwrite", overwrite), ("teacher_finetuned", teacher_finetuned)):
        if not isinstance(value, bool):  # "no" would read as true: a run replaced, a teacher never fine-tuned
            raise ArgumentError(f"{name}= takes True or False, got {_describe(value)}")
    if echo is not None and not callable(echo):
        raise ArgumentError(
            f"echo= takes a function of one str (print, a logger's info) or None, got {_describe(echo)}"
        )
    result = run(run_config, manager.registry, overwrite=overwrite, echo=echo or (lambda text: None))
    from .inference import load_student

    return DistillResult(run_dir=result.run_dir, metrics=result.metrics, student=load_student(result.run_dir))


def _prepare(
    teacher, student, projector, task, data_dir, recipe, config, output, teacher_finetuned, teacher_weights, settings
) -> tuple[RunConfig, PluginManager]:
    """The run :func:`distill` starts: its configuration, checked, and the plugins with its in-memory objects."""
    members = ensemble_members(teacher, teacher_weights, "teachers" in settings)
    if members is not None:
        teacher = None
    check_arguments(teacher=teacher, student=student, task=task, projector=projector, recipe=recipe, config=config)
    for name, value in (("data_dir", data_dir), ("output", output)):
        if value is not None and not isinstance(value, (str, Path)):
            raise ArgumentError(f"{name}= takes a directory (str or pathlib.Path), got {type(value).__name__}")
    run_config = _base_config(config)
    objects: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, given in (("teacher", teacher), ("student", student), ("task", task)):
        if given is None:
            continue
        if isinstance(given, (str, Path)):
            values[key] = str(given)
        else:
            objects[key] = given
            values[key] = IN_MEMORY.format(kind=key)
    for key, given in (("projector", projector), ("recipe", recipe), ("data_dir", data_dir), ("output", output)):
        if given is not None:
            values[key] = str(given)
    if members is not None:
        values["teachers"] = [_member_entry(member, objects) for member in members]
        values["teacher"] = values["teachers"][0]["teacher"]
    elif teacher_weights is not None and not run_config.teachers and "teachers" not in settings:
        raise ArgumentError("teacher_weights= weighs an ensemble's members: give teacher= a list of two or more")
    apply(run_config, {**values, **settings}, source="kdplug.distill")
    if teacher_weights is not None and members is None:
        apply(
            run_config,
            {"teachers": _weighted(run_config.teachers, _numbers(teacher_weights))},
            source="teacher_weights",
        )
    run_config.validate()
    manager = process_manager().copy()  # the process's plugins (and --disable-plugin), plus ours
    if objects:
        manager.register(_InMemory(objects, teacher_finetuned, manager), "kdplug-python-api", distribution="kdplug")
    return run_config, manager


def ensemble_members(teacher: Any, weights: Optional[Sequence[float]], teachers_given: bool) -> Optional[list]:
    """``teacher=[A, B, ...]``'s members as ``(teacher, weight)``; None where ``teacher`` is one teacher (a
    tuple is one: ``(model, tokenizer)``, checked as such)."""
    if not isinstance(teacher, list):
        return None
    if teachers_given:
        raise ArgumentError("give the ensemble once: teacher=[A, B] or teachers=[{...}, {...}], not both")
    if len(teacher) < 2:
        raise ArgumentError(f"teacher= takes one teacher, or a list of two or more for an ensemble; got {len(teacher)}")
    for index, member in enumerate(teacher):
        if not isinstance(member, (str, Path)) and not _acceptable("teacher", member):
            raise ArgumentError(f"teacher[{index}] is {_describe(member)}; each member takes {ACCEPTS['teacher']}")
    weights = _weights(weights, len(teacher))
    return list(zip(teacher, weights))


def _weights(weights: Optional[Sequence[float]], count: int) -> list[float]:
    if weights is None:
        return [1.0] * count
    weights = _numbers(weights)
    if len(weights) != count:
        raise ArgumentError(
            f"teacher_weights= gives {len(weights)} weight(s) for {count} teachers: give one per teacher"
        )
    return list(weights)  # each checked as a member's weight (a ConfigError naming teachers[N].weight)


def _numbers(weights: Any) -> list:
    """``teacher_weights`` as a list, numpy's arrays and scalars (``np.float32(2)``, ``np.int64(3)``) as Python
    floats (the configuration holds plain numbers); anything else as given, checked as a member's weight."""
    if hasattr(weights, "tolist") and not isinstance(weights, (str, bytes)):
        weights = weights.tolist()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ArgumentError(f"teacher_weights= takes a list of numbers, one per teacher; got {_describe(weights)}")
    plain = (bool, int, float)
    return [float(w) if isinstance(w, numbers.Real) and not isinstance(w, plain) else w for w in weights]


def _weighted(entries: list, weights: list) -> list:
    if len(weights) != len(entries):
        raise ArgumentError(
            f"teacher_weights= gives {len(weights)} weight(s) for {len(entries)} teachers: give one per teacher"
        )
    return [
        {**entry, "weight": weight} if isinstance(entry, dict) else entry for entry, weight in zip(entries, weights)
    ]


def _member_entry(member: tuple[Any, Any], objects: dict[str, Any]) -> dict[str, Any]:
    """One ``teacher=[...]`` member as a ``teachers`` entry; an object is registered as ``python:teacher-N``."""
    given, weight = member
    if isinstance(given, (str, Path)):
        name = str(given)
    else:
        name = f"{IN_MEMORY.format(kind='teacher')}-{sum(key.startswith('teacher') for key in objects)}"
        objects[name.removeprefix("python:")] = given
    unweighted = weight == 1.0 and not isinstance(weight, bool)  # True is no weight: refused as a member's
    return {"teacher": name} if unweighted else {"teacher": name, "weight": weight}


#: what each component argument of :func:`distill` accepts, for the messages
ACCEPTS = {
    "teacher": "a name, a checkpoint directory or a hub id (str), a (model, tokenizer) pair, or a kdplug.types.Teacher",
    "student": "a name, a checkpoint directory or a hub id (str), or a torch.nn.Module",
    "task": "a name (str), a kdplug Task, or a datasets.DatasetDict",
    "projector": "a projector's name (str)",
    "recipe": "a recipe's name (str)",
    "config": "a RunConfig, a dict of its keys, or a YAML file's path",
}


def check_arguments(**given: Any) -> None:
    """Every component argument of :func:`distill` is of a kind it accepts, before anything is loaded:
    an :class:`ArgumentError` (a ``TypeError``) naming the argument otherwise."""
    for name, value in given.items():
        if value is None or isinstance(value, str) or (isinstance(value, Path) and name != "projector"):
            continue
        if not _acceptable(name, value):
            raise ArgumentError(f"{name}= takes {ACCEPTS[name]}; got {_describe(value)}")


def _acceptable(name: str, value: Any) -> bool:
    if name == "teacher":
        if isinstance(value, Teacher):
            return True
        return (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], nn.Module)
            and hasattr(value[0], "config")
            and callable(value[1])
        )
    if name == "student":
        return isinstance(value, nn.Module) and _reads_token_ids(value)
    if name == "task":
        return (hasattr(value, "load_split") and hasattr(value, "compute_metrics")) or (
            hasattr(value, "keys") and hasattr(value, "column_names")
        )
    if name == "config":
        return isinstance(value, (RunConfig, dict))
    return False


def _reads_token_ids(module: nn.Module) -> bool:
    """Whether ``module.forward`` takes ``input_ids`` and ``attention_mask`` (the Student protocol)."""
    import inspect

    parameters = inspect.signature(module.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return True
    return {"input_ids", "attention_mask"} <= set(parameters)


def _describe(value: Any) -> str:
    if isinstance(value, nn.Module) and not _reads_token_ids(value):
        return f"a {type(value).__name__} whose forward takes no input_ids and attention_mask (kdplug.types.Student)"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(item).__name__ for item in value)})"
    return f"{type(value).__name__} {value!r}"[:120]


def _base_config(config: Union[RunConfig, dict, str, Path, None]) -> RunConfig:
    if isinstance(config, RunConfig):
        return copy.deepcopy(config)
    base = RunConfig()
    if isinstance(config, (str, Path)):
        apply(base, load_yaml(config), source=str(config))
    elif isinstance(config, dict):
        apply(base, config, source="config")
    return base


class _InMemory:
    """A plugin, for one call, whose components are the objects given to :func:`distill`."""

    def __init__(self, objects: dict[str, Any], teacher_finetuned: bool, manager: PluginManager) -> None:
        self.objects, self.teacher_finetuned, self.manager = objects, teacher_finetuned, manager

    @hookimpl
    def kdplug_register_teachers(self, register):
        for key in self.objects:
            if key == "teacher" or key.startswith("teacher-"):  # one teacher, or an ensemble's member
                factory = functools.partial(self.teacher, key=key)
                register(f"python:{key}", factory, description="a teacher given in memory")

    @hookimpl
    def kdplug_register_students(self, register):
        if "student" in self.objects:
            register(IN_MEMORY.format(kind="student"), self.student, description="a student given in memory")

    @hookimpl
    def kdplug_register_tasks(self, register):
        if "task" in self.objects:
            register(IN_MEMORY.format(kind="task"), self.task, description="a task or DatasetDict given in memory")

    def teacher(self, task: Task, source: Optional[str] = None, *, key: str = "teacher") -> Teacher:
        if source is not None:  # the engine reloads a teacher it fine-tuned and stored
            loader, options = self.manager.registry.model_reference("teacher", source)
            return self.manager.registry.create("teacher", loader, task, **options)
        given = self.objects[key]
        if isinstance(given, Teacher):
            return (
                given
                if given.finetuned or not self.teacher_finetuned
                else Teacher(**{**given.__dict__, "finetuned": True})
            )
        if not (isinstance(given, tuple) and len(given) == 2):
            raise UsageError(
                f"an in-memory teacher is (model, tokenizer) or a kdplug.types.Teacher, got {type(given).__name__}"
            )
        model, tokenizer = given
        expected = num_outputs(task)
        if getattr(model.config, "num_labels", None) != expected:
            raise UsageError(
                f"the teacher has {model.config.num_labels} outputs but the task has {expected}; load it "
                f"with num_labels={expected} (AutoModelForSequenceClassification.from_pretrained(..., "
                f"num_labels={expected}))"
            )
        model = model if self.teacher_finetuned else copy.deepcopy(model)  # fine-tuning must not touch yours
        model.config.output_hidden_states = True

        def save_pretrained(directory: str, finetuned: bool = True) -> None:
            model.save_pretrained(directory)
            tokenizer.save_pretrained(directory)

        name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        return Teacher(
            model=model,
            tokenizer=tokenizer,
            source=f"in memory ({name})",
            finetuned=self.teacher_finetuned,
            save_pretrained=save_pretrained,
            pretrained=name if Path(name).is_dir() else None,
        )

    def student(self, task: Task, teacher: Teacher) -> nn.Module:
        return copy.deepcopy(self.objects["student"])  # every stage and baseline starts from the same weights

    def task(self, data_dir: Optional[str] = None, **options: Any) -> Task:
        given = self.objects["task"]
        if hasattr(given, "load_split") and hasattr(given, "compute_metrics"):
            return given
        if hasattr(given, "keys") and hasattr(given, "column_names"):  # a datasets.DatasetDict
            return self.manager.registry.create("task", "local", dataset=given, **options)
        raise UsageError(f"an in-memory task is a kdplug Task or a datasets.DatasetDict, got {type(given).__name__}")

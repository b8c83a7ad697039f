"""Teacher ensembles: several teachers, one target.

Each member is a teacher as a one-teacher run has it (``RunConfig.member_config``): created,
fine-tuned or reused, frozen, checked against the majority class and cached under its own keys, so
its cache entries are the ones a run with that teacher alone makes and reuses. The target students
learn from is the weighted mean of the members' probabilities at the stage's temperature T,
given to the stages as logits whose softmax at T is that mean (Hinton, Vinyals & Dean 2015; see
docs/methods.md):

    z_ens = T * log(sum_i w_i * softmax(z_i / T))

computed in float64 with log-sum-exp; for a regression, the weighted mean of the members' scores.
Layer methods read the layers of one member, the layer teacher.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from accelerate.utils import set_seed

from .. import fingerprint
from ..capabilities import ProjectorCapabilities
from ..config import RunConfig, TeacherMember
from ..errors import PluginError, UsageError
from ..hub import display_name
from ..registry import Registry
from ..types import LayerSpec, Task, Teacher
from . import preflight
from . import teacher as teacher_stage
from .cache import TeacherCache
from .schedule import DEFAULT_TEMPERATURE
from .trainer import predictions_from_logits

log = logging.getLogger("kdplug")


def run_temperature(config: RunConfig, registry: Registry) -> float:
    """The temperature the run's distillation uses where a stage does not say its own: the run's
    ``temperature``, else its projector's default, else kdplug's (as :func:`~kdplug.engine.recipe.stage_weights`)."""
    if config.temperature is not None:
        return float(config.temperature)
    defaults = preflight.declared(registry, ProjectorCapabilities, config.projector).default_weights or {}
    return float(defaults.get("temperature", DEFAULT_TEMPERATURE))


def _logsumexp(values: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
    top = np.max(values, axis=axis, keepdims=True)
    summed = np.log(np.sum(np.exp(values - top), axis=axis, keepdims=True)) + top
    return summed if keepdims else np.squeeze(summed, axis=axis)


def combined_logits(
    logits: Sequence[np.ndarray], weights: Sequence[float], temperature: float, regression: bool
) -> np.ndarray:
    """The ensemble's target as logits (float32, one row per example): ``T * log(sum_i w_i softmax(z_i / T))``,
    whose softmax at ``temperature`` is the weighted mean of the members' probabilities; for a
    regression, the weighted mean of their scores. Computed in float64."""
    stacked = np.stack([np.asarray(z, dtype=np.float64) for z in logits])  # (members, N, C)
    w = np.asarray(weights, dtype=np.float64)[:, None, None]
    if regression:
        return (w * stacked).sum(axis=0).astype(np.float32)
    scaled = stacked / temperature
    log_probabilities = scaled - _logsumexp(scaled, axis=2, keepdims=True)
    return (temperature * _logsumexp(log_probabilities + np.log(w), axis=0)).astype(np.float32)


@dataclass(frozen=True, kw_only=True)
class Combination:
    """How the members' outputs make one target: their normalised weights, the temperature, whether
    the task is a regression, and the member whose layers the run reads (None: none)."""

    weights: tuple[float, ...]
    temperature: float
    regression: bool
    layer_index: Optional[int] = None

    def at(self, temperature: float) -> Combination:
        return dataclasses.replace(self, temperature=float(temperature))


#: rows of the members' logits combined at a time
COMBINE_ROWS = 65536


class EnsembleCache:
    """One split's ensemble target with the :class:`~kdplug.engine.cache.TeacherCache` interface the
    stages read: the combined logits (held in memory: examples x classes) and the layer teacher's
    layer vectors, where the run reads them."""

    def __init__(self, members: list[TeacherCache], combination: Combination) -> None:
        sizes = {len(cache) for cache in members}
        if len(sizes) != 1:
            raise RuntimeError(f"the ensemble's members hold outputs for different numbers of examples: {sizes}")
        self.members, self.combination = members, combination
        size, c = len(members[0]), combination
        self.logits = np.empty((size, members[0].num_outputs), dtype=np.float32)
        for start in range(0, size, COMBINE_ROWS):  # float64 work space for a chunk of rows, not for the split
            rows = slice(start, min(start + COMBINE_ROWS, size))
            self.logits[rows] = combined_logits(
                [cache.logits[rows] for cache in members], c.weights, c.temperature, c.regression
            )
        index = combination.layer_index
        self.layer_cache = members[index] if index is not None and members[index].has_layers else None
        self.layers = self.layer_cache.layers if self.layer_cache is not None else None
        self.specs: list[LayerSpec] = self.layer_cache.specs if self.layer_cache is not None else []

    @property
    def has_layers(self) -> bool:
        return self.layer_cache is not None

    @property
    def num_outputs(self) -> int:
        return self.members[0].num_outputs

    @property
    def temperature(self) -> float:
        return self.combination.temperature

    @property
    def fingerprint(self) -> str:
        """The members' keys (a layer teacher's with its layers), their weights and the temperature."""
        c = self.combination
        return fingerprint.of_values(
            "teacher-ensemble", [cache.fingerprint for cache in self.members], list(c.weights), c.temperature
        )

    @property
    def built(self) -> bool:
        return any(cache.built for cache in self.members)

    @property
    def computed_by(self) -> list[dict[str, Any]]:
        return [record for cache in self.members for record in cache.computed_by]

    def record(self) -> dict[str, Any]:
        """Each member's record of the split (its keys, bytes, and whether they were reused)."""
        return {"examples": len(self), "members": [cache.record() for cache in self.members]}

    def __len__(self) -> int:
        return len(self.members[0])

    def fetch(self, index: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor]]:
        rows = index.cpu().numpy()
        logits = torch.from_numpy(np.ascontiguousarray(self.logits[rows])).to(device)
        layers = self.layer_cache.fetch(index, device)[1] if self.layer_cache is not None else []
        return logits, layers

    def at_temperature(self, temperature: float) -> EnsembleCache:
        """The same members combined at ``temperature`` (a stage with a temperature of its own)."""
        if self.combination.regression or float(temperature) == self.combination.temperature:
            return self
        return EnsembleCache(self.members, self.combination.at(temperature))


def at_temperature(cache: Any, temperature: float) -> Any:
    """``cache`` as a stage at ``temperature`` reads it: an ensemble's target combined at that
    temperature (also the one behind a transfer set's); any other cache as it is."""
    from .cache import ConcatCache

    if isinstance(cache, EnsembleCache):
        return cache.at_temperature(temperature)
    if isinstance(cache, ConcatCache) and isinstance(cache.labelled, EnsembleCache):
        return ConcatCache(cache.labelled.at_temperature(temperature), at_temperature(cache.transfer, temperature))
    return cache


@dataclass(kw_only=True)
class Member:
    """One member of the run's ensemble, prepared: its entry, its one-teacher configuration, the teacher
    (fine-tuned, frozen), its layer extractor, its outputs (its own encoding and cache keys), its
    task, data and sequence length as a run with it alone has them, and what metrics.json records of it."""

    member: TeacherMember
    config: RunConfig
    teacher: Teacher
    extractor: Any
    outputs: teacher_stage.TeacherOutputs
    base: Any  # its inputs.TaskAndTeacher: its sequence length, the data encoded with its tokenizer
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return member_label(self.member.index, self.member.name)


class EnsembleOutputs:
    """The ensemble's outputs with :class:`~kdplug.engine.teacher.TeacherOutputs`' interface: each
    member's opened (or computed and stored) on first use, combined per split. Only the layer teacher's
    cache holds layer vectors."""

    def __init__(self, members: list[Member], combination: Combination, layers: bool = False) -> None:
        self.members, self.combination = members, combination
        self.layers = False
        self.teacher = members[0].teacher
        self.dev = members[0].outputs.dev  # the primary teacher's dev splits, as it reads them
        self._dev: Optional[dict[str, EnsembleCache]] = None
        self._train: Optional[EnsembleCache] = None
        if layers:
            self.require_layers()

    def require_layers(self) -> None:
        if self.layers:
            return
        index = self.combination.layer_index
        if index is None:
            raise UsageError(
                "a stage reads the teacher's layers, but no member of the ensemble is its layer teacher; name one "
                "with --set layer_teacher=N (its position in teachers, from 0)"
            )
        self.members[index].outputs.require_layers()
        self.layers = True
        self._train, self._dev = None, None

    def dev_caches(self) -> dict[str, EnsembleCache]:
        if self._dev is None:
            opened = [member.outputs.dev_caches() for member in self.members]
            self._dev = {
                name: EnsembleCache([caches[name] for caches in opened], self.combination) for name in self.dev
            }
        return self._dev

    def train_cache(self) -> EnsembleCache:
        if self._train is None:
            self._train = EnsembleCache([member.outputs.train_cache() for member in self.members], self.combination)
        return self._train

    def record(self) -> dict[str, Any]:
        """Per split opened so far, each member's record (its keys, bytes, reused or built)."""
        opened = {**({"train": self._train} if self._train is not None else {}), **(self._dev or {})}
        return {name: cache.record() for name, cache in opened.items()}

    def record_members(self) -> None:
        """Each member's own cache record into its ``info`` (metrics.json's ``teacher.members``)."""
        for member in self.members:
            cached = member.outputs.record()
            if cached:
                member.info["cache"] = cached

    def __call__(self, layers: bool = False) -> tuple[EnsembleCache, dict[str, EnsembleCache]]:
        if layers:
            self.require_layers()
        dev = self.dev_caches()
        return self.train_cache(), dev


@dataclass(kw_only=True)
class EnsembleTransferOutputs:
    """The members' outputs on the run's transfer set (each a
    :class:`~kdplug.engine.transfer_outputs.TransferOutputs`, read with its own encoding), combined."""

    members: list[Any]
    combination: Combination
    cache: Optional[EnsembleCache] = None
    info: dict[str, Any] = field(default_factory=dict)

    def __call__(self, layers: bool = False) -> EnsembleCache:
        if self.cache is None or (layers and not self.cache.has_layers):
            index = self.combination.layer_index
            caches = [outputs(layers=layers and i == index) for i, outputs in enumerate(self.members)]
            self.cache = EnsembleCache(caches, self.combination)
            infos = [outputs.info for outputs in self.members]
            self.info.update(
                {
                    "examples": len(self.cache),
                    "teacher_seconds": round(sum(info.get("teacher_seconds", 0.0) for info in infos), 2),
                    "reused": all(info.get("reused", False) for info in infos),
                    "cache": self.cache.record(),
                }
            )
        return self.cache


def member_fingerprint(member: Member) -> str:
    """A member as its cache keys know it (what a recipe keys its stored models by): its weights, its
    tokenizer and its data as it reads it, which hold a prompted or served member's prompt and shots."""
    fingerprints = teacher_stage.teacher_fingerprints(member.teacher)
    splits = [member.outputs.train, *member.outputs.dev.values()]  # as its encoder formats them
    return fingerprint.of_values(
        fingerprints, [s.token_fingerprint or fingerprint.of_token_ids(s.input_ids) for s in splits]
    )


def layer_index(config: RunConfig, members: Sequence[tuple[str, Teacher, Any]], reads_layers: bool) -> Optional[int]:
    """The member whose layers layer methods read: ``layer_teacher``, else the one member whose layers
    kdplug can read; None where the run reads no layers. Two or none such members: refused. ``members``:
    each member's label, teacher and layer extractor, in order (the run's, or a dry run's)."""
    if config.layer_teacher is not None:
        return int(config.layer_teacher)
    if not reads_layers:
        return None
    readable = [index for index, (_, teacher, extractor) in enumerate(members) if _has_layers(teacher, extractor)]
    if len(readable) == 1:
        return readable[0]
    which = ", ".join(members[index][0] for index in readable) if readable else "none of them"
    raise UsageError(
        f"the run's method matches the teacher's layers, and an ensemble's come from one member; kdplug can read the "
        f"layers of {which}: name the one with --set layer_teacher=N (its position in teachers, from 0), or use a "
        f"method on the logits only"
    )


def member_label(index: int, name: str) -> str:
    return f"teacher {index} ({display_name(name)})"


def _has_layers(teacher: Teacher, extractor: Any) -> bool:
    try:
        return bool(teacher_stage.matchable_specs(extractor, teacher.model)[0])
    except (PluginError, NotImplementedError, AttributeError, TypeError):
        return False


def check_label_names(teacher: Teacher, task: Task, label: str, index: int) -> None:
    """A member's outputs mean the task's classes in the task's order: refused otherwise (before it is
    fine-tuned or run), naming both lists."""
    config = getattr(teacher.model, "config", None)
    id2label = getattr(config, "id2label", None) or {}
    if not task.labels or len(id2label) != len(task.labels):  # not a classifier of the task's classes (a prompted LM)
        return
    names = [str(id2label.get(i, id2label.get(str(i), ""))) for i in range(len(id2label))]
    if all(name.upper().startswith("LABEL_") for name in names):  # unnamed: read in the task's order
        return
    if names != [str(name) for name in task.labels]:
        raise UsageError(
            f"ensemble {label}: its outputs are labelled {names}, but the task {task.name!r} has the labels "
            f"{list(task.labels)}; an ensemble averages the members' probabilities class by class, so each member "
            f"must predict the task's labels (map them with --set teachers.{index}.teacher_options.label_map=..., "
            f"or choose a teacher for this task)"
        )


def ensemble_dev(task: Task, dev: dict[str, Any], caches: dict[str, EnsembleCache]) -> dict[str, Any]:
    """The ensemble's dev metrics: the argmax of its combined target (its mean score for a regression)."""
    scores = {}
    for name, cache in caches.items():
        predictions = predictions_from_logits(torch.from_numpy(cache.logits.copy()), task.is_regression).tolist()
        scores[name] = task.compute_metrics(predictions, dev[name].labels)
    return scores


def ensemble_info(members: list[Member], combination: Combination) -> dict[str, Any]:
    """metrics.json's ``teacher`` of an ensemble: each member's record (with its weight) and the sum
    of their parameters; the ensemble's dev metrics are added once its dev outputs are read."""
    primary = members[0].info
    for member in members:
        member.info["weight"] = member.member.weight
    return {
        "name": " + ".join(display_name(member.member.name) for member in members),
        "ensemble": {
            "temperature": combination.temperature,
            "weights": list(combination.weights),
            "layer_teacher": combination.layer_index,
        },
        "members": [member.info for member in members],
        "parameters": sum(member.info.get("parameters", 0) for member in members),
        "precision": primary.get("precision"),
        "pretrained": primary.get("pretrained"),
    }


def member_echo(echo: Callable[[str], None], member: Member) -> Callable[[str], None]:
    """``echo`` with each line naming the member it is about, its options as the member's."""
    return lambda line: echo(f"{member.label}: {member_options(line, member.member.index)}")


def prepare_members(config: RunConfig, registry: Registry, env: Any, loaded: Any, trainer: Any) -> list[Member]:
    """Each member as a one-teacher run prepares its teacher: created, fine-tuned or reused, frozen,
    its data encoded as it reads it; its outputs opened on first use. A member that cannot be
    created, or whose labels are not the task's, is refused naming it."""
    from . import inputs as run_inputs

    # the projectors against the layer teacher (else the first member), before any member: a refusal names no
    # member that is not the layer teacher (each member's load checks the same again, which then passes)
    preflight.check_projectors(config, registry, loaded[0])
    members = []
    for entry in config.members():
        member_config = config.member_config(entry)
        label = member_label(entry.index, entry.name)
        # each member from the seed a one-teacher run starts from: its random head (and so its stored
        # fine-tuning's key) must not depend on whether the members before it were fine-tuned or reused
        set_seed(run_inputs.teacher_seed(member_config))
        try:
            base = run_inputs.load_task_and_teacher(member_config, registry, loaded, run=config)
        except UsageError as exc:
            raise UsageError(f"ensemble {label}: {member_options(str(exc), entry.index)}") from exc
        check_label_names(base.teacher, base.task, label, entry.index)
        echo = lambda line, label=label, index=entry.index: env.echo(f"{label}: {member_options(line, index)}")  # noqa: E731
        member_env = dataclasses.replace(env, echo=echo)
        if entry.index:  # its fine-tuning's checkpoints apart from the other members'
            member_env = dataclasses.replace(member_env, checkpoints=member_checkpoints(env.checkpoints, entry.index))
        teacher, info = run_inputs.prepare_teacher(member_config, registry, base, member_env)
        run_inputs.freeze_and_describe(teacher, info, config.precision, env)
        info["index"] = entry.index
        outputs = run_inputs.teacher_outputs(teacher, base, registry, trainer, env, config.precision, layers=False)
        member = Member(
            member=entry,
            config=member_config,
            teacher=teacher,
            extractor=outputs.extractor,
            outputs=outputs,
            base=base,
            info=info,
        )
        members.append(member)
    return members


def member_options(message: str, index: int) -> str:
    """A one-teacher message's ``--set teacher_options.KEY=...`` as the member's ``teachers.N.teacher_options.KEY``."""
    for quote in ("'", ""):
        message = message.replace(f"--set {quote}teacher_options.", f"--set {quote}teachers.{index}.teacher_options.")
    return message


def member_checkpoints(checkpoints: Any, index: int) -> Any:
    """A member's fine-tuning checkpoints, under the run's but apart from the other members'."""
    moved = copy.copy(checkpoints)
    moved.root = checkpoints.root / f"member{index}"
    return moved


def prepare_ensemble_inputs(
    config: RunConfig, registry: Registry, env: Any, loaded: Any, record: Callable, *, warm: bool = False
) -> Any:
    """:func:`~kdplug.engine.inputs.prepare_inputs` for an ensemble: every member prepared and checked
    as a one-teacher run's teacher, and their outputs combined (:class:`EnsembleOutputs`). The first
    member is the run's primary teacher: its tokenizer encodes the students' data, students built from
    the teacher start from it, and augmenters that read a teacher read it."""
    from . import inputs as run_inputs

    loaded = loaded or run_inputs.load_task(config, registry)
    task = loaded[0]
    trainer = run_inputs.student_trainer(config, env, task)
    record({"task": task.name, "main_metric": task.main_metric, "config": config.to_dict()})
    reads_layers = preflight.reads_teacher_layers(config, registry)
    members = prepare_members(config, registry, env, loaded, trainer)
    combination = Combination(
        weights=tuple(member.member.weight for member in members),
        temperature=run_temperature(config, registry),
        regression=task.is_regression,
        layer_index=layer_index(config, [(m.label, m.teacher, m.extractor) for m in members], reads_layers),
    )
    info = ensemble_info(members, combination)
    record({"teacher": info})
    caches = EnsembleOutputs(members, combination, layers=reads_layers)
    primary = members[0]
    reads_teacher, dev_caches = preflight.reads_teacher(config, registry), None
    if reads_teacher and warm:
        caches()
        env.echo(f"teacher outputs cached for train and {', '.join(primary.base.dev)} (each member's)")
    elif reads_teacher:
        for member in members:
            echo = member_echo(env.echo, member)
            try:
                run_inputs.check_teacher(
                    member.config, task, member.base.dev, member.outputs.dev_caches(), member.info, echo
                )
            except run_inputs.WeakTeacherError as exc:
                raise run_inputs.WeakTeacherError(
                    f"ensemble {member.label}: {member_options(str(exc), member.member.index)}"
                ) from exc
        dev_caches = caches.dev_caches()
        info["dev"] = ensemble_dev(task, primary.base.dev, dev_caches)
        first = task.dev_splits[0]
        env.echo(
            f"ensemble of {len(members)} teachers: dev {task.main_metric} "
            f"{info['dev'][first][task.main_metric] * 100:.2f} on {first}"
        )
    transfer = (
        run_inputs.build_transfer_set(primary.config, registry, task, primary.teacher, env)
        if reads_teacher or not warm
        else None
    )
    return run_inputs.RunInputs(
        task=task,
        teacher=primary.teacher,
        max_length=primary.base.max_length,
        train=primary.base.train,
        dev=primary.base.dev,
        trainer=trainer,
        cache_root=env.cache_root,
        caches=caches,
        teacher_info=info,
        dev_caches=dev_caches,
        transfer=transfer,
        transfer_outputs=None
        if transfer is None
        else ensemble_transfer_outputs(members, combination, transfer, trainer),
        layer_teacher=None if combination.layer_index is None else members[combination.layer_index].teacher,
    )


def ensemble_transfer_outputs(
    members: list[Member], combination: Combination, transfer: Any, trainer: Any
) -> EnsembleTransferOutputs:
    from . import inputs as run_inputs

    return EnsembleTransferOutputs(
        members=[
            run_inputs.transfer_outputs(
                member.config,
                transfer,
                member.teacher,
                member.extractor,
                trainer,
                member.base.task,
                member.base.max_length,
                member.outputs.root,
            )
            for member in members
        ],
        combination=combination,
    )

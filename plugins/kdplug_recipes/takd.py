"""TAKD, teacher-assistant KD (Mirzadeh et al. 2020): bridge the capacity gap with a chain of models.

teacher → TA₁ → ... → TA_k → student: each link is an ordinary logit-KD (RKD) run whose
teacher is the best checkpoint of the link before, L = (1−η)·CE + η·τ²·KL(σ(z_t/τ) ‖ σ(z_s/τ)).
A TA is any registered student (``bert-6``, ``bilstm`` ...) or teacher (``roberta-base``, the
Universal-KD paper's TA for RoBERTa-large → DistilRoBERTa); a teacher-type TA starts from its
pretrained weights and reads text with its own tokenizer.

A trained TA is stored under ``<cache>/takd/<fingerprint>`` (safetensors + a summary), the
fingerprint chaining the previous link's (the teacher's weights for the first), the TA's name
and options, the data and the training settings; a later run that needs the same link loads
it instead of training it again. The final link trains the run's student and is always run.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from accelerate import PartialState
from accelerate.utils import broadcast_object_list, set_seed
from safetensors.torch import load_model, save_model
from torch import nn

import kdplug
from kdplug import fingerprint
from kdplug.errors import ConfigError, UsageError
from kdplug.storage import atomic_directory, complete_copy, file_lock, move_aside, verify
from kdplug.types import StudentCapabilities, Teacher, capabilities

log = logging.getLogger("kdplug.recipes.takd")

WEIGHTS, SUMMARY = "model.safetensors", "takd_link.json"


TAKD = """@inproceedings{mirzadeh2020takd,
  title = {Improved Knowledge Distillation via Teacher Assistant},
  author = {Mirzadeh, Seyed Iman and Farajtabar, Mehrdad and Li, Ang and Levine, Nir and Matsukawa, Akihiro
            and Ghasemzadeh, Hassan},
  booktitle = {Proceedings of AAAI 2020},
  pages = {5191--5198},
  year = {2020}
}"""


@dataclass(frozen=True)
class Link:
    """One model of the chain: a registered student or teacher name and its options."""

    name: str
    options: dict = field(default_factory=dict)
    final: bool = False  # the run's student


def plan_chain(ta: Any, student: str, student_options: Optional[dict] = None) -> list[Link]:
    """The links in training order: each TA of ``ta``, then the student.

    ``ta`` is a name, a ``{"name": .., **options}`` mapping, or a list of them (teacher side first).
    """
    entries = ta if isinstance(ta, (list, tuple)) else [ta]
    if not entries:
        raise ConfigError(
            "recipe 'takd': ta is empty; name at least one teaching assistant, e.g. --set 'recipe_options.ta=[bert-4]'"
        )
    links = []
    for entry in entries:
        if isinstance(entry, str):
            links.append(Link(entry))
        elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
            options = {k: v for k, v in entry.items() if k != "name"}
            links.append(Link(entry["name"], options))
        else:
            raise ConfigError(f"recipe 'takd': a TA is a name or {{name: NAME, option: value ...}}, got {entry!r}")
    return links + [Link(student, dict(student_options or {}), final=True)]


def default_ta(ctx) -> list[str]:
    """A BERT-k TA halfway between a Hugging Face teacher's depth and nothing (TAKD's middle size)."""
    from transformers import PreTrainedModel

    if not isinstance(ctx.teacher.model, PreTrainedModel):
        raise UsageError(
            "recipe 'takd' needs the option ta: the teaching assistant(s), e.g. --set 'recipe_options.ta=[bilstm]'"
        )
    depth = ctx.teacher.model.config.num_hidden_layers
    return [f"bert-{max(1, depth // 2)}"]


def link_key(previous: str, link: Link, data: str, settings: dict) -> str:
    """The stored TA's fingerprint: what it learnt from, what it is, on which data, how."""
    return fingerprint.of_values("takd-link", previous, link.name, link.options, data, settings)


class TAKD:
    """Train each link of the chain with RKD from the previous link's best checkpoint.

    Options: ``ta`` (a name, ``{name: .., option: ..}`` or a list of them; default ``bert-{n/2}``
    for an n-layer Hugging Face teacher), ``eta`` and ``temperature`` (default: the run's, else
    the link projector's: RKD's 0.7 and 10), ``ta_epochs`` and ``ta_lr`` (default: the run's epochs
    and learning rate), ``link_projector`` (whose default weights each link uses: ``rkd``).
    """

    citation = TAKD
    #: every link is logit KD: the run's projector is not used (kdplug says so when one is set)
    uses_projector = False
    reads_teacher_layers = False  # logits only: no teacher or TA caches a layer vector
    #: the folder of the cache root the trained TAs go to, for ``kdplug cache``
    stores = {"takd": "trained teacher assistants (TAKD)"}

    def __init__(
        self,
        ta: Any = None,
        eta: Optional[float] = None,
        temperature: Optional[float] = None,
        ta_epochs: Optional[int] = None,
        ta_lr: Optional[float] = None,
        link_projector: str = "rkd",
    ) -> None:
        self.ta, self.eta, self.temperature = ta, eta, temperature
        self.ta_epochs, self.ta_lr, self.link_projector = ta_epochs, ta_lr, link_projector
        if ta is not None:
            plan_chain(ta, "student")  # malformed entries fail before any work

    def run(self, ctx):
        settings = ctx.settings
        links = plan_chain(
            self.ta if self.ta is not None else default_ta(ctx), settings.student, settings.student_options
        )
        data = ctx.data_fingerprint()
        teaching, teacher_label = ctx, settings.teacher
        previous = teacher_fingerprint = ctx.teacher_fingerprint()  # an ensemble's: its members' and weights
        for number, link in enumerate(links, start=1):
            stage = f"link{number}-{link.name}"
            model = self.build(ctx, link)
            weights = self.weights(teaching, model)
            record = {
                "model": link.name,
                "options": link.options,
                "teacher": teacher_label,
                "teacher_fingerprint": teacher_fingerprint,
            }
            if link.final:  # the run's student: always trained
                teaching.train_stage(stage, model, None, weights=weights)
                ctx.record(stage, **record)
                break
            key = link_key(previous, link, data, self.settings(ctx, weights))
            stored = self.train_or_reuse(ctx, teaching, stage, model, weights, key)
            ctx.record(stage, **record, stored=str(stored))
            tokenizer = capabilities(StudentCapabilities, model).tokenizer or ctx.tokenizer
            # its outputs are computed now, before the next link seeds its run: the same whether stored or not
            teaching = ctx.with_teacher(Teacher(model=model, tokenizer=tokenizer, source=str(stored), finetuned=True))
            previous, teacher_label = key, f"{link.name} (link {number})"
            teacher_fingerprint = fingerprint.of_module(model)
        return model

    # -- one link ---------------------------------------------------------------------------
    def build(self, ctx, link: Link) -> nn.Module:
        """A fresh model for ``link``: the run's student, a registered student, or a teacher's model."""
        if link.final:
            return ctx.new_student()
        if ctx.has("student", link.name):
            return ctx.new_student(link.name, **link.options)
        if not ctx.has("teacher", link.name):
            raise UsageError(
                f"recipe 'takd': TA {link.name!r} is neither a registered student nor a teacher; "
                f"see 'kdplug plugins --kind student' and '--kind teacher'"
            )
        set_seed(ctx.settings.seed)
        ta = ctx.new_teacher(link.name, **link.options)
        if ta.tokenizer is not None and ta.tokenizer.get_vocab() != ctx.tokenizer.get_vocab():
            ta.model.tokenizer = ta.tokenizer  # it reads text its own way (see the student hook)
        return ta.model

    def weights(self, teaching, model: nn.Module):
        rkd = teaching.new_projector(model, name=self.link_projector)
        return teaching.weights(rkd, eta=self.eta, lam=0.0, temperature=self.temperature)

    def settings(self, ctx, weights) -> dict:
        config = ctx.settings
        return {
            "weights": weights.as_dict(),
            "epochs": self.ta_epochs or config.epochs,
            "lr": self.ta_lr or config.lr,
            "batch_size": config.batch_size,
            "weight_decay": config.weight_decay,
            "warmup_ratio": config.warmup_ratio,
            "best_checkpoint": config.best_checkpoint,
            "patience": config.patience,
            "min_epochs": config.min_epochs,
            "max_length": ctx.max_length,
            "precision": config.precision,  # the assistant's training
            "teacher_precision": ctx.teacher_precision,  # the outputs it learns from
            "seed": config.seed,
        }

    def train_or_reuse(self, ctx, teaching, stage: str, model: nn.Module, weights, key: str) -> Path:
        """Load the link's stored weights into ``model``, or train it and store them. The processes of
        a launch train the link together: the main one alone holds the lock (another rank waiting on
        it would leave the main one waiting in training's first collective) and decides for all."""
        directory = ctx.store_directory("takd", key)
        launch = PartialState()
        lock = file_lock(directory.parent / f"{key}.lock") if launch.is_main_process else contextlib.nullcontext()
        with lock:
            found = self.stored(ctx, stage, model, directory) if launch.is_main_process else None
            if launch.num_processes > 1:
                found = broadcast_object_list([found])[0]
            if found is not None:
                if not launch.is_main_process:
                    load_model(model, str(found / WEIGHTS))
                return found
            teaching.train_stage(stage, model, None, weights=weights, epochs=self.ta_epochs, lr=self.ta_lr)
            if launch.is_main_process:
                store(model, directory, dict(ctx.stage_record(stage)))
            launch.wait_for_everyone()
        return directory

    @staticmethod
    def stored(ctx, stage: str, model: nn.Module, directory: Path) -> Optional[Path]:
        """The intact stored copy of the link, loaded into ``model`` and recorded; None if there is none."""
        found = complete_copy(directory, lambda path: (path / SUMMARY).is_file())
        problems = verify(found) if found is not None else []
        if problems:  # a damaged store: keep it aside for inspection, train again
            log.warning(
                "stored TA %s is damaged (%s); moved it to %s and training it again",
                found,
                "; ".join(problems),
                move_aside(found),
            )
            return None
        if found is None:
            return None
        try:
            load_model(model, str(found / WEIGHTS))
            summary = json.loads((found / SUMMARY).read_text())
        except Exception as exc:
            log.warning("stored TA %s is unreadable (%s); training it again", found, exc)
            return None
        log.info("%s: reusing the trained TA %s", stage, found)
        ctx.record(stage, **summary, reused=str(found))
        return found


def store(model: nn.Module, directory: Path, summary: dict) -> None:
    """Write the TA's weights and summary atomically, with checksums (a crash never leaves half a link)."""
    with atomic_directory(directory, f"the trained teacher assistant {directory}") as staging:
        save_model(model, str(staging / WEIGHTS))
        (staging / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))


@kdplug.hookimpl
def kdplug_register_recipes(register):
    register(
        "takd",
        TAKD,
        description="TAKD: teacher -> TA(s) -> student, each link RKD from the previous link's "
        "best checkpoint (Mirzadeh et al. 2020)",
    )

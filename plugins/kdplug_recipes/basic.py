"""The basic training schedules: one distillation stage, and Universal-KD's two stages."""

from __future__ import annotations

import logging

import kdplug
from kdplug.types import ProjectorCapabilities, capabilities

log = logging.getLogger("kdplug.recipes.basic")


class Standard:
    """One stage: L = ce·CE + eta·KD + lam·ILD (ce = 1 - eta - lam unless set) for ``epochs`` epochs."""

    #: the recipe of a run whose projector names no default_recipe of its own
    is_default = True

    def run(self, ctx):
        student = ctx.new_student()
        projector = ctx.new_projector(student)
        weights = ctx.weights(projector)
        if weights.ce == 0:
            log.warning(
                "the CE weight is 0 (eta %g, lam %g): this single stage never sees a gold label, so the student "
                "learns only what the teacher's outputs say. Train in two stages (--recipe two-stage: stage 2 is CE "
                "only), or give CE a weight (--set lam=0.2, or --set ce_weight=0.3).",
                weights.eta,
                weights.lam,
            )
        ctx.train_stage("distill", student, projector, weights=weights)
        return student


class TwoStage:
    """Universal-KD's schedule (Wu et al. 2021): stage 1 distils with L = beta·KD + (1 - beta)·L_Univ
    (eta = beta, lam = 1 - beta, and never a CE term), stage 2 fine-tunes the best stage-1 student
    with CE only.

    Options: ``beta`` (stage-1 KD weight; default: the run's eta, else 1 - its lam, else the
    projector's eta), ``stage2_epochs`` (default: the run's epochs), ``stage2_lr``.
    """

    citation = """@inproceedings{wu2021universalkd,
  title = {Universal-{KD}: Attention-based Output-Grounded Intermediate Layer Knowledge Distillation},
  author = {Wu, Yimeng and Rezagholizadeh, Mehdi and Ghaddar, Abbas and Haidar, Md Akmal and Ghodsi, Ali},
  booktitle = {Proceedings of EMNLP 2021},
  year = {2021}
}"""

    def __init__(self, beta: float | None = None, stage2_epochs: int | None = None, stage2_lr: float | None = None):
        self.beta, self.stage2_epochs, self.stage2_lr = beta, stage2_epochs, stage2_lr

    def run(self, ctx):
        student = ctx.new_student()
        projector = ctx.new_projector(student)
        beta = self.stage1_beta(ctx, projector)
        stage1 = ctx.weights(projector, eta=beta, lam=1.0 - beta, ce=0.0)
        ctx.train_stage("stage1", student, projector, weights=stage1)
        ctx.train_stage(
            "stage2",
            student,
            None,
            weights=ctx.weights(None, eta=0.0, lam=0.0),
            epochs=self.stage2_epochs,
            lr=self.stage2_lr,
        )
        return student

    def stage1_beta(self, ctx, projector) -> float:
        """beta: the recipe option, else the run's eta, else 1 - the run's lam, else the projector's eta."""
        if self.beta is not None:
            return float(self.beta)
        config = ctx.settings
        if config.eta is not None:
            if config.lam is not None and abs(config.eta + config.lam - 1.0) > 1e-9:
                log.warning(
                    "two-stage: stage 1 weighs KD by beta = eta = %g and the layer loss by 1 - beta = %g; "
                    "the run's lam %g is not used (stage 1 has no CE term)",
                    config.eta,
                    1 - config.eta,
                    config.lam,
                )
            return float(config.eta)
        if config.lam is not None:
            return 1.0 - float(config.lam)
        return float((capabilities(ProjectorCapabilities, projector).default_weights or {}).get("eta", 0.5))


@kdplug.hookimpl
def kdplug_register_recipes(register):
    register("standard", Standard, description="one distillation stage (CE + KD + ILD)")
    register("two-stage", TwoStage, description="Universal-KD: stage 1 KD + ILD, stage 2 CE only")

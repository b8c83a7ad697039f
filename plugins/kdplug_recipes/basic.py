"""The basic training schedules: one distillation stage, and Universal-KD's two stages."""

from __future__ import annotations

import logging

import kdplug

log = logging.getLogger("kdplug.recipes.basic")


class Standard:
    """One stage: L = ce·CE + eta·KD + lam·ILD (ce = 1 - eta - lam unless set) for ``epochs`` epochs."""

    def run(self, ctx):
        student = ctx.new_student()
        projector = ctx.new_projector(student)
        weights = ctx.weights(projector)
        if weights.ce == 0:
            log.warning(
                "the CE weight is 0 (eta %g, lam %g): this single stage never sees a gold label, so the student "
                "learns only what the teacher's outputs say. Train in two stages (--recipe two-stage: stage 2 is CE "
                "only), or give CE a weight (--set lam=0.2, or --set ce_weight=0.3).", weights.eta, weights.lam)
        ctx.train_stage("distill", student, projector, weights=weights)
        return student


class TwoStage:
    """Universal-KD's schedule: stage 1 distils (KD + the projector's loss, by default without
    CE: eta = beta, lam = 1 - beta), stage 2 fine-tunes the best stage-1 student with CE only.

    Options: ``beta`` (stage-1 KD weight; default: the run's or projector's eta),
    ``stage2_epochs`` (default: the run's epochs), ``stage2_lr``.
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
        if self.beta is not None:
            stage1 = ctx.weights(projector, eta=self.beta, lam=1.0 - self.beta)
        else:
            stage1 = ctx.weights(projector)
        ctx.train_stage("stage1", student, projector, weights=stage1)
        ctx.train_stage("stage2", student, None, weights=ctx.weights(None, eta=0.0, lam=0.0),
                        epochs=self.stage2_epochs, lr=self.stage2_lr)
        return student


@kdplug.hookimpl
def kdplug_register_recipes(register):
    register("standard", Standard, description="one distillation stage (CE + KD + ILD)")
    register("two-stage", TwoStage, description="Universal-KD: stage 1 KD + ILD, stage 2 CE only")

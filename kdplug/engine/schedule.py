"""The run's training schedule where the recipe leaves it open: the defaults a stage falls back on
(learning rate, epochs, temperature) and the early-stopping policy (patience, the first epoch it may
stop at, and the line that announces it). The teacher's fine-tuning and every stage read them here."""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from ..capabilities import StudentCapabilities, capabilities

DEFAULT_LR = 5e-5
DEFAULT_EPOCHS = 3
DEFAULT_TEMPERATURE = 1.0
#: with its default number of epochs a student still takes at least this many optimizer steps:
#: a few hundred labelled examples need many more epochs than GLUE's tens of thousands
MIN_DEFAULT_STEPS = 300
MAX_DEFAULT_EPOCHS = 30
#: early stopping where kdplug chose the epoch count: epochs without a dev improvement
DEFAULT_PATIENCE = 3


def resolve_patience(configured: Optional[int], epochs_chosen_by_kdplug: bool) -> int:
    """The run's ``patience`` if set; else early stopping only where kdplug chose the epoch count
    (a budget the user set is kept whole)."""
    if configured is not None:
        return configured
    return DEFAULT_PATIENCE if epochs_chosen_by_kdplug else 0


def resolve_min_epochs(configured: Optional[int], epochs: int) -> int:
    """The first epoch after which early stopping may end a stage: the run's ``min_epochs`` if set,
    else a quarter of the stage's epochs. A student trained from scratch can predict the majority
    class for its first epochs (PKD's layer term leads a BiLSTM for five or six on the demo), and one
    lucky epoch among them would otherwise start a patience it runs out before it learns."""
    return configured if configured is not None else -(-epochs // 4)


def family_default(declared: Any, fallback: Any) -> Any:
    """A student family's own default (its ``default_lr``, ``default_epochs`` ...), else ``fallback``."""
    return fallback if declared is None else declared


def default_epochs(student: nn.Module, examples: int, batch_size: int) -> int:
    """The family's default epochs, raised to reach its step budget: ``default_steps`` optimizer
    steps (else ``MIN_DEFAULT_STEPS``), in at most ``max_default_epochs`` epochs (else
    ``MAX_DEFAULT_EPOCHS``). The budget is in steps, so a transfer set 20 times the data makes
    each epoch longer, not the run 20 times longer; on a small data set three epochs are a few
    dozen steps, which leaves a freshly initialised student predicting one class. Early stopping
    (``patience``) ends the stage once the dev score stops improving."""
    declared = capabilities(StudentCapabilities, student)
    family = int(family_default(declared.default_epochs, DEFAULT_EPOCHS))
    budget = int(family_default(declared.default_steps, MIN_DEFAULT_STEPS))
    cap = int(family_default(declared.max_default_epochs, MAX_DEFAULT_EPOCHS))
    steps_per_epoch = max(1, -(-examples // batch_size))
    return max(family, min(cap, -(-budget // steps_per_epoch)))


def stopping_rule(patience: int, min_epochs: int, epochs: int) -> str:
    """How a stage stops early, for the line that announces it (empty when it does not)."""
    if not patience:
        return ""
    if min_epochs >= epochs:
        return f", no early stopping (min_epochs {min_epochs} of {epochs} epochs)"
    after = f", not before epoch {min_epochs}" if min_epochs > patience + 1 else ""
    return f", early stopping after {patience} epochs without a dev improvement{after}"

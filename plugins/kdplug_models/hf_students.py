"""The Hugging Face students: BERT-k and DistilRoBERTa built from the teacher's architecture, and any
checkpoint as the student (``--student DIR_OR_HUB_ID``).

BERT-k students follow PKD (Sun et al. 2019, Sec. 4.2): the teacher's block with k layers,
initialised from the embeddings and the first k layers of the *pre-trained* model the teacher was
fine-tuned from ("the first k layers of parameters from pre-trained BERT-Base"). The option
``init=teacher`` copies the fine-tuned teacher's instead (TinyBERT and DistilBERT's habit), and
``init=DIR`` any checkpoint of the same architecture.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from kdplug import hub
from kdplug.errors import UsageError
from kdplug.types import ModelShape, Task, Teacher, num_outputs

from .hf_loading import _load_classifier, checkpoint_shape

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Students
# --------------------------------------------------------------------------------------------


INIT_PRETRAINED, INIT_TEACHER = "pretrained", "teacher"


def _hf_teacher_model(teacher: Teacher, student: str):
    from transformers import PreTrainedModel

    if not isinstance(teacher.model, PreTrainedModel):
        raise UsageError(
            f"student {student!r} copies a Hugging Face teacher's layers, but the teacher is a "
            f"{type(teacher.model).__name__}; use a Hugging Face teacher or another student"
        )
    return teacher.model


def _initial_weights(teacher: Teacher, task: Task, *, student: str, init: str, source: Optional[str]):
    """The model whose embeddings and first layers a truncated student copies, and where it came from."""
    model = _hf_teacher_model(teacher, student)
    if init == INIT_TEACHER:
        return model, {"init": INIT_TEACHER, "from": teacher.source}
    if init == INIT_PRETRAINED:
        checkpoint = source or teacher.pretrained
        if checkpoint is None:
            note = (
                f"the teacher {hub.display_name(teacher.source)} came fine-tuned and names no pre-trained checkpoint, "
                f"so {student} starts from the fine-tuned teacher's own layers, not from pre-trained ones as in "
                f"PKD (Sun et al. 2019, Sec. 4.2); name the pre-trained model with --set "
                f"student_options.source=DIR_OR_HUB_ID (e.g. bert-base-uncased) to follow the paper"
            )
            logger.warning("%s", note)
            return model, {"init": INIT_TEACHER, "from": teacher.source, "note": note}
    else:
        checkpoint = init
    checkpoint = os.path.expanduser(str(checkpoint))
    initial = _load_classifier(checkpoint, task, what="student").model
    for attribute in ("model_type", "hidden_size", "num_attention_heads", "intermediate_size"):
        mine, theirs = getattr(model.config, attribute, None), getattr(initial.config, attribute, None)
        if mine != theirs:
            raise UsageError(
                f"student {student!r}: the checkpoint {checkpoint} has {attribute}={theirs!r} but the "
                f"teacher has {mine!r}; initialise from a checkpoint of the teacher's architecture"
            )
    return initial, {"init": INIT_PRETRAINED if init == INIT_PRETRAINED else "checkpoint", "from": checkpoint}


def truncated_copy(
    teacher: Teacher,
    task: Task,
    layers: int,
    *,
    student: str,
    init: str = INIT_PRETRAINED,
    source: Optional[str] = None,
    copy_classifier: bool = False,
    **config_overrides: Any,
):
    """The teacher's architecture with ``layers`` layers, holding the embeddings and first ``layers``
    layers (and pooler) of the model named by ``init`` (see the module docstring); the classifier
    is new unless ``copy_classifier`` (which copies the fine-tuned teacher's)."""
    from transformers import AutoModelForSequenceClassification

    teacher_model = _hf_teacher_model(teacher, student)
    check_layer_count(layers, teacher_model.config.num_hidden_layers, student, f"the teacher ({teacher.source})")
    check_truncated_options(teacher_model.config, student, config_overrides)
    config = teacher_model.config.__class__.from_dict(teacher_model.config.to_dict())
    config.update(config_overrides)
    config.num_hidden_layers = layers
    config.num_labels = num_outputs(task)
    config.output_hidden_states = True
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    model = AutoModelForSequenceClassification.from_config(config)

    initial, provenance = _initial_weights(teacher, task, student=student, init=init, source=source)
    prefix = teacher_model.base_model_prefix + "."
    copied = {}
    for state, wanted in (
        (initial.state_dict(), lambda name: name.startswith(prefix)),
        (teacher_model.state_dict(), lambda name: copy_classifier and not name.startswith(prefix)),
    ):
        for name, tensor in model.state_dict().items():
            if wanted(name) and name in state and state[name].shape == tensor.shape:
                copied[name] = state[name]
    # Layer i of the student has the same parameter names as layer i of the source, so the names
    # present in the student are exactly the embeddings, layers 0..k-1 (and the pooler).
    model.load_state_dict(copied, strict=False)
    missing = [name for name in model.state_dict() if name.startswith(prefix) and name not in copied]
    if missing:
        raise UsageError(
            f"student {student!r} could not copy {len(missing)} tensor(s) from {provenance['from']}, e.g. {missing[0]}"
        )
    model.kdplug_init = {**provenance, "layers": list(range(1, layers + 1))}
    return model


def check_layer_count(layers: int, total: int, student: str, teacher: str = "the teacher") -> None:
    if not 1 <= layers <= total:
        raise UsageError(
            f"student {student!r} takes the teacher's first {layers} layers, but {teacher} has {total}; "
            f"ask for 1 to {total} layers"
        )


def truncated_shape(teacher: ModelShape, layers: int, student: str, overrides: dict[str, Any]) -> Optional[ModelShape]:
    """What ``truncated_copy`` will build, from the teacher's shape: its block with ``layers`` layers."""
    check_layer_count(layers, len(teacher.layers), student)
    width = overrides.get("hidden_size", teacher.width)
    heads = overrides.get("num_attention_heads", teacher.tokens.heads if teacher.tokens else None)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (width, heads or 1)):
        return None  # the copy refuses these itself
    return ModelShape.transformer(layers, width, heads)


TRUNCATED_OPTIONS = ("init", "source", "copy_classifier")


def check_truncated_options(config: Any, student: str, options: dict[str, Any]) -> None:
    unknown = sorted(key for key in options if not hasattr(config, key))
    if unknown:
        raise UsageError(
            f"unknown student option(s) {', '.join(unknown)} for {student!r}: options are "
            f"{', '.join(TRUNCATED_OPTIONS)} or attributes of the teacher's {type(config).__name__}"
        )


def _check_init(init: Any, student: str) -> None:
    if not isinstance(init, str) or not init:
        raise UsageError(
            f"student {student!r}: init must be {INIT_PRETRAINED!r}, {INIT_TEACHER!r} or a checkpoint "
            f"directory, got {init!r}"
        )


def bert_k_student(
    task: Task,
    teacher: Teacher,
    layers: int,
    *,
    init: str = INIT_PRETRAINED,
    source: Optional[str] = None,
    copy_classifier: bool = False,
    **config_overrides: Any,
):
    """BERT-k (PKD): the teacher's block with ``layers`` layers, from the pre-trained model's first ones.

    ``init``: ``pretrained`` (the checkpoint the teacher was fine-tuned from; ``source`` names it
    when the teacher came already fine-tuned), ``teacher`` (the fine-tuned teacher's layers) or a
    checkpoint directory.
    """
    _check_init(init, f"bert-{layers}")
    return truncated_copy(
        teacher,
        task,
        layers,
        student=f"bert-{layers}",
        init=init,
        source=source,
        copy_classifier=copy_classifier,
        **config_overrides,
    )


def check_bert_k_options(
    task: Task,
    teacher: Teacher,
    layers: int,
    *,
    init: str = INIT_PRETRAINED,
    source: Optional[str] = None,
    copy_classifier: bool = False,
    **config_overrides: Any,
) -> None:
    """What ``bert_k_student`` would reject in its options, checked before any work."""
    _check_init(init, f"bert-{layers}")
    check_truncated_options(_hf_teacher_model(teacher, f"bert-{layers}").config, f"bert-{layers}", config_overrides)


def bert_k_shape(task: Task, teacher: ModelShape, layers: int, **options: Any) -> Optional[ModelShape]:
    """BERT-k's shape (see the student hook): a count of layers the teacher lacks fails here."""
    overrides = {key: value for key, value in options.items() if key not in TRUNCATED_OPTIONS}
    return truncated_shape(teacher, layers, f"bert-{layers}", overrides)


bert_k_student.check_options = check_bert_k_options
bert_k_student.shape = bert_k_shape


def distilroberta_student(
    task: Task,
    teacher: Teacher,
    *,
    source: str = "distilroberta-base",
    from_teacher: bool = False,
    init: str = INIT_PRETRAINED,
    layers: int = 6,
    trust_remote_code: bool = False,
    **config_overrides: Any,
):
    """DistilRoBERTa: a pretrained checkpoint (``source``), or with ``from_teacher`` the RoBERTa
    teacher's architecture with ``layers`` (6) layers, initialised as ``init`` says (see bert-k)."""
    if from_teacher:
        model_type = _hf_teacher_model(teacher, "distilroberta").config.model_type
        if "roberta" not in model_type:
            raise UsageError(
                f"student 'distilroberta' with from_teacher=True copies a RoBERTa teacher, but the "
                f"teacher is a {model_type} model; use bert-{layers} for it"
            )
        _check_init(init, "distilroberta")
        return truncated_copy(teacher, task, layers, student="distilroberta", init=init, **config_overrides)
    return hf_student(task, teacher, source=source, trust_remote_code=trust_remote_code, **config_overrides)


def hf_student(
    task: Task,
    teacher: Teacher,
    source: Optional[str] = None,
    *,
    label_map: Optional[dict] = None,
    trust_remote_code: bool = False,
    revision: Optional[str] = None,
    **config_overrides: Any,
):
    """Any Hugging Face encoder checkpoint as the student (``source``: a hub id or a directory).

    A pre-trained encoder gets a new head; a checkpoint already fine-tuned with the task's number
    of labels keeps its head, its outputs put in the task's label order by name as for teachers
    (``label_map`` says it explicitly). A student whose vocabulary differs from the teacher's
    reads the text with its own tokenizer.
    """
    if not source:
        raise UsageError(
            "student 'hf' needs the option source: a hub id or a directory "
            "(--student /path/to/dir, --student distilbert-base-uncased, or --set student_options.source=ID)"
        )
    source = os.path.expanduser(str(source))
    loaded = _load_classifier(
        source,
        task,
        what="student",
        label_map=label_map,
        trust_remote_code=trust_remote_code,
        revision=revision,
        **config_overrides,
    )
    model = loaded.model
    if teacher.tokenizer is None or teacher.tokenizer.get_vocab() != loaded.tokenizer.get_vocab():
        model.tokenizer = loaded.tokenizer  # it reads text its own way (see the student hook)
    # weights fine-tuned for a classification task are not "pre-trained" ones: say which
    model.kdplug_init = {"init": "finetuned-checkpoint" if loaded.is_classifier else INIT_PRETRAINED, "from": source}
    if loaded.labels is not None:
        model.kdplug_init["labels"] = loaded.labels.as_dict()
    return model


hf_student.loads_checkpoints = True


def hf_student_shape(
    task: Task,
    teacher: ModelShape,
    source: Optional[str] = None,
    *,
    label_map: Optional[dict] = None,
    trust_remote_code: bool = False,
    revision: Optional[str] = None,
    **config_overrides: Any,
) -> Optional[ModelShape]:
    """What ``hf_student`` will load, from the checkpoint's config (see the student hook)."""
    if not source:
        return None
    return checkpoint_shape(source, "student", config_overrides, trust_remote_code=trust_remote_code, revision=revision)


def distilroberta_shape(
    task: Task,
    teacher: ModelShape,
    *,
    source: str = "distilroberta-base",
    from_teacher: bool = False,
    init: str = INIT_PRETRAINED,
    layers: int = 6,
    trust_remote_code: bool = False,
    **config_overrides: Any,
) -> Optional[ModelShape]:
    if from_teacher:
        return truncated_shape(teacher, layers, "distilroberta", config_overrides)
    return hf_student_shape(task, teacher, source, trust_remote_code=trust_remote_code, **config_overrides)


hf_student.shape = hf_student_shape
distilroberta_student.shape = distilroberta_shape

"""The Hugging Face students: BERT-k and DistilRoBERTa built from the teacher's architecture, and any
checkpoint as the student (``--student DIR_OR_HUB_ID``).

BERT-k students follow PKD (Sun et al. 2019, Sec. 4.2): the teacher's block with k layers,
initialised from the embeddings and the first k layers of the *pre-trained* model the teacher was
fine-tuned from ("the first k layers of parameters from pre-trained BERT-Base"). The option
``init=teacher`` copies the fine-tuned teacher's instead (TinyBERT and DistilBERT's habit), and
``init=DIR`` any checkpoint of the same architecture.

A decoder teacher (Llama, Qwen2, GPT-2...) has no encoder layers to cut: its blocks attend
causally, and its vocabulary and widths are an LLM's. Its BERT-k student is the pre-trained
encoder ``source`` names instead, with that encoder's first k layers and its own tokenizer;
without ``source`` the student is refused before the teacher is fine-tuned or cached.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from kdplug import fingerprint, hub
from kdplug.errors import UsageError
from kdplug.types import ModelShape, Task, Teacher, num_outputs

from .decoders import is_decoder_only
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
    teacher_model = _hf_teacher_model(teacher, student)
    if is_decoder_only(teacher_model.config):
        checkpoint = encoder_source(teacher, student, init=init, source=source, copy_classifier=copy_classifier)
        return encoder_of_decoder_teacher(checkpoint, task, layers, student=student, **config_overrides)
    check_layer_count(layers, teacher_model.config.num_hidden_layers, student, f"the teacher ({teacher.source})")
    check_truncated_options(teacher_model.config, student, config_overrides)
    initial, provenance = _initial_weights(teacher, task, student=student, init=init, source=source)
    model = _cut(teacher_model.config, initial, task, layers, student, provenance["from"], config_overrides)
    if copy_classifier:
        _copy_head(model, teacher_model)
    model.kdplug_init = {**provenance, "layers": list(range(1, layers + 1))}
    return model


def _cut(config: Any, initial: Any, task: Task, layers: int, student: str, origin: str, overrides: dict[str, Any]):
    """A new classifier of ``config``'s architecture with ``layers`` layers (and ``overrides``),
    holding the embeddings, first ``layers`` layers and pooler of ``initial``; a new head."""
    from transformers import AutoModelForSequenceClassification

    config = config.__class__.from_dict(config.to_dict())
    config.update(overrides)
    config.num_hidden_layers = layers
    config.num_labels = num_outputs(task)
    config.output_hidden_states = True
    config.problem_type = "regression" if task.is_regression else "single_label_classification"
    model = AutoModelForSequenceClassification.from_config(config)
    prefix = initial.base_model_prefix + "."
    state = initial.state_dict()
    # Layer i of the student has the same parameter names as layer i of the source, so the names
    # present in the student are exactly the embeddings, layers 0..k-1 (and the pooler).
    copied = {
        name: _read(initial, name, state[name])
        for name, tensor in model.state_dict().items()
        if name.startswith(prefix) and name in state and state[name].shape == tensor.shape
    }
    model.load_state_dict(copied, strict=False)
    missing = [name for name in model.state_dict() if name.startswith(prefix) and name not in copied]
    if missing:
        raise UsageError(
            f"student {student!r} could not copy {len(missing)} tensor(s) from {origin}, e.g. {missing[0]}"
        )
    return model


def _copy_head(model: Any, teacher_model: Any) -> None:
    """The fine-tuned teacher's classification head, copied into ``model`` where the shapes agree."""
    prefix = teacher_model.base_model_prefix + "."
    state = teacher_model.state_dict()
    head = {
        name: _read(teacher_model, name, state[name])
        for name, tensor in model.state_dict().items()
        if not name.startswith(prefix) and name in state and state[name].shape == tensor.shape
    }
    model.load_state_dict(head, strict=False)


def _read(model: Any, name: str, tensor: Any) -> Any:
    """``model``'s tensor ``name``, read from where Accelerate offloaded it (a sharded teacher's)."""
    return fingerprint.offloaded_tensor(model, name) if tensor.is_meta else tensor


# --------------------------------------------------------------------------------------------
# Students of a decoder teacher: a named pre-trained encoder, since a decoder's layers cannot be cut
# --------------------------------------------------------------------------------------------


def encoder_source(teacher: Teacher, student: str, *, init: str, source: Optional[str], copy_classifier: bool) -> str:
    """The encoder checkpoint a student of the decoder ``teacher`` starts from (``source``, or
    ``init=DIR``), or a usage error that says why there is none and what to pass."""
    kind = f"a decoder ({teacher.model.config.model_type})"
    why = (
        f"student {student!r} is cut from its teacher's layers, but the teacher {hub.display_name(teacher.source)} "
        f"is {kind}, and a decoder's layers cannot initialise an encoder (they attend causally, to the left only, "
        f"and read the decoder's own vocabulary)"
    )
    if init == INIT_TEACHER:
        raise UsageError(f"{why}; drop init=teacher and name the pre-trained encoder to start from: {SOURCE_HINT}")
    if copy_classifier:
        raise UsageError(f"{why}, nor does its classifier fit one; drop copy_classifier")
    named = [checkpoint for checkpoint in (source, None if init == INIT_PRETRAINED else init) if checkpoint]
    if not named:
        raise UsageError(f"{why}. Name the pre-trained encoder it starts from: {SOURCE_HINT}")
    if len(named) == 2 and named[0] != named[1]:
        raise UsageError(f"student {student!r}: source={named[0]} and init={named[1]} both name its start; keep one")
    return os.path.expanduser(str(named[0]))


#: how to pass the encoder a student of a decoder teacher starts from as a local directory
LOCAL_SOURCE = "--set student_options.source=DIR"
#: how to name the encoder a student of a decoder teacher starts from
SOURCE_HINT = (
    "--set student_options.source=DIR_OR_HUB_ID (a local directory or a hub id such as bert-base-uncased; "
    "the student takes its first layers and its own tokenizer), or --student hf --set student_options.source=... "
    "for the whole encoder"
)


def encoder_of_decoder_teacher(checkpoint: str, task: Task, layers: int, *, student: str, **config_overrides: Any):
    """The pre-trained encoder ``checkpoint`` cut to its first ``layers`` layers (with its
    embeddings and pooler; a new head), reading text with its own tokenizer."""
    loaded = _load_classifier(checkpoint, task, what="student")
    encoder = loaded.model
    check_encoder_config(encoder.config, checkpoint, layers, student, config_overrides)
    model = _cut(encoder.config, encoder, task, layers, student, checkpoint, config_overrides)
    model.tokenizer = loaded.tokenizer  # never the decoder's: the student reads text its own way
    model.kdplug_init = {
        "init": INIT_PRETRAINED,
        "from": checkpoint,
        "layers": list(range(1, layers + 1)),
        "note": "the teacher is a decoder: the student is this encoder's first layers, with its own tokenizer",
    }
    return model


def check_encoder_config(config: Any, checkpoint: str, layers: int, student: str, overrides: dict[str, Any]) -> None:
    """``checkpoint``'s config is an encoder's with at least ``layers`` layers and the attributes
    ``overrides`` set."""
    if is_decoder_only(config) or getattr(config, "is_encoder_decoder", False):
        raise UsageError(
            f"student {student!r}: source {checkpoint} is a {config.model_type} model, not an encoder; name a "
            f"pre-trained encoder (BERT, RoBERTa, MiniLM, DeBERTa ...)"
        )
    check_layer_count(layers, config.num_hidden_layers, student, f"the encoder {checkpoint}")
    check_truncated_options(config, student, overrides)


def check_layer_count(layers: int, total: int, student: str, cut_from: str = "the teacher") -> None:
    """``layers`` is 1 to the ``total`` layers of the model the student is ``cut_from`` (the teacher,
    or the encoder a decoder teacher's student starts from)."""
    if not 1 <= layers <= total:
        taken = (
            f"the teacher's first {layers} layers, but {cut_from} has {total}"
            if cut_from.startswith("the teacher")
            else f"the first {layers} layers of {cut_from}, which has {total}"
        )
        raise UsageError(f"student {student!r} takes {taken}; ask for 1 to {total} layers")


def truncated_shape(
    teacher: ModelShape, layers: int, student: str, overrides: dict[str, Any], cut_from: str = "the teacher"
) -> Optional[ModelShape]:
    """What ``truncated_copy`` will build, from the shape of the model it is ``cut_from`` (the
    teacher's, or a decoder teacher's encoder ``source``): its block with ``layers`` layers."""
    check_layer_count(layers, len(teacher.layers), student, cut_from)
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
    """What ``bert_k_student`` would reject in its options, checked before any work: with a decoder
    teacher, a missing ``source`` and an encoder that does not fit (read from its config alone)."""
    student = f"bert-{layers}"
    _check_init(init, student)
    config = _hf_teacher_model(teacher, student).config
    if is_decoder_only(config):
        checkpoint = encoder_source(teacher, student, init=init, source=source, copy_classifier=copy_classifier)
        from transformers import AutoConfig

        config = hub.load_pretrained(AutoConfig, checkpoint, "student", local_option=LOCAL_SOURCE)
        check_encoder_config(config, checkpoint, layers, student, config_overrides)
        return
    check_truncated_options(config, student, config_overrides)


def bert_k_shape(task: Task, teacher: ModelShape, layers: int, **options: Any) -> Optional[ModelShape]:
    """BERT-k's shape (see the student hook): a count of layers the teacher lacks fails here. A
    teacher whose shape has no token signals may be a decoder, whose BERT-k is the encoder its
    ``source`` names: that encoder's shape, or None (unknown) without one."""
    overrides = {key: value for key, value in options.items() if key not in TRUNCATED_OPTIONS}
    if teacher.tokens is None:
        source = options.get("source") if options.get("init", INIT_PRETRAINED) == INIT_PRETRAINED else None
        encoder = checkpoint_shape(source, "student", overrides) if source else None
        if encoder is None or encoder.tokens is None:
            return None
        return truncated_shape(encoder, layers, f"bert-{layers}", overrides, f"the encoder {source}")
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
        _check_roberta_teacher(teacher, layers)
        _check_init(init, "distilroberta")
        return truncated_copy(teacher, task, layers, student="distilroberta", init=init, **config_overrides)
    return hf_student(task, teacher, source=source, trust_remote_code=trust_remote_code, **config_overrides)


def _check_roberta_teacher(teacher: Teacher, layers: int) -> None:
    config = _hf_teacher_model(teacher, "distilroberta").config
    if "roberta" not in config.model_type:
        use = (
            "drop from_teacher: the student is then the pre-trained encoder student_options.source names "
            "(distilroberta-base by default), with its own tokenizer, since a decoder's layers cannot "
            "initialise an encoder"
            if is_decoder_only(config)
            else f"use bert-{layers} for it"
        )
        raise UsageError(
            f"student 'distilroberta' with from_teacher=True copies a RoBERTa teacher, but the "
            f"teacher is a {config.model_type} model; {use}"
        )


def check_distilroberta_options(
    task: Task, teacher: Teacher, *, from_teacher: bool = False, layers: int = 6, **_: Any
) -> None:
    """What ``distilroberta_student`` would reject, checked once the teacher is loaded: copying a
    teacher that is no RoBERTa (a decoder's layers least of all)."""
    if from_teacher:
        _check_roberta_teacher(teacher, layers)


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
        if teacher.tokens is None:  # no encoder (a decoder): check_options refuses copying it, with why
            return None
        return truncated_shape(teacher, layers, "distilroberta", config_overrides)
    return hf_student_shape(task, teacher, source, trust_remote_code=trust_remote_code, **config_overrides)


hf_student.shape = hf_student_shape
distilroberta_student.shape = distilroberta_shape
distilroberta_student.check_options = check_distilroberta_options

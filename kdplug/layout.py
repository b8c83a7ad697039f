"""The names of what a run directory holds: one home for them, read by the engine that writes
them and by every command that reads runs (report, sweep, seeds, predict).

A run directory (``kdplug run --output DIR``)::

    kdplug_run.json            the marker: status (running, completed, failed, interrupted)
    kdplug_run.lock            held by the process writing the run, for the run's whole life
    config.yaml                the resolved configuration
    metrics.json               every stage, every epoch, the teacher's check, the student's scores
    log.txt                    the run's log
    predictions.json           the student's dev predictions and the gold labels
    baseline_predictions.json  the --baseline student's
    student/                   the student package (weights, config, tokenizer, model card, and
                               kdplug_student.json: labels, input columns, maximum length)
    checkpoints/               while the run goes on (and with keep_checkpoints)
    attention.json, attention.png, layers_dev.safetensors   what the last distillation compared
    tracking/                  --report-to's stores

Groups of runs: ``seeds.json`` beside ``seed-<s>/`` run directories (``kdplug run --seeds``);
``sweep.yaml`` beside ``points/<id>/`` (``kdplug sweep``).
"""

MARKER_FILE = "kdplug_run.json"
LOCK_FILE = "kdplug_run.lock"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
LOG_FILE = "log.txt"
PREDICTIONS_FILE = "predictions.json"
BASELINE_PREDICTIONS_FILE = "baseline_predictions.json"
STUDENT_DIR = "student"
#: in a student package (``student/``, or what ``kdplug export`` writes): what kdplug needs to read inputs
INFO_FILE = "kdplug_student.json"
CHECKPOINT_DIR = "checkpoints"
ATTENTION_FILE = "attention.json"
ATTENTION_PLOT = "attention.png"
LAYERS_FILE = "layers_dev.safetensors"
TRACKING_DIR = "tracking"

#: everything a run writes at the top of its directory; nothing else is ever removed from it
RUN_ENTRIES = (
    MARKER_FILE,
    LOCK_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    LOG_FILE,
    PREDICTIONS_FILE,
    BASELINE_PREDICTIONS_FILE,
    STUDENT_DIR,
    CHECKPOINT_DIR,
    ATTENTION_FILE,
    ATTENTION_PLOT,
    LAYERS_FILE,
    TRACKING_DIR,
)

#: those of :data:`RUN_ENTRIES` that are folders (the others are files)
RUN_FOLDERS = (STUDENT_DIR, CHECKPOINT_DIR, TRACKING_DIR)

# A student package (``student/``, or what ``kdplug export`` writes): transformers' files, and kdplug's
#: the model's config (transformers' name)
MODEL_CONFIG_FILE = "config.json"
#: the tokenizer's config, and the fast tokenizer's one file (transformers' names)
TOKENIZER_CONFIG_FILE, TOKENIZER_FILE = "tokenizer_config.json", "tokenizer.json"
#: the stems of the files a tokenizer is saved in (transformers' and tokenizers' names)
TOKENIZER_FILES = ("tokenizer", "vocab", "merges", "spiece", "special_tokens_map", "added_tokens", "sentencepiece")
#: the model card: what a package may change without changing a prediction
CARD_FILE = "README.md"
#: the ONNX export's graph (``kdplug export --format onnx``)
ONNX_FILE = "model.onnx"
#: every file's SHA-256, written last by ``kdplug.storage.atomic_directory`` (in any directory it writes)
CHECKSUMS_FILE = "kdplug_checksums.json"

SEEDS_FILE = "seeds.json"
SEED_DIR_PREFIX = "seed-"
SWEEP_FILE = "sweep.yaml"
POINTS_DIR = "points"

"""Write the zoo entries from the papers' tables, transcribed once, here.

The YAML files are the reviewed artefact (``kdplug zoo show`` prints them, users copy them);
this script is how they were made, so that a fix to a transcribed number is one edit and a
re-run: ``python zoo/generate.py``. ``tests/zoo`` checks the files are what it writes.

Every number below is copied from the papers' tables (Sun et al. 2019, "Patient Knowledge
Distillation for BERT Model Compression", EMNLP-IJCNLP 2019; Passban et al. 2021, "ALP-KD:
Attention-Based Layer Projection for Knowledge Distillation", AAAI 2021; Wu et al. 2021,
"Universal-KD: Attention-based Output-Grounded Intermediate Layer Knowledge Distillation", EMNLP
2021): reported scores as printed (in %), hyper-parameters from the appendix tables. Where a paper gives no value, the
entry leaves the key unset (the engine's default applies) and says so in ``notes``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from kdplug.config import FIELDS

ZOO = Path(__file__).resolve().parent
TASKS = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb")
COLUMN = {
    "cola": "CoLA",
    "mnli": "MNLI",
    "mrpc": "MRPC",
    "qnli": "QNLI",
    "qqp": "QQP",
    "rte": "RTE",
    "sst2": "SST-2",
    "stsb": "STS-B",
}
SPLIT = {"mnli": "dev_matched"}  # ALP-KD and Universal-KD report MNLI matched
METRIC = {"cola": "matthews", "stsb": "pearson"}  # accuracy for the rest


def per_task(values: str) -> dict[str, float]:
    """One table row, columns in TASKS order: ``"2e-5 5e-5 ..."``."""
    numbers = [float(v) for v in values.split()]
    assert len(numbers) == len(TASKS), values
    return dict(zip(TASKS, numbers))


def dev_score(task: str, value: float) -> dict:
    return {SPLIT.get(task, "dev"): {METRIC.get(task, "accuracy"): value}}


class Settings:
    """An entry's configuration, every value with where it comes from.

    Sources start with ``paper:`` (the paper says so, and where), ``assumed:`` (the paper implies it,
    and why we read it so) or ``kdplug:`` (the paper gives no value; kdplug chose one and says why).
    Keys the entry leaves unset run at kdplug's defaults, which ``kdplug zoo show`` marks as such.
    """

    def __init__(self) -> None:
        self.config: dict = {}
        self.sources: dict[str, str] = {}

    def set(self, source: str, **values) -> Settings:
        """``set("paper: Table 5", lr=2e-5)``; option keys as ``recipe_options__beta=0.5``."""
        assert source.startswith(("paper:", "assumed:", "kdplug:")), source
        for key, value in values.items():
            key = key.replace("__", ".")
            head, _, rest = key.partition(".")
            if rest:
                self.config.setdefault(head, {})[rest] = value
            else:
                self.config[key] = value
            self.sources[key] = source
        return self

    def copy(self) -> Settings:
        other = Settings()
        other.config = {k: dict(v) if isinstance(v, dict) else v for k, v in self.config.items()}
        other.sources = dict(self.sources)
        return other


# ---------------------------------------------------------------------------------------------
# ALP-KD (Passban et al., AAAI 2021): Tables 1-4, hyper-parameters in Tables 5-10
# ---------------------------------------------------------------------------------------------

ALP_EPOCHS = {"stsb": 10, "sst2": 10, "qnli": 10, "mnli": 5, "qqp": 5, "mrpc": 20, "rte": 20, "cola": 50}
ALP_TEACHER_LR = per_task("2e-5 5e-5 2e-5 2e-5 2e-5 2e-5 2e-5 2e-5")  # Table 5
ALP_HP = {  # Tables 6-10: lr, T, eta, lambda per task
    "nkd": {"lr": per_task("2e-5 5e-5 2e-5 2e-5 5e-5 2e-5 5e-5 5e-5")},
    "rkd": {
        "lr": per_task("2e-5 5e-5 2e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
        "temperature": per_task("10 20 10 20 20 5 10 5"),
        "eta": per_task("0.5 0.7 0.5 0.7 0.7 0.7 0.7 0.2"),
        "lam": per_task("0 0 0 0 0 0 0 0"),
    },
    "pkd": {
        "lr": per_task("2e-5 5e-5 5e-5 5e-5 5e-5 2e-5 5e-5 5e-5"),
        "temperature": per_task("5 20 5 20 20 5 5 5"),
        "eta": per_task("0.5 0.2 0.2 0.2 0.5 0.2 0.2 0.2"),
        "lam": per_task("0.2 0.7 0.7 0.7 0.2 0.7 0.7 0.2"),
    },
    "ckd": {
        "lr": per_task("5e-5 5e-5 2e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
        "temperature": per_task("20 10 10 20 5 10 20 20"),
        "eta": per_task("0.2 0.5 0.7 0.7 0.2 0.2 0.5 0.2"),
        "lam": per_task("0.2 0.2 0.2 0.2 0.2 0.2 0.2 0.2"),
    },
    "alp": {
        "lr": per_task("5e-5 5e-5 5e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
        "temperature": per_task("5 20 10 20 20 10 20 5"),
        "eta": per_task("0.2 0.7 0.7 0.7 0.7 0.2 0.2 0.2"),
        "lam": per_task("0.5 0.2 0.2 0.2 0.2 0.2 0.7 0.5"),
    },
}
ALP_HP_TABLE = {"nkd": 6, "rkd": 7, "pkd": 8, "ckd": 9, "alp": 10}
ALP_COMMON_NOTES = [
    "Tables 5-10 give one value per task for 'all experiments'; the 6- and 2-layer tables reuse them.",
    "Optimizer, weight decay and warm-up are not given: kdplug's defaults (AdamW, weight decay 0.01, 10% "
    "linear warm-up, as BERT's fine-tuning code) apply. The best dev epoch is reported, as the papers do.",
]
PAIR_TASKS = ("mnli", "mrpc", "qnli", "qqp", "rte", "stsb")

# (row label, slug, projector, hyper-parameter family, extra projector options, reported per task)
ALP_TABLES = {
    1: (
        "bert-4",
        "BERT-base -> 4-layer students",
        [
            ("T_BERT", "teacher", None, None, {}, "57.31 83.39 86.76 91.25 90.96 68.23 92.67 88.82"),
            ("S_NKD", "nkd", "nkd", "nkd", {}, "31.05 76.83 77.70 85.13 88.97 61.73 88.19 87.29"),
            ("S_RKD", "rkd", "rkd", "rkd", {}, "29.22 79.31 79.41 86.77 90.25 65.34 90.37 87.45"),
            (
                "S_PKD",
                "pkd",
                "pkd-skip",
                "pkd",
                {"layer_map": [1, 5, 9]},
                "32.13 79.26 80.15 86.64 90.23 65.70 90.14 87.26",
            ),
            ("S_CKD-NO", "ckd-no", "ckd-no", "ckd", {}, "31.23 79.42 80.64 86.93 88.70 66.06 90.37 87.62"),
            ("S_CKD-PO", "ckd-po", "ckd-po", "ckd", {}, "31.95 79.53 80.39 86.75 89.89 67.51 90.25 87.55"),
            ("S_ALP-NO", "alp-no", "alp-no", "alp", {}, "34.21 79.26 79.66 87.11 90.72 65.70 90.37 87.52"),
            ("S_ALP-PO", "alp-po", "alp-po", "alp", {}, "33.86 79.74 79.90 86.95 90.25 66.43 90.48 87.52"),
            ("S_ALP", "alp", "alp", "alp", {}, "33.07 79.62 80.72 87.02 90.54 67.15 90.37 87.62"),
        ],
    ),
    2: (
        "bert-6",
        "BERT-base -> 6-layer students",
        [
            ("T_BERT", "teacher", None, None, {}, "57.31 83.39 86.76 91.25 90.96 68.23 92.67 88.82"),
            ("S_NKD", "nkd", "nkd", "nkd", {}, "40.33 79.91 81.86 87.57 90.21 65.34 90.02 88.49"),
            ("S_RKD", "rkd", "rkd", "rkd", {}, "45.51 81.41 83.82 88.21 90.56 67.51 91.51 88.70"),
            ("S_PKD", "pkd", "pkd-skip", "pkd", {}, "45.78 82.18 85.05 89.31 90.73 68.23 91.51 88.56"),
            ("S_CKD-NO", "ckd-no", "ckd-no", "ckd", {}, "48.49 81.91 83.82 89.53 90.64 67.51 91.40 88.73"),
            ("S_CKD-PO", "ckd-po", "ckd-po", "ckd", {}, "46.99 81.99 83.82 89.44 90.82 67.51 91.17 88.62"),
            ("S_ALP-NO", "alp-no", "alp-no", "alp", {}, "46.40 81.99 85.78 89.71 90.64 68.95 91.86 88.81"),
            ("S_ALP-PO", "alp-po", "alp-po", "alp", {}, "46.02 82.04 84.07 89.16 90.56 68.23 91.74 88.72"),
            ("S_ALP", "alp", "alp", "alp", {}, "46.81 81.86 85.05 89.67 90.73 68.59 91.86 88.68"),
        ],
    ),
    3: (
        "bert-2",
        "BERT-base -> 2-layer students",
        [
            ("T_BERT", "teacher", None, None, {}, "57.31 83.39 86.76 91.25 90.96 68.23 92.67 88.82"),
            ("S_NKD", "nkd", "nkd", "nkd", {}, "14.50 72.73 72.06 79.61 86.89 57.04 85.89 40.80"),
            ("S_RKD", "rkd", "rkd", "rkd", {}, "24.50 74.90 73.53 81.04 87.40 59.21 87.39 41.87"),
            (
                "S_PKD-1",
                "pkd-1",
                "pkd-skip",
                "pkd",
                {"layer_map": [1]},
                "23.09 74.65 72.55 81.27 87.68 57.40 88.76 43.37",
            ),
            (
                "S_PKD-6",
                "pkd-6",
                "pkd-skip",
                "pkd",
                {"layer_map": [6]},
                "22.48 74.57 73.04 80.74 87.70 57.40 88.65 42.92",
            ),
            (
                "S_PKD-12",
                "pkd-12",
                "pkd-skip",
                "pkd",
                {"layer_map": [12]},
                "22.46 74.33 72.79 81.22 87.88 57.40 88.76 45.39",
            ),
            ("S_CKD", "ckd", "ckd-no", "ckd", {}, "24.69 74.67 73.04 81.60 87.10 58.84 88.65 43.71"),
            ("S_ALP", "alp", "alp", "alp", {}, "24.61 74.78 73.53 81.24 88.01 59.57 88.88 46.04"),
        ],
    ),
    4: (
        "bert-4",
        "ALP-KD with key-query-value attention, BERT-base -> 4 layers",
        [
            (
                "S_ALP-NO-1",
                "alp-no-1",
                "alp-kqv1",
                "alp",
                {"buckets": "no"},
                "32.84 78.94 79.03 86.31 90.31 65.06 88.53 87.26",
            ),
            (
                "S_ALP-PO-1",
                "alp-po-1",
                "alp-kqv1",
                "alp",
                {"buckets": "po"},
                "31.56 78.37 79.66 85.39 89.97 65.32 89.04 87.45",
            ),
            ("S_ALP-1", "alp-1", "alp-kqv1", "alp", {}, "31.75 79.31 80.64 86.75 90.11 66.06 89.95 87.33"),
            (
                "S_ALP-NO-4",
                "alp-no-4",
                "alp-kqv4",
                "alp",
                {"buckets": "no"},
                "33.37 79.62 80.64 86.84 90.27 66.06 89.91 87.67",
            ),
            (
                "S_ALP-PO-4",
                "alp-po-4",
                "alp-kqv4",
                "alp",
                {"buckets": "po"},
                "33.62 79.50 79.90 86.69 90.14 65.34 90.25 87.52",
            ),
            ("S_ALP-4", "alp-4", "alp-kqv4", "alp", {}, "32.61 79.34 79.90 87.00 90.26 67.31 90.71 87.46"),
        ],
    ),
}
ALP_PAPER = "paper: ALP-KD"
ALP_SEED = "kdplug: the paper reports single runs and gives no seed"


def alp_common(task: str, student: str, table: int) -> Settings:
    """What every ALP-KD run shares: the teacher, its fine-tuning, batch size, epochs, lengths."""
    settings = Settings()
    settings.set(f"{ALP_PAPER} §Experimental Study (the original BERT-Base, 12 layers)", teacher="bert-base")
    settings.set(f"{ALP_PAPER} Table {table} caption", student=student)
    settings.set(
        f"{ALP_PAPER} §Experimental Study: students take the teacher's first m layers, 'borrowed from PKD', "
        "whose students start from pre-trained BERT-Base (PKD §4.2)",
        student_options__init="pretrained",
    )
    settings.set(f"{ALP_PAPER} Table {table}", task=task)
    settings.set(f"{ALP_PAPER} eq. 7: one stage, L = beta CE + eta KD + lambda ILD", recipe="standard")
    settings.set(f"{ALP_PAPER} Table 5 (the teacher's learning rate)", teacher_lr=ALP_TEACHER_LR[task])
    settings.set(
        f"{ALP_PAPER} appendix, Hyper-parameters: 'we run {ALP_EPOCHS[task]} epochs for fine-tuning' on "
        f"{COLUMN[task]}, for the teacher and the students alike",
        teacher_epochs=ALP_EPOCHS[task],
        epochs=ALP_EPOCHS[task],
    )
    settings.set(f"{ALP_PAPER} appendix: 'batch size to 32 for all models'", teacher_batch_size=32, batch_size=32)
    settings.set(
        f"{ALP_PAPER} appendix: maximum sequence length 64 for single sentences, 128 for pairs",
        max_length=128 if task in PAIR_TASKS else 64,
    )
    settings.set(ALP_SEED, seed=42)
    return settings


def alp_entries() -> list[dict]:
    entries = []
    for table, (student, caption, rows) in ALP_TABLES.items():
        for label, slug, projector, family, options, scores in rows:
            reported = per_task(scores)
            for task in TASKS:
                settings = alp_common(task, student, table)
                notes = list(ALP_COMMON_NOTES)
                search = None
                if projector is None:
                    settings.set(
                        f"{ALP_PAPER} Table 1: the teacher row; the run trains S_RKD alongside", projector="rkd"
                    )
                    settings.set(
                        f"{ALP_PAPER} Table 7 (S_RKD's {COLUMN[task]} column)",
                        lr=ALP_HP["rkd"]["lr"][task],
                        temperature=ALP_HP["rkd"]["temperature"][task],
                        eta=ALP_HP["rkd"]["eta"][task],
                    )
                    settings.set(f"{ALP_PAPER} appendix: lambda is 0 for RKD", lam=0.0)
                    notes.append(
                        "The teacher row: the score to compare is the fine-tuned teacher's dev score "
                        "(metrics.json: teacher.dev), which every run records; the student trained "
                        "alongside is S_RKD of this table."
                    )
                else:
                    settings.set(f"{ALP_PAPER} Table {table}, row {label}", projector=projector)
                    hp, hp_table = ALP_HP[family], ALP_HP_TABLE[family]
                    where = (
                        f"assumed: Table 4 has no hyper-parameter table of its own; ALP's Table 10 ({COLUMN[task]})"
                        if table == 4
                        else f"{ALP_PAPER} Table {hp_table} ({COLUMN[task]} column)"
                    )
                    settings.set(
                        where, **{key: hp[key][task] for key in ("lr", "temperature", "eta", "lam") if key in hp}
                    )
                    if family == "nkd":
                        settings.set(f"{ALP_PAPER}: S_NKD uses no KD (eta = lambda = 0, beta = 1)", eta=0.0, lam=0.0)
                    search = {"lr": [1e-5, 2e-5, 5e-5]}
                    if family != "nkd":
                        search.update(temperature=[1, 5, 10, 20], eta=[0.2, 0.5, 0.7])
                    if family not in ("nkd", "rkd"):
                        search["lam"] = [0.2, 0.5, 0.7]
                    if options:
                        layer_map = options.get("layer_map")
                        if layer_map is not None:
                            settings.set(
                                f"{ALP_PAPER} Table {table}: PKD's layer map {layer_map}"
                                + (" (§Experimental Study)" if table == 1 else ""),
                                projector_options__layer_map=layer_map,
                            )
                        if "buckets" in options:
                            settings.set(
                                f"{ALP_PAPER} Table 4, row {label}: {options['buckets'].upper()} buckets",
                                projector_options__buckets=options["buckets"],
                            )
                    if table == 3 and projector == "ckd-no":
                        settings.set(
                            f"{ALP_PAPER} §Training Deeper/Shallower: 'we combine all teacher layers and "
                            "distill into the first layer of the student'",
                            projector_options__buckets=[list(range(1, 13))],
                        )
                    if table == 2 and projector == "pkd-skip":
                        notes.append(
                            "The paper does not give the 6-layer PKD map; pkd-skip's default "
                            "(2, 4, 6, 8, 10) is PKD's own."
                        )
                entries.append(
                    entry(
                        name=f"alp-kd/table{table}-{task}-{slug}",
                        paper="alp-kd",
                        table=table,
                        row=label,
                        description=f"ALP-KD Table {table} ({caption}), row {label}, {COLUMN[task]}",
                        measure="teacher" if projector is None else "student",
                        reported={"set": "dev", "scores": dev_score(task, reported[task])},
                        settings=settings,
                        search=search,
                        notes=notes,
                    )
                )
    return entries


# ---------------------------------------------------------------------------------------------
# Universal-KD (Wu et al., EMNLP 2021): Tables 2, 4, 5, 6; hyper-parameters in Tables 7-9
# ---------------------------------------------------------------------------------------------

UKD_T7 = {
    "lr": per_task("5e-5 5e-5 2e-5 5e-5 2e-5 5e-5 2e-5 5e-5"),
    "batch_size": per_task("32 32 32 32 32 16 32 32"),
    "beta": per_task("0.2 0.5 0.5 0.5 0.7 0.5 0.5 0.2"),
}
UKD_T8 = {
    "lr": per_task("2e-5 2e-5 5e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
    "batch_size": per_task("32 32 32 32 32 16 16 32"),
    "beta": per_task("0.5 0.5 0.5 0.5 0.5 0.5 0.5 0.5"),
}
UKD_T9 = {
    "bilstm": {
        "lr": per_task("2e-4 2e-5 3e-5 2e-5 3e-5 1e-5 5e-5 1e-5"),
        "batch_size": per_task("8 64 64 32 64 8 32 8"),
        "dropout": per_task("0.4 0.1 0.4 0.2 0.1 0.4 0.3 0.4"),
        "beta": per_task("0.5 0.5 0.7 0.5 0.5 0.5 0.7 0.2"),
    },
    "gated-cnn": {
        "lr": per_task("2e-4 2e-5 3e-5 2e-5 3e-5 1e-5 5e-5 1e-5"),
        "batch_size": per_task("64 64 16 32 32 16 64 8"),
        "dropout": per_task("0.4 0.1 0.4 0.2 0.1 0.4 0.3 0.4"),
        "beta": per_task("0.5 0.5 0.7 0.5 0.5 0.5 0.7 0.2"),
    },
}
UKD_SEARCH_A1 = {"batch_size": [8, 16, 32], "lr": [2e-5, 5e-5], "recipe_options.beta": [0.2, 0.5, 0.7]}
UKD_SEARCH_A2 = {
    "batch_size": [8, 16, 32, 64],
    "lr": [5e-5, 1e-4],
    "recipe_options.beta": [0.2, 0.5, 0.7],
    "student_options.dropout": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
}
UKD_PAPER = "paper: Universal-KD"
UKD_T1 = f"{UKD_PAPER} App. A.1: 'We set T to 1 for all experiments'"
UKD_NOTES = ["The paper reports single runs and gives no seed (seed 42 is kdplug's choice)."]


def ukd_two_stage(settings: Settings, task: str, hp: dict, table: int) -> Settings:
    """§4.2 and App. A.1: stage 1 (KD + Universal loss, no CE) for 20 epochs (CoLA 50), stage 2 CE for 10."""
    settings.set(
        f"{UKD_PAPER} §4.2: two stages, stage 1 beta KD + (1 - beta) Universal-KD, stage 2 CE only", recipe="two-stage"
    )
    settings.set(
        f"{UKD_PAPER} Table {table} ({COLUMN[task]} column)",
        lr=hp["lr"][task],
        batch_size=int(hp["batch_size"][task]),
        recipe_options__beta=hp["beta"][task],
    )
    settings.set(UKD_T1, temperature=1.0)
    settings.set(
        f"{UKD_PAPER} §5.2: 'trained for 20 epochs in stage 1 for all datasets except for CoLA. CoLA needs 50 epochs'",
        epochs=50 if task == "cola" else 20,
    )
    settings.set(f"{UKD_PAPER} §5.2: 'further trained for 10 epochs in stage 2'", recipe_options__stage2_epochs=10)
    settings.set(ALP_SEED, seed=42)
    return settings


def ukd_baseline_budget(settings: Settings, task: str, hp: dict, table: int) -> Settings:
    """The capacity-gap baselines the paper re-ran: the same budget and grid point as its own method."""
    why = (
        "assumed: the paper gives no budget for its baselines; they get Universal-KD's own (20 + 10 "
        "epochs, CoLA 50 + 10; §5.2)"
    )
    settings.set(why, epochs=60 if task == "cola" else 30)
    settings.set(
        f"assumed: the paper gives no learning rate or batch size for its baselines; Universal-KD's "
        f"(Table {table}, {COLUMN[task]})",
        lr=hp["lr"][task],
        batch_size=int(hp["batch_size"][task]),
    )
    settings.set(ALP_SEED, seed=42)
    return settings


def ukd_table2() -> list[dict]:
    """4-layer BERT students on GLUE dev. Its teacher, BERT-4, vanilla KD, PKD and ALP rows are ALP-KD's
    Table 1 (PKD and ALP marked dagger; the others carry the same numbers, rounded)."""
    rows = [
        ("BERT-base", "teacher", "57.3 83.4 86.8 91.3 91 68.2 92.7 88.9"),
        ("BERT-4", "nkd", "31 76.8 77.7 85.1 89 61.7 88.2 87.3"),
        ("Vanilla KD", "rkd", "29.2 79.3 79.4 86.8 90.3 65.3 90.4 87.5"),
        ("PKD (dagger)", "pkd", "32.1 79.3 80.2 86.6 90.2 65.7 90.1 87.3"),
        ("MHKD (*)", "mhkd", "32.8 79.4 80.6 86.8 90.1 66.4 90.5 87.5"),
        ("ALP (dagger)", "alp", "33.1 79.6 80.7 87 90.5 67.2 90.4 87.6"),
        ("Universal-KD (IL)", "universal-il", "34.2 79.6 81 87.1 90.7 67.9 90.6 87.9"),
    ]
    alp_rows = {e["name"]: e for e in alp_entries()}
    entries = []
    for label, slug, scores in rows:
        reported = per_task(scores)
        for task in TASKS:
            notes = list(UKD_NOTES)
            requires = None
            search = None
            measure = "student"
            if slug in ("teacher", "nkd", "rkd", "pkd", "alp"):
                source = alp_rows[f"alp-kd/table1-{task}-{slug}"]
                settings = Settings()
                settings.config, settings.sources = (
                    source["config"],
                    {
                        key: f"assumed: this row's numbers are ALP-KD Table 1's (rounded), so is its setting; "
                        f"{value.removeprefix('paper: ').removeprefix('assumed: ')}"
                        for key, value in source["sources"].items()
                    },
                )
                notes = [
                    "Universal-KD takes this row from ALP-KD Table 1 (the scores are ALP-KD's, rounded); the "
                    f"configuration is that of alp-kd/table1-{task}-{slug}, including its temperature (the "
                    "paper's T = 1 is for its own runs)."
                ] + source["notes"]
                search = source.get("search")
                measure = source["measure"]
            elif slug == "mhkd":
                settings = Settings()
                settings.set(f"{UKD_PAPER} §5.2", teacher="bert-base", student="bert-4", task=task)
                settings.set(
                    f"{UKD_PAPER} Table 2 (MHKD, Wang et al. 2020, re-implemented by the paper)", projector="mhkd"
                )
                settings.set("kdplug: MHKD's settings are not given", recipe="standard", batch_size=32)
                settings.set(ALP_SEED, seed=42)
                requires = ["projector mhkd"]
                notes.append(
                    "MHKD (Wang et al. 2020) is a baseline the paper re-implemented; kdplug has no "
                    "'mhkd' projector yet. Its hyper-parameters are not given."
                )
            else:
                settings = Settings()
                settings.set(f"{UKD_PAPER} §5.2: a standard 12-layer BERT-base teacher", teacher="bert-base")
                settings.set(f"{UKD_PAPER} §5.2: BERT students with 4 layers", student="bert-4")
                settings.set(
                    f"{UKD_PAPER} §5.2: 'we utilize the first 4 layers of the pre-trained BERT-base teacher "
                    "to initialize the students'",
                    student_options__init="pretrained",
                )
                settings.set(f"{UKD_PAPER} Table 2", task=task, projector="universal-il")
                settings.set(
                    "assumed: the paper's teacher scores are ALP-KD's, so is its fine-tuning (ALP-KD Table 5 "
                    "and appendix)",
                    teacher_lr=ALP_TEACHER_LR[task],
                    teacher_epochs=ALP_EPOCHS[task],
                    teacher_batch_size=32,
                )
                ukd_two_stage(settings, task, UKD_T7, 7)
                search = dict(UKD_SEARCH_A1)
            entries.append(
                entry(
                    name=f"universal-kd/table2-{task}-{slug}",
                    paper="universal-kd",
                    table=2,
                    row=label,
                    description=f"Universal-KD Table 2 (BERT-base -> BERT-4, dev), row {label}, {COLUMN[task]}",
                    measure=measure,
                    reported={"set": "dev", "scores": dev_score(task, reported[task])},
                    settings=settings,
                    search=search,
                    notes=notes,
                    requires=requires,
                )
            )
    return entries


def ukd_roberta(table: int, rows: list, tasks: tuple[str, ...]) -> list[dict]:
    entries = []
    for label, slug, scores in rows:
        values = dict(zip(tasks, (float(v) for v in scores.split())))
        for task in tasks:
            notes = list(UKD_NOTES)
            search = None
            measure = "student"
            settings = Settings()
            settings.set(f"{UKD_PAPER} §5.2: RoBERTa-large teacher (24 layers, 1024 wide)", teacher="roberta-large")
            settings.set(
                f"{UKD_PAPER} §5.2: DistilRoBERTa student (6 layers, 768 wide, 82M parameters)", student="distilroberta"
            )
            settings.set(f"{UKD_PAPER} Table {table}", task=task)
            if slug in ("teacher", "nkd", "rkd"):
                settings.set(
                    f"{UKD_PAPER} Table {table}, row {label}"
                    + (" (vanilla KD trains alongside)" if slug == "teacher" else ""),
                    projector="rkd" if slug == "teacher" else slug,
                    recipe="standard",
                )
                if slug == "teacher":
                    measure = "teacher"
                    notes.append(
                        "The teacher row: compare the fine-tuned teacher's dev score "
                        "(metrics.json: teacher.dev); the student trained alongside is vanilla KD."
                    )
                if slug == "nkd":
                    settings.set(f"{UKD_PAPER} Table {table}: DistilRoBERTa without KD", eta=0.0, lam=0.0)
                else:
                    settings.set(UKD_T1, temperature=1.0)
                ukd_baseline_budget(settings, task, UKD_T8, 8)
                search = {"batch_size": [8, 16, 32], "lr": [2e-5, 5e-5]}
                if slug != "nkd":
                    search["eta"] = [0.2, 0.5, 0.7]
            elif slug in ("takd", "dih", "annealing"):
                settings.set(f"{UKD_PAPER} Table {table}, row {label}", recipe=slug)
                settings.set(
                    "kdplug: the recipe trains with its own loss; rkd names the logit KD it uses", projector="rkd"
                )
                if slug == "takd":
                    settings.set(
                        f"{UKD_PAPER} §5.4: 'the TA used in TAKD is a single RoBERTa-base model with 12 layers'",
                        recipe_options__ta=["roberta-base"],
                    )
                    notes.append(
                        "The paper takes TAKD's scores from Jafari et al. (2021) (dagger); each link gets "
                        "the budget below."
                    )
                if slug == "annealing":
                    settings.set(
                        "paper: Jafari et al. 2021, 'Annealing Knowledge Distillation' (EACL 2021; the "
                        "scores are theirs, dagger in Table 4): E1 = 10, E2 = 3, tau_max = 10 on GLUE",
                        recipe_options__e1=10,
                        recipe_options__e2=3,
                        recipe_options__tau_max=10,
                    )
                if slug == "dih":
                    notes.append(
                        "DIH (*): re-run by the paper for NLP; its alpha, temperature and heads are not "
                        "given, so kdplug's dih defaults apply (alpha 0.1, tau 5, heads at n/4, n/2, "
                        "3n/4; docs/recipes.md)."
                    )
                if slug == "annealing":
                    settings.set(ALP_SEED, seed=42)
                    settings.set(
                        "assumed: the paper gives no learning rate or batch size for its baselines; "
                        f"Universal-KD's (Table 8, {COLUMN[task]})",
                        lr=UKD_T8["lr"][task],
                        batch_size=int(UKD_T8["batch_size"][task]),
                    )
                else:
                    ukd_baseline_budget(settings, task, UKD_T8, 8)
            else:
                settings.set(f"{UKD_PAPER} Table {table}, row {label}", projector=slug)
                settings.set(
                    f"{UKD_PAPER} §5.2: 'DistilRoBERTa' (the pre-trained distilroberta-base)",
                    student_options__source="distilroberta-base",
                )
                ukd_two_stage(settings, task, UKD_T8, 8)
                search = dict(UKD_SEARCH_A1)
                if slug == "universal-loss-att":
                    notes.append(
                        "Universal-KD (triangle): 'all the settings are the same with Universal-KD(CG)' (Section 5.6)."
                    )
            notes.append("The RoBERTa-large teacher's fine-tuning settings are not given: kdplug's defaults apply.")
            entries.append(
                entry(
                    name=f"universal-kd/table{table}-{task}-{slug}",
                    paper="universal-kd",
                    table=table,
                    row=label,
                    description=f"Universal-KD Table {table} (RoBERTa-large -> DistilRoBERTa, dev), row {label}, "
                    f"{COLUMN[task]}",
                    measure=measure,
                    reported={"set": "dev", "scores": dev_score(task, values[task])},
                    settings=settings,
                    search=search,
                    notes=notes,
                )
            )
    return entries


def ukd_table4() -> list[dict]:
    return ukd_roberta(
        4,
        [
            ("RoBERTa-large", "teacher", "68.1 90.2 89 94.6 91.5 86.3 96.4 92.3"),
            ("DistilRoBERTa", "nkd", "59.3 84 84.3 90.8 90.9 67.9 92.5 88.5"),
            ("Vanilla KD", "rkd", "61 84.2 86.5 91.4 91.7 71.1 92.54 88.9"),
            ("TAKD (dagger)", "takd", "61.2 83.9 85.8 91.3 91.7 71.8 92.5 89"),
            ("DIH (*)", "dih", "61.5 84.5 86.8 91.5 91.1 72.6 92 88.7"),
            ("Annealing KD (dagger)", "annealing", "61.7 85.3 87.3 91.6 91.5 73.6 93.1 89"),
            ("Universal-KD (CG)", "universal-cg", "63 83.9 87.8 91.6 91.7 74 93.5 89.9"),
        ],
        TASKS,
    )


def ukd_table6() -> list[dict]:
    return ukd_roberta(
        6,
        [
            ("DIH", "dih", "86.8 72.6 92 91.1"),
            ("Universal-KD (triangle)", "universal-loss-att", "87.1 72.6 92.4 91.4"),
            ("Universal-KD (CG)", "universal-cg", "87.8 74 93.5 91.7"),
        ],
        ("mrpc", "rte", "sst2", "qqp"),
    )


def ukd_table5() -> list[dict]:
    rows = [
        ("BERT-base", None, "teacher", "57.3 83.4 86.8 91.3 91.0 68.2 92.7 88.8"),
        ("Bi-LSTM w/o KD", "bilstm", "nkd", "22 68.6 70.8 65.1 84.4 55.6 86.5 18.5"),
        ("Bi-LSTM Vanilla KD", "bilstm", "rkd", "24.5 69.1 69.4 64.5 84.8 56.3 86.1 20.2"),
        ("Bi-LSTM Universal-KD (CA)", "bilstm", "universal-ca", "25.7 69.3 70.6 65.2 85 56.5 86.9 22.1"),
        ("Gated-CNN w/o KD", "gated-cnn", "nkd", "21.3 58.4 70.6 61.9 81.7 53.4 88 21.8"),
        ("Gated-CNN Vanilla KD", "gated-cnn", "rkd", "20.6 58.7 69.6 62.2 82 54.1 88.8 21.6"),
        ("Gated-CNN Universal-KD (CA)", "gated-cnn", "universal-ca", "24.5 59.1 70.8 62.4 82.2 56 89 24.9"),
    ]
    entries = []
    for label, student, slug, scores in rows:
        reported = per_task(scores)
        for task in TASKS:
            arch = student or "bilstm"
            hp = UKD_T9[arch]
            name = "Bi-LSTM" if arch == "bilstm" else "Gated-CNN"
            notes = list(UKD_NOTES) + [
                "Table 9's learning rates (2e-4 ... 1e-5) reach outside the range App. A.2 states (1e-4 to 5e-5); "
                "Table 9 is used.",
                "Epochs are not given for the cross-architecture students (App. A.2): kdplug's default applies.",
                "Pairs are one sequence (no siamese encoder), as in the paper.",
            ]
            settings = Settings()
            settings.set(f"{UKD_PAPER} §5.5: 'a strong BERT-base model' as the teacher", teacher="bert-base")
            settings.set(f"{UKD_PAPER} Table 5", task=task, student=arch)
            settings.set(
                f"{UKD_PAPER} §5.5: {'3' if arch == 'bilstm' else '4'} layers, hidden size 768",
                student_options__num_layers=3 if arch == "bilstm" else 4,
                student_options__hidden_size=768,
            )
            settings.set(
                "assumed: the paper's teacher scores are ALP-KD's, so is its fine-tuning (ALP-KD Table 5 and appendix)",
                teacher_lr=ALP_TEACHER_LR[task],
                teacher_epochs=ALP_EPOCHS[task],
                teacher_batch_size=32,
            )
            settings.set(
                f"{UKD_PAPER} Table 9 ({name}, {COLUMN[task]}): 'the best for each model on each task'",
                lr=hp["lr"][task],
                batch_size=int(hp["batch_size"][task]),
                student_options__dropout=hp["dropout"][task],
            )
            settings.set(
                f"{UKD_PAPER} App. A.2: 'We adopt the Adam optimization algorithm' (no weight decay "
                "mentioned; Adam without decay is AdamW with weight_decay 0)",
                weight_decay=0.0,
            )
            settings.set(ALP_SEED, seed=42)
            measure = "student"
            if slug == "teacher":
                measure = "teacher"
                settings.set(
                    f"{UKD_PAPER} Table 5: the teacher row; the Bi-LSTM with vanilla KD trains alongside",
                    projector="rkd",
                    recipe="standard",
                )
                settings.set(UKD_T1, temperature=1.0)
                notes.append(
                    "The teacher row: compare the fine-tuned teacher's dev score (metrics.json: "
                    "teacher.dev); the student trained alongside is the Bi-LSTM with vanilla KD."
                )
            elif slug == "universal-ca":
                settings.set(f"{UKD_PAPER} Table 5, row {label}", projector="universal-ca")
                settings.set(f"{UKD_PAPER} §4.2: two stages", recipe="two-stage")
                settings.set(UKD_T1, temperature=1.0)
                settings.set(f"{UKD_PAPER} Table 9 ({name}, {COLUMN[task]})", recipe_options__beta=hp["beta"][task])
            else:
                settings.set(f"{UKD_PAPER} Table 5, row {label}", projector=slug, recipe="standard")
                if slug == "nkd":
                    settings.set(f"{UKD_PAPER} Table 5: without KD", eta=0.0, lam=0.0)
                else:
                    settings.set(UKD_T1, temperature=1.0)
                    notes.append(
                        "Vanilla KD: Table 9's beta is Universal-KD's stage-1 KD weight; this baseline's "
                        "KD weight is not given (the rkd projector's default)."
                    )
            entries.append(
                entry(
                    name=f"universal-kd/table5-{task}-" + ("teacher" if slug == "teacher" else f"{arch}-{slug}"),
                    paper="universal-kd",
                    table=5,
                    row=label,
                    description=f"Universal-KD Table 5 (BERT-base -> Bi-LSTM / Gated-CNN, dev), row {label}, "
                    f"{COLUMN[task]}",
                    measure=measure,
                    reported={"set": "dev", "scores": dev_score(task, reported[task])},
                    settings=settings,
                    search=dict(UKD_SEARCH_A2),
                    notes=notes,
                )
            )
    return entries


# ---------------------------------------------------------------------------------------------
# PKD (Sun et al., EMNLP 2019): Table 1, GLUE test server
# ---------------------------------------------------------------------------------------------

PKD_TASKS = ("sst2", "mrpc", "qqp", "mnli", "qnli", "rte")


def pkd_scores(cells: list[str]) -> dict[str, dict]:
    """Columns SST-2, MRPC (F1/acc), QQP (F1/acc), MNLI-m, MNLI-mm, QNLI, RTE."""
    sst2, mrpc, qqp, mnli_m, mnli_mm, qnli, rte = cells
    pair = lambda text: dict(zip(("f1", "accuracy"), (float(v) for v in text.split("/"))))  # noqa: E731
    return {
        "sst2": {"dev": {"accuracy": float(sst2)}},
        "mrpc": {"dev": pair(mrpc)},
        "qqp": {"dev": pair(qqp)},
        "mnli": {"dev_matched": {"accuracy": float(mnli_m)}, "dev_mismatched": {"accuracy": float(mnli_mm)}},
        "qnli": {"dev": {"accuracy": float(qnli)}},
        "rte": {"dev": {"accuracy": float(rte)}},
    }


PKD_PAPER = "paper: PKD"


def pkd_entries() -> list[dict]:
    rows = [
        ("BERT12 (Google)", None, "google", "93.5 88.9/84.8 71.2/89.2 84.6 83.4 90.5 66.4"),
        ("BERT12 (Teacher)", None, "teacher", "94.3 89.2/85.2 70.9/89.0 83.7 82.8 90.4 69.1"),
        ("BERT6-FT", "bert-6", "nkd", "90.7 85.9/80.2 69.2/88.2 80.4 79.7 86.7 63.6"),
        ("BERT6-KD", "bert-6", "rkd", "91.5 86.2/80.6 70.1/88.8 80.2 79.8 88.3 64.7"),
        ("BERT6-PKD", "bert-6", "pkd-skip", "92.0 85.0/79.9 70.7/88.9 81.5 81.0 89.0 65.5"),
        ("BERT3-FT", "bert-3", "nkd", "86.4 80.5/72.6 65.8/86.9 74.8 74.3 84.3 55.2"),
        ("BERT3-KD", "bert-3", "rkd", "86.9 79.5/71.1 67.3/87.6 75.4 74.8 84.0 56.2"),
        ("BERT3-PKD", "bert-3", "pkd-skip", "87.5 80.7/72.5 68.1/87.8 76.7 76.3 84.7 58.2"),
    ]
    common = [
        "PKD Table 1 reports GLUE test-server scores; kdplug measures dev, so the comparison is indicative only.",
        "The learning rate, T, alpha and beta chosen per task are not given (the grid is in 'search'); the "
        "values set here are marked as kdplug's choices.",
        "Optimizer and warm-up are not given: kdplug's defaults (AdamW, weight decay 0.01, 10% warm-up, as "
        "Google's BERT code PKD builds on).",
    ]
    entries = []
    for label, student, slug, cells in rows:
        scores = pkd_scores(cells.split())
        for task in PKD_TASKS:
            notes = list(common)
            settings = Settings()
            settings.set(f"{PKD_PAPER} §4.2: BERT-Base (BERT12) fine-tuned as the teacher", teacher="bert-base")
            settings.set(f"{PKD_PAPER} Table 1", task=task)
            settings.set(
                f"{PKD_PAPER} §4.2: 'the batch size as 32, and the number of epochs as 4 for all the experiments'",
                batch_size=32,
                epochs=4,
                teacher_batch_size=32,
                teacher_epochs=4,
            )
            settings.set(
                "kdplug: the paper searches the learning rate in {5e-5, 2e-5, 1e-5} and does not report the "
                "choice; 5e-5 is in the grid",
                teacher_lr=5e-5,
            )
            settings.set(
                f"{PKD_PAPER} §4.2: 'the model with the best validation accuracy is selected'", best_checkpoint="best"
            )
            settings.set("kdplug: the paper reports single runs and gives no seed", seed=42)
            search = {"lr": [5e-5, 2e-5, 1e-5]}
            measure = "student"
            if student is None:
                measure = "teacher"
                settings.set(
                    f"{PKD_PAPER} Table 1: the teacher row; BERT6-KD trains alongside",
                    student="bert-6",
                    projector="rkd",
                    recipe="standard",
                )
                notes.append(
                    "The teacher row: compare the fine-tuned teacher's dev score (metrics.json: "
                    "teacher.dev); the student trained alongside is BERT6-KD."
                )
                if slug == "google":
                    notes.append(
                        "Google's official GLUE leaderboard submission of BERT-base, not a PKD run; "
                        "the closest kdplug run is the fine-tuned teacher."
                    )
                search = {"teacher_lr": search["lr"]}
            else:
                settings.set(f"{PKD_PAPER} Table 1, row {label}", student=student, projector=slug, recipe="standard")
                settings.set(
                    f"{PKD_PAPER} §4.2: 'We initialize BERT_k with the first k layers of parameters from "
                    "pre-trained BERT-Base'",
                    student_options__init="pretrained",
                )
                settings.set(
                    "kdplug: the paper searches {5e-5, 2e-5, 1e-5} and does not report the choice; 5e-5 is in the grid",
                    lr=5e-5,
                )
                if slug == "nkd":
                    settings.set(
                        f"{PKD_PAPER} §4.2: direct fine-tuning 'without using any soft labels'", eta=0.0, lam=0.0
                    )
                else:
                    settings.set(
                        "kdplug: PKD searches T in {5, 10, 20} and alpha in {0.2, 0.5, 0.7} (eq. 5) and "
                        "reports neither choice; the grid's middle",
                        temperature=10.0,
                        eta=0.5,
                    )
                    if slug == "rkd":
                        search.update(temperature=[5, 10, 20], eta=[0.2, 0.5, 0.7])
                if slug == "pkd-skip":
                    settings.set(
                        f"{PKD_PAPER} eq. 8: (1 - alpha) CE + alpha L_DS + beta L_PT, beta outside the "
                        "convex combination: ce_weight = 1 - alpha",
                        ce_weight=0.5,
                    )
                    settings.set(
                        "kdplug: PKD searches beta in {10, 100, 500, 1000} and does not report the choice; "
                        "100 is in the grid",
                        lam=100.0,
                    )
                    settings.set(
                        f"{PKD_PAPER}'s code (patience_loss): the normalised MSE averaged over the hidden "
                        "dimension and the layers, the scale its beta weighs",
                        projector_options__loss_reduction="mean",
                    )
                    search["lam"] = [10, 100, 500, 1000]
                    notes.append(
                        "PKD fixes alpha and T to the best vanilla-KD run's and searches only beta and the "
                        "learning rate, so the grid here does too (change eta together with ce_weight = "
                        "1 - eta). Layer map: PKD-Skip, {2,4,6,8,10} for BERT6 and {4,8} for BERT3 "
                        "(pkd-skip's default)."
                    )
            entries.append(
                entry(
                    name=f"pkd/table1-{task}-{slug if student is None else student + '-' + slug.replace('-skip', '')}",
                    paper="pkd",
                    table=1,
                    row=label,
                    description=f"PKD Table 1 (GLUE test), row {label}, {COLUMN[task]}",
                    measure=measure,
                    reported={"set": "test", "scores": scores[task]},
                    settings=settings,
                    search=search,
                    notes=notes,
                )
            )
    return entries


# ---------------------------------------------------------------------------------------------
# Transfer sets (kdplug's --augment): Tang et al. 2019, and Universal-KD Table 5 beyond the paper
# ---------------------------------------------------------------------------------------------

TANG = "Tang et al. 2019, 'Distilling Task-Specific Knowledge from BERT into Simple Neural Networks' (arXiv:1903.12136)"
TANG_NOT_IN_SHARED = (
    "Tang et al. (2019, arXiv:1903.12136) was not transcribed from its text, unlike the zoo's other "
    "papers: the two SST-2 scores (86.7 without, 90.7 with distillation on the augmented set) were "
    "entered from a secondary quotation and not checked against the paper's tables; its MNLI and "
    "QQP columns and its training settings are not entered, so those entries are not written and "
    "the settings below are kdplug's"
)


def tang_entries() -> list[dict]:
    """Tang et al.'s single-sentence setting: a one-layer BiLSTM from scratch, without and with
    distillation on the teacher-labelled transfer set made by their three augmentation rules."""
    entries = []
    for row, slug, score in (("BiLSTM", "nkd", 86.7), ("BiLSTM_SOFT", "rkd-tang20", 90.7)):
        settings = Settings()
        settings.set(
            f"assumed: {TANG} fine-tune BERT on the task as the teacher (the BERT size is not transcribed; "
            f"BERT-base is the zoo's teacher)",
            teacher="bert-base",
        )
        settings.set(
            f"paper: {TANG}, abstract: 'a single-layer BiLSTM'",
            student="bilstm",
            task="sst2",
            student_options__num_layers=1,
        )
        settings.set(
            "assumed: ALP-KD's SST-2 teacher fine-tuning (the zoo's other SST-2 teachers)",
            teacher_lr=ALP_TEACHER_LR["sst2"],
            teacher_epochs=ALP_EPOCHS["sst2"],
            teacher_batch_size=32,
        )
        settings.set(ALP_SEED, seed=42)
        notes = ["The paper reports GLUE test-server scores; a reproduction reports dev.", TANG_NOT_IN_SHARED]
        if slug == "nkd":
            settings.set(
                f"paper: {TANG}: the BiLSTM trained on the labelled data alone",
                projector="nkd",
                recipe="standard",
                eta=0.0,
                lam=0.0,
            )
        else:
            settings.set(
                f"assumed: {TANG} distil the teacher's logits (not transcribed from the paper's text)",
                projector="rkd",
                recipe="standard",
            )
            settings.set(
                f"assumed: {TANG}, §3.3: its rules (masking, POS-guided replacement, n-gram sampling) and "
                f"n_iter = 20 for SST-2, from a secondary description (not transcribed from the paper's "
                f"text; docs/transfer-sets.md)",
                augment="tang",
                augment_factor=20,
            )
            notes.append(
                "The paper distils with the mean squared error between logits on the transfer set; kdplug's "
                "rkd uses the temperature-scaled KL (its default weights) with CE on the labelled rows."
            )
        entries.append(
            entry(
                name=f"tang-2019/table1-sst2-{slug}",
                paper="tang-2019",
                table=1,
                row=row,
                description=f"Tang et al. 2019 Table 1 (BiLSTM from BERT, GLUE test), row {row}, SST-2",
                measure="student",
                reported={"set": "test", "scores": dev_score("sst2", score)},
                settings=settings,
                notes=notes,
            )
        )
    return entries


def ukd_table5_transfer() -> list[dict]:
    """Universal-KD Table 5's SST-2 Bi-LSTM rows again, each distilled with Tang et al.'s augmented
    transfer set: beyond the paper, with the paper's own score (no transfer set) beside it."""
    entries = []
    for base in (
        e
        for e in ukd_table5()
        if e["name"] in ("universal-kd/table5-sst2-bilstm-rkd", "universal-kd/table5-sst2-bilstm-universal-ca")
    ):
        settings = Settings()
        settings.config = {k: dict(v) if isinstance(v, dict) else v for k, v in base["config"].items()}
        settings.sources = dict(base["sources"])
        settings.set(
            "kdplug: beyond the paper: Tang et al. 2019's augmentation (n_iter = 20 for SST-2) as the transfer set",
            augment="tang",
            augment_factor=20,
        )
        entries.append(
            entry(
                name=base["name"] + "-transfer",
                paper="universal-kd",
                table=5,
                row=base["row"] + " + transfer set",
                description=base["description"] + ", with a transfer set (beyond the paper)",
                measure="student",
                reported=base["reported"],
                settings=settings,
                search=base.get("search"),
                notes=base["notes"]
                + [
                    "Beyond the paper: the reported score is the paper's row without a transfer set, "
                    "the number a transfer set has to beat."
                ],
            )
        )
    return entries


# ---------------------------------------------------------------------------------------------
# Layer maps: Yu, Wen and Mou 2025 (not in shared/papers; read from the paper's reference code)
# ---------------------------------------------------------------------------------------------

YU = (
    "Yu, Wen and Mou 2025, 'Revisiting Intermediate-Layer Matching in Knowledge Distillation: Layer-Selection "
    "Strategy Doesn't Matter (Much)' (Findings of IJCNLP-AACL 2025, arXiv:2502.04499)"
)
YU_CODE = "github.com/MANGA-UOFA/Layer-Selection at 2315d7f, classification/"
YU_NOTES = [
    "Scores from the paper's repository README (its main table, weights-copied rows; the table number was not read "
    "from the paper, 1 is assumed); its teacher row is "
    "BERT-base's GLUE test score from Devlin et al., so these are read as GLUE test-server scores: a "
    "reproduction reports dev.",
    "The paper's student copies teacher layers 4, 8 and 12 (and embeddings, pooler); kdplug's bert-3 copies the "
    "fine-tuned teacher's first 3 layers (student_options.init=teacher). Its random-init rows are not written: "
    "kdplug's BERT-k students always start from copied layers.",
    "The paper's L_hid is the MSE over every non-pad token's hidden state, the embeddings included, with no "
    "normalisation (its code divides by the batch size twice, an effective weight 3/B); kdplug's pkd-skip "
    "compares normalised [CLS] vectors of the matched layers, the embeddings never matched.",
]


def yu_entries() -> list[dict]:
    """The SST-2 layer-selection rows with a weights-copied 3-layer student: forward, reverse and
    all-to-one matching, and no matching at all."""
    rows = (("None", "none", 88.7), ("Forward", "forward", 92.3), ("Reverse", "reverse", 90.0))
    rows += (("All-to-one", "all-to-one", 91.4),)
    entries = []
    for row, layer_map, score in rows:
        settings = Settings()
        settings.set(f"assumed: {YU_CODE}scripts/finetune/sst2.sh: bert-base-uncased fine-tuned", teacher="bert-base")
        settings.set(
            f"assumed: {YU_CODE}scripts/finetune/sst2.sh: lr 5e-5, 3 epochs, batch 32",
            teacher_lr=5e-5,
            teacher_epochs=3,
            teacher_batch_size=32,
        )
        settings.set(f"paper: {YU}, SST-2 column", task="sst2")
        settings.set(
            f"assumed: {YU_CODE}trainer.py: a 3-layer BERT with the teacher's config, layers copied",
            student="bert-3",
            student_options__init="teacher",
        )
        settings.set(
            f"assumed: {YU_CODE}scripts/*/sst2*.sh: batch 32, max length 128, 20 epochs, the best checkpoint",
            batch_size=32,
            max_length=128,
            epochs=20,
            best_checkpoint="best",
        )
        settings.set(
            f"assumed: {YU_CODE}scripts: lr 2e-5 for forward and reverse, 1e-5 for all-to-one",
            lr=1e-5 if layer_map == "all-to-one" else 2e-5,
        )
        settings.set("assumed: the scripts pass no seed, so HF's default 42", seed=42)
        settings.set(
            f"assumed: {YU_CODE}: HF Trainer's defaults (linear decay, no warm-up, no weight decay)",
            warmup_ratio=0.0,
            weight_decay=0.0,
        )
        settings.set(
            f"assumed: {YU_CODE}trainer.py: alpha_mle 1, alpha_kl 1 at temperature 1 (no tau^2 at tau = 1)",
            ce_weight=1.0,
            eta=1.0,
            temperature=1.0,
        )
        if layer_map == "none":
            settings.set(f"paper: {YU}: 'None', no intermediate-layer matching (alpha_hid = 0)", projector="rkd")
        else:
            settings.set(
                f"assumed: {YU_CODE}trainer.py: alpha_hid 3; kdplug's PKD loss stands for the paper's L_hid",
                projector="pkd-skip",
                lam=3.0,
            )
            settings.set(
                f"paper: {YU}: the {row.lower()} strategy over every student layer, the last included",
                projector_options__layer_map=layer_map,
                projector_options__match_output_layer=True,
            )
        settings.set("kdplug: one stage, as the paper trains", recipe="standard")
        entries.append(
            entry(
                name=f"yu-2025/sst2-bert3-{layer_map}",
                paper="yu-2025",
                table=1,
                row=f"Weights copied, {row}",
                description=f"Yu, Wen and Mou 2025 (layer selection, GLUE test), weights copied, {row}, SST-2",
                measure="student",
                reported={"set": "test", "scores": dev_score("sst2", score)},
                settings=settings,
                notes=list(YU_NOTES),
            )
        )
    return entries


# ---------------------------------------------------------------------------------------------


def entry(
    *, name, paper, table, row, description, measure, reported, settings, search=None, notes=(), requires=None
) -> dict:
    config = {key: settings.config[key] for key in FIELDS if key in settings.config}  # RunConfig's order
    keys = [key for key in config if not isinstance(config[key], dict)]
    keys += [f"{key}.{option}" for key in config if isinstance(config[key], dict) for option in config[key]]
    missing = [key for key in keys if key not in settings.sources]
    assert not missing, f"{name}: no source for {missing}"
    data = {
        "name": name,
        "paper": paper,
        "table": table,
        "row": row,
        "description": description,
        "measure": measure,
        "reported": reported,
        "seeds": [config.get("seed", 42)],
        "config": config,
        "sources": {key: settings.sources[key] for key in keys},
    }
    if search:
        data["search"] = search
    if requires:
        data["requires"] = requires
    data["notes"] = list(notes)
    return data


def all_entries() -> list[dict]:
    return (
        alp_entries()
        + ukd_table2()
        + ukd_table4()
        + ukd_table5()
        + ukd_table6()
        + pkd_entries()
        + tang_entries()
        + ukd_table5_transfer()
        + yu_entries()
    )


def render(data: dict) -> str:
    header = f"# {data['description']}\n# Generated by zoo/generate.py from the paper's tables; edit there.\n"
    return header + yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)


def index(entries: list[dict]) -> str:
    rows = [
        {
            "name": e["name"],
            "file": f"{e['name']}.yaml",
            "paper": e["paper"],
            "table": e["table"],
            "row": e["row"],
            "task": e["config"]["task"],
        }
        for e in entries
    ]
    return (
        "# Every zoo entry, one line each (written by zoo/generate.py; 'kdplug zoo list' reads it).\n"
        + yaml.safe_dump({"entries": rows}, sort_keys=False, width=200, default_flow_style=None)
    )


def expected_files() -> dict[Path, str]:
    entries = all_entries()
    files = {ZOO / f"{e['name']}.yaml": render(e) for e in entries}
    files[ZOO / "index.yaml"] = index(entries)
    return files


def main() -> int:
    files = expected_files()
    names = [p for p in files if p.name != "index.yaml"]
    assert len(set(names)) == len(names), "duplicate entry names"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"wrote {len(names)} entries and the index to {ZOO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the zoo entries from the papers' tables, transcribed once, here.

The YAML files are the reviewed artefact (``kdplug zoo show`` prints them, users copy them);
this script is how they were made, so that a fix to a transcribed number is one edit and a
re-run: ``python zoo/generate.py``. ``tests/zoo`` checks the files are what it writes.

Every number below is copied from the paper's tables (``shared/papers``): reported scores as
printed (in %), hyper-parameters from the appendix tables. Where a paper gives no value, the
entry leaves the key unset (the engine's default applies) and says so in ``notes``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from kdplug.config import FIELDS

ZOO = Path(__file__).resolve().parent
TASKS = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb")
COLUMN = {"cola": "CoLA", "mnli": "MNLI", "mrpc": "MRPC", "qnli": "QNLI", "qqp": "QQP", "rte": "RTE",
          "sst2": "SST-2", "stsb": "STS-B"}
SPLIT = {"mnli": "dev_matched"}  # ALP-KD and Universal-KD report MNLI matched
METRIC = {"cola": "matthews", "stsb": "pearson"}  # accuracy for the rest


def per_task(values: str) -> dict[str, float]:
    """One table row, columns in TASKS order: ``"2e-5 5e-5 ..."``."""
    numbers = [float(v) for v in values.split()]
    assert len(numbers) == len(TASKS), values
    return dict(zip(TASKS, numbers))


def dev_score(task: str, value: float) -> dict:
    return {SPLIT.get(task, "dev"): {METRIC.get(task, "accuracy"): value}}


# ---------------------------------------------------------------------------------------------
# ALP-KD (Passban et al., AAAI 2021): Tables 1-4, hyper-parameters in Tables 5-10
# ---------------------------------------------------------------------------------------------

ALP_EPOCHS = {"stsb": 10, "sst2": 10, "qnli": 10, "mnli": 5, "qqp": 5, "mrpc": 20, "rte": 20, "cola": 50}
ALP_TEACHER_LR = per_task("2e-5 5e-5 2e-5 2e-5 2e-5 2e-5 2e-5 2e-5")  # Table 5
ALP_HP = {  # Tables 6-10: lr, T, eta, lambda per task
    "nkd": {"lr": per_task("2e-5 5e-5 2e-5 2e-5 5e-5 2e-5 5e-5 5e-5")},
    "rkd": {"lr": per_task("2e-5 5e-5 2e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
            "temperature": per_task("10 20 10 20 20 5 10 5"),
            "eta": per_task("0.5 0.7 0.5 0.7 0.7 0.7 0.7 0.2"), "lam": per_task("0 0 0 0 0 0 0 0")},
    "pkd": {"lr": per_task("2e-5 5e-5 5e-5 5e-5 5e-5 2e-5 5e-5 5e-5"),
            "temperature": per_task("5 20 5 20 20 5 5 5"),
            "eta": per_task("0.5 0.2 0.2 0.2 0.5 0.2 0.2 0.2"),
            "lam": per_task("0.2 0.7 0.7 0.7 0.2 0.7 0.7 0.2")},
    "ckd": {"lr": per_task("5e-5 5e-5 2e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
            "temperature": per_task("20 10 10 20 5 10 20 20"),
            "eta": per_task("0.2 0.5 0.7 0.7 0.2 0.2 0.5 0.2"),
            "lam": per_task("0.2 0.2 0.2 0.2 0.2 0.2 0.2 0.2")},
    "alp": {"lr": per_task("5e-5 5e-5 5e-5 5e-5 5e-5 5e-5 5e-5 5e-5"),
            "temperature": per_task("5 20 10 20 20 10 20 5"),
            "eta": per_task("0.2 0.7 0.7 0.7 0.7 0.2 0.2 0.2"),
            "lam": per_task("0.5 0.2 0.2 0.2 0.2 0.2 0.7 0.5")},
}
ALP_HP_TABLE = {"nkd": 6, "rkd": 7, "pkd": 8, "ckd": 9, "alp": 10}
ALP_COMMON_NOTES = [
    "Hyper-parameters: ALP-KD appendix; batch size 32, max length 64 (single sentence) / 128 (pairs).",
    "Epochs: the appendix gives 10 (STS-B, SST-2, QNLI), 5 (MNLI, QQP), 20 (MRPC, RTE), 50 (CoLA) "
    "'for fine-tuning'; used here for both the teacher and the student.",
    "Tables 5-10 give one value per task for 'all experiments'; the 6- and 2-layer tables reuse them.",
    "Seeds: the paper reports single runs and gives no seed.",
]

# (row label, slug, projector, hyper-parameter family, extra projector options, reported per task)
ALP_TABLES = {
    1: ("bert-4", "BERT-base -> 4-layer students", [
        ("T_BERT", "teacher", None, None, {}, "57.31 83.39 86.76 91.25 90.96 68.23 92.67 88.82"),
        ("S_NKD", "nkd", "nkd", "nkd", {}, "31.05 76.83 77.70 85.13 88.97 61.73 88.19 87.29"),
        ("S_RKD", "rkd", "rkd", "rkd", {}, "29.22 79.31 79.41 86.77 90.25 65.34 90.37 87.45"),
        ("S_PKD", "pkd", "pkd-skip", "pkd", {"layer_map": [1, 5, 9]},
         "32.13 79.26 80.15 86.64 90.23 65.70 90.14 87.26"),
        ("S_CKD-NO", "ckd-no", "ckd-no", "ckd", {}, "31.23 79.42 80.64 86.93 88.70 66.06 90.37 87.62"),
        ("S_CKD-PO", "ckd-po", "ckd-po", "ckd", {}, "31.95 79.53 80.39 86.75 89.89 67.51 90.25 87.55"),
        ("S_ALP-NO", "alp-no", "alp-no", "alp", {}, "34.21 79.26 79.66 87.11 90.72 65.70 90.37 87.52"),
        ("S_ALP-PO", "alp-po", "alp-po", "alp", {}, "33.86 79.74 79.90 86.95 90.25 66.43 90.48 87.52"),
        ("S_ALP", "alp", "alp", "alp", {}, "33.07 79.62 80.72 87.02 90.54 67.15 90.37 87.62"),
    ]),
    2: ("bert-6", "BERT-base -> 6-layer students", [
        ("T_BERT", "teacher", None, None, {}, "57.31 83.39 86.76 91.25 90.96 68.23 92.67 88.82"),
        ("S_NKD", "nkd", "nkd", "nkd", {}, "40.33 79.91 81.86 87.57 90.21 65.34 90.02 88.49"),
        ("S_RKD", "rkd", "rkd", "rkd", {}, "45.51 81.41 83.82 88.21 90.56 67.51 91.51 88.70"),
        ("S_PKD", "pkd", "pkd-skip", "pkd", {}, "45.78 82.18 85.05 89.31 90.73 68.23 91.51 88.56"),
        ("S_CKD-NO", "ckd-no", "ckd-no", "ckd", {}, "48.49 81.91 83.82 89.53 90.64 67.51 91.40 88.73"),
        ("S_CKD-PO", "ckd-po", "ckd-po", "ckd", {}, "46.99 81.99 83.82 89.44 90.82 67.51 91.17 88.62"),
        ("S_ALP-NO", "alp-no", "alp-no", "alp", {}, "46.40 81.99 85.78 89.71 90.64 68.95 91.86 88.81"),
        ("S_ALP-PO", "alp-po", "alp-po", "alp", {}, "46.02 82.04 84.07 89.16 90.56 68.23 91.74 88.72"),
        ("S_ALP", "alp", "alp", "alp", {}, "46.81 81.86 85.05 89.67 90.73 68.59 91.86 88.68"),
    ]),
    3: ("bert-2", "BERT-base -> 2-layer students", [
        ("T_BERT", "teacher", None, None, {}, "57.31 83.39 86.76 91.25 90.96 68.23 92.67 88.82"),
        ("S_NKD", "nkd", "nkd", "nkd", {}, "14.50 72.73 72.06 79.61 86.89 57.04 85.89 40.80"),
        ("S_RKD", "rkd", "rkd", "rkd", {}, "24.50 74.90 73.53 81.04 87.40 59.21 87.39 41.87"),
        ("S_PKD-1", "pkd-1", "pkd-skip", "pkd", {"layer_map": [1]},
         "23.09 74.65 72.55 81.27 87.68 57.40 88.76 43.37"),
        ("S_PKD-6", "pkd-6", "pkd-skip", "pkd", {"layer_map": [6]},
         "22.48 74.57 73.04 80.74 87.70 57.40 88.65 42.92"),
        ("S_PKD-12", "pkd-12", "pkd-skip", "pkd", {"layer_map": [12]},
         "22.46 74.33 72.79 81.22 87.88 57.40 88.76 45.39"),
        ("S_CKD", "ckd", "ckd-no", "ckd", {}, "24.69 74.67 73.04 81.60 87.10 58.84 88.65 43.71"),
        ("S_ALP", "alp", "alp", "alp", {}, "24.61 74.78 73.53 81.24 88.01 59.57 88.88 46.04"),
    ]),
    4: ("bert-4", "ALP-KD with key-query-value attention, BERT-base -> 4 layers", [
        ("S_ALP-NO-1", "alp-no-1", "alp-kqv1", "alp", {"buckets": "no"},
         "32.84 78.94 79.03 86.31 90.31 65.06 88.53 87.26"),
        ("S_ALP-PO-1", "alp-po-1", "alp-kqv1", "alp", {"buckets": "po"},
         "31.56 78.37 79.66 85.39 89.97 65.32 89.04 87.45"),
        ("S_ALP-1", "alp-1", "alp-kqv1", "alp", {}, "31.75 79.31 80.64 86.75 90.11 66.06 89.95 87.33"),
        ("S_ALP-NO-4", "alp-no-4", "alp-kqv4", "alp", {"buckets": "no"},
         "33.37 79.62 80.64 86.84 90.27 66.06 89.91 87.67"),
        ("S_ALP-PO-4", "alp-po-4", "alp-kqv4", "alp", {"buckets": "po"},
         "33.62 79.50 79.90 86.69 90.14 65.34 90.25 87.52"),
        ("S_ALP-4", "alp-4", "alp-kqv4", "alp", {}, "32.61 79.34 79.90 87.00 90.26 67.31 90.71 87.46"),
    ]),
}
ALP_ROW_NOTES = {
    (1, "pkd"): "Layer map A = (1, 5, 9): the paper's choice for 4-layer students (Section 'Experimental Results').",
    (2, "pkd"): "The paper does not give the 6-layer PKD map; pkd-skip's default (2, 4, 6, 8, 10) is PKD's own.",
    (3, "ckd"): "2-layer CKD: all 12 teacher layers in one bucket for h_S^1 (ckd-no with one bucket = all).",
    (3, "alp"): "2-layer ALP: attention over all 12 teacher layers into h_S^1.",
}


def alp_entries() -> list[dict]:
    entries = []
    for table, (student, caption, rows) in ALP_TABLES.items():
        for label, slug, projector, family, options, scores in rows:
            reported = per_task(scores)
            for task in TASKS:
                config = {"teacher": "bert-base", "student": student, "projector": projector or "rkd",
                          "task": task, "recipe": "standard", "teacher_lr": ALP_TEACHER_LR[task],
                          "teacher_epochs": ALP_EPOCHS[task], "teacher_batch_size": 32, "epochs": ALP_EPOCHS[task],
                          "batch_size": 32, "seed": 42}
                notes = list(ALP_COMMON_NOTES) + ["Teacher: learning rate from Table 5."]
                search = None
                if projector is None:
                    config.update(lr=ALP_HP["rkd"]["lr"][task], temperature=ALP_HP["rkd"]["temperature"][task],
                                  eta=ALP_HP["rkd"]["eta"][task], lam=0.0)
                    notes.append("The teacher row: the score to compare is the fine-tuned teacher's dev score "
                                 "(metrics.json: teacher.dev), which every run records; the student trained "
                                 "alongside is S_RKD of this table.")
                else:
                    hp = ALP_HP[family]
                    for key in ("lr", "temperature", "eta", "lam"):
                        if key in hp:
                            config[key] = hp[key][task]
                    if family == "nkd":
                        config.update(eta=0.0, lam=0.0)
                    notes.append(f"Student: lr, T, eta, lambda from Table {ALP_HP_TABLE[family]}.")
                    search = {"lr": [1e-5, 2e-5, 5e-5]}
                    if family != "nkd":
                        search.update(temperature=[1, 5, 10, 20], eta=[0.2, 0.5, 0.7])
                    if family not in ("nkd", "rkd"):
                        search["lam"] = [0.2, 0.5, 0.7]
                    if options:
                        config["projector_options"] = dict(options)
                    if table == 3 and projector == "ckd-no":
                        config["projector_options"] = {"buckets": [list(range(1, 13))]}
                    if table == 4:
                        notes.append("Table 4 has no hyper-parameter table of its own; ALP's Table 10 values "
                                     "are assumed (the paper does not say).")
                    note = ALP_ROW_NOTES.get((table, slug))
                    if note:
                        notes.append(note)
                entries.append(entry(
                    name=f"alp-kd/table{table}-{task}-{slug}", paper="alp-kd", table=table, row=label,
                    description=f"ALP-KD Table {table} ({caption}), row {label}, {COLUMN[task]}",
                    measure="teacher" if projector is None else "student",
                    reported={"set": "dev", "scores": dev_score(task, reported[task])},
                    config=config, search=search, notes=notes))
    return entries


# ---------------------------------------------------------------------------------------------
# Universal-KD (Wu et al., EMNLP 2021): Tables 2, 4, 5, 6; hyper-parameters in Tables 7-9
# ---------------------------------------------------------------------------------------------

UKD_T7 = {"lr": per_task("5e-5 5e-5 2e-5 5e-5 2e-5 5e-5 2e-5 5e-5"), "batch_size": per_task("32 32 32 32 32 16 32 32"),
          "beta": per_task("0.2 0.5 0.5 0.5 0.7 0.5 0.5 0.2")}
UKD_T8 = {"lr": per_task("2e-5 2e-5 5e-5 5e-5 5e-5 5e-5 5e-5 5e-5"), "batch_size": per_task("32 32 32 32 32 16 16 32"),
          "beta": per_task("0.5 0.5 0.5 0.5 0.5 0.5 0.5 0.5")}
UKD_T9 = {
    "bilstm": {"lr": per_task("2e-4 2e-5 3e-5 2e-5 3e-5 1e-5 5e-5 1e-5"), "batch_size": per_task("8 64 64 32 64 8 32 8"),
               "dropout": per_task("0.4 0.1 0.4 0.2 0.1 0.4 0.3 0.4"), "beta": per_task("0.5 0.5 0.7 0.5 0.5 0.5 0.7 0.2")},
    "gated-cnn": {"lr": per_task("2e-4 2e-5 3e-5 2e-5 3e-5 1e-5 5e-5 1e-5"),
                  "batch_size": per_task("64 64 16 32 32 16 64 8"),
                  "dropout": per_task("0.4 0.1 0.4 0.2 0.1 0.4 0.3 0.4"),
                  "beta": per_task("0.5 0.5 0.7 0.5 0.5 0.5 0.7 0.2")},
}
UKD_SEARCH_A1 = {"batch_size": [8, 16, 32], "lr": [2e-5, 5e-5], "recipe_options.beta": [0.2, 0.5, 0.7]}
UKD_SEARCH_A2 = {"batch_size": [8, 16, 32, 64], "lr": [5e-5, 1e-4], "recipe_options.beta": [0.2, 0.5, 0.7],
                 "student_options.dropout": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}
UKD_NOTES = ["Seeds: the paper reports single runs and gives no seed.",
             "Universal-KD: T = 1 for all experiments (Appendix A.1)."]


def ukd_two_stage(task: str, hp: dict, *, stage1: int = 20, stage2: int = 10) -> dict:
    """Appendix A.1: stage 1 (KD + Universal loss, no CE) for 20 epochs (CoLA 50), stage 2 CE for 10."""
    return {"recipe": "two-stage", "lr": hp["lr"][task], "batch_size": int(hp["batch_size"][task]),
            "temperature": 1.0, "epochs": 50 if task == "cola" else stage1,
            "recipe_options": {"beta": hp["beta"][task], "stage2_epochs": stage2}}


def ukd_table2() -> list[dict]:
    """4-layer BERT students on GLUE dev. PKD and ALP rows are ALP-KD's Table 1 (marked dagger)."""
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
                config = dict(source["config"])
                notes = ["Universal-KD takes this row from ALP-KD Table 1 (the scores are ALP-KD's, rounded); "
                         "the configuration is that of alp-kd/table1-" + f"{task}-{slug}."] + source["notes"]
                search = source.get("search")
                measure = source["measure"]
            elif slug == "mhkd":
                config = {"teacher": "bert-base", "student": "bert-4", "projector": "mhkd", "task": task,
                          "recipe": "standard", "batch_size": 32, "seed": 42}
                requires = ["projector mhkd"]
                notes.append("MHKD (Wang et al. 2020) is a baseline the paper re-implemented; kdplug has no "
                             "'mhkd' projector yet. Its hyper-parameters are not given.")
            else:
                config = {"teacher": "bert-base", "student": "bert-4", "projector": "universal-il", "task": task,
                          "teacher_lr": ALP_TEACHER_LR[task], "teacher_epochs": ALP_EPOCHS[task], "seed": 42,
                          **ukd_two_stage(task, UKD_T7)}
                search = dict(UKD_SEARCH_A1)
                notes += ["Student: lr, batch size and beta from Table 7; stage 1 20 epochs (CoLA 50), stage 2 "
                          "10 epochs (Appendix A.1).",
                          "Teacher: the paper's teacher scores are ALP-KD's; its fine-tuning settings are not "
                          "given, ALP-KD's (Table 5, appendix epochs) are assumed."]
            entries.append(entry(
                name=f"universal-kd/table2-{task}-{slug}", paper="universal-kd", table=2, row=label,
                description=f"Universal-KD Table 2 (BERT-base -> BERT-4, dev), row {label}, {COLUMN[task]}",
                measure=measure, reported={"set": "dev", "scores": dev_score(task, reported[task])},
                config=config, search=search, notes=notes, requires=requires))
    return entries


def ukd_roberta(table: int, rows: list, tasks: tuple[str, ...]) -> list[dict]:
    entries = []
    for label, slug, scores in rows:
        values = dict(zip(tasks, (float(v) for v in scores.split())))
        for task in tasks:
            notes = list(UKD_NOTES)
            requires = None
            search = None
            measure = "student"
            config = {"teacher": "roberta-large", "student": "distilroberta", "task": task, "recipe": "standard",
                      "seed": 42}
            if slug in ("teacher", "nkd", "rkd"):
                config["projector"] = "rkd" if slug == "teacher" else slug
                if slug == "teacher":
                    measure = "teacher"
                    notes.append("The teacher row: compare the fine-tuned teacher's dev score "
                                 "(metrics.json: teacher.dev); the student trained alongside is vanilla KD.")
                if slug == "nkd":
                    config.update(eta=0.0, lam=0.0)
                notes.append("The paper gives no hyper-parameters for this baseline; the engine's defaults "
                             "apply. Its grid for DistilRoBERTa students (Appendix A.1) is in 'search'.")
                search = {"batch_size": [8, 16, 32], "lr": [2e-5, 5e-5]}
                if slug != "nkd":
                    search["eta"] = [0.2, 0.5, 0.7]
            elif slug in ("takd", "dih", "annealing"):
                config.update(projector="rkd", recipe=slug)
                if slug == "takd":
                    config["recipe_options"] = {"ta": ["roberta-base"]}
                    notes.append("TA: a single 12-layer RoBERTa-base (Section 5.4).")
                notes.append("The paper gives no hyper-parameters for this baseline; the recipe's defaults "
                             "(METHODS.md: capacity-gap baselines) apply.")
                if slug in ("takd", "annealing"):
                    notes.append("The paper takes these scores from Jafari et al. (2021) (dagger).")
            else:
                config["projector"] = slug
                config.update(ukd_two_stage(task, UKD_T8))
                search = dict(UKD_SEARCH_A1)
                notes.append("Student: lr, batch size and beta from Table 8; stage 1 20 epochs (CoLA 50), "
                             "stage 2 10 epochs (Appendix A.1).")
                if slug == "universal-loss-att":
                    notes.append("Universal-KD (triangle): 'all the settings are the same with Universal-KD(CG)' "
                                 "(Section 5.6).")
            notes.append("Teacher: RoBERTa-large fine-tuning settings are not given; engine defaults apply.")
            entries.append(entry(
                name=f"universal-kd/table{table}-{task}-{slug}", paper="universal-kd", table=table, row=label,
                description=f"Universal-KD Table {table} (RoBERTa-large -> DistilRoBERTa, dev), row {label}, "
                            f"{COLUMN[task]}",
                measure=measure, reported={"set": "dev", "scores": dev_score(task, values[task])},
                config=config, search=search, notes=notes, requires=requires))
    return entries


def ukd_table4() -> list[dict]:
    return ukd_roberta(4, [
        ("RoBERTa-large", "teacher", "68.1 90.2 89 94.6 91.5 86.3 96.4 92.3"),
        ("DistilRoBERTa", "nkd", "59.3 84 84.3 90.8 90.9 67.9 92.5 88.5"),
        ("Vanilla KD", "rkd", "61 84.2 86.5 91.4 91.7 71.1 92.54 88.9"),
        ("TAKD (dagger)", "takd", "61.2 83.9 85.8 91.3 91.7 71.8 92.5 89"),
        ("DIH (*)", "dih", "61.5 84.5 86.8 91.5 91.1 72.6 92 88.7"),
        ("Annealing KD (dagger)", "annealing", "61.7 85.3 87.3 91.6 91.5 73.6 93.1 89"),
        ("Universal-KD (CG)", "universal-cg", "63 83.9 87.8 91.6 91.7 74 93.5 89.9"),
    ], TASKS)


def ukd_table6() -> list[dict]:
    return ukd_roberta(6, [
        ("DIH", "dih", "86.8 72.6 92 91.1"),
        ("Universal-KD (triangle)", "universal-loss-att", "87.1 72.6 92.4 91.4"),
        ("Universal-KD (CG)", "universal-cg", "87.8 74 93.5 91.7"),
    ], ("mrpc", "rte", "sst2", "qqp"))


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
            notes = list(UKD_NOTES) + [
                f"Student: lr, batch size, dropout{' and beta' if slug == 'universal-ca' else ''} from Table 9 "
                f"({'Bi-LSTM' if arch == 'bilstm' else 'Gated-CNN'}), 'the best for each model on each task'.",
                "Epochs are not given for the cross-architecture students (Appendix A.2); engine default.",
                "Optimizer: Adam in the paper; kdplug uses AdamW with weight_decay (set --set weight_decay=0 "
                "for plain Adam).",
                "Pairs are one sequence (no siamese encoder), as in the paper."]
            config = {"teacher": "bert-base", "student": arch, "task": task, "seed": 42,
                      "teacher_lr": ALP_TEACHER_LR[task], "teacher_epochs": ALP_EPOCHS[task],
                      "lr": hp["lr"][task], "batch_size": int(hp["batch_size"][task]),
                      "student_options": {"dropout": hp["dropout"][task]}}
            measure = "student"
            if slug == "teacher":
                measure = "teacher"
                config.update(projector="rkd", recipe="standard")
                notes.append("The teacher row: compare the fine-tuned teacher's dev score (metrics.json: "
                             "teacher.dev); the student trained alongside is the Bi-LSTM with vanilla KD.")
            elif slug == "universal-ca":
                config.update(projector="universal-ca", recipe="two-stage", temperature=1.0,
                              recipe_options={"beta": hp["beta"][task]})
            else:
                config.update(projector=slug, recipe="standard")
                if slug == "nkd":
                    config.update(eta=0.0, lam=0.0)
                else:
                    config["temperature"] = 1.0
                    notes.append("Vanilla KD: Table 9's beta is Universal-KD's stage-1 KD weight; the KD weight "
                                 "of this baseline is not given (projector default).")
            notes.append("Teacher: the paper's teacher scores are ALP-KD's; ALP-KD's fine-tuning settings "
                         "(Table 5) are assumed.")
            entries.append(entry(
                name=f"universal-kd/table5-{task}-" + ("teacher" if slug == "teacher" else f"{arch}-{slug}"),
                paper="universal-kd", table=5, row=label,
                description=f"Universal-KD Table 5 (BERT-base -> Bi-LSTM / Gated-CNN, dev), row {label}, "
                            f"{COLUMN[task]}",
                measure=measure, reported={"set": "dev", "scores": dev_score(task, reported[task])},
                config=config, search=dict(UKD_SEARCH_A2), notes=notes))
    return entries


# ---------------------------------------------------------------------------------------------
# PKD (Sun et al., EMNLP 2019): Table 1, GLUE test server
# ---------------------------------------------------------------------------------------------

PKD_TASKS = ("sst2", "mrpc", "qqp", "mnli", "qnli", "rte")


def pkd_scores(cells: list[str]) -> dict[str, dict]:
    """Columns SST-2, MRPC (F1/acc), QQP (F1/acc), MNLI-m, MNLI-mm, QNLI, RTE."""
    sst2, mrpc, qqp, mnli_m, mnli_mm, qnli, rte = cells
    pair = lambda text: dict(zip(("f1", "accuracy"), (float(v) for v in text.split("/"))))  # noqa: E731
    return {"sst2": {"dev": {"accuracy": float(sst2)}}, "mrpc": {"dev": pair(mrpc)}, "qqp": {"dev": pair(qqp)},
            "mnli": {"dev_matched": {"accuracy": float(mnli_m)}, "dev_mismatched": {"accuracy": float(mnli_mm)}},
            "qnli": {"dev": {"accuracy": float(qnli)}}, "rte": {"dev": {"accuracy": float(rte)}}}


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
    common = ["PKD Table 1 reports GLUE test-server scores; kdplug measures dev, so the comparison is "
              "indicative only.",
              "Batch size 32 and 4 epochs 'for all the experiments'; the learning rate, T, alpha and beta "
              "chosen per task are not given (the grid is in 'search'). Engine defaults apply.",
              "Seeds: the paper reports single runs and gives no seed."]
    entries = []
    for label, student, slug, cells in rows:
        scores = pkd_scores(cells.split())
        for task in PKD_TASKS:
            notes = list(common)
            config = {"teacher": "bert-base", "student": student or "bert-6", "task": task, "recipe": "standard",
                      "batch_size": 32, "epochs": 4, "teacher_batch_size": 32, "teacher_epochs": 4, "seed": 42}
            measure = "student"
            search = {"lr": [5e-5, 2e-5, 1e-5]}
            if student is None:
                measure = "teacher"
                config["projector"] = "rkd"
                notes.append("The teacher row: compare the fine-tuned teacher's dev score (metrics.json: "
                             "teacher.dev); the student trained alongside is BERT6-KD.")
                if slug == "google":
                    notes.append("Google's official GLUE leaderboard submission of BERT-base, not a PKD run; "
                                 "the closest kdplug run is the fine-tuned teacher.")
                search["teacher_lr"] = search.pop("lr")
            else:
                config["projector"] = slug
                if slug == "nkd":
                    config.update(eta=0.0, lam=0.0)
                else:
                    search.update(temperature=[5, 10, 20], eta=[0.2, 0.5, 0.7])
                if slug == "pkd-skip":
                    notes.append("PKD weighs L_PT with beta in {10, 100, 500, 1000} on top of (1-alpha)CE + "
                                 "alpha KD (eq. 8); kdplug's objective is convex (lam in [0, 1], CE weight "
                                 "1-eta-lam), so beta has no direct equivalent: search lam instead.")
                    search["lam"] = [0.2, 0.5, 0.7]
                    notes.append("Layer map: PKD-Skip, {2,4,6,8,10} for BERT6 and {4,8} for BERT3 (pkd-skip's "
                                 "default).")
            entries.append(entry(
                name=f"pkd/table1-{task}-{slug if student is None else student + '-' + slug.replace('-skip', '')}",
                paper="pkd", table=1, row=label,
                description=f"PKD Table 1 (GLUE test), row {label}, {COLUMN[task]}",
                measure=measure, reported={"set": "test", "scores": scores[task]},
                config=config, search=search, notes=notes))
    return entries


# ---------------------------------------------------------------------------------------------

def entry(*, name, paper, table, row, description, measure, reported, config, search=None, notes=(),
          requires=None) -> dict:
    config = {key: config[key] for key in FIELDS if key in config}  # RunConfig's order, for reading
    data = {"name": name, "paper": paper, "table": table, "row": row, "description": description,
            "measure": measure, "reported": reported, "seeds": [config.get("seed", 42)], "config": config}
    if search:
        data["search"] = search
    if requires:
        data["requires"] = requires
    data["notes"] = list(notes)
    return data


def all_entries() -> list[dict]:
    return alp_entries() + ukd_table2() + ukd_table4() + ukd_table5() + ukd_table6() + pkd_entries()


def render(data: dict) -> str:
    header = f"# {data['description']}\n# Generated by zoo/generate.py from the paper's tables; edit there.\n"
    return header + yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)


def index(entries: list[dict]) -> str:
    rows = [{"name": e["name"], "file": f"{e['name']}.yaml", "paper": e["paper"], "table": e["table"],
             "row": e["row"], "task": e["config"]["task"]} for e in entries]
    return ("# Every zoo entry, one line each (written by zoo/generate.py; 'kdplug zoo list' reads it).\n"
            + yaml.safe_dump({"entries": rows}, sort_keys=False, width=200, default_flow_style=None))


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

"""A refactor's check that it changed no behaviour: capture what kdplug writes on tiny runs of every phase, before
and after, and compare.

    python benchmarks/behaviour_snapshot.py capture OUT_DIR             # with the kdplug on PYTHONPATH
    python benchmarks/behaviour_snapshot.py compare BEFORE_DIR AFTER_DIR  # every difference; exit 1 if any

``capture`` builds a tiny random BERT teacher, a tiny causal LM and a tiny SST-2 in a fixed scratch folder
(``--work``, default ``/tmp/kdplug-behaviour-snapshot``: the same paths in every capture, so that cache keys and
data fingerprints compare), runs ``python -m kdplug.cli`` as a subprocess per scenario (one process, one thread,
fixed seeds; see ``SCENARIOS``), then ``predict``, ``export`` and ``report`` over the runs. It copies everything
they wrote to ``OUT_DIR/raw`` and derives ``OUT_DIR/snapshot`` from it, one folder per run, command, export and
the cache, each with:

  - ``files.txt``: every file written;
  - ``weights.txt``: the sha256 of every binary file (the student package's and each stage's weights and
    checkpoints, the cached fine-tuned teachers and teacher outputs, encoded transfer sets);
  - ``files/...``: every text file masked: JSON (metrics.json, the report's, the package's) flattened to
    ``key.path = value`` lines, sorted, with timings, dates, pids, hostnames and the load masked
    (``MASKED_KEYS``); model cards, configs, predictions, the commands' stdout and stderr (the dry runs' plans
    among them) with the scratch folder written ``<WORK>`` and durations and dates masked (``mask_text``).

``compare`` derives both snapshots again from their ``raw`` folders with today's masks (so a mask improved later
applies to an earlier capture) and prints every difference.

To compare a branch with main (single core, about 3 minutes a capture; hold the heavy-job lock)::

    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    SNAPSHOT="flock /tmp/kdplug-heavy.lock python benchmarks/behaviour_snapshot.py"
    PYTHONPATH=$MAIN:$MAIN/plugins $SNAPSHOT capture /tmp/before
    PYTHONPATH=$WT:$WT/plugins $SNAPSHOT capture /tmp/after
    python benchmarks/behaviour_snapshot.py compare /tmp/before /tmp/after

Two captures of the same code compare identical (checked when this was written); what is masked and why is
in ``MASKED_KEYS`` and ``mask_text``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_WORK = Path("/tmp/kdplug-behaviour-snapshot")
MARKER = "kdplug-behaviour-snapshot.marker"  # a scratch folder this script made (it deletes no other)

BILSTM = ["--student", "bilstm", "--set", "student_options.embedding_dim=16", "--set", "student_options.hidden_size=16"]
BERT2 = ["--student", "bert-2"]
TINY = ["--epochs", "1", "--set", "teacher_epochs=1", "--set", "allow_weak_teacher=true", "--set", "batch_size=8"]
TINY += ["--set", "measure_speed=false", "--set", "head_epochs=1", "--threads", "1", "--seed", "42"]
TINY += ["--set", "keep_checkpoints=true"]  # each stage's weights stay in checkpoints/, to be compared

PROMPT = {"prompt": "Review: {text}\nSentiment:", "verbalizer": {"negative": " bad", "positive": " good"}}
PROMPTED = [f"teacher_options.{key}={json.dumps(value)}" for key, value in PROMPT.items()]
PROMPTED = [
    part
    for option in [*PROMPTED, "teacher_options.shots=1", "teacher_options.calibrate=true"]
    for part in ("--set", option)
]

#: (name, arguments after ``kdplug run``); {transfer} is the unlabelled text file. In this order: the first
#: run fine-tunes the teacher (after a dry run that plans the fine-tuning), the later ones reuse it from the cache
SCENARIOS: list[tuple[str, list[str]]] = [
    ("dry-run-cold", [*BILSTM, *"--projector pkd-skip --dry-run".split()]),
    ("finetune-bilstm-pkd", [*BILSTM, "--projector", "pkd-skip"]),
    ("bilstm-universal-ca", [*BILSTM, "--projector", "universal-ca"]),
    ("bilstm-alp", [*BILSTM, "--projector", "alp"]),
    ("bilstm-ckd", [*BILSTM, "--projector", "ckd-po"]),
    ("bilstm-rkd", [*BILSTM, "--projector", "rkd"]),
    ("bert2-pkd", [*BERT2, "--projector", "pkd-skip"]),
    ("bert2-universal-ca", [*BERT2, "--projector", "universal-ca"]),
    ("bert2-alp", [*BERT2, "--projector", "alp"]),
    ("bert2-ckd", [*BERT2, "--projector", "ckd-po"]),
    ("bert2-rkd", [*BERT2, "--projector", "rkd"]),
    ("recipe-dih", [*BERT2, *"--projector rkd --recipe dih".split()]),
    ("recipe-takd", [*BILSTM, *"--projector rkd --recipe takd --set recipe_options.ta=[bert-2]".split()]),
    ("recipe-annealing", [*BILSTM, *"--recipe annealing --set recipe_options.e1=2 --set recipe_options.e2=1".split()]),
    ("baseline", [*BILSTM, *"--projector rkd --baseline universal-ca".split()]),
    (
        "transfer-early-stop",
        [*BILSTM, *"--projector rkd --transfer {transfer} --set transfer_ratio=3 --epochs 3".split()]
        + "--set patience=1 --set min_epochs=1".split(),
    ),
    ("augment-tang", [*BILSTM, *"--projector rkd --augment tang --augment-factor 2".split()]),
    ("augment-teacher-words", [*BILSTM, *"--projector rkd --augment teacher-words --augment-factor 2".split()]),
    ("bert2-tinybert", [*BERT2, "--projector", "tinybert"]),  # the teacher in the loop
    ("seeds", [*BILSTM, *"--projector rkd --seeds 2".split()]),
    ("prompted-lm", ["--teacher", "{lm}", *BILSTM, "--projector", "alp", *PROMPTED]),
]
#: scenarios whose dry run is also captured (after the real runs: the teacher and caches exist)
DRY_RUNS = [
    "finetune-bilstm-pkd",
    "bert2-universal-ca",
    "recipe-dih",
    "recipe-takd",
    "baseline",
    "transfer-early-stop",
    "augment-tang",
    "prompted-lm",
]
PREDICTED = ["finetune-bilstm-pkd", "bert2-pkd"]
EXPORTED = ["finetune-bilstm-pkd", "bert2-pkd"]

#: metrics keys masked wherever they occur, with why: they measure the machine or the moment, not the run
MASKED_KEYS = re.compile(
    r"(^|_)(seconds|secs|elapsed|wall|time|timestamp|date|created|updated|started|finished|pid|pids|host|hostname)"
    r"($|_)"
    r"|per_second|ms_per|^load$|^usable_cores$",  # threads' load and usable cores: what other jobs leave free
    re.IGNORECASE,
)
TEXT_SUFFIXES = {".json", ".md", ".txt", ".yaml", ".yml", ".tsv", ".csv", ".jsonl", ".html", ".py"}
#: binary files compared by their sha256: weights, checkpoints, the teacher cache's arrays, encoded transfer sets
WEIGHT_SUFFIXES = {".safetensors", ".onnx", ".bin", ".pt", ".pth", ".npy", ".npz", ".f16", ".f32", ".i32", ".i8"}
SKIPPED = {"log.txt"}  # the log is timings throughout (its messages are in stdout/stderr.txt)
SKIPPED_SUFFIXES = {".lock", ".png"}
#: a package's or cache entry's checksums: the md5 of its JSON files (they hold timings and dates, and are
#: compared key by key, masked, on their own) and of its safetensors files (compared by ``sha256``) are masked
CHECKSUMS, COMPARED_APART = "kdplug_checksums.json", (".json", ".safetensors")
WORK_PATH = "work_path.txt"  # the scratch folder's path, written <WORK> in the snapshot
GROUPS = (
    "runs",
    "outputs",
    "exports",
    "predictions",
)  # folders of one snapshot folder per entry  # locks are empty; figures carry the plotting library's metadata


# -- masking ---------------------------------------------------------------------------------------------------------


def mask_text(text: str, work: str) -> str:
    """The scratch folder as ``<WORK>``; dates, clock times and durations as placeholders (they measure the
    moment and the machine's speed, never the run's result)."""
    text = text.replace(str(work), "<WORK>")
    text = re.sub(r"\d{4}-\d{2}-\d{2}[ T_]\d{2}[:\-]\d{2}([:\-]\d{2})?(\.\d+)?", "<DATE>", text)
    text = re.sub(r"\bpid[ =:]*\d+", "pid <PID>", text)
    # durations: "1.5 s", "0.3s", "2 min", "12 ms", "1:02:03"
    text = re.sub(r"\b\d+(\.\d+)?\s?(ms|s|sec|min|h)\b", "<T>", text)
    text = re.sub(r"\b\d+:\d{2}(:\d{2})?\b", "<T>", text)
    return text


def flatten(value, prefix: str = ""):
    """``(key.path, value)`` for every leaf of a JSON value; list items by index."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def masked_metrics(path: Path, work: str) -> str:
    """A JSON file as sorted ``key.path = value`` lines, the keys of ``MASKED_KEYS`` masked."""
    lines = []
    for key, value in flatten(json.loads(path.read_text(encoding="utf-8"))):
        leaf = re.sub(r"\[\d+\]$", "", key).rsplit(".", 1)[-1]
        masked = MASKED_KEYS.search(leaf) or (path.name == CHECKSUMS and key.endswith(COMPARED_APART))
        shown = "<MASKED>" if masked else json.dumps(value, sort_keys=True)
        lines.append(f"{key} = {mask_text(shown, work)}")
    return "\n".join(sorted(lines)) + "\n"


def sha256(path: Path) -> str:
    """The file's sha256; of a safetensors file, over its header with sorted keys and then its tensors' bytes:
    safetensors writes the header's metadata from a Rust HashMap, in an order that changes from process to
    process (layers_dev.safetensors, with three metadata keys, differed between two captures of the same code)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if path.suffix == ".safetensors":
            size = int.from_bytes(handle.read(8), "little")
            digest.update(json.dumps(json.loads(handle.read(size)), sort_keys=True).encode())
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- the snapshot: derived from a capture's raw files, so that a better mask applies to earlier captures too ---------


def snapshot_folder(source: Path, target: Path, work: str) -> None:
    """``target``: files.txt (every file), weights.txt (the binary files' sha256), metrics.json.txt and every
    other text file masked (JSON key by key, so that a changed key reads as that key)."""
    target.mkdir(parents=True, exist_ok=True)
    listing, digests = [], []
    for path in sorted(path for path in source.rglob("*") if path.is_file()):
        relative = path.relative_to(source).as_posix()
        listing.append(relative)
        if path.name in SKIPPED or path.suffix in SKIPPED_SUFFIXES:
            continue
        if path.suffix in WEIGHT_SUFFIXES:
            digests.append(f"{relative} sha256 {sha256(path)}")
        elif path.suffix in TEXT_SUFFIXES:
            out = target / "files" / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(masked_file(path, work), encoding="utf-8")
    (target / "weights.txt").write_text("\n".join(digests) + "\n", encoding="utf-8")
    (target / "files.txt").write_text("\n".join(listing) + "\n", encoding="utf-8")


def masked_file(path: Path, work: str) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".json" and _is_json(text):
        return masked_metrics(path, work)
    if path.name == "stderr.txt":
        return mask_stderr(text, work)
    return mask_text(text, work)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def mask_stderr(text: str, work: str) -> str:
    """stderr without progress bars (tqdm redraws them by speed), and log lines without their logger's module
    (``INFO kdplug.engine.cache: ...``): where the code lives may move in a refactor; what it says may not."""
    lines = [line for line in text.replace("\r", "\n").splitlines() if not re.search(r"\d+it/s|s/it\]|%\|", line)]
    lines = [re.sub(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) kdplug[\w.]*:", r"\1 kdplug:", line) for line in lines]
    return mask_text("\n".join(lines), work) + "\n"


def derive(raw: Path, target: Path) -> None:
    """The snapshot of a capture's raw folder: one folder per run, command output, export, and the cache."""
    work = (raw / WORK_PATH).read_text(encoding="utf-8").strip()
    for entry in sorted(raw.iterdir()):
        if entry.name in GROUPS and entry.is_dir():
            for unit in sorted(entry.iterdir()):
                snapshot_folder(unit, target / entry.name / unit.name, work)
        elif entry.is_dir():
            snapshot_folder(entry, target / entry.name, work)


# -- capture ---------------------------------------------------------------------------------------------------------


def cli(argv: list[str], work: Path, name: str) -> subprocess.CompletedProcess:
    """``python -m kdplug.cli argv`` in a child process; its stdout, stderr and exit code to outputs/``name``."""
    env = {**os.environ, "KDPLUG_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("KDPLUG_DISABLE_PLUGINS", None)  # every plugin loaded, in both captures
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "kdplug.cli", *argv], env=env, capture_output=True, text=True, cwd=work, timeout=600
    )
    print(f"  {name}: exit {done.returncode} ({time.monotonic() - started:.1f} s)", flush=True)
    out = work / "outputs" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "exit_code.txt").write_text(f"{done.returncode}\n", encoding="utf-8")
    (out / "stdout.txt").write_text(done.stdout, encoding="utf-8")
    (out / "stderr.txt").write_text(done.stderr, encoding="utf-8")
    return done


def prepare(work: Path) -> dict[str, Path]:
    """A fresh scratch folder with the tiny teacher, the task data and unlabelled text."""
    if work.exists():
        if not (work / MARKER).exists():
            raise SystemExit(f"error: {work} exists and was not made by this script; pass --work to another folder")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / MARKER).write_text("made by benchmarks/behaviour_snapshot.py\n", encoding="utf-8")
    (work / WORK_PATH).write_text(f"{work}\n", encoding="utf-8")
    from kdplug.testing.contracts import TINY_SST2_DEV, TINY_SST2_TRAIN, write_tiny_sst2
    from kdplug.testing.decoders import make_tiny_causal_lm
    from kdplug.testing.tiny import make_tiny_bert

    teacher = make_tiny_bert(work / "bert", num_layers=4, hidden=32)
    language_model = make_tiny_causal_lm(work / "lm", "llama")
    data = write_tiny_sst2(work / "SST-2", (TINY_SST2_TRAIN * 4)[:45], TINY_SST2_DEV * 2)
    transfer = work / "unlabelled.txt"
    transfer.write_text("".join(f"{text} and more\n" for text, _ in TINY_SST2_TRAIN * 2), encoding="utf-8")
    texts = work / "texts.txt"
    texts.write_text("".join(f"{text}\n" for text, _ in TINY_SST2_DEV + TINY_SST2_TRAIN[:4]), encoding="utf-8")
    return {
        "teacher": Path(teacher),
        "lm": Path(language_model),
        "data": Path(data),
        "transfer": transfer,
        "texts": texts,
    }


def run_argv(arguments: list[str], inputs: dict[str, Path], output: Path) -> list[str]:
    """``run`` with the tiny teacher (unless the scenario names its own), task and settings."""
    arguments = [{"{transfer}": str(inputs["transfer"]), "{lm}": str(inputs["lm"])}.get(a, a) for a in arguments]
    teacher = [] if "--teacher" in arguments else ["--teacher", str(inputs["teacher"])]
    common = [*teacher, "--task", "sst2", "--data-dir", str(inputs["data"]), *TINY]
    return ["run", *common, *arguments, "--output", str(output)]


def capture(out: Path, work: Path) -> None:
    """Run every scenario in ``work``; copy what they wrote to OUT/raw and its snapshot to OUT/snapshot."""
    started = time.monotonic()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty; give a new folder")
    inputs = prepare(work)
    import kdplug

    print(f"capturing kdplug from {Path(kdplug.__file__).parent} into {out} (scratch: {work})", flush=True)
    runs = work / "runs"
    for name, arguments in SCENARIOS:
        cli(run_argv(arguments, inputs, runs / name), work, name)
    for name in DRY_RUNS:
        cli(run_argv([*dict(SCENARIOS)[name], "--dry-run"], inputs, runs / f"dry-{name}"), work, f"dry-run-{name}")
    run_commands(inputs, runs, work)
    shutil.copytree(work, out / "raw", ignore=shutil.ignore_patterns(MARKER, "*.lock"))
    derive(out / "raw", out / "snapshot")
    (out / "source.txt").write_text(f"{Path(kdplug.__file__).parent}\n", encoding="utf-8")
    print(f"captured in {time.monotonic() - started:.0f} s: {out}", flush=True)


def run_commands(inputs: dict[str, Path], runs: Path, work: Path) -> None:
    """predict and export over some runs; report over all of them."""
    for name in PREDICTED:
        predictions = work / "predictions" / name / "predictions.jsonl"
        predictions.parent.mkdir(parents=True)
        argv = ["predict", str(runs / name), "--input", str(inputs["texts"]), "--output", str(predictions)]
        cli([*argv, "--device", "cpu"], work, f"predict-{name}")
    for name in EXPORTED:
        cli(
            ["export", str(runs / name), "--format", "hf", "--output", str(work / "exports" / name)],
            work,
            f"export-{name}",
        )
    ran = [str(runs / name) for name, _ in SCENARIOS if (runs / name / "metrics.json").is_file()]
    cli(["report", *ran, "--output", str(work / "report"), "--resamples", "200"], work, "report")


# -- compare ---------------------------------------------------------------------------------------------------------


def compare(before: Path, after: Path) -> int:
    """Print every difference between two captures (their snapshots derived again from their raw files, with
    today's masks); 1 if any, else 0."""
    with tempfile.TemporaryDirectory() as scratch:
        old_root, new_root = snapshot_of(before, Path(scratch) / "before"), snapshot_of(after, Path(scratch) / "after")
        names = {path.relative_to(old_root).as_posix() for path in old_root.rglob("*") if path.is_file()}
        names |= {path.relative_to(new_root).as_posix() for path in new_root.rglob("*") if path.is_file()}
        differences = sum(print_difference(old_root / name, new_root / name, name) for name in sorted(names))
    print(f"{differences} file(s) differ" if differences else f"identical ({len(names)} files)")
    return 1 if differences else 0


def snapshot_of(capture_dir: Path, scratch: Path) -> Path:
    if not (capture_dir / "raw" / WORK_PATH).is_file():
        raise SystemExit(f"error: {capture_dir} is not a capture (no raw/{WORK_PATH}); make one with 'capture'")
    derive(capture_dir / "raw", scratch)
    return scratch


def print_difference(old: Path, new: Path, name: str) -> bool:
    if not old.is_file() or not new.is_file():
        print(f"only in {'after' if new.is_file() else 'before'}: {name}")
        return True
    old_lines = old.read_text(encoding="utf-8").splitlines()
    new_lines = new.read_text(encoding="utf-8").splitlines()
    if old_lines == new_lines:
        return False
    print(f"--- {name}")
    for line in difflib.unified_diff(old_lines, new_lines, "before", "after", lineterm="", n=0):
        if not line.startswith(("---", "+++")):
            print(f"    {line}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    capturing = commands.add_parser("capture", help="run the scenarios and write their snapshot to OUT_DIR")
    capturing.add_argument("out", type=Path, metavar="OUT_DIR")
    capturing.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"scratch folder (default: {DEFAULT_WORK})")
    comparing = commands.add_parser("compare", help="print every difference between two snapshots")
    comparing.add_argument("before", type=Path, metavar="BEFORE_DIR")
    comparing.add_argument("after", type=Path, metavar="AFTER_DIR")
    args = parser.parse_args(argv)
    if args.command == "capture":
        capture(args.out.resolve(), args.work.resolve())
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())

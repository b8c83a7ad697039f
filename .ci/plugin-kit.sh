#!/usr/bin/env bash
# CI: the third-party plugin path, as a plugin author and a user would walk it.
# In a fresh virtual environment: kdplug; then examples/kdplug-cosine installed as a separate
# distribution (its tests pass, `kdplug plugins` lists it, `kdplug run --projector cosine` uses it,
# `kdplug check-plugin` passes it); then a skeleton of every kind from `kdplug new-plugin`, installed
# and tested, and the student, loss, recipe and augmenter skeletons used together in a run and in `kdplug predict`.
# Offline: tiny random teacher, 16-line SST-2. Takes about 2-3 minutes, most of it pip.
set -euo pipefail
unset PYTEST_ADDOPTS  # the caller's pytest options (e.g. CI's) are not the generated packages'
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
    --epochs 1 --set teacher_epochs=1 --set allow_weak_teacher=true --set student_options.embedding_dim=16 --set student_options.hidden_size=16 \
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

KINDS="projector loss student teacher task recipe augmenter"
step "kdplug new-plugin, a skeleton of every kind ($KINDS); installed together, listed, their tests pass as generated"
for kind in $KINDS; do
    kdplug new-plugin "ci-$kind" --kind "$kind" --output "$WORK/kdplug-ci-$kind" >/dev/null
done
$PIP $(for kind in $KINDS; do echo "$WORK/kdplug-ci-$kind"; done)
kdplug plugins > "$WORK/plugins-after.txt"
for kind in $KINDS; do
    grep -E "^  ci-$kind .*\[ci-$kind: kdplug-ci-$kind 0\.1\.0\]$" "$WORK/plugins-after.txt"
    cp -r "$WORK/kdplug-ci-$kind/tests" "$WORK/ci-$kind-tests"  # against the installed package
done
# one pytest for the seven: each started its own Python and imported torch, about 10 s apiece
(cd "$WORK" && python -m pytest -q -p no:cacheprovider $(for kind in $KINDS; do echo "ci-$kind-tests"; done))

step "the installed skeletons in a run: the student, its loss, recipe and augmenter; then kdplug predict loads the student"
kdplug run --teacher "$WORK/tiny-bert" --student ci-student --projector pkd-skip --set ild_loss=ci-loss \
    --recipe ci-recipe --augment ci-augmenter --augment-factor 2 --task sst2 --data-dir "$WORK/SST-2" --epochs 1 --set teacher_epochs=1 --set allow_weak_teacher=true \
    --set student_options.embedding_dim=16 --set student_options.hidden_size=16 --output "$WORK/run-skeletons"
python - "$WORK/run-skeletons/metrics.json" <<'PY'
import json, sys
metrics = json.load(open(sys.argv[1]))
assert list(metrics["stages"]) == ["warmup", "distill"], metrics["stages"].keys()  # the ci-recipe's stages
assert metrics["config"]["ild_loss"] == "ci-loss" and "ild" in metrics["stages"]["distill"]["history"][0]["train"]
assert metrics["transfer"]["augmented"] > 0 and metrics["transfer"]["augment"] == "ci-augmenter"  # the skeleton augmenter
print("the skeleton student trained with the skeleton loss, recipe and augmenter:", metrics["student"]["dev"])
PY
printf 'a gripping film\na dull film\n' > "$WORK/texts.txt"
kdplug predict "$WORK/run-skeletons" --input "$WORK/texts.txt"

step "plugin kit: OK (${SECONDS}s)"

#!/usr/bin/env bash
# The GPU check: bash scripts/gpu_check.sh [--quick] [--out DIR] [--skip STEP,...]
#
# On a machine with an NVIDIA GPU, from the repository root:
#   1. install: a CUDA build of torch when the Python's torch sees no GPU (pip's torch for Linux
#      x86-64 is a CUDA build), then the project's dependencies where they are missing. With
#      FOLD_WHEELHOUSE=DIR (a machine without a network) the wheels in DIR are installed into
#      a private site dir instead, without dependencies.
#   2. tests: pytest -m gpu (engine, weave and SST models on CUDA == CPU, bfloat16 and autocast, Ray Train on GPU)
#   3. table1: the paper's Table 1 at its sizes (state 1024, 128 leaves, batch 1..1024) on the GPU
#   4. sst: SST Tree-LSTM training and inference trees/s, batch 25, 100, 1024
#   5. util: a short Tai-preset pipeline run with ray.use_gpu=true: GPU busy share, data-wait share
# and writes DIR/gpu_report.json and DIR/gpu_report.md (DIR: results/gpu). Steps: install,tests,
# table1,sst,util. --quick: fewer repeats and sizes (minutes). Exit status: 1 if a test failed or
# a step broke, else 0. Env: FOLD_PYTHON (python3), FOLD_DATA_DIR (../shared/data),
# FOLD_SST_EMBEDDINGS (a GloVe text file for the util step; default the installed GloVe 6B 50d).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

OUT_DIR=results/gpu QUICK=0 SKIP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT_DIR="$2"; shift ;;
    --skip) SKIP="$2"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
PY="${FOLD_PYTHON:-python3}"
# the data directory by pipelines.datadir's rule (empty: none, the download cache)
FOLD_DATA_DIR="$(cd "$ROOT" && "$PY" -m pipelines.datadir)"
export FOLD_DATA_DIR PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$OUT_DIR/mlflow.db}"
t_start=$SECONDS
say() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - t_start))" "$*" >&2; }
want() { case ",$SKIP," in *",$1,"*) say "$1: skipped (--skip)"; return 1 ;; esac; return 0; }
status=0
fail() { say "FAILED: $*"; status=1; }

if want install; then
  if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    say "install: torch sees no CUDA device; installing a CUDA build of torch"
    "$PY" -m pip install -q "torch>=2.5,<2.14" || fail "pip install torch"
  fi
  if [ -n "${FOLD_WHEELHOUSE:-}" ]; then
    say "install: wheels from $FOLD_WHEELHOUSE into /tmp/fold-site (no dependencies resolved)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/fold-site \
      "$FOLD_WHEELHOUSE"/*.whl || fail "wheelhouse install"
    export PYTHONPATH="$PYTHONPATH:/tmp/fold-site"
  elif ! "$PY" -c 'import ray, mlflow, nltk, pytest' 2>/dev/null; then
    say "install: the project's dependencies (pip install -e '.[test]')"
    "$PY" -m pip install -q -e '.[test]' || fail "pip install -e .[test]"
  fi
fi
"$PY" - "$OUT_DIR/system.json" <<'EOF' || { say "no CUDA device usable from $PY (see above): nothing to check"; exit 1; }
import json, subprocess, sys, torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
info = {"gpu": torch.cuda.get_device_name(0), "nvidia_smi": smi, "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": sys.version.split()[0]}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)
EOF
HAVE_MLFLOW=0
"$PY" -c 'import mlflow' 2>/dev/null && HAVE_MLFLOW=1
MLFLOW_FLAG=()
[ "$HAVE_MLFLOW" = 1 ] || MLFLOW_FLAG=(--no-mlflow)

if want tests; then
  # the files that hold gpu-marked tests (collecting only them needs no RDKit)
  mapfile -t GPU_TESTS < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
  say "tests: pytest -m gpu ${GPU_TESTS[*]}"
  "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT_DIR/pytest.xml" "${GPU_TESTS[@]}" \
    2>&1 | tee "$OUT_DIR/pytest.log" | tail -25
  [ "${PIPESTATUS[0]}" = 0 ] || fail "gpu tests (see $OUT_DIR/pytest.log)"
fi
if want table1; then
  say "table1: vector 1024, 128 leaves, on cuda"
  if [ "$QUICK" = 1 ]; then T1=(--batch-sizes 1,32,256,1024 --repeats 3); else T1=(--batch-sizes 1,32,64,128,256,512,1024 --repeats 3); fi
  "$PY" -m benchmarks.table1 --device cuda --vector 1024 --leaves 128 --max-call-rows 0 \
    --schedulers depth,coalesce "${T1[@]}" --out "$OUT_DIR/table1_gpu.json" "${MLFLOW_FLAG[@]}" \
    >"$OUT_DIR/table1.log" 2>&1 || fail "table1 (see $OUT_DIR/table1.log)"
  tail -40 "$OUT_DIR/table1.log"
fi
if want sst; then
  say "sst: SST Tree-LSTM training and inference on cuda"
  REPS=3; [ "$QUICK" = 1 ] && REPS=2
  "$PY" -m benchmarks.sst_device --device cuda --batches 25,100,1024 --repeats "$REPS" \
    --out "$OUT_DIR/sst_gpu.json" "${MLFLOW_FLAG[@]}" >"$OUT_DIR/sst.log" 2>&1 || fail "sst (see $OUT_DIR/sst.log)"
  tail -20 "$OUT_DIR/sst.log"
fi
if want util; then
  say "util: Tai-preset pipeline run with ray.use_gpu=true"
  EPOCHS=2; [ "$QUICK" = 1 ] && EPOCHS=1
  EMB=()
  [ -n "${FOLD_SST_EMBEDDINGS:-}" ] && EMB=("sst.embeddings=$FOLD_SST_EMBEDDINGS")
  "$PY" -m benchmarks.gpu_utilization --out "$OUT_DIR/gpu_util.json" -- "epochs=$EPOCHS" ray.num_workers=1 \
    "tracking.uri=$MLFLOW_TRACKING_URI" "ray.storage_path=${TMPDIR:-/tmp}/fold-gpu-check-ray" "${EMB[@]}" \
    >"$OUT_DIR/util.log" 2>&1 || fail "util (see $OUT_DIR/util.log)"
  tail -30 "$OUT_DIR/util.log"
fi
"$PY" -m benchmarks.gpu_report "$OUT_DIR" || fail "report"
say "done: $OUT_DIR/gpu_report.md (exit $status)"
exit "$status"

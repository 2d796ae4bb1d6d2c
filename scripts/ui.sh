#!/usr/bin/env bash
# The MLflow UI over this checkout's store: bash scripts/ui.sh [--port N] [--store URI]
#
# Uses the project's own mlflow (.venv/bin/mlflow, so no activated venv is needed; FOLD_PYTHON's or
# PATH's mlflow otherwise), binds to 127.0.0.1 only, and serves MLFLOW_TRACKING_URI or the
# repository's sqlite:///mlflow.db (the store scripts/reproduce.sh and the pipelines write by
# default). Open the printed address in a browser; Ctrl-C stops it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT=5000
STORE="${MLFLOW_TRACKING_URI:-sqlite:///$ROOT/mlflow.db}"
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT="$2"; shift ;;
    --store) STORE="$2"; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "ui.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -x "$ROOT/.venv/bin/mlflow" ]; then
  MLFLOW="$ROOT/.venv/bin/mlflow"
elif [ -n "${FOLD_PYTHON:-}" ] && [ -x "$(dirname "$FOLD_PYTHON")/mlflow" ]; then
  MLFLOW="$(dirname "$FOLD_PYTHON")/mlflow"
else
  MLFLOW="$(command -v mlflow || true)"
fi
[ -n "$MLFLOW" ] || { echo "ui.sh: no mlflow found: run bash scripts/test.sh or bash scripts/reproduce.sh first (they install .venv)" >&2; exit 1; }
# workflowType=machine_learning: MLflow 3.17 opens in its GenAI view otherwise
echo "MLflow UI for $STORE at http://127.0.0.1:$PORT/#/experiments?workflowType=machine_learning (Ctrl-C stops it)" >&2
exec "$MLFLOW" ui --backend-store-uri "$STORE" --host 127.0.0.1 --port "$PORT"

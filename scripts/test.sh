#!/usr/bin/env bash
# Run the test suite: bash scripts/test.sh [pytest args...]
#
# Self-sufficient on a fresh machine: when .venv is missing (or pyproject.toml changed since it
# was installed) it creates it with python3.11 and installs torch==2.13.0 first (a CPU build; an
# unpinned torch would pull a multi-GB CUDA build), then the project with its test extra.
# Set FOLD_USE_CURRENT_PYTHON=1 to skip the venv and use `python3` as it is (deps installed).
# FOLD_DATA_DIR defaults to ../shared/data. Exits non-zero on failure, and also when pytest
# collects no tests (exit code 5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SCRIPT_NAME=test.sh
# shellcheck source=scripts/_venv.sh
source "$ROOT/scripts/_venv.sh"

say "running: $PY -m pytest -q $* (FOLD_DATA_DIR=${FOLD_DATA_DIR:-<unset>})"
t0=$SECONDS
set +e
"$PY" -m pytest -q "$@"
rc=$?
set -e
say "pytest finished in $((SECONDS - t0))s with exit code $rc"
if [ "$rc" -eq 5 ]; then
  say "ERROR: pytest collected no tests (exit code 5); treating that as a failure"
fi
exit "$rc"

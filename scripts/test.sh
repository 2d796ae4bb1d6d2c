#!/usr/bin/env bash
# Run the test suite: bash scripts/test.sh [pytest args...]
# Without arguments: the whole suite, as two pytest runs on two processes each (the fast tier,
# then the integration tests); with arguments: one pytest run with them.
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

# pytest [args]: one run; 5 (no test collected) is a failure too
run_pytest() {
  say "running: $PY -m pytest -q $* (FOLD_DATA_DIR=${FOLD_DATA_DIR:-<unset>})"
  local t0=$SECONDS rc
  set +e
  "$PY" -m pytest -q "$@"
  rc=$?
  set -e
  say "pytest finished in $((SECONDS - t0))s with exit code $rc"
  if [ "$rc" -eq 5 ]; then
    say "ERROR: pytest collected no tests (exit code 5); treating that as a failure"
  fi
  return "$rc"
}

if [ $# -gt 0 ]; then
  run_pytest "$@"
  exit $?
fi
# Everything, in two runs: the tests that start no Ray, MLflow server or main job (the fast tier,
# `-m "not integration"`) on two processes (pytest-xdist), then the integration tests on two
# processes, a test file to one process whole and every file with a `fault` test to the same one
# (tests/conftest.py; docs/quickstart.md). Both always run.
t_all=$SECONDS
rc=0
run_pytest -m "not integration" -n 2 || rc=$?
run_pytest -m integration -n 2 --dist loadfile --no-loadscope-reorder || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
say "both runs finished in $((SECONDS - t_all))s with exit code $rc"
exit "$rc"

# Sourced by scripts/test.sh and scripts/reproduce.sh (with ROOT set and the cwd at ROOT).
# Picks the Python to use, installing the project into .venv when needed, and sets PY, PATH
# and FOLD_DATA_DIR (python -m pipelines.datadir: the rule the Python code follows).  .venv is
# (re)installed when missing or when pyproject.toml changed: torch==2.13.0 FIRST (a CPU build;
# an unpinned torch would pull a multi-GB CUDA build), then the project with its test extra.
# FOLD_USE_CURRENT_PYTHON=1 uses `python3` as it is.

say() { printf '[%s] %s\n' "${SCRIPT_NAME:-foldengine}" "$*" >&2; }
quiet_pip() {  # pip, minus this machine's notes about missing local index dirs
  "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }
}
# heartbeat LABEL CMD...: say LABEL, run CMD, and while it runs say "LABEL (Ns)" every
# FOLD_HEARTBEAT_S seconds (default 60); return CMD's exit status.
heartbeat() {
  local label=$1 every=${FOLD_HEARTBEAT_S:-60} rc=0 hb
  shift
  say "$label"
  ( n=0; while sleep "$every"; do n=$((n + every)); say "$label (${n}s)"; done ) &
  hb=$!
  "$@" || rc=$?
  kill "$hb" 2>/dev/null || true
  wait "$hb" 2>/dev/null || true
  return "$rc"
}

install_venv() {
  local py
  py="$(command -v python3.11 || true)"
  if [ -z "$py" ]; then
    py="$(command -v python3)"
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { say "Python >= 3.11 is required"; exit 1; }
  fi
  local t0=$SECONDS
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $py"
    "$py" -m venv .venv
  fi
  heartbeat "installing torch==2.13.0 (CPU build) into .venv" \
    quiet_pip .venv/bin/python -m pip install -q torch==2.13.0
  heartbeat "installing foldengine with Ray, MLflow, RDKit and its test tools (pip install -e '.[test]')" \
    quiet_pip .venv/bin/python -m pip install -q -e '.[test]'
  sha256sum pyproject.toml >.venv/.foldengine-installed
  say "install took $((SECONDS - t0))s"
}

if [ "${FOLD_USE_CURRENT_PYTHON:-0}" = 1 ]; then
  PY="$(command -v python3)"
elif [ -n "${VIRTUAL_ENV:-}" ] && [ "$VIRTUAL_ENV" != "$ROOT/.venv" ]; then
  PY="$VIRTUAL_ENV/bin/python"   # the caller's own activated venv
else
  if [ ! -x .venv/bin/python ] || ! sha256sum -c --status .venv/.foldengine-installed 2>/dev/null; then
    install_venv
  fi
  PY="$ROOT/.venv/bin/python"
fi

# The data directory by pipelines.datadir's rule ($FOLD_DATA_DIR, else ../shared/data beside the
# checkout when it exists, else none: the download cache), absolute; unset when there is none.
FOLD_DATA_DIR="$("$PY" -m pipelines.datadir)"
if [ -n "$FOLD_DATA_DIR" ]; then export FOLD_DATA_DIR; else unset FOLD_DATA_DIR; fi
# Console scripts (ray, mlflow) of that Python come first on PATH.
PATH="$(dirname "$PY"):$PATH"
export PATH

#!/usr/bin/env bash
# The documentation site (MkDocs + mkdocs-material + mkdocstrings; pages in docs/, mkdocs.yml).
#
#   bash scripts/docs.sh build [mkdocs args...]   # strict build into build/site (a warning fails)
#   bash scripts/docs.sh serve [mkdocs args...]   # live preview on http://127.0.0.1:8000
#   bash scripts/docs.sh test  [pytest args...]   # run every page's code blocks + the strict build
#
# Uses .venv like scripts/test.sh (created or updated when missing or when pyproject.toml
# changed; the test extra includes the docs tools). FOLD_USE_CURRENT_PYTHON=1 uses `python3`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

SCRIPT_NAME=docs.sh
# shellcheck source=scripts/_venv.sh
source "$ROOT/scripts/_venv.sh"

export NO_MKDOCS_2_WARNING=1   # mkdocs-material's banner about its successor
cmd="${1:-build}"
[ $# -gt 0 ] && shift
if ! "$PY" -c "import mkdocs, material, mkdocstrings" 2>/dev/null; then
  say "installing the docs tools (pip install -e '.[docs]')"
  quiet_pip "$PY" -m pip install -q -e '.[docs]'
fi
case "$cmd" in
  build) exec "$PY" -m mkdocs build --strict "$@" ;;
  serve) exec "$PY" -m mkdocs serve "$@" ;;
  test)  exec "$PY" -m pytest -q tests/docs "$@" ;;
  -h|--help) sed -n '2,9p' "$0" ;;
  *) say "unknown command '$cmd' (build, serve or test)"; exit 2 ;;
esac

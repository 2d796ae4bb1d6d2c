#!/usr/bin/env bash
# Builds DyNet 2.1.2 (C++ with autobatching) from its PyPI sdist into the project's Python, for the
# optional DyNet variant of python -m benchmarks.peers.  PyPI has no DyNet wheel for Python 3.11 and the
# sdist's setup.py downloads Eigen from the internet; here Eigen comes from Debian instead.
#
#   bash scripts/install_dynet.sh            # about 7 minutes on 2 cores
#
# Needs: root (or sudo) for apt-get install libeigen3-dev; cmake, make and g++; PyPI; numpy in the
# target Python.  Installs cython<3, setuptools and wheel into a scratch directory (build only); never
# touches torch.  DyNet's release flags use -march=native: the library is built for this machine's CPU.
# Measured here: 7 min 22 s into a fresh venv holding only numpy.
# FOLD_PYTHON: the Python to install into (default <repo>/.venv/bin/python, else python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${FOLD_PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
say() { printf '[install_dynet] %s\n' "$*" >&2; }

if "$PY" -c 'import dynet' >/dev/null 2>&1; then
  say "dynet already imports in $PY"; exit 0
fi
EIGEN="${EIGEN3_INCLUDE_DIR:-/usr/include/eigen3}"
if [ ! -f "$EIGEN/Eigen/Core" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  say "installing Eigen headers (libeigen3-dev)"
  $SUDO apt-get install -y -q libeigen3-dev >/dev/null
fi
for tool in cmake make g++; do
  command -v "$tool" >/dev/null || { say "missing $tool (apt-get install cmake build-essential)"; exit 1; }
done
WORK="$(mktemp -d /tmp/dynet_build.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
say "building in $WORK with $PY"
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK" "dyNET==2.1.2"
"$PY" -c 'import numpy' 2>/dev/null || { say "numpy must import in $PY (the project's venv has it)"; exit 1; }
# build-only tools (the sdist builds without isolation so that it sees numpy): into a scratch dir
"$PY" -m pip install -q --target "$WORK/pydeps" "cython<3" setuptools wheel
tar xzf "$WORK"/dyNET-2.1.2.tar.gz -C "$WORK"
(cd "$WORK/dyNET-2.1.2" &&
  EIGEN3_INCLUDE_DIR="$EIGEN" MAKE_FLAGS="-j$(nproc)" PYTHONPATH="$WORK/pydeps" \
    "$PY" -m pip install -q --no-build-isolation --no-deps --no-cache-dir .)
"$PY" -c 'import dynet_config; dynet_config.set(autobatch=1); import dynet; print("dynet", "imports with autobatching")'

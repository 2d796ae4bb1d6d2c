#!/usr/bin/env bash
# Makes dgllife's own interpreter for the Tox21 peer benchmark (python -m benchmarks.tox21_peers
# --dgllife-python <venv>/bin/python): dgl and dgllife need a torch of their own, so they live in
# a venv beside the project's and run as a separate process (benchmarks/dgllife_weave.py).
#
#   bash scripts/make_dgllife_venv.sh              # .venv-dgllife: torch 2.2.1, dgl 2.1.0 (the newest dgl on PyPI)
#   bash scripts/make_dgllife_venv.sh dgl1         # .venv-dgllife-dgl1: the project's torch 2.13.0 (CPU), dgl 1.1.3
#
# dgl 2.1.0's graphbolt is built for torch <= 2.2.1, and PyPI's torch 2.2.1 for Linux is the CUDA
# build: about 4 GB in the venv (it runs on the CPU here). dgl 1.1.3 has no graphbolt and imports
# with torch 2.13.0 (its tensoradapter is built for torch <= 2.1, so it falls back to its own
# allocator): 1 GB, from this machine's torch file. The benchmark measures whichever you give it;
# give both (--dgllife-python A,B) to take the faster.
# DGLLIFE_VENV: the venv's path (default as above). Needs python3.11 and PyPI.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FLAVOUR="${1:-dgl2}"
say() { printf '[make_dgllife_venv] %s\n' "$*" >&2; }
case "$FLAVOUR" in
  dgl2) VENV="${DGLLIFE_VENV:-$ROOT/.venv-dgllife}"
        TORCH=(torch==2.2.1 "numpy<2")
        # torchdata 0.7 (its datapipes) and pydantic are imported by dgl 2.1's graphbolt
        REST=(dgl==2.1.0 dgllife==0.3.2 rdkit torchdata==0.7.1 pydantic packaging pyyaml pandas scikit-learn scipy
              "numpy<2" torch==2.2.1) ;;
  dgl1) VENV="${DGLLIFE_VENV:-$ROOT/.venv-dgllife-dgl1}"
        TORCH=(torch==2.13.0)
        REST=(dgl==1.1.3 dgllife==0.3.2 rdkit packaging pyyaml pandas scikit-learn scipy torch==2.13.0) ;;
  *) say "unknown flavour '$FLAVOUR' (dgl2 or dgl1)"; exit 2 ;;
esac
PY="$VENV/bin/python"
check='import torch, dgl, dgllife, rdkit; print(f"torch {torch.__version__}, dgl {dgl.__version__}, dgllife {dgllife.__version__}")'
if [ -x "$PY" ] && DGLBACKEND=pytorch "$PY" -c "$check" >/dev/null 2>&1; then
  say "dgllife already imports in $PY"; echo "$PY"; exit 0
fi
say "making $VENV ($FLAVOUR)"
python3.11 -m venv "$VENV"
"$PY" -m pip install -q "${TORCH[@]}"        # torch first, pinned: nothing else may pick another one
"$PY" -m pip install -q "${REST[@]}"
DGLBACKEND=pytorch "$PY" -c "$check" >&2
echo "$PY"

#!/usr/bin/env bash
# Stop the Ray head and MLflow server started by scripts/cluster_up.sh from the same state dir
# ($FOLD_CLUSTER_DIR, default .cluster/). Only those processes are signalled (by pid/session id),
# never other Ray or MLflow processes on the machine. Safe to run when nothing is running.
# The MLflow store (mlflow.db, mlartifacts/) and logs stay in the state dir.
set -euo pipefail
# shellcheck source=scripts/_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

ray_marker=""
[ -s "$FOLD_CLUSTER_DIR/ray_temp_dir" ] && ray_marker="$(cat "$FOLD_CLUSTER_DIR/ray_temp_dir")/"

fold_stop_service mlflow
fold_stop_service ray "$ray_marker"
rm -f "$FOLD_CLUSTER_DIR/ray_agent.port"   # chosen afresh at each start

for p in "$FOLD_RAY_PORT" "$FOLD_RAY_DASHBOARD_PORT" "$FOLD_MLFLOW_PORT"; do
  if fold_port_in_use "$p"; then
    fold_log "warning: port $p still answers on 127.0.0.1 (another process, not from $FOLD_CLUSTER_DIR?)"
  fi
done
fold_log "cluster down (state kept in $FOLD_CLUSTER_DIR)"

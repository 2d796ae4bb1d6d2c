#!/usr/bin/env bash
# Submit an experiment to the Ray cluster started by scripts/cluster_up.sh, follow its logs,
# and exit with its status (0 only when the job SUCCEEDED).
#
#   bash scripts/submit.sh EXPERIMENT [key=value ...]
#   bash scripts/submit.sh some.module.path [args ...]     # python -m some.module.path args
#   bash scripts/submit.sh --raw -- COMMAND [args ...]     # any command, run in the job's working dir
#
# EXPERIMENT            entry point (run in the job)
#   sst                 python -m pipelines.training       --config conf/sst_treelstm.yaml (or conf/sst.yaml)
#   sst_tai2015         python -m pipelines.training       --config conf/sst_tai2015.yaml
#   tox21               python -m pipelines.training --config conf/molecules_tox21.yaml
#   esol                python -m pipelines.training --config conf/molecules_esol.yaml (or conf/esol.yaml)
#   table1              python -m benchmarks.table1          --config conf/bench_table1.yaml
#   predict             python -m pipelines.predict --model URI --input FILES --output DIR (batch inference)
#   sweep               python -m pipelines.sweep --config CONF --seeds N | --search KEY=KIND(ARGS) ... (Ray Tune)
# key=value overrides are passed through after the config; the first existing config file listed
# is used, or FOLD_CONFIG=conf/other.yaml.
#
# The job gets the repository as its working dir (without .git, .venv, .cluster, mlruns, ...) and
# the environment variables MLFLOW_TRACKING_URI (the cluster's MLflow server, or
# FOLD_MLFLOW_TRACKING_URI) and FOLD_DATA_DIR (absolute; default ../shared/data when it exists:
# python -m pipelines.datadir). The pipelines' entry points are checked locally first (their
# --check: the config and data files, predict's inputs and output): a missing file is not submitted.
# Other settings: see scripts/_common.sh. Ctrl-C stops the job too.
set -euo pipefail

usage() { sed -n '2,25p' "$0"; }

[ $# -ge 1 ] || { usage >&2; exit 2; }

# shellcheck source=scripts/_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
cd "$FOLD_REPO_ROOT"

experiment_cmd() {  # MODULE CONFIG [ALTERNATIVE_CONFIG ...] (first existing file wins)
  local target=$1 config="" c
  shift
  if [ -n "${FOLD_CONFIG:-}" ]; then
    config=$FOLD_CONFIG
  else
    for c in "$@"; do
      if [ -f "$c" ]; then config=$c; break; fi
    done
  fi
  [ -n "$config" ] && [ -f "$config" ] || fold_die "no config file for this experiment in $FOLD_REPO_ROOT (looked for: ${FOLD_CONFIG:-$*}); set FOLD_CONFIG=conf/....yaml"
  CMD=(python -m "$target" --config "$config")
}

CMD=()
case "$1" in
  -h|--help) usage; exit 0 ;;
  --raw)
    shift
    [ "${1:-}" = "--" ] && shift
    [ $# -ge 1 ] || fold_die "--raw needs a command: submit.sh --raw -- COMMAND [args]"
    CMD=("$@"); set -- ;;
  sst)         shift; experiment_cmd pipelines.training conf/sst_treelstm.yaml conf/sst.yaml ;;
  sst_tai2015) shift; experiment_cmd pipelines.training conf/sst_tai2015.yaml ;;
  tox21)       shift; experiment_cmd pipelines.training conf/molecules_tox21.yaml conf/molecules_weave.yaml conf/tox21.yaml ;;
  esol)        shift; experiment_cmd pipelines.training conf/molecules_esol.yaml conf/esol.yaml ;;
  table1)      shift; experiment_cmd benchmarks.table1 conf/bench_table1.yaml ;;
  predict)     shift; CMD=(python -m pipelines.predict) ;;
  sweep)       shift; CMD=(python -m pipelines.sweep) ;;
  -*) fold_die "unknown option $1 (see --help)" ;;
  *.*)
    mod=$1; shift
    [[ "$mod" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$ ]] || fold_die "not a module path: $mod"
    CMD=(python -m "$mod") ;;
  *) fold_die "unknown experiment '$1' (sst, sst_tai2015, tox21, esol, table1, predict, sweep, a module path, or --raw -- CMD)" ;;
esac
CMD+=("$@")

# ---------------------------------------------------------------- local checks
# The job's data directory: pipelines.datadir's rule ($FOLD_DATA_DIR, else ../shared/data beside
# the checkout when it exists), absolute; empty: none (the job's download cache).
DATA_DIR="$("$FOLD_PYTHON" -m pipelines.datadir)"
# A pipelines entry point first runs its own checks here (--check: the config and the data files
# with the job's FOLD_DATA_DIR; predict: its --input files and --output), so that a missing file
# stops the submission in seconds with the entry point's one line, before anything is sent.
if [ "${CMD[0]}" = python ] && [ "${CMD[1]:-}" = -m ]; then
  case "${CMD[2]:-}" in
    pipelines.training|pipelines.sst.train|pipelines.molecules.train|pipelines.sweep|pipelines.predict)
      check_rc=0
      FOLD_DATA_DIR="$DATA_DIR" "$FOLD_PYTHON" "${CMD[@]:1}" --check >&2 || check_rc=$?
      if [ "$check_rc" -ne 0 ]; then
        fold_log "not submitted: the local check of ${CMD[2]} failed (exit status $check_rc)"
        exit "$check_rc"
      fi ;;
  esac
fi

# ---------------------------------------------------------------- environment for the job
fold_ray_client_env
if [ "$(fold_http_status "$FOLD_DASHBOARD_URL/api/version" token)" != 200 ]; then
  fold_die "no Ray dashboard answers at $FOLD_DASHBOARD_URL: run 'bash scripts/cluster_up.sh' first"
fi

TRACKING_URI="${FOLD_MLFLOW_TRACKING_URI:-$FOLD_MLFLOW_URL}"
if [ -z "${FOLD_MLFLOW_TRACKING_URI:-}" ] && [ "$(fold_http_status "$FOLD_MLFLOW_URL/health")" != 200 ]; then
  fold_log "warning: no MLflow server answers at $FOLD_MLFLOW_URL; the job's MLflow logging will fail"
fi
SUBMISSION_ID="${FOLD_SUBMISSION_ID:-fold_$(date +%Y%m%d_%H%M%S)_$$}"
RUNTIME_ENV_JSON="$("$FOLD_PYTHON" - "$TRACKING_URI" "$DATA_DIR" <<'PY'
import json, sys
tracking_uri, data_dir = sys.argv[1], sys.argv[2]
env = {"MLFLOW_TRACKING_URI": tracking_uri}
if data_dir:
    env["FOLD_DATA_DIR"] = data_dir
print(json.dumps({
    "excludes": [".git", ".venv", ".cluster", "mlruns", "mlflow.db", "mlartifacts", "__pycache__",
                 "*.pyc", ".pytest_cache", ".hypothesis"],
    "env_vars": env,
}))
PY
)"

fold_log "submitting $SUBMISSION_ID to $FOLD_DASHBOARD_URL: ${CMD[*]}"
# Ray's own hints below (`ray job logs <id>` ...) leave out the address this cluster needs:
fold_log "its logs later: $(fold_tool ray) job logs --address $FOLD_DASHBOARD_URL $SUBMISSION_ID (status: job status, stop: job stop, same --address)"
fold_log "MLFLOW_TRACKING_URI=$TRACKING_URI FOLD_DATA_DIR=${DATA_DIR:-<unset>}"

RAY_BIN="$(fold_tool ray)"
stop_job() {
  fold_log "interrupted: stopping job $SUBMISSION_ID"
  "$RAY_BIN" job stop --address "$FOLD_DASHBOARD_URL" "$SUBMISSION_ID" >/dev/null 2>&1 || true
  exit 130
}
trap stop_job INT TERM

# ray job submit waits for the job and streams its logs (no --no-wait).
# ray quotes each word (shlex.join), so arguments reach the job unchanged; for shell syntax
# use: submit.sh --raw -- bash -c '...'
# Ray's CLI notices (the server address, "submitted successfully", "Next steps" with commands that
# lack this cluster's --address, the working-dir packaging lines, "Tailing logs", the closing
# banner) are dropped: the lines above say the same. Its errors (ERR) and the job's output stay.
RAY_CLI_NOTICE=$'^[0-9-]+ [0-9:,]+\t(INFO|SUCC|WARNING) (cli|working_dir|packaging|dashboard_sdk|sdk|job_manager)\\.py:[0-9]+ -- |^Running entrypoint for job '
set +e
"$RAY_BIN" job submit \
    --address "$FOLD_DASHBOARD_URL" \
    --submission-id "$SUBMISSION_ID" \
    --working-dir . \
    --runtime-env-json "$RUNTIME_ENV_JSON" \
    -- "${CMD[@]}" 2>&1 | grep --line-buffered -vE "$RAY_CLI_NOTICE"
submit_rc=${PIPESTATUS[0]}
set -e
trap - INT TERM

# `ray job submit` exits 1 on FAILED but 0 on STOPPED; ask for the final status to be sure.
STATUS="$(fold_http_json_field "$FOLD_DASHBOARD_URL/api/jobs/$SUBMISSION_ID" status token)"
fold_log "job $SUBMISSION_ID finished: status $STATUS (ray job submit exit code $submit_rc)"
if [ "$STATUS" = SUCCEEDED ] && [ "$submit_rc" -eq 0 ]; then
  exit 0
fi
exit 1

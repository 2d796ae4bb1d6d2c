#!/usr/bin/env bash
# Start a local Ray head (dashboard + job API on 127.0.0.1) and an MLflow tracking server.
#
#   bash scripts/cluster_up.sh [--host ADDRESS] [--auth disabled|token] [--num-cpus N]
#
# Idempotent: services already running from the same state dir are left alone.
# Settings (ports, state dir, auth mode, ...) come from the environment: see scripts/_common.sh.
# State in $FOLD_CLUSTER_DIR (default .cluster/): *.pid, *.port, logs/, mlflow.db, mlartifacts/.
#
# Network: by default (--host 127.0.0.1) every port the Ray head and MLflow open listens on
# 127.0.0.1 only. --host ADDRESS (or FOLD_RAY_HOST) with a non-loopback address, for worker nodes
# on other machines, makes Ray's ports listen off loopback (see docs/cluster.md, "Network exposure"); the
# dashboard / job API and MLflow stay on 127.0.0.1.
# Auth: Ray 2.60 can require a token on its dashboard/job API and its RPC services. Default:
# disabled on loopback (a single-user machine), token for a non-loopback --host. With
# --auth token (or FOLD_RAY_AUTH_MODE=token) the head requires a token: RAY_AUTH_TOKEN or
# RAY_AUTH_TOKEN_PATH if set, else one generated into $FOLD_CLUSTER_DIR/ray_auth_token (mode 600).
# scripts/submit.sh passes it automatically; other clients need RAY_AUTH_MODE=token and the token.
# Ray's temp dir lives in a private directory (mode 0700): see FOLD_RAY_TEMP_DIR in _common.sh.
set -euo pipefail

while [ $# -gt 0 ]; do
  case "$1" in
    --auth) FOLD_RAY_AUTH_MODE="$2"; shift 2 ;;
    --auth=*) FOLD_RAY_AUTH_MODE="${1#*=}"; shift ;;
    --host) FOLD_RAY_HOST="$2"; shift 2 ;;
    --host=*) FOLD_RAY_HOST="${1#*=}"; shift ;;
    --num-cpus) FOLD_RAY_NUM_CPUS="$2"; shift 2 ;;
    --num-cpus=*) FOLD_RAY_NUM_CPUS="${1#*=}"; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

# shellcheck source=scripts/_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

LOG_DIR="$FOLD_CLUSTER_DIR/logs"
mkdir -p "$LOG_DIR" "$FOLD_CLUSTER_DIR/mlartifacts"

# Ray's temp root holds its unix sockets (whose full path must stay under ~107 bytes) and Ray
# makes it and its subdirectories world-writable (0777), so it lives inside a private directory:
# FOLD_RAY_TEMP_DIR if set (created 0700, or else it must be ours and 0700), else the one recorded
# by an earlier start if it still is private, else a fresh `mktemp -d` (0700) under /tmp.
# Sets RAY_TEMP_ROOT, the --temp-dir given to Ray.
choose_ray_temp_dir() {
  local recorded=""
  [ -s "$FOLD_CLUSTER_DIR/ray_temp_dir" ] && recorded="$(cat "$FOLD_CLUSTER_DIR/ray_temp_dir")"
  if [ -n "${FOLD_RAY_TEMP_DIR:-}" ]; then
    case "$FOLD_RAY_TEMP_DIR" in /*) ;; *) fold_die "FOLD_RAY_TEMP_DIR must be an absolute path" ;; esac
    [ -e "$FOLD_RAY_TEMP_DIR" ] || mkdir -m 700 -p "$FOLD_RAY_TEMP_DIR"
    fold_private_dir "$FOLD_RAY_TEMP_DIR" || fold_die "FOLD_RAY_TEMP_DIR=$FOLD_RAY_TEMP_DIR must be a directory of yours with mode 0700 (not a link): Ray makes its temp dir world-writable inside it"
  elif [ -n "$recorded" ] && fold_private_dir "$recorded"; then
    FOLD_RAY_TEMP_DIR="$recorded"
  else
    FOLD_RAY_TEMP_DIR="$(mktemp -d /tmp/fold-ray.XXXXXXXX)"
  fi
  RAY_TEMP_ROOT="$FOLD_RAY_TEMP_DIR/ray"
}

wait_for_log() {  # WHAT LOGFILE TEXT PIDFILE -> waits until TEXT appears in LOGFILE
  local what=$1 log=$2 text=$3 pidfile=$4 start
  start=$(date +%s)
  until grep -qF -- "$text" "$log" 2>/dev/null; do
    if ! fold_pid_alive "$pidfile"; then
      fold_log "$what exited while starting; last lines of $log:"
      tail -n 30 "$log" >&2 || true
      return 1
    fi
    if [ $(( $(date +%s) - start )) -ge "$FOLD_READY_TIMEOUT" ]; then
      fold_log "$what did not report '$text' within ${FOLD_READY_TIMEOUT}s; last lines of $log:"
      tail -n 30 "$log" >&2 || true
      return 1
    fi
    sleep 1
  done
}

wait_for() {  # WHAT URL PIDFILE [with-token] -> waits for HTTP 200
  local what=$1 url=$2 pidfile=$3 tok=${4:-} start code
  start=$(date +%s)
  while :; do
    code="$(fold_http_status "$url" ${tok:+"$tok"})"
    [ "$code" = 200 ] && return 0
    if ! fold_pid_alive "$pidfile"; then
      fold_log "$what exited while starting; last lines of its log:"
      tail -n 30 "$LOG_DIR/$(basename "$pidfile" .pid).log" >&2 || true
      return 1
    fi
    if [ $(( $(date +%s) - start )) -ge "$FOLD_READY_TIMEOUT" ]; then
      fold_log "$what did not answer $url with 200 within ${FOLD_READY_TIMEOUT}s (last status $code)"
      tail -n 30 "$LOG_DIR/$(basename "$pidfile" .pid).log" >&2 || true
      return 1
    fi
    sleep 1
  done
}

# ---------------------------------------------------------------- Ray head
# Ready means: `ray start` finished starting every process (a dashboard can answer before the
# raylet has failed to start), the dashboard and its job API answer, and the head's dashboard
# agent, which runs submitted jobs, is registered (else submissions fail with
# "No available agent to submit job", seen on loaded machines).
ray_ready() {  # PIDFILE
  local pidfile=$1
  wait_for_log "Ray head" "$LOG_DIR/ray.log" "Ray runtime started." "$pidfile" || return 1
  wait_for "Ray dashboard" "$FOLD_DASHBOARD_URL/api/version" "$pidfile" token || return 1
  wait_for "Ray job API" "$FOLD_DASHBOARD_URL/api/jobs/" "$pidfile" token || return 1
  "$FOLD_PYTHON" - "127.0.0.1:$FOLD_RAY_PORT" "$FOLD_READY_TIMEOUT" <<'PY' || return 1
import sys, time
address, timeout = sys.argv[1], float(sys.argv[2])
try:
    from ray._raylet import GcsClient
    client = GcsClient(address=address)
except Exception as e:  # private API: never block start-up on it
    print(f"(could not check the job agent: {e})", file=sys.stderr)
    sys.exit(0)
deadline = time.time() + timeout
while time.time() < deadline:
    try:
        if client.internal_kv_keys(b"DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX:", b"dashboard", timeout=5):
            sys.exit(0)
    except Exception:
        pass
    time.sleep(1)
print(f"the Ray job agent did not register within {timeout:.0f}s", file=sys.stderr)
sys.exit(1)
PY
}

# Ray's worker port range (ray start's defaults for --min-worker-port / --max-worker-port).
RAY_MIN_WORKER_PORT=10002
RAY_MAX_WORKER_PORT=19999

forget_ports() {  # a failed start leaves no port files behind for the next start to reuse
  rm -f "$FOLD_CLUSTER_DIR"/{ray,dashboard,ray_client,ray_agent}.port "$FOLD_CLUSTER_DIR/ray_host" \
        "$FOLD_CLUSTER_DIR/ray_temp_dir"
}

start_ray() {
  local pidfile="$FOLD_CLUSTER_DIR/ray.pid"
  if fold_pid_alive "$pidfile"; then
    local saved_mode
    saved_mode="$(cat "$FOLD_CLUSTER_DIR/auth_mode" 2>/dev/null || echo disabled)"
    [ "$saved_mode" = "$FOLD_RAY_AUTH_MODE" ] || \
      fold_log "note: Ray head already runs with auth mode '$saved_mode'; run cluster_down.sh first to change it"
    FOLD_RAY_AUTH_MODE="$saved_mode"
    local saved_host
    saved_host="$(cat "$FOLD_CLUSTER_DIR/ray_host" 2>/dev/null || echo 127.0.0.1)"
    if fold_is_loopback "$FOLD_RAY_HOST"; then [ "$saved_host" = 127.0.0.1 ]; else [ "$saved_host" = "$FOLD_RAY_HOST" ]; fi || \
      fold_log "note: Ray head already listens on '$saved_host'; run cluster_down.sh first to change it"
    fold_ray_client_env
    if [ "$(fold_http_status "$FOLD_DASHBOARD_URL/api/version" token)" = 200 ]; then
      fold_log "Ray head already running (pid $(cat "$pidfile")), dashboard $FOLD_DASHBOARD_URL"
      return 0
    fi
    fold_log "Ray head pid $(cat "$pidfile") runs but its dashboard does not answer yet; waiting"
    ray_ready "$pidfile" || fold_die "Ray head (pid $(cat "$pidfile")) is not ready; see $LOG_DIR/ray.log, or restart it with cluster_down.sh + cluster_up.sh"
    return
  fi
  rm -f "$pidfile"
  # Ray gives its worker processes ports 10002-19999 (ray start --min/--max-worker-port); a
  # service port in that range fails later with Ray's raw error, or collides with a worker.
  local name value
  for name in FOLD_RAY_PORT FOLD_RAY_DASHBOARD_PORT FOLD_RAY_CLIENT_PORT FOLD_RAY_AGENT_PORT; do
    value=${!name:-}
    if [ -n "$value" ] && [ "$value" -ge "$RAY_MIN_WORKER_PORT" ] && [ "$value" -le "$RAY_MAX_WORKER_PORT" ]; then
      forget_ports
      fold_die "$name=$value lies in Ray's worker port range $RAY_MIN_WORKER_PORT-$RAY_MAX_WORKER_PORT; choose a port outside it (defaults: FOLD_RAY_PORT 6379, FOLD_RAY_DASHBOARD_PORT 8265, FOLD_RAY_CLIENT_PORT 10001)"
    fi
  done
  for p in "$FOLD_RAY_PORT" "$FOLD_RAY_DASHBOARD_PORT" "$FOLD_RAY_CLIENT_PORT"; do
    if fold_port_in_use "$p"; then
      fold_die "port $p on 127.0.0.1 is taken by another process (not started from $FOLD_CLUSTER_DIR); free it or choose other ports (FOLD_RAY_PORT / FOLD_RAY_DASHBOARD_PORT / FOLD_RAY_CLIENT_PORT)"
    fi
  done

  # The agent's port is internal; Ray's fixed default (52365) collides with any other Ray
  # instance on the machine (a test's ray.init(), another user), so fall back to a free one.
  if [ -z "${FOLD_RAY_AGENT_PORT:-}" ]; then
    FOLD_RAY_AGENT_PORT=52365
    fold_port_in_use "$FOLD_RAY_AGENT_PORT" && FOLD_RAY_AGENT_PORT="$(fold_free_port)"
  elif fold_port_in_use "$FOLD_RAY_AGENT_PORT"; then
    fold_die "port $FOLD_RAY_AGENT_PORT (FOLD_RAY_AGENT_PORT) is taken by another process"
  fi

  # Where Ray listens. On loopback, Ray 2.60 would still replace 127.0.0.1 by the machine's LAN
  # address (`ray start --node-ip-address 127.0.0.1` is resolved to a "remotely reachable" IP) and
  # then bind its RPC servers, agents and metrics ports to that address or to 0.0.0.0; with
  # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's single-machine mode, its default on macOS) the node
  # IP stays 127.0.0.1 and every Ray port binds to 127.0.0.1.
  local node_ip
  if fold_is_loopback "$FOLD_RAY_HOST"; then
    node_ip=127.0.0.1
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  else
    node_ip=$FOLD_RAY_HOST
  fi

  # A new head's auth mode: the one asked for, else disabled on loopback and token off loopback.
  if [ -n "$FOLD_RAY_AUTH_MODE_GIVEN" ]; then
    FOLD_RAY_AUTH_MODE=$FOLD_RAY_AUTH_MODE_GIVEN
  elif [ "$node_ip" = 127.0.0.1 ]; then
    FOLD_RAY_AUTH_MODE=disabled
  else
    FOLD_RAY_AUTH_MODE=token
    fold_log "Ray listens on $node_ip (not loopback): token auth is ON by default (FOLD_RAY_AUTH_MODE=disabled or --auth disabled turns it off)"
  fi
  if [ "$node_ip" != 127.0.0.1 ] && [ "$FOLD_RAY_AUTH_MODE" = disabled ]; then
    fold_log "WARNING: Ray listens on $node_ip with auth disabled: anyone who reaches this machine's Ray ports can run commands as $(id -un) (e.g. through the dashboard agent's job API on port $FOLD_RAY_AGENT_PORT); use --auth token or a firewall"
  fi

  if [ "$FOLD_RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    if [ ! -s "$FOLD_AUTH_TOKEN_FILE" ]; then
      (umask 077; "$FOLD_PYTHON" -c 'import secrets; print(secrets.token_hex(32), end="")' >"$FOLD_AUTH_TOKEN_FILE")
      fold_log "generated a Ray auth token in $FOLD_AUTH_TOKEN_FILE"
    fi
  fi
  echo "$FOLD_RAY_AUTH_MODE" >"$FOLD_CLUSTER_DIR/auth_mode"
  fold_ray_client_env
  choose_ray_temp_dir

  local ray_bin args
  ray_bin="$(fold_tool ray)"
  args=(start --head --block
        --node-ip-address "$node_ip"
        --port "$FOLD_RAY_PORT"
        --ray-client-server-port "$FOLD_RAY_CLIENT_PORT"
        --dashboard-agent-listen-port "$FOLD_RAY_AGENT_PORT"
        --include-dashboard true
        --dashboard-host 127.0.0.1
        --dashboard-port "$FOLD_RAY_DASHBOARD_PORT"
        --temp-dir "$RAY_TEMP_ROOT"
        --disable-usage-stats)
  [ -n "${FOLD_RAY_NUM_CPUS:-}" ] && args+=(--num-cpus "$FOLD_RAY_NUM_CPUS")
  # Idle worker processes are kept for reuse (pipelines.cluster.WORKER_POOL_CONFIG): each new one
  # imports torch again. Nodes that join the head get the same system config from it.
  args+=(--system-config "$(cd "$FOLD_REPO_ROOT" && "$FOLD_PYTHON" -c 'import json; from pipelines.cluster import WORKER_POOL_CONFIG; print(json.dumps(WORKER_POOL_CONFIG))')")
  # shellcheck disable=SC2206
  [ -n "${FOLD_RAY_EXTRA_ARGS:-}" ] && args+=($FOLD_RAY_EXTRA_ARGS)

  # Jobs run with the head's environment: put this Python's bin dir first on their PATH so
  # an entrypoint's `python` is the one that has the project installed.
  export PATH="$FOLD_BIN:$PATH"
  echo "$FOLD_RAY_PORT" >"$FOLD_CLUSTER_DIR/ray.port"
  echo "$FOLD_RAY_DASHBOARD_PORT" >"$FOLD_CLUSTER_DIR/dashboard.port"
  echo "$FOLD_RAY_CLIENT_PORT" >"$FOLD_CLUSTER_DIR/ray_client.port"
  echo "$FOLD_RAY_AGENT_PORT" >"$FOLD_CLUSTER_DIR/ray_agent.port"
  echo "$FOLD_RAY_TEMP_DIR" >"$FOLD_CLUSTER_DIR/ray_temp_dir"
  echo "$node_ip" >"$FOLD_CLUSTER_DIR/ray_host"
  ln -sfn "$RAY_TEMP_ROOT" "$FOLD_CLUSTER_DIR/ray-temp"

  # `ray start` gives the raylet a fixed 30 s to register; on a busy machine that can fail, so a
  # failed start is retried (FOLD_RAY_START_TRIES, default 2).
  local try tries=${FOLD_RAY_START_TRIES:-2}
  for ((try = 1; try <= tries; try++)); do
    fold_log "starting Ray head (try $try/$tries; listens on $node_ip, auth: $FOLD_RAY_AUTH_MODE, GCS port $FOLD_RAY_PORT, dashboard $FOLD_DASHBOARD_URL)"
    # setsid: the head and everything it spawns share one session, so cluster_down.sh can
    # stop exactly these processes. --block keeps `ray start` alive as the session leader.
    [ -s "$LOG_DIR/ray.log" ] && mv -f "$LOG_DIR/ray.log" "$LOG_DIR/ray.previous.log"
    # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S: on SIGTERM Ray (2.60) first drains the node, waiting up
    # to 30 s for it to go idle, which it never does while a finished job's Ray Data actors
    # (_StatsActor, _AutoscalingCoordinatorActor) live: cluster_down.sh then needed SIGKILL.  The
    # drain lets Serve proxies on Kubernetes finish requests; here it is off unless
    # FOLD_RAY_DRAIN_TIMEOUT_S asks for it.
    RAY_USAGE_STATS_ENABLED=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="${FOLD_RAY_DRAIN_TIMEOUT_S:-0}" \
      setsid "$ray_bin" "${args[@]}" >"$LOG_DIR/ray.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    if ray_ready "$pidfile"; then
      break
    fi
    fold_log "Ray head did not come up: stopping what was started (logs: $LOG_DIR/ray.log, $FOLD_RAY_TEMP_DIR)"
    fold_stop_service ray "$FOLD_RAY_TEMP_DIR/" >/dev/null 2>&1 || true
    if [ "$try" -ge "$tries" ]; then
      forget_ports
      fold_die "Ray head failed to start $tries times; see the logs above"
    fi
  done
  fold_log "Ray head ready (pid $(cat "$pidfile"))"
}

# ---------------------------------------------------------------- MLflow server
start_mlflow() {
  local pidfile="$FOLD_CLUSTER_DIR/mlflow.pid"
  if fold_pid_alive "$pidfile"; then
    if [ "$(fold_http_status "$FOLD_MLFLOW_URL/health")" = 200 ]; then
      fold_log "MLflow server already running (pid $(cat "$pidfile")), $FOLD_MLFLOW_URL"
      return 0
    fi
    fold_log "MLflow server pid $(cat "$pidfile") runs but does not answer yet; waiting"
    wait_for "MLflow server" "$FOLD_MLFLOW_URL/health" "$pidfile" || fold_die "MLflow server is not ready; see $LOG_DIR/mlflow.log"
    return
  fi
  rm -f "$pidfile"
  if fold_port_in_use "$FOLD_MLFLOW_PORT"; then
    fold_die "port $FOLD_MLFLOW_PORT on 127.0.0.1 is taken by another process; free it or set FOLD_MLFLOW_PORT"
  fi
  local mlflow_bin
  mlflow_bin="$(fold_tool mlflow)"
  fold_log "starting MLflow server on $FOLD_MLFLOW_URL (store sqlite:///$FOLD_CLUSTER_DIR/mlflow.db)"
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$mlflow_bin" server \
      --backend-store-uri "sqlite:///$FOLD_CLUSTER_DIR/mlflow.db" \
      --artifacts-destination "$FOLD_CLUSTER_DIR/mlartifacts" --serve-artifacts \
      --host 127.0.0.1 --port "$FOLD_MLFLOW_PORT" --workers 1 \
      >"$LOG_DIR/mlflow.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  echo "$FOLD_MLFLOW_PORT" >"$FOLD_CLUSTER_DIR/mlflow.port"
  if ! wait_for "MLflow server" "$FOLD_MLFLOW_URL/health" "$pidfile"; then
    fold_stop_service mlflow >/dev/null 2>&1 || true
    fold_die "MLflow server did not come up (log: $LOG_DIR/mlflow.log)"
  fi
  fold_log "MLflow server ready (pid $(cat "$pidfile"))"
}

start_ray
start_mlflow

RAY_HOST_NOW="$(cat "$FOLD_CLUSTER_DIR/ray_host" 2>/dev/null || echo 127.0.0.1)"
if [ "$RAY_HOST_NOW" = 127.0.0.1 ]; then
  LISTENS="127.0.0.1 only (every Ray and MLflow port)"
else
  LISTENS="$RAY_HOST_NOW and all interfaces (Ray's RPC and metrics ports; see docs/cluster.md, Network exposure)"
fi
cat <<EOF
Cluster is up (state: $FOLD_CLUSTER_DIR, logs: $FOLD_CLUSTER_DIR/logs)
  Ray listens on              : $LISTENS
  Ray dashboard / job address : $FOLD_DASHBOARD_URL
  Ray GCS address             : $RAY_HOST_NOW:$FOLD_RAY_PORT
  Ray auth mode               : $FOLD_RAY_AUTH_MODE$( [ "$FOLD_RAY_AUTH_MODE" = token ] && printf '  (clients: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=%s)' "${RAY_AUTH_TOKEN_PATH:-\$RAY_AUTH_TOKEN}" )
  MLflow tracking URI / UI    : $FOLD_MLFLOW_URL
Submit with: bash scripts/submit.sh EXPERIMENT [key=value ...]    Stop with: bash scripts/cluster_down.sh
EOF

# shellcheck shell=bash
# Shared settings and helpers for scripts/cluster_up.sh, cluster_down.sh and submit.sh.
# Sourced, never run. Every setting can be overridden from the environment:
#
#   FOLD_CLUSTER_DIR         state dir: pid/port files, logs, MLflow store   (default <repo>/.cluster)
#   FOLD_RAY_PORT            Ray GCS port                                     (default 6379)
#   FOLD_RAY_DASHBOARD_PORT  Ray dashboard + job submission port              (default 8265)
#   FOLD_RAY_CLIENT_PORT     Ray client server port                           (default 10001)
#   FOLD_RAY_AGENT_PORT      dashboard agent HTTP port (runs submitted jobs)  (default 52365, or a
#                            free port when another Ray on this machine holds 52365)
#   FOLD_RAY_NUM_CPUS        CPUs the Ray head offers                         (default: all)
#   FOLD_RAY_HOST            address the Ray head listens on and other nodes reach (default
#                            127.0.0.1: every Ray port on loopback only). A non-loopback address
#                            makes Ray listen off loopback and turns token auth on by default.
#                            (FOLD_RAY_NODE_IP is the older name of this setting.)
#   FOLD_RAY_AUTH_MODE       disabled | token   (default: disabled on loopback, token otherwise)
#   FOLD_RAY_TEMP_DIR        a private dir (yours, mode 0700) holding Ray's temp/session root
#                            (default: a fresh mktemp -d /tmp/fold-ray.XXXXXXXX, recorded in the
#                            state dir and reused by later starts; kept short: unix socket paths)
#   FOLD_RAY_DRAIN_TIMEOUT_S seconds Ray drains the head on SIGTERM before stopping (default 0:
#                            no drain; cluster_down.sh stops an idle or used head in seconds)
#   FOLD_MLFLOW_PORT         MLflow tracking server port                      (default 5000)
#   FOLD_PYTHON              the Python whose ray/mlflow to use   (default <repo>/.venv/bin/python,
#                            else python3 on PATH)
#   FOLD_READY_TIMEOUT       seconds to wait for each service to answer       (default 120)

FOLD_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

fold_log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
fold_die() { fold_log "ERROR: $*"; exit 1; }

FOLD_CLUSTER_DIR="${FOLD_CLUSTER_DIR:-$FOLD_REPO_ROOT/.cluster}"
# A state dir created here is private to the user (it holds the auth token, the MLflow store).
(umask 077; mkdir -p "$FOLD_CLUSTER_DIR")
FOLD_CLUSTER_DIR="$(cd "$FOLD_CLUSTER_DIR" && pwd)"

# A port file written by cluster_up wins over the default, so that submit.sh and
# cluster_down.sh find a cluster started with non-default ports without repeating them.
_fold_port() {  # NAME ENVVAR DEFAULT
  local name=$1 envvar=$2 default=$3
  if [ -n "${!envvar:-}" ]; then echo "${!envvar}"
  elif [ -s "$FOLD_CLUSTER_DIR/$name.port" ]; then cat "$FOLD_CLUSTER_DIR/$name.port"
  else echo "$default"; fi
}
FOLD_RAY_PORT="$(_fold_port ray FOLD_RAY_PORT 6379)"
FOLD_RAY_DASHBOARD_PORT="$(_fold_port dashboard FOLD_RAY_DASHBOARD_PORT 8265)"
FOLD_RAY_CLIENT_PORT="$(_fold_port ray_client FOLD_RAY_CLIENT_PORT 10001)"
FOLD_RAY_AGENT_PORT="$(_fold_port ray_agent FOLD_RAY_AGENT_PORT "")"
FOLD_MLFLOW_PORT="$(_fold_port mlflow FOLD_MLFLOW_PORT 5000)"
FOLD_READY_TIMEOUT="${FOLD_READY_TIMEOUT:-120}"

# The auth mode the caller asked for (empty: none); cluster_up derives the default for a new head
# from FOLD_RAY_HOST. Other scripts use the mode the running head was started with.
FOLD_RAY_AUTH_MODE_GIVEN="${FOLD_RAY_AUTH_MODE:-}"
if [ -z "${FOLD_RAY_AUTH_MODE:-}" ] && [ -s "$FOLD_CLUSTER_DIR/auth_mode" ]; then
  FOLD_RAY_AUTH_MODE="$(cat "$FOLD_CLUSTER_DIR/auth_mode")"
fi
FOLD_RAY_AUTH_MODE="${FOLD_RAY_AUTH_MODE:-disabled}"
case "$FOLD_RAY_AUTH_MODE" in
  disabled|token) ;;
  *) fold_die "FOLD_RAY_AUTH_MODE must be 'disabled' or 'token', not '$FOLD_RAY_AUTH_MODE'" ;;
esac

FOLD_RAY_HOST="${FOLD_RAY_HOST:-${FOLD_RAY_NODE_IP:-127.0.0.1}}"
fold_is_loopback() {  # HOST -> 0 for 127.0.0.0/8, ::1 and localhost
  case "$1" in
    127.*|::1|\[::1\]|localhost) return 0 ;;
    *) return 1 ;;
  esac
}

if [ -z "${FOLD_PYTHON:-}" ]; then
  if [ -x "$FOLD_REPO_ROOT/.venv/bin/python" ] && [ -z "${VIRTUAL_ENV:-}" ]; then
    FOLD_PYTHON="$FOLD_REPO_ROOT/.venv/bin/python"
  else
    FOLD_PYTHON="$(command -v python3 || command -v python)"
  fi
fi
# The bin dir of that Python holds its `ray` and `mlflow` console scripts.
FOLD_BIN="$("$FOLD_PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))')"
fold_tool() {  # NAME -> path of the console script next to FOLD_PYTHON, else on PATH
  if [ -x "$FOLD_BIN/$1" ]; then echo "$FOLD_BIN/$1"
  elif command -v "$1" >/dev/null 2>&1; then command -v "$1"
  else fold_die "'$1' not found next to $FOLD_PYTHON nor on PATH: install the project (pip install -e .)"; fi
}

FOLD_DASHBOARD_URL="http://127.0.0.1:$FOLD_RAY_DASHBOARD_PORT"
FOLD_MLFLOW_URL="http://127.0.0.1:$FOLD_MLFLOW_PORT"
FOLD_AUTH_TOKEN_FILE="$FOLD_CLUSTER_DIR/ray_auth_token"

# Point Ray's client side at the right auth mode (and token) for this cluster.
fold_ray_client_env() {
  export RAY_AUTH_MODE="$FOLD_RAY_AUTH_MODE"
  if [ "$FOLD_RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    [ -s "$FOLD_AUTH_TOKEN_FILE" ] && export RAY_AUTH_TOKEN_PATH="$FOLD_AUTH_TOKEN_FILE"
  fi
}

# One GET, sending the Ray token when WITH_TOKEN is "token".  Prints the HTTP status (000
# when nothing answers), or with FIELD that field of the JSON body (UNKNOWN on any failure).
fold_http_get() {  # URL WITH_TOKEN FIELD
  "$FOLD_PYTHON" - "$@" <<'PY'
import json, os, sys, urllib.request, urllib.error
url, with_token, field = sys.argv[1], sys.argv[2] == "token", sys.argv[3]
req = urllib.request.Request(url)
if with_token:
    tok = os.environ.get("RAY_AUTH_TOKEN")
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not tok and path and os.path.exists(path):
        tok = open(path).read().strip()
    if tok:
        req.add_header("Authorization", "Bearer " + tok)
try:
    with urllib.request.urlopen(req, timeout=10 if field else 5) as r:
        print(json.load(r).get(field, "UNKNOWN") if field else r.status)
except urllib.error.HTTPError as e:
    print("UNKNOWN" if field else e.code)
except Exception:
    print("UNKNOWN" if field else "000")
PY
}

fold_http_status() { fold_http_get "$1" "${2:-}" ""; }            # URL [token]
fold_http_json_field() { fold_http_get "$1" "${3:-}" "$2"; }      # URL FIELD [token]

fold_port_in_use() {  # PORT -> 0 when something listens on 127.0.0.1:PORT
  "$FOLD_PYTHON" - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.settimeout(1)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}

fold_private_dir() {  # DIR -> 0 when DIR is a directory (not a link) of this user, mode 0700
  local d=$1
  [ -d "$d" ] && [ ! -L "$d" ] || return 1
  [ "$(stat -c '%u %a' "$d" 2>/dev/null)" = "$(id -u) 700" ]
}

fold_free_port() {  # -> a TCP port nobody listens on now
  "$FOLD_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1]); s.close()'
}

fold_pid_alive() {  # PIDFILE -> 0 when the pid in it runs and still leads its own session
  local f=$1 pid sid
  [ -s "$f" ] || return 1
  pid="$(cat "$f")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  sid="$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ')"
  [ "$sid" = "$pid" ]   # a recycled pid of some unrelated process does not count
}

# PIDs of every process in the session led by PID (the services are started with setsid),
# plus processes whose command line names MARKER (e.g. this cluster's Ray temp dir).
fold_session_pids() {  # SID [MARKER]
  local sid=$1 marker=${2:-} p
  ps -eo pid=,sid= | awk -v s="$sid" '$2 == s {print $1}'
  if [ -n "$marker" ]; then
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$p" = "$$" ] && continue
      if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF -- "$marker"; then echo "$p"; fi
    done
  fi
}


# Stop the service NAME started by cluster_up.sh (pid file NAME.pid holds its session id):
# SIGTERM to every process of that session (and, for Ray, every process naming MARKER, its
# temp dir), SIGKILL to what is left after FOLD_STOP_GRACE seconds (default 20).
fold_stop_service() {  # NAME [MARKER]
  local name=$1 marker=${2:-} pidfile="$FOLD_CLUSTER_DIR/$1.pid" sid pids waited=0 grace=${FOLD_STOP_GRACE:-20}
  if [ ! -s "$pidfile" ]; then
    fold_log "$name: not running (no pid file)"
    return 0
  fi
  sid="$(cat "$pidfile")"
  pids="$(fold_session_pids "$sid" "$marker" | sort -un | tr '\n' ' ')"
  if [ -z "${pids// /}" ]; then
    fold_log "$name: not running (stale pid $sid)"
    rm -f "$pidfile"
    return 0
  fi
  fold_log "$name: stopping session $sid (pids: $pids)"
  # The session leader first (`ray start --block`, `mlflow server`): it stops its own children in
  # order (Ray's head: ~6 s). Signalling every process at once leaves some waiting on others that
  # are gone, until the SIGKILL below.
  if [[ " $pids " == *" $sid "* ]]; then
    kill -TERM "$sid" 2>/dev/null || true
    while [ "$waited" -lt "$grace" ]; do
      pids="$(fold_session_pids "$sid" "$marker" | sort -un | tr '\n' ' ')"
      [[ -z "${pids// /}" || " $pids " != *" $sid "* ]] && break
      sleep 1
      waited=$((waited + 1))
    done
  fi
  pids="$(fold_session_pids "$sid" "$marker" | sort -un | tr '\n' ' ')"
  # shellcheck disable=SC2086
  [ -n "${pids// /}" ] && kill -TERM $pids 2>/dev/null || true
  while [ "$waited" -lt "$grace" ]; do
    pids="$(fold_session_pids "$sid" "$marker" | sort -un | tr '\n' ' ')"
    [ -z "${pids// /}" ] && break
    sleep 1
    waited=$((waited + 1))
  done
  pids="$(fold_session_pids "$sid" "$marker" | sort -un | tr '\n' ' ')"
  if [ -n "${pids// /}" ]; then
    fold_log "$name: still alive after ${grace}s, sending SIGKILL to $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 1
  fi
  rm -f "$pidfile"
  fold_log "$name: stopped"
}

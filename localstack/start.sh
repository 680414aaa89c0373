#!/usr/bin/env bash
# LocalStack 4.13.1 in host mode (no Docker) on 127.0.0.1 with SQS + EC2, for skyport's tests.
# tests/env.sh calls this; it also works on its own.
#
#   localstack/start.sh [start]   build the venv if needed, start LocalStack in the background,
#                                 wait until SQS and EC2 answer
#   localstack/start.sh stop      stop the instance this script started (by its pid file)
#   localstack/start.sh status    print the health JSON (exit 1 when not reachable)
#
# Environment:
#   LS_STATE         runtime state: pid, log, filesystem root
#                    (default ${SKYPORT_STATE:-/tmp/skyport-env}/localstack)
#   LS_PORT          gateway port on 127.0.0.1 (default 4566)
#   SKYPORT_CACHE    cache root (default ~/.cache/skyport); the venv is
#                    $SKYPORT_CACHE/localstack/venv-<hash of requirements.txt + Python version>
#   LS_PYTHON        interpreter for the venv (default python3.11 if it works, else python3)
#   LS_WAIT_S        seconds to wait for readiness (default 180)
# Any LocalStack setting already in the environment (SERVICES, DEBUG, GATEWAY_SERVER, ...)
# overrides the defaults below.
# Progress goes to stderr, so callers can keep stdout for themselves.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQUIREMENTS="$HERE/requirements.txt"
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"
LS_STATE="${LS_STATE:-${SKYPORT_STATE:-/tmp/skyport-env}/localstack}"
LS_PORT="${LS_PORT:-4566}"
LS_WAIT_S="${LS_WAIT_S:-180}"
PIDFILE="$LS_STATE/localstack.pid"
LOGFILE="$LS_STATE/localstack.log"
FSROOT="$LS_STATE/fs"
ENDPOINT="http://127.0.0.1:$LS_PORT"

# shellcheck source=tests/env/need.sh
. "$HERE/../tests/env/need.sh"
log() { echo "localstack: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Alive *and* ours: a stale pid file may name a recycled pid of an unrelated process.
is_running() {
  local pid
  [[ -f "$PIDFILE" ]] || return 1
  pid="$(cat "$PIDFILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'localstack.runtime.main'
}

healthy() { curl -fsS --max-time 2 "$ENDPOINT/_localstack/health" 2>/dev/null; }

# TERM, then KILL after 15 s: a LocalStack whose gateway could not bind its port ignores TERM.
terminate() {
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 1 60); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.25; done
  kill -KILL "$1" 2>/dev/null || true
}

case "${1:-start}" in
  stop)
    if is_running; then
      pid="$(cat "$PIDFILE")"
      terminate "$pid"
      log "stopped (pid $pid)"
    else
      log "not running"
    fi
    rm -f "$PIDFILE"
    exit 0 ;;
  status)
    if out="$(healthy)"; then echo "$out"; exit 0; fi
    echo "LocalStack not reachable at $ENDPOINT" >&2; exit 1 ;;
  start) ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac

mkdir -p "$LS_STATE"
need curl ss

# ---- interpreter and venv -------------------------------------------------------------------
if [[ -z "${LS_PYTHON:-}" ]]; then
  if python3.11 -c '' >/dev/null 2>&1; then LS_PYTHON=python3.11; else LS_PYTHON=python3; fi
fi
PYVER="$("$LS_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# Keyed by content, so a changed pin file or interpreter gets a new venv and old checkouts
# keep working with theirs.
KEY="$( { cat "$REQUIREMENTS"; echo "python $PYVER"; } | sha256sum | cut -c1-12)"
VENV="$CACHE/localstack/venv-$KEY"

if [[ ! -f "$VENV/.complete" ]]; then
  mkdir -p "$CACHE/localstack"
  # Parallel first runs (e.g. two checkouts) must not build into the same directory at once.
  exec {venvlock}>"$CACHE/localstack/.venv-$KEY.lock"
  flock "$venvlock"
  if [[ ! -f "$VENV/.complete" ]]; then
    log "creating $VENV (Python $PYVER, ~1-2 min)"
    rm -rf "$VENV"
    "$LS_PYTHON" -m venv "$VENV"
    # --no-deps: the file is the complete closure; pip check proves nothing is missing.
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps -r "$REQUIREMENTS" >&2
    "$VENV/bin/python" -m pip check --disable-pip-version-check >&2
    # Pre-build the service catalog, as LocalStack's Dockerfile does at image build time.
    # Without it every fresh filesystem root rebuilds it on the first request (+5-9 s) and the
    # process keeps ~600 MB RSS instead of ~260 MB. Starts link it in read-only (see below).
    mkdir -p "$VENV/fsroot/usr/lib/localstack"
    OVERRIDE_IN_DOCKER=0 FILESYSTEM_ROOT="$VENV/fsroot" "$VENV/bin/python" -m localstack.aws.spec >&2
    touch "$VENV/.complete"
  fi
  exec {venvlock}>&-
fi

# ---- already running? -------------------------------------------------------------------------
if is_running; then
  # Give a concurrent start that is still warming up a moment before declaring it broken.
  for _ in $(seq 1 150); do healthy >/dev/null && break; sleep 0.2; done
  healthy >/dev/null || die "pid $(cat "$PIDFILE") is running but $ENDPOINT is not healthy; log: $LOGFILE"
  log "already running (pid $(cat "$PIDFILE")) at $ENDPOINT"
  exit 0
fi
rm -f "$PIDFILE"

if ss -Hltn "sport = :$LS_PORT" | grep -q .; then
  ss -Hltnp "sport = :$LS_PORT" >&2 || true
  die "port $LS_PORT is already in use by a process this script did not start (set LS_PORT)"
fi

# Fresh filesystem root each start (LocalStack keeps its state in memory anyway), with the
# prebuilt catalog linked in from the venv.
rm -rf "$FSROOT"
mkdir -p "$FSROOT/usr/lib"
ln -s "$VENV/fsroot/usr/lib/localstack" "$FSROOT/usr/lib/localstack"

# ---- configuration ----------------------------------------------------------------------------
# Dev machines and CI containers often have /.dockerenv, which makes LocalStack believe it is in
# its own image: it then writes to /var/lib/localstack and, if its DNS server started, rewrites
# /etc/resolv.conf. OVERRIDE_IN_DOCKER=0 + FILESYSTEM_ROOT keep it inside $LS_STATE, and
# DNS_ADDRESS=0 turns the DNS server off.
export OVERRIDE_IN_DOCKER="${OVERRIDE_IN_DOCKER:-0}"
export FILESYSTEM_ROOT="$FSROOT"
export LOCALSTACK_VOLUME_DIR="${LOCALSTACK_VOLUME_DIR:-$LS_STATE/volume}"
export DNS_ADDRESS="${DNS_ADDRESS:-0}"
# sts: GetCallerIdentity, which the ACK SQS controller calls at start (benches/ack.rs).
export SERVICES="${SERVICES:-sqs,ec2,sts}"
export GATEWAY_LISTEN="${GATEWAY_LISTEN:-127.0.0.1:$LS_PORT}"
# twisted (the default gateway) is ~2x faster than hypercorn but ignores the host part of
# GATEWAY_LISTEN and binds 0.0.0.0; the launcher below makes it bind 127.0.0.1.
export GATEWAY_SERVER="${GATEWAY_SERVER:-twisted}"
# Queue URLs as http://127.0.0.1:<port>/000000000000/<name>. The default strategy returns
# sqs.<region>.localhost.localstack.cloud URLs, which need public DNS.
export LOCALSTACK_HOST="${LOCALSTACK_HOST:-127.0.0.1:$LS_PORT}"
export SQS_ENDPOINT_STRATEGY="${SQS_ENDPOINT_STRATEGY:-off}"
# Behave like AWS: re-creating a queue name within 60 s of deleting it fails with
# AWS.SimpleQueueService.QueueDeletedRecently (LocalStack's own default lets it succeed).
export SQS_DELAY_RECENTLY_DELETED="${SQS_DELAY_RECENTLY_DELETED:-1}"
# Load SQS/EC2 at startup instead of on the first request, so tests do not pay for it.
export EAGER_SERVICE_LOADING="${EAGER_SERVICE_LOADING:-1}"
export DISABLE_EVENTS="${DISABLE_EVENTS:-1}"               # no analytics calls
export SKIP_SSL_CERT_DOWNLOAD="${SKIP_SSL_CERT_DOWNLOAD:-1}"  # no network fetch of a TLS cert
mkdir -p "$LOCALSTACK_VOLUME_DIR"

# ---- start --------------------------------------------------------------------------------------
T0="$(date +%s.%N)"
# setsid + nohup: LocalStack must outlive this script and the caller's terminal/session.
# stdout/stderr go to the log so that `$(...)` in a caller never waits on this process.
# The inner bash writes its own pid and execs Python: $! would be wrong whenever setsid forks.
rm -f "$PIDFILE"
setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" "$VENV/bin/python" -W "ignore:You do not have a working installation of the service_identity" -c '
import os, runpy
import twisted.internet.endpoints as ep
_tcp4 = ep.TCP4ServerEndpoint
_host = os.environ["GATEWAY_LISTEN"].split(",")[0].rsplit(":", 1)[0] or "127.0.0.1"
def _bound(reactor, port, backlog=50, interface=""):
    return _tcp4(reactor, port, backlog, interface or _host)
ep.TCP4ServerEndpoint = _bound      # loopback-only bind for the twisted gateway
runpy.run_module("localstack.runtime.main", run_name="__main__", alter_sys=True)
' >"$LOGFILE" 2>&1 </dev/null &
for _ in $(seq 1 50); do [[ -s "$PIDFILE" ]] && break; sleep 0.1; done
PID="$(cat "$PIDFILE")"

# Ready = health lists sqs, then one real SQS and EC2 call each (boto3 is in the pins), so the
# first request of a test does not pay for lazy initialisation.
if ! "$VENV/bin/python" - "$ENDPOINT" "$PID" "$LS_WAIT_S" "$SERVICES" "$T0" <<'PY' >&2
import json, os, sys, time, urllib.request
endpoint, pid, wait_s, services, t0 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
deadline = time.time() + wait_s
state = None
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"localstack: process {pid} exited during startup")
    try:
        with urllib.request.urlopen(endpoint + "/_localstack/health", timeout=2) as r:
            state = json.load(r)["services"].get("sqs")
        if state in ("available", "running"):
            break
    except Exception:
        pass
    time.sleep(0.2)
else:
    sys.exit(f"localstack: timed out after {wait_s:.0f}s waiting for sqs in /_localstack/health (last: {state})")
import boto3
kw = dict(endpoint_url=endpoint, region_name="us-east-1",
          aws_access_key_id="test", aws_secret_access_key="test")
boto3.client("sqs", **kw).list_queues()
if "ec2" in services.split(","):
    boto3.client("ec2", **kw).describe_regions()
print(f"localstack: ready at {endpoint} (pid {pid}) after {time.time() - t0:.1f}s")
PY
then
  tail -n 30 "$LOGFILE" >&2
  terminate "$PID"
  rm -f "$PIDFILE"
  die "failed to start; full log: $LOGFILE"
fi

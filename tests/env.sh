#!/usr/bin/env bash
# Local test environment for skyport: a real Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager; upstream v1.36 binaries built by tests/env/build-control-plane.sh) and
# LocalStack (SQS + EC2, localstack/start.sh), all on 127.0.0.1, no Docker, no kubelet/nodes;
# and, as root, a second cluster with one real node (tests/env/node.sh; SKYPORT_NODE=0: none).
#
#   eval "$(tests/env.sh up)"   start whatever is not running yet, then print export lines
#   tests/env.sh env            print the export lines of a running environment
#   tests/env.sh status         one line per component (exit 1 if any is down)
#   tests/env.sh down           stop what this script started, delete etcd's data
#
# `up` prints only `export ...` lines on stdout (KUBECONFIG, AWS_ENDPOINT_URL, AWS_REGION,
# AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, SKYPORT_TEST_ENV, and PATH with
# the matching kubectl first); all progress goes to stderr.
#
# Environment (ports are remembered in the state dir, so `env`/`status`/`down` need no flags):
#   SKYPORT_STATE            state dir: pid files, logs, pki, etcd data  (default /tmp/skyport-env)
#   SKYPORT_CACHE            binary/venv cache                           (default ~/.cache/skyport)
#   SKYPORT_ETCD_PORT        etcd client port       (default 23790)
#   SKYPORT_ETCD_PEER_PORT   etcd peer port         (default 23800)
#   SKYPORT_APISERVER_PORT   kube-apiserver port    (default 26443)
#   SKYPORT_LOCALSTACK_PORT  LocalStack port        (default 4566)
#   SKYPORT_NODE_APISERVER_PORT  the node cluster's kube-apiserver port (default 26444)
#   SKYPORT_NODE             0: start no node
#
# With the node, `up` also exports SKYPORT_NODE_KUBECONFIG, SKYPORT_NODE_AWS_ENDPOINT_URL,
# SKYPORT_NODE_CONTAINERD, SKYPORT_NODE_EXIT_ADDRESSES and SKYPORT_NODE_BIN; without it,
# SKYPORT_NODE_ERROR (the reason) or SKYPORT_NODE=0.
#
# What the cluster is (and is not):
#   - Auth: user `admin` in group system:masters, by bearer token ($STATE/pki/tokens.csv, used by
#     $STATE/kubeconfig) or by client certificate ($STATE/pki/admin.{crt,key}, signed by
#     $STATE/pki/ca.crt). RBAC is on; system:masters bypasses it.
#   - kube-controller-manager runs only the garbage collector (ownerReference cascades), the
#     namespace controller (namespace deletion completes), the serviceaccount controller and the
#     ClusterRole aggregation (skyport's tenant roles reach the built-in view/edit/admin).
#     No scheduler, no kubelet: Pods stay Pending and Deployments get no ReplicaSets, so tests
#     patch .status themselves. The GC rediscovers resource types every 30 s, so cascades
#     *from* a custom resource owner work only ~30 s after its CRD was created.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${SKYPORT_STATE:-/tmp/skyport-env}"
RUN="$STATE/run"          # pid files
LOGS="$STATE/logs"
PKI="$STATE/pki"
PORTS_FILE="$STATE/ports"
EXPORTS_FILE="$STATE/exports"

log() { echo "env.sh: $*" >&2; }
die() { echo "env.sh: ERROR: $*" >&2; exit 1; }

# Explicit env var > ports of the running environment > default.
load_ports() {
  local ETCD_PORT= ETCD_PEER_PORT= APISERVER_PORT= LOCALSTACK_PORT= NODE_APISERVER_PORT=
  # shellcheck disable=SC1090
  [[ -f "$PORTS_FILE" ]] && . "$PORTS_FILE"
  P_ETCD="${SKYPORT_ETCD_PORT:-${ETCD_PORT:-23790}}"
  P_PEER="${SKYPORT_ETCD_PEER_PORT:-${ETCD_PEER_PORT:-23800}}"
  P_API="${SKYPORT_APISERVER_PORT:-${APISERVER_PORT:-26443}}"
  P_LS="${SKYPORT_LOCALSTACK_PORT:-${LOCALSTACK_PORT:-4566}}"
  P_NODE_API="${SKYPORT_NODE_APISERVER_PORT:-${NODE_APISERVER_PORT:-26444}}"
}

# ---- process bookkeeping ---------------------------------------------------------------------
pid_of() { cat "$RUN/$1.pid" 2>/dev/null || true; }

# argv[0] of a live pid, empty if dead.
argv0() { [[ -n "$1" && -r "/proc/$1/cmdline" ]] && tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n1 || true; }

# Running and really ours: pid files outlive reboots and pids get recycled, so also compare
# the executable name.
alive() {
  local name="$1" pid a
  pid="$(pid_of "$name")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  a="$(argv0 "$pid")"
  [[ "$(basename "${a:-/}")" == "$name" ]]
}

port_busy() { ss -Hltn "sport = :$1" | grep -q .; }

# Called only when the component is not running from our pid file, so a listener is foreign.
need_free_port() {
  local port="$1" what="$2" var="$3"
  if port_busy "$port"; then
    ss -Hltnp "sport = :$port" >&2 || true
    die "port $port (for $what) is taken by a process tests/env.sh did not start; stop it or set $var"
  fi
}

# Starts "$@" detached (own session, immune to the caller's hangup, stdio to the log) so it
# outlives this script, and records its pid. The inner bash writes its own pid before exec-ing,
# because $! is wrong whenever setsid has to fork. The lock fd is closed for the child, or
# the process would hold the lock for its whole life.
launch() {
  local name="$1"; shift
  rm -f "$RUN/$name.pid"
  setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$RUN/$name.pid" "$@" \
    >"$LOGS/$name.log" 2>&1 </dev/null {LOCK}>&- &
  # Until the exec, argv0 is still bash and `alive` would say no; wait past that point.
  for _ in $(seq 1 100); do alive "$name" && return 0; sleep 0.05; done
  fail_with_log "$name" "$name did not start"
}

fail_with_log() {
  local name="$1" msg="$2"
  echo "---- last lines of $LOGS/$name.log ----" >&2
  tail -n 40 "$LOGS/$name.log" >&2 || true
  echo "----" >&2
  die "$msg (full log: $LOGS/$name.log; clean up with: tests/env.sh down)"
}

# wait_until <name> <timeout s> <check command...>: polls the check while the process lives.
wait_until() {
  local name="$1" timeout="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || fail_with_log "$name" "$name exited during startup"
    ((SECONDS < deadline)) || fail_with_log "$name" "$name not ready after ${timeout}s"
    sleep 0.2
  done
}

# stop <name>...: SIGTERM to all at once (each takes 2-4 s to shut down gracefully), wait up to
# 20 s, then SIGKILL whatever is left.
stop() {
  local name pid pids=() names=()
  for name in "$@"; do
    if alive "$name"; then
      pid="$(pid_of "$name")"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid"); names+=("$name")
    fi
  done
  local i left
  for _ in $(seq 1 100); do
    left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    ((left)) || break
    sleep 0.2
  done
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      log "${names[$i]} (pid ${pids[$i]}) ignored SIGTERM for 20 s, sending SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null || true
    fi
    log "stopped ${names[$i]} (pid ${pids[$i]})"
  done
  for name in "$@"; do rm -f "$RUN/$name.pid"; done
}

# ---- health checks ---------------------------------------------------------------------------
etcd_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$P_ETCD/health" | grep -q '"health":"true"'; }
api_ready()    { [[ "$(curl -fsS --max-time 3 --cacert "$PKI/ca.crt" "https://127.0.0.1:$P_API/readyz" 2>/dev/null)" == ok ]]; }
# kube-controller-manager serves nothing (--secure-port=0). Ready = the garbage collector has
# synced its monitors (it logs this at the default verbosity; the log is fresh per process) and
# the serviceaccount controller has created default/default.
kcm_working() {
  grep -q 'Proceeding to collect garbage' "$LOGS/kube-controller-manager.log" &&
  curl -fsS --max-time 3 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(cut -d, -f1 "$PKI/tokens.csv")" \
    "https://127.0.0.1:$P_API/api/v1/namespaces/default/serviceaccounts/default" >/dev/null
}
ls_healthy()   { curl -fsS --max-time 2 "http://127.0.0.1:$P_LS/_localstack/health" | grep -q '"sqs": *"running"'; }

# Is it running from this bin dir? A rebuilt cache dir means a different version.
check_same_build() {
  local name="$1" a
  a="$(argv0 "$(pid_of "$name")")"
  [[ "$a" == "$BIN/$name" ]] || die "$name (pid $(pid_of "$name")) runs $a, not $BIN/$name; run tests/env.sh down first"
}

# ---- one-time material: CA, serving + client certs, service-account keys, admin token ---------
make_pki() {
  [[ -f "$PKI/.complete" ]] && return 0
  log "creating test PKI in $PKI"
  rm -rf "$PKI"; mkdir -p "$PKI"
  # Run in the background and `wait`: a subshell on the left of `||` would run with set -e
  # disabled and carry on after a failed openssl call. openssl's chatter goes to pki.log.
  (
    set -euo pipefail
    cd "$PKI"; umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt \
      -subj "/CN=skyport-test-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
    # Serving cert: clients reach the apiserver as 127.0.0.1 or localhost; the in-cluster names
    # cost nothing and keep tools that build URLs from the kubernetes Service happy.
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -subj "/CN=kube-apiserver" \
      | openssl x509 -req -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out apiserver.crt \
          -extfile <(printf '%s\n' \
            "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
            "extendedKeyUsage=serverAuth" "keyUsage=critical,digitalSignature,keyEncipherment")
    # Client cert for clients that prefer certs over tokens (CN = user, O = group).
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -subj "/O=system:masters/CN=admin" \
      | openssl x509 -req -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out admin.crt \
          -extfile <(printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature,keyEncipherment")
    # Service-account token signing pair (RSA 2048); both halves are mandatory flags.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key
    openssl pkey -in sa.key -pubout -out sa.pub
    # Static token file: token,user,uid,"groups".
    echo "$(openssl rand -hex 32),admin,admin,\"system:masters\"" >tokens.csv
    chmod 644 ca.crt apiserver.crt admin.crt sa.pub
    touch .complete
  ) 2>"$LOGS/pki.log" &
  wait $! || { cat "$LOGS/pki.log" >&2; die "creating the PKI in $PKI failed"; }
}

write_kubeconfig() {
  local tmp="$STATE/kubeconfig.tmp"
  (umask 077; cat >"$tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: skyport-test
  cluster:
    server: https://127.0.0.1:$P_API
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: admin
  user:
    token: $(cut -d, -f1 "$PKI/tokens.csv")
contexts:
- name: skyport-test
  context:
    cluster: skyport-test
    user: admin
    namespace: default
current-context: skyport-test
EOF
  )
  mv "$tmp" "$STATE/kubeconfig"   # atomic: a running KCM or test never reads half a file
}

write_exports() {
  # AWS dummies come from localstack/env (single source); only the port may differ.
  local region key secret
  # shellcheck disable=SC1091
  read -r region key secret < <(. "$ROOT/localstack/env"; echo "$AWS_REGION $AWS_ACCESS_KEY_ID $AWS_SECRET_ACCESS_KEY")
  {
    printf 'export KUBECONFIG=%q\n' "$STATE/kubeconfig"
    printf 'export AWS_ENDPOINT_URL=%q\n' "http://127.0.0.1:$P_LS"
    printf 'export AWS_REGION=%q\n' "$region"
    printf 'export AWS_DEFAULT_REGION=%q\n' "$region"     # boto3 / AWS CLI spelling
    printf 'export AWS_ACCESS_KEY_ID=%q\n' "$key"
    printf 'export AWS_SECRET_ACCESS_KEY=%q\n' "$secret"
    printf 'export SKYPORT_TEST_ENV=%q\n' "$STATE"
    printf 'export PATH=%q:"$PATH"\n' "$BIN"
    node_exports
  } >"$EXPORTS_FILE.tmp"
  mv "$EXPORTS_FILE.tmp" "$EXPORTS_FILE"
}

# ---- components ------------------------------------------------------------------------------
start_etcd() {
  if alive etcd; then
    check_same_build etcd
    wait_until etcd 30 etcd_healthy
    log "etcd already running (pid $(pid_of etcd))"; return
  fi
  need_free_port "$P_ETCD" "etcd client" SKYPORT_ETCD_PORT
  need_free_port "$P_PEER" "etcd peer" SKYPORT_ETCD_PEER_PORT
  mkdir -p "$STATE/etcd"
  # --unsafe-no-fsync: test data is disposable and fsync dominates write latency.
  launch etcd "$BIN/etcd" --name=skyport-test --data-dir="$STATE/etcd" \
    --listen-client-urls="http://127.0.0.1:$P_ETCD" --advertise-client-urls="http://127.0.0.1:$P_ETCD" \
    --listen-peer-urls="http://127.0.0.1:$P_PEER" --initial-advertise-peer-urls="http://127.0.0.1:$P_PEER" \
    --initial-cluster="skyport-test=http://127.0.0.1:$P_PEER" --unsafe-no-fsync=true
  wait_until etcd 30 etcd_healthy
  log "etcd up on 127.0.0.1:$P_ETCD (pid $(pid_of etcd))"
}

start_apiserver() {
  if alive kube-apiserver; then
    check_same_build kube-apiserver
    wait_until kube-apiserver 90 api_ready
    log "kube-apiserver already running (pid $(pid_of kube-apiserver))"; return
  fi
  need_free_port "$P_API" kube-apiserver SKYPORT_APISERVER_PORT
  # --advertise-address: otherwise it derives one from the default route (a non-loopback IP, or
  #   a startup failure without a default route).
  # --endpoint-reconciler-type=none: endpoints of the `kubernetes` Service may not be loopback
  #   IPs, so the reconciler would only log errors.
  # --disable-admission-plugins=ServiceAccount: pods need no token/default SA here (no kubelet).
  launch kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$P_ETCD" \
    --advertise-address=127.0.0.1 --bind-address=127.0.0.1 --secure-port="$P_API" \
    --cert-dir="$STATE/apiserver" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer="https://127.0.0.1:$P_API/" \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --disable-admission-plugins=ServiceAccount \
    --allow-privileged=true \
    --endpoint-reconciler-type=none
  wait_until kube-apiserver 90 api_ready
  log "kube-apiserver ready on https://127.0.0.1:$P_API (pid $(pid_of kube-apiserver))"
}

start_kcm() {
  if alive kube-controller-manager; then
    check_same_build kube-controller-manager
    wait_until kube-controller-manager 60 kcm_working
    log "kube-controller-manager already running (pid $(pid_of kube-controller-manager))"; return
  fi
  # The Deployment/ReplicaSet controllers are left out on purpose (see header).
  launch kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$STATE/kubeconfig" \
    --leader-elect=false --secure-port=0 \
    --controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,clusterrole-aggregation-controller \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=false
  wait_until kube-controller-manager 60 kcm_working
  log "kube-controller-manager working (pid $(pid_of kube-controller-manager))"
}

# LocalStack does not depend on the control plane, so it starts in the background while the
# control plane comes up (saves ~5 s). start.sh is idempotent and owns LocalStack's pid file
# (under $STATE/localstack).
start_localstack_bg() {
  LS_STATE="$STATE/localstack" LS_PORT="$P_LS" "$ROOT/localstack/start.sh" start \
    >"$LOGS/localstack-start.log" 2>&1 </dev/null {LOCK}>&- &
  LS_STARTER=$!
  # If the control plane fails, let this start finish before exiting, so that an immediate
  # `down` does not race a LocalStack that is about to write its pid file.
  trap '[[ -n "${LS_STARTER:-}" ]] && wait "$LS_STARTER" 2>/dev/null' EXIT
}

wait_localstack() {
  local rc=0
  wait "$LS_STARTER" || rc=$?
  LS_STARTER=
  cat "$LOGS/localstack-start.log" >&2
  ((rc == 0)) || die "LocalStack failed to start (see above; its port is SKYPORT_LOCALSTACK_PORT; log: $STATE/localstack/localstack.log)"
}

ls_pid() { cat "$STATE/localstack/localstack.pid" 2>/dev/null || true; }
ls_alive() {
  local pid; pid="$(ls_pid)"
  [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q localstack.runtime.main
}

# ---- subcommands -------------------------------------------------------------------------------
take_lock() {
  mkdir -p "$STATE"
  exec {LOCK}>"$STATE/.lock"
  if ! flock -n "$LOCK"; then
    log "waiting for another tests/env.sh in $STATE to finish"
    flock "$LOCK"
  fi
}

cmd_up() {
  local t0=$SECONDS
  take_lock
  need curl openssl ss
  mkdir -p "$RUN" "$LOGS"
  load_ports
  BIN="$("$ROOT/tests/env/build-control-plane.sh" {LOCK}>&-)" || die "building the control plane failed"
  [[ -x "$BIN/kube-apiserver" ]] || die "no kube-apiserver in '$BIN'"
  printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPISERVER_PORT=%s\nLOCALSTACK_PORT=%s\nNODE_APISERVER_PORT=%s\n' \
    "$P_ETCD" "$P_PEER" "$P_API" "$P_LS" "$P_NODE_API" >"$PORTS_FILE"
  make_pki
  start_localstack_bg
  start_etcd
  start_apiserver
  write_kubeconfig
  start_kcm
  wait_localstack
  start_node_or_report
  write_exports
  log "environment up in $((SECONDS - t0))s; state in $STATE"
  cat "$EXPORTS_FILE"
}

cmd_env() {
  load_ports
  [[ -f "$EXPORTS_FILE" ]] || die "not up (no $EXPORTS_FILE); run: eval \"\$(tests/env.sh up)\""
  local c
  for c in etcd kube-apiserver kube-controller-manager; do
    alive "$c" || die "$c is not running; run: eval \"\$(tests/env.sh up)\""
  done
  api_ready || die "kube-apiserver is running but not ready"
  ls_healthy || die "LocalStack is not healthy on 127.0.0.1:$P_LS"
  cat "$EXPORTS_FILE"
}

cmd_status() {
  load_ports
  local ok=0 c pid state
  line() { printf '%-24s %-8s %-10s %s\n' "$@"; }
  for c in etcd kube-apiserver kube-controller-manager; do
    pid="$(pid_of "$c")"
    if alive "$c"; then
      case "$c" in
        etcd) etcd_healthy && state="healthy" || { state="UNHEALTHY"; ok=1; }
              line "$c" running "pid $pid" "http://127.0.0.1:$P_ETCD $state" ;;
        kube-apiserver) api_ready && state="ready" || { state="NOT READY"; ok=1; }
              line "$c" running "pid $pid" "https://127.0.0.1:$P_API $state" ;;
        *)    line "$c" running "pid $pid" "(no endpoint; controllers: gc, namespace, serviceaccount)" ;;
      esac
    else
      line "$c" stopped "" ""; ok=1
    fi
  done
  if ls_alive; then
    line localstack running "pid $(ls_pid)" "http://127.0.0.1:$P_LS $(ls_healthy && echo healthy || echo 'NOT HEALTHY (starting?)')"
    ls_healthy || ok=1
  else
    line localstack stopped "" ""; ok=1
  fi
  if [[ -d "$STATE/node" ]]; then node_status || ok=1; fi
  return $ok
}

cmd_down() {
  take_lock
  load_ports
  # etcd last, so the apiserver does not spend its shutdown retrying a vanished backend.
  LS_STATE="$STATE/localstack" "$ROOT/localstack/start.sh" stop >&2 {LOCK}>&- &
  local ls_stopper=$!
  stop_node
  stop kube-controller-manager kube-apiserver
  stop etcd
  wait "$ls_stopper" || true
  rm -f "$EXPORTS_FILE" "$PORTS_FILE"
  rm -rf "$STATE/etcd"
  log "down (kept: $LOGS, $PKI)"
}

# shellcheck source=tests/env/node.sh
. "$ROOT/tests/env/node.sh"

case "${1:-}" in
  up) cmd_up ;;
  env) cmd_env ;;
  status) cmd_status ;;
  down) cmd_down ;;
  *) echo "usage: $0 up|down|status|env   (typical: eval \"\$(tests/env.sh up)\")" >&2; exit 2 ;;
esac

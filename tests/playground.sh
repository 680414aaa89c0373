#!/usr/bin/env bash
# A local playground: the real control plane + LocalStack (tests/env.sh), the example Queues from
# examples/ Ready, and the example LoadBalancer Service with an address that curl reaches through
# a real tunnel.
#
# Where the machine runs the test node (tests/env/node.sh), skyport is installed there as users
# install it: its image (tests/env/build-image.sh) with the Helm chart, the local exit-server
# provider, the tunnel client and a web backend as real Pods, `kubectl get pods` shows them.
# Otherwise (or with SKYPORT_NODE=0) the operator runs as a local process with CRDs from crds/,
# and the backend and tunnel client are local processes standing in for Pods.
#
#   tests/playground.sh [up]   bring it all up (idempotent; restarts the operator with a fresh build)
#   tests/playground.sh down   stop the operator and the environment
#
# With SKYPORT_PLAYGROUND_PROVIDER=guest (root only) the exit server is a booted Debian guest (the
# guest provider: systemd-nspawn, cloud-init) that downloads the shipped static binary over HTTPS
# from a mirror on this machine with a CA of its own; the operator runs that same binary, so the
# digest it hands the guest is the mirror's file's. The first run builds the guest root file
# system and the static binary (tests/env/build-guest.sh, build-musl.sh: ~20 minutes once).
#
# Afterwards: eval "$(tests/env.sh env)"; kubectl get queues,tunnels,services
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/env/need.sh
. tests/env/need.sh
STATE="${SKYPORT_STATE:-/tmp/skyport-env}"
PIDFILE="$STATE/run/operator.pid"
LOG="$STATE/logs/operator.log"
HOSTS="$STATE/local-hosts"
GUESTS="$STATE/guests"
DEMO="$STATE/run/demo"
PROVIDER="${SKYPORT_PLAYGROUND_PROVIDER:-local}"
MIRROR_PORT=18443

# The demo's stand-ins for a node: a web backend on loopback and the tunnel client (no kubelet
# runs in this control plane; tests/common/kubelet.rs does the same for the tests).
stop_demo() {
  for f in "$DEMO"/*.pid; do
    [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}

stop_operator() {
  if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill -TERM "$(cat "$PIDFILE")"
    for _ in $(seq 50); do kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$(cat "$PIDFILE")" 2>/dev/null || true
    echo "stopped the operator" >&2
  fi
  rm -f "$PIDFILE"
}

case "${1:-up}" in
  down)
    if [[ -f "$STATE/node/kubeconfig" ]] && eval "$(tests/env.sh env 2>/dev/null)" && [[ -n "${SKYPORT_NODE_KUBECONFIG:-}" ]]; then
      # Services first, so the running operator deletes the exit server.
      kubectl --kubeconfig "$SKYPORT_NODE_KUBECONFIG" delete -f examples/tunnel.yaml --ignore-not-found --timeout=60s >&2 || true
      kubectl --kubeconfig "$SKYPORT_NODE_KUBECONFIG" delete -f examples/queue.yaml --ignore-not-found --timeout=60s >&2 || true
      "$(tests/env/build-helm.sh)" --kubeconfig "$SKYPORT_NODE_KUBECONFIG" uninstall skyport -n skyport-system >&2 || true
    fi
    stop_demo
    if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      # Deleting the Tunnel lets the running operator delete its exit server.
      eval "$(tests/env.sh env)" 2>/dev/null && kubectl delete -f examples/tunnel.yaml --ignore-not-found --wait=false >&2 || true
      kubectl wait --for=delete tunnel/web-tunnel --timeout=30s >/dev/null 2>&1 || true
    fi
    stop_operator
    rm -rf "$DEMO/mirror"
    tests/env.sh down
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 [up|down]" >&2; exit 2 ;;
esac

need curl awk cc make
eval "$(tests/env.sh up)"
if [[ -n "${SKYPORT_NODE_KUBECONFIG:-}" ]]; then
  exec tests/playground-node.sh
fi
[[ -n "${SKYPORT_NODE_ERROR:-}" ]] && echo "the test node is not available ($SKYPORT_NODE_ERROR); the operator runs as a local process" >&2
tests/env/cargo-progress.sh skyport --bin skyport
kubectl apply --server-side --force-conflicts --field-manager=skyport-playground -f crds/ >&2
kubectl wait --for condition=Established crd/queues.skyport.dev crd/tunnels.skyport.dev --timeout=60s >/dev/null

stop_demo
stop_operator
mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")" "$DEMO"
OPERATOR="${CARGO_TARGET_DIR:-target}/debug/skyport"
PROVIDER_ARGS=(--provider local --local-state-dir "$HOSTS")
if [[ $PROVIDER == guest ]]; then
  [[ $(id -u) == 0 ]] || { echo "playground: the guest provider needs root" >&2; exit 1; }
  need openssl
  ROOTFS="$(tests/env/build-guest.sh)"
  OPERATOR="$(tests/env/build-musl.sh)"
  # The mirror: the static binary at the default URL's path, over HTTPS with a CA made for it.
  MIRROR="$DEMO/mirror"
  VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
  rm -rf "$MIRROR" && mkdir -p "$MIRROR/www/v$VERSION"
  cp "$OPERATOR" "$MIRROR/www/v$VERSION/skyport-$(uname -m)"
  EC=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  (cd "$MIRROR" &&
    openssl req -x509 -days 30 "${EC[@]}" -subj "/CN=skyport playground mirror CA" -keyout ca.key -out ca.pem \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
    openssl req "${EC[@]}" -subj /CN=host.skyport.internal -keyout server.key -out server.csr &&
    printf 'subjectAltName=DNS:host.skyport.internal\nextendedKeyUsage=serverAuth\n' >server.ext &&
    openssl x509 -req -days 30 -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -extfile server.ext \
      -out server.pem) 2>/dev/null
  (cd "$MIRROR/www" && exec setsid python3 -c '
import http.server, ssl, sys
server = http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain("../server.pem", "../server.key")
server.socket = tls.wrap_socket(server.socket, server_side=True)
server.serve_forever()' "$MIRROR_PORT" >"$DEMO/mirror.log" 2>&1 </dev/null) &
  echo $! >"$DEMO/mirror.pid"
  PROVIDER_ARGS=(--provider guest --guest-rootfs "$ROOTFS" --guest-state-dir "$GUESTS"
    --guest-ca-file "$MIRROR/ca.pem"
    --exit-server-url "https://host.skyport.internal:$MIRROR_PORT/v{version}/skyport-{arch}"
    --skip-exit-server-check)
fi
# Only the default namespace: tests run their own controllers in their own namespaces. As the
# cluster admin, whom no admission policy covers: hence --allow-without-admission-policies.
setsid nohup "$OPERATOR" run --namespace default --queue-resync 20s \
  --allow-without-admission-policies \
  "${PROVIDER_ARGS[@]}" --tunnel-resync 20s \
  >"$LOG" 2>&1 </dev/null &
echo $! >"$PIDFILE"
echo "operator running (pid $(cat "$PIDFILE")), log: $LOG" >&2

kubectl apply -f examples/queue.yaml >&2
if ! kubectl wait --for=condition=Ready queue/orders-dlq queue/orders --timeout=120s >&2; then
  tail -n 30 "$LOG" >&2
  exit 1
fi
kubectl get queues -o wide >&2

# The LoadBalancer demo: a backend on loopback, the Service, its Tunnel Active with an address.
mkdir -p "$DEMO/www"
echo "hello from the web backend behind the tunnel" >"$DEMO/www/index.html"
(cd "$DEMO/www" && exec setsid python3 -m http.server 18080 --bind 127.0.0.1 >"$DEMO/web.log" 2>&1 </dev/null) &
echo $! >"$DEMO/web.pid"
kubectl apply -f examples/tunnel.yaml >&2
# The tunnel client, as the Deployment web-tunnel-client would run it, with the Service's
# cluster IP pointed at the backend (no kube-proxy here either). It starts once the exit server
# exists (its address is in the client config); the Tunnel is Active only after the health check
# went through it, so the client runs before the wait.
for _ in $(seq 120); do
  kubectl get secret web-tunnel-credentials -o jsonpath='{.data.client\.toml}' 2>/dev/null | base64 -d >"$DEMO/client.toml.new" 2>/dev/null
  grep -q '^remote_addr' "$DEMO/client.toml.new" && break
  sleep 1
done
# Only the Service's port goes to the backend; the health check's section keeps its own address.
awk '/^\[/{section=$0} /^local_addr = / && section !~ /skyport-health/ {$0="local_addr = \"127.0.0.1:18080\""} {print}' \
  "$DEMO/client.toml.new" >"$DEMO/client.toml"
rm -f "$DEMO/client.toml.new"
chmod 600 "$DEMO/client.toml"
setsid nohup "${CARGO_TARGET_DIR:-target}"/debug/skyport tunnel client --config "$DEMO/client.toml" >"$DEMO/client.log" 2>&1 </dev/null &
echo $! >"$DEMO/client.pid"
# A guest boots and installs the server first: minutes on a busy machine.
if ! kubectl wait --for=jsonpath='{.status.phase}'=Active tunnel/web-tunnel --timeout=300s >&2; then
  tail -n 30 "$LOG" "$DEMO/client.log" >&2
  exit 1
fi
IP="$(kubectl get service web -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
for _ in $(seq 50); do curl -fsS --max-time 2 "http://$IP:8080/" >/dev/null 2>&1 && break; sleep 0.2; done
kubectl get service/web tunnel/web-tunnel >&2
echo "curl http://$IP:8080/ ->" >&2
curl -fsS --max-time 5 "http://$IP:8080/" >&2

cat >&2 <<MSG

The playground is up. In your shell:
  eval "\$(tests/env.sh env)"
  kubectl get queues,tunnels,services
  kubectl get configmap orders-sqs -o yaml
  curl http://$IP:8080/        # through the exit server and the tunnel client
Operator log: $LOG      Stop everything: tests/playground.sh down
MSG

#!/usr/bin/env bash
# A local playground: the real control plane + LocalStack (tests/env.sh), CRDs from crds/, the
# skyport operator running as a local process, and the example Queues from examples/ Ready.
#
#   tests/playground.sh [up]   bring it all up (idempotent; restarts the operator with a fresh build)
#   tests/playground.sh down   stop the operator and the environment
#
# Afterwards: eval "$(tests/env.sh env)"; kubectl get queues
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STATE="${SKYPORT_STATE:-/tmp/skyport-env}"
PIDFILE="$STATE/run/operator.pid"
LOG="$STATE/logs/operator.log"

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
    stop_operator
    tests/env.sh down
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 [up|down]" >&2; exit 2 ;;
esac

eval "$(tests/env.sh up)"
echo "building skyport ..." >&2
cargo build --quiet --bin skyport
kubectl apply --server-side --force-conflicts --field-manager=skyport-playground -f crds/ >&2
kubectl wait --for condition=Established crd/queues.skyport.dev --timeout=60s >/dev/null

stop_operator
mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"
# Only the default namespace: tests run their own controllers in their own namespaces.
setsid nohup target/debug/skyport run --namespace default --queue-resync 20s >"$LOG" 2>&1 </dev/null &
echo $! >"$PIDFILE"
echo "operator running (pid $(cat "$PIDFILE")), log: $LOG" >&2

kubectl apply -f examples/queue.yaml >&2
if ! kubectl wait --for=condition=Ready queue/orders-dlq queue/orders --timeout=120s >&2; then
  tail -n 30 "$LOG" >&2
  exit 1
fi
kubectl get queues -o wide >&2
cat >&2 <<MSG

The playground is up. In your shell:
  eval "\$(tests/env.sh env)"
  kubectl get queues
  kubectl get configmap orders-sqs -o yaml
Operator log: $LOG      Stop everything: tests/playground.sh down
MSG

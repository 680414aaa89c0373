#!/usr/bin/env bash
# The playground on the test node (tests/playground.sh runs it when `tests/env.sh up` started the
# node): skyport's image imported into the node's containerd, installed with the Helm chart
# (the local exit-server provider on the node's network), the example Queues, and the example
# LoadBalancer Service in front of a web backend Pod, reached with curl through the exit server,
# the tunnel client Pod and kube-proxy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[[ -n "${SKYPORT_NODE_KUBECONFIG:-}" ]] || { echo "no node: run tests/playground.sh" >&2; exit 1; }
# shellcheck source=tests/env/need.sh
. tests/env/need.sh
need ctr curl cc make
k() { kubectl --kubeconfig "$SKYPORT_NODE_KUBECONFIG" "$@"; }
HELM="$(tests/env/build-helm.sh)"

# The image ships the debug build the playground has anyway (its glibc libraries go into the
# image's base; tests/env/build-image.sh).
tests/env/cargo-progress.sh skyport --bin skyport
image="$(tests/env/build-image.sh "${CARGO_TARGET_DIR:-target}/debug/skyport")"
read -r archive ref <<<"$image"
ctr --address "$SKYPORT_NODE_CONTAINERD" --namespace k8s.io images import "$archive" >&2
k create namespace skyport-system --dry-run=client -o yaml | k apply -f - >&2
k -n skyport-system create secret generic skyport-aws --dry-run=client -o yaml \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" \
  | k apply -f - >&2
# httpPort 28080: on the node's network the operator listens on every address of this machine, so
# its port must be one nothing else here binds: 8080 is the example's, and the tests, which may run
# while the playground is up, bind 18080-18083 on loopback addresses of their own.
"$HELM" --kubeconfig "$SKYPORT_NODE_KUBECONFIG" upgrade --install skyport deploy/helm/skyport -n skyport-system \
  --set image.repository="${ref%:*}" --set image.tag="${ref##*:}" --set image.pullPolicy=Never \
  --set aws.region="$AWS_REGION" --set aws.sqsEndpointUrl="$SKYPORT_NODE_AWS_ENDPOINT_URL" \
  --set tunnel.provider=local --set tunnel.local.addresses="$SKYPORT_NODE_EXIT_ADDRESSES" --set httpPort=28080 \
  --wait --timeout 4m >&2

k apply -f examples/queue.yaml >&2
k wait --for=condition=Ready queue/orders-dlq queue/orders --timeout=120s >&2
# The example Service's backend: busybox's httpd on port 80 (examples/tunnel.yaml's targetPort).
k apply -f - >&2 <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: httpd
    image: skyport.test/busybox:debian
    imagePullPolicy: Never
    command: [/bin/busybox, sh, -c, "/bin/busybox mkdir -p /www && echo 'hello from the web Pod behind the tunnel' > /www/index.html && exec /bin/busybox httpd -f -p 80 -h /www"]
YAML
k apply -f examples/tunnel.yaml >&2
# The operator makes the Tunnel a moment after the Service; `kubectl wait` on a name that does
# not exist yet fails at once, so wait for it to exist first.
for _ in $(seq 120); do k get tunnel/web-tunnel >/dev/null 2>&1 && break; sleep 0.5; done
k wait --for=jsonpath='{.status.phase}'=Active tunnel/web-tunnel --timeout=180s >&2
IP="$(k get service web -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
for _ in $(seq 50); do curl -fsS --max-time 2 "http://$IP:8080/" >/dev/null 2>&1 && break; sleep 0.2; done
k get pods -A -o wide >&2
echo "curl http://$IP:8080/ ->" >&2
curl -fsS --max-time 5 "http://$IP:8080/" >&2

cat >&2 <<MSG

The playground is up on the node. In your shell:
  eval "\$(tests/env.sh env)"; export KUBECONFIG=\$SKYPORT_NODE_KUBECONFIG
  kubectl get pods -A; kubectl get queues,tunnels,services
  kubectl -n skyport-system logs deploy/skyport
  curl http://$IP:8080/        # exit server -> tunnel client Pod -> Service -> web Pod
Stop everything: tests/playground.sh down
MSG

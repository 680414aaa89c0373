# The test node: a second cluster with one real node, sourced by tests/env.sh (uses its launch,
# alive, wait_until, stop, log, die and its variables STATE, RUN, LOGS, PKI, BIN, P_ETCD).
#
# The shared cluster stays node-less on purpose (its tests stand in for the kubelet and patch
# Deployment status themselves; a real kubelet would run their Pods too), so the node belongs to
# a cluster of its own, in the same etcd under another prefix:
#   node-apiserver           kube-apiserver on $NODE_IP:$P_NODE_API, Node,RBAC authorization,
#                            default admission (ServiceAccount tokens, NodeRestriction)
#   node-controller-manager  kube-controller-manager with its default controllers
#   kube-scheduler, kubelet, kube-proxy (iptables mode)     upstream, same version
#   containerd + runc        Debian's; images imported from OCI archives, nothing is pulled
#   CNI                      Debian's bridge + host-local plugins: bridge skyport0, $POD_CIDR
#   CoreDNS                  a Deployment in kube-system behind the Service $DNS_IP
#   exit addresses           $EXIT_RANGE routed to lo, for the local provider's exit servers
#   localstack-forward       socat from $NODE_IP:<LocalStack port> to LocalStack on 127.0.0.1,
#                            so Pods reach the SQS/EC2 emulator
# The node's address is an extra address of lo (a dummy interface needs a kernel module that
# containers and small VMs may lack), so Pods reach the host at a fixed address on any machine. kubelet, kube-proxy and the scheduler use their default ports: one node
# per machine.
NODE_NAME=skyport-node
NODE_IP=10.201.0.1
POD_CIDR=10.202.0.0/24
SVC_CIDR=10.203.0.0/24
SVC_API_IP=10.203.0.1
DNS_IP=10.203.0.10
# Addresses the host routes to itself, for exit servers of the local provider that Pods reach.
EXIT_RANGE=10.204.0.0/24
EXIT_ADDRESSES=10.204.0.1-10.204.0.254
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
N="$STATE/node"
NODE_LOG="$LOGS/node.log"
# shellcheck source=tests/env/need.sh
. "$ROOT/tests/env/need.sh"

ctr_() { ctr --address "$N/containerd/containerd.sock" --namespace k8s.io "$@"; }
kubectl_node() { "$N/bin/kubectl" --kubeconfig "$N/kubeconfig" "$@"; }
node_api_ready() { [[ "$(curl -fsS --max-time 3 --cacert "$PKI/ca.crt" "https://$NODE_IP:$P_NODE_API/readyz" 2>/dev/null)" == ok ]]; }
node_ready() {
  kubectl_node get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

# Certificates signed by the environment's CA: the node apiserver's serving cert, the kubelet's
# client (system:node:<name>) and serving certs, the apiserver's client cert towards the kubelet.
node_pki() {
  [[ -f "$N/pki/.complete" ]] && return 0
  rm -rf "$N/pki"; mkdir -p "$N/pki"
  (
    set -euo pipefail
    cd "$N/pki"; umask 077
    cert() {  # name subject extensions...
      local name="$1" subj="$2"; shift 2
      openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -subj "$subj" \
        | openssl x509 -req -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -CAserial serial \
            -days 3650 -out "$name.crt" -extfile <(printf '%s\n' "$@" "keyUsage=critical,digitalSignature,keyEncipherment")
    }
    cert apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth" \
      "subjectAltName=IP:$NODE_IP,IP:$SVC_API_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
    cert kubelet-serving "/CN=$NODE_NAME" "extendedKeyUsage=serverAuth" "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
    touch .complete
  ) >>"$NODE_LOG" 2>&1 &
  wait $! || die "creating the node's certificates failed (log: $NODE_LOG)"
}

node_kubeconfig() {  # file user-lines...
  local file="$1"; shift
  (umask 077; {
    printf '%s\n' "apiVersion: v1" "kind: Config" "clusters:" "- name: skyport-node" "  cluster:" \
      "    server: https://$NODE_IP:$P_NODE_API" "    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")" \
      "users:" "- name: user" "  user:"
    printf '    %s\n' "$@"
    printf '%s\n' "contexts:" "- name: skyport-node" "  context: {cluster: skyport-node, user: user, namespace: default}" \
      "current-context: skyport-node"
  } >"$file.tmp")
  mv "$file.tmp" "$file"
}

# The host side: the node's address, forwarding, bridged traffic through iptables (kube-proxy).
node_host_network() {
  # Read whole, not piped into `grep -q`: grep exits at the first match, `ip` then dies of SIGPIPE,
  # and under pipefail a present address reads as missing (the add then fails: "File exists").
  [[ "$(ip -4 addr show dev lo)" == *"inet $NODE_IP/"* ]] || ip addr add "$NODE_IP/32" dev lo \
    || die "cannot add the node address $NODE_IP to lo (needs root)"
  [[ $'\n'"$(ip route show table local)" == *$'\n'"local $EXIT_RANGE dev lo"* ]] \
    || ip route add local "$EXIT_RANGE" dev lo || die "cannot route $EXIT_RANGE to lo (needs root)"
  sysctl -qw net.ipv4.ip_forward=1 || die "cannot enable IPv4 forwarding (needs root)"
  # kube-proxy and the kubelet watch files with inotify; at the default 128 instances per user,
  # a busy test run (every tunnel process watches its config) starved kube-proxy, which exited
  # with "too many open files". Raised only, never lowered.
  (($(cat /proc/sys/fs/inotify/max_user_instances) >= 1024)) || sysctl -qw fs.inotify.max_user_instances=1024 \
    || die "cannot raise fs.inotify.max_user_instances (needs root)"
  # A highly available Tunnel's planned handover on the local provider: the exit server giving
  # the reserved address up closes its SO_REUSEPORT listeners while the new holder's are open,
  # and the kernel resets connections still queued on a closed one unless it hands them over.
  sysctl -qw net.ipv4.tcp_migrate_req=1 || die "cannot enable net.ipv4.tcp_migrate_req (needs root, Linux 5.14+)"
  # This state dir owns the host's node setup: only its `down` undoes it.
  touch "$N/host-network"
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || die "no br_netfilter (net.bridge.bridge-nf-call-iptables); kube-proxy cannot see bridged Pod traffic"
}

node_configs() {
  mkdir -p "$N/containerd" "$N/cni" "$N/kubelet" "$N/pod-logs" "$N/manifests"
  cat >"$N/containerd/config.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
[grpc]
  address = "$N/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Without it runc sets each sandbox's oom_score_adj to -998, which needs CAP_SYS_RESOURCE; a
  # test machine that is itself a container may lack it (runc: "nsexec: failed to update
  # /proc/self/oom_score_adj: Permission denied", "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
EOF
  cat >"$N/cni/10-skyport.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "skyport", "plugins": [
  {"type": "bridge", "bridge": "skyport0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$N/cni-ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
EOF
  # failCgroupV1: false: the machines this runs on may still be on cgroup v1, which the kubelet
  # refuses by default. The eviction thresholds are low so a full CI disk does not taint the node.
  cat >"$N/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$N/containerd/containerd.sock
address: $NODE_IP
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
tlsCertFile: $N/pki/kubelet-serving.crt
tlsPrivateKeyFile: $N/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: /etc/resolv.conf
podLogsDir: $N/pod-logs
staticPodPath: $N/manifests
failSwapOn: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  node_kubeconfig "$N/kubelet/kubeconfig" "client-certificate: $N/pki/kubelet-client.crt" "client-key: $N/pki/kubelet-client.key"
  node_kubeconfig "$N/kubeconfig" "token: $(cut -d, -f1 "$PKI/tokens.csv")"
  cat >"$N/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $N/kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
EOF
}

# The cluster DNS: CoreDNS as a cluster add-on would be (tests/env/node-dns.yaml).
node_dns_manifest() {
  sed -e "s|@DNS_IMAGE@|$DNS_IMAGE|g" -e "s|@DNS_IP@|$DNS_IP|g" "$ROOT/tests/env/node-dns.yaml"
}

node_link() {  # name target: pid files are matched by the executable's name
  mkdir -p "$N/bin"; ln -sfn "$2" "$N/bin/$1"; echo "$N/bin/$1"
}

start_node() {
  local t0=$SECONDS
  mkdir -p "$N"
  : >"$NODE_LOG"
  NODE_BIN="$("$ROOT/tests/env/build-node.sh" {LOCK}>&- 2>>"$NODE_LOG")" || die "building the node failed (log: $NODE_LOG)"
  echo "$NODE_BIN" >"$N/node-bin"
  DNS_IMAGE="$(tar -xOf "$NODE_BIN/images/coredns.tar" index.json | sed -n 's/.*"io.containerd.image.name": "\([^"]*\)".*/\1/p')"
  node_link kubectl "$BIN/kubectl" >/dev/null
  if ! alive kubelet && port_busy 10250; then
    die "port 10250 (the kubelet's) is taken: is another test node running (tests/env.sh with another SKYPORT_STATE)? One node per machine"
  fi
  # Debian's container runtime and CNI plugins, what kube-proxy and the kubelet call, the host
  # network's tools, and socat for localstack-forward.
  need /usr/bin/containerd ctr runc /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/portmap \
    iptables conntrack ip sysctl pgrep umount awk socat >>"$NODE_LOG" 2>&1 \
    || die "installing the node's packages failed (log: $NODE_LOG)"
  node_host_network
  node_pki
  node_configs

  if ! alive node-apiserver; then
    need_free_port "$P_NODE_API" "the node cluster's kube-apiserver" SKYPORT_NODE_APISERVER_PORT
    launch node-apiserver "$(node_link node-apiserver "$BIN/kube-apiserver")" \
      --etcd-servers="http://127.0.0.1:$P_ETCD" --etcd-prefix=/skyport-node \
      --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port="$P_NODE_API" \
      --cert-dir="$N/apiserver" --tls-cert-file="$N/pki/apiserver.crt" --tls-private-key-file="$N/pki/apiserver.key" \
      --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
      --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
      --kubelet-client-certificate="$N/pki/apiserver-kubelet-client.crt" \
      --kubelet-client-key="$N/pki/apiserver-kubelet-client.key" --kubelet-certificate-authority="$PKI/ca.crt" \
      --kubelet-preferred-address-types=InternalIP \
      --service-account-issuer="https://kubernetes.default.svc" \
      --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
      --service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true
  fi
  wait_until node-apiserver 90 node_api_ready
  if ! alive node-controller-manager; then
    launch node-controller-manager "$(node_link node-controller-manager "$BIN/kube-controller-manager")" \
      --kubeconfig="$N/kubeconfig" --leader-elect=false --secure-port=0 \
      --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
      --use-service-account-credentials=false --service-cluster-ip-range="$SVC_CIDR"
  fi
  alive kube-scheduler || launch kube-scheduler "$NODE_BIN/kube-scheduler" \
    --kubeconfig="$N/kubeconfig" --leader-elect=false --bind-address=127.0.0.1
  if ! alive containerd; then
    launch containerd /usr/bin/containerd --config "$N/containerd/config.toml"
    wait_until containerd 30 ctr_ version
    local image
    for image in pause coredns busybox; do
      ctr_ images import "$NODE_BIN/images/$image.tar" >>"$NODE_LOG" 2>&1 || die "importing the $image image failed (log: $NODE_LOG)"
    done
  fi
  alive kubelet || launch kubelet "$NODE_BIN/kubelet" --config="$N/kubelet/config.yaml" \
    --kubeconfig="$N/kubelet/kubeconfig" --root-dir="$N/kubelet/root" \
    --node-ip="$NODE_IP" --hostname-override="$NODE_NAME"
  wait_until kubelet 120 node_ready
  alive kube-proxy || launch kube-proxy "$NODE_BIN/kube-proxy" --config="$N/kube-proxy.yaml"
  if ! alive localstack-forward; then
    launch localstack-forward "$(node_link localstack-forward "$(type -P socat)")" \
      "TCP-LISTEN:$P_LS,bind=$NODE_IP,reuseaddr,fork" "TCP:127.0.0.1:$P_LS"
  fi
  node_dns_manifest | kubectl_node apply -f - >>"$NODE_LOG" 2>&1 || die "applying CoreDNS failed (log: $NODE_LOG)"
  kubectl_node -n kube-system rollout status deployment/coredns --timeout=120s >>"$NODE_LOG" 2>&1 \
    || die "CoreDNS did not become ready (log: $NODE_LOG, $LOGS/kubelet.log)"
  log "node $NODE_NAME ready at $NODE_IP (cluster https://$NODE_IP:$P_NODE_API) in $((SECONDS - t0))s"
}

# A failure anywhere leaves the reason in $STATE/node-unavailable (exported as SKYPORT_NODE_ERROR,
# so tests that need the node fail with it) instead of failing the whole environment.
start_node_or_report() {
  rm -f "$STATE/node-unavailable"
  if [[ "${SKYPORT_NODE:-1}" == 0 ]]; then
    log "no node (SKYPORT_NODE=0): tests that need one are skipped and say so"; return 0
  fi
  (
    die() { echo "$*" >"$STATE/node-unavailable"; echo "env.sh: ERROR: $*" >&2; exit 1; }
    start_node
  ) &
  if ! wait $!; then
    [[ -s "$STATE/node-unavailable" ]] || echo "starting the node failed (log: $NODE_LOG)" >"$STATE/node-unavailable"
    log "the node is NOT available; tests that need it will fail (opt out: SKYPORT_NODE=0)"
  fi
}

node_exports() {
  if [[ "${SKYPORT_NODE:-1}" == 0 ]]; then
    printf 'export SKYPORT_NODE=0\n'
  elif [[ -s "$STATE/node-unavailable" ]]; then
    printf 'export SKYPORT_NODE_ERROR=%q\n' "$(cat "$STATE/node-unavailable")"
  else
    printf 'export SKYPORT_NODE_KUBECONFIG=%q\n' "$N/kubeconfig"
    # LocalStack as Pods reach it (localstack-forward).
    printf 'export SKYPORT_NODE_AWS_ENDPOINT_URL=%q\n' "http://$NODE_IP:$P_LS"
    # The runtime's socket, for `ctr --address ... --namespace k8s.io images import` of test images.
    printf 'export SKYPORT_NODE_CONTAINERD=%q\n' "$N/containerd/containerd.sock"
    # For the local provider's exit servers (Helm: tunnel.local.addresses).
    printf 'export SKYPORT_NODE_EXIT_ADDRESSES=%q\n' "$EXIT_ADDRESSES"
    # crictl and the other node binaries.
    printf 'export SKYPORT_NODE_BIN=%q\n' "$(cat "$N/node-bin")"
  fi
}

node_components=(kube-proxy kubelet containerd kube-scheduler node-controller-manager node-apiserver localstack-forward)

node_status() {
  local c ok=0
  for c in "${node_components[@]}"; do
    if alive "$c"; then printf '%-24s %-8s %s\n' "$c" running "pid $(pid_of "$c")"; else printf '%-24s stopped\n' "$c"; ok=1; fi
  done
  if ((ok == 0)); then node_ready && echo "node $NODE_NAME Ready" || { echo "node $NODE_NAME NOT Ready"; ok=1; }; fi
  return $ok
}

# The chains the kubelet itself makes (kube-proxy --cleanup removes only its own).
node_kubelet_iptables_cleanup() {
  local cmd table chain
  for cmd in iptables ip6tables; do
    for table in filter nat mangle; do
      for chain in INPUT OUTPUT; do
        while "$cmd" -t "$table" -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
      done
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$cmd" -t "$table" -F "$chain" 2>/dev/null && "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

# The kubelet goes first (it would restart the Pods), then the runtime stops and removes every
# Pod sandbox (CNI teardown, network namespaces, mounts) before it stops itself.
stop_node() {
  [[ -d "$N" ]] || return 0
  local bin; bin="$(cat "$N/node-bin" 2>/dev/null || true)"
  stop kube-proxy kubelet
  if alive containerd && [[ -x "$bin/crictl" ]]; then
    "$bin/crictl" --runtime-endpoint "unix://$N/containerd/containerd.sock" rmp --all --force >/dev/null 2>&1 \
      || log "crictl rmp failed; killing the containers instead"
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  fi
  stop containerd kube-scheduler node-controller-manager localstack-forward
  stop node-apiserver
  # The runtime's shims outlive containerd; they are ours when they serve our socket.
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $N/containerd/containerd.sock" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Host-wide state, undone only by the state dir that set it up (not by one whose node never
  # started because another runs).
  if [[ -f "$N/host-network" ]]; then
    [[ -x "$bin/kube-proxy" ]] && "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
    node_kubelet_iptables_cleanup
    awk -v n="$N/" 'index($2, n) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    ip link del skyport0 2>/dev/null || true
    ip addr del "$NODE_IP/32" dev lo 2>/dev/null || true
    ip route del local "$EXIT_RANGE" dev lo 2>/dev/null || true
    rm -f "$N/host-network"
  fi
  rm -rf "$N/containerd/state" "$N/cni-ipam" "$N/kubelet/root"
  log "node stopped"
}

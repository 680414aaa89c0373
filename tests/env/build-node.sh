#!/usr/bin/env bash
# Builds what the test node runs (tests/env/node.sh) into a cache directory keyed by the recipes'
# hash, and prints that directory. A warm cache makes this a no-op.
#
#   kubelet, kube-proxy, kube-scheduler   upstream Go modules, same version as the control plane
#                                         (recipe: tests/env/node/go.mod)
#   coredns, crictl                       CoreDNS and cri-tools from their Go modules
#                                         (tests/env/node-tools/go.mod)
#   pause                                 upstream build/pause/linux/pause.c from the same
#                                         k8s.io/kubernetes module, static, with gcc
#   images/pause.tar, images/coredns.tar  OCI archives of those two (tests/env/oci-image.py),
#                                         named as the kubelet and the DNS Deployment expect
#   images/busybox.tar                    Debian's static busybox, for tests' probe and backend Pods
#
# The container runtime and the CNI plugins the node runs are Debian's, installed by tests/env/node.sh
# (`need`, tests/env/packages.txt).
#
#   SKYPORT_CACHE   cache root (default ~/.cache/skyport); output in $SKYPORT_CACHE/bin/node-<ver>-<key>/
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"
PAUSE_TAG=3.10.2

KV="$(grep -oE 'k8s.io/kubernetes v[0-9.]+' "$HERE/node/go.mod" | head -1 | cut -d' ' -f2)"
DV="$(grep -oE 'github.com/coredns/coredns v[0-9.]+' "$HERE/node-tools/go.mod" | head -1 | cut -d' ' -f2)"
[[ -n "$KV" && -n "$DV" ]] || { echo "build-node: no versions in $HERE/node/go.mod, $HERE/node-tools/go.mod" >&2; exit 1; }
KEY="$(cat "$HERE"/node/go.mod "$HERE"/node/go.sum "$HERE"/node-tools/go.mod "$HERE"/node-tools/go.sum \
  "$HERE/oci-image.py" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
OUT="$CACHE/bin/node-$KV-$KEY"

if [[ -x "$OUT/kubelet" && -x "$OUT/kube-proxy" && -x "$OUT/kube-scheduler" && -x "$OUT/coredns" && -x "$OUT/crictl" \
  && -f "$OUT/images/pause.tar" && -f "$OUT/images/coredns.tar" && -f "$OUT/images/busybox.tar" ]]; then
  echo "$OUT"; exit 0
fi

command -v go >/dev/null || { echo "build-node: Go is required (https://go.dev/dl/)" >&2; exit 1; }
# shellcheck source=tests/env/need.sh
. "$HERE/need.sh"
need gcc strip /bin/busybox
# Debian's busybox package installs a dynamically linked /bin/busybox; the images need busybox-static's.
ldd /bin/busybox 2>/dev/null | grep -q ' => ' && { echo "build-node: /bin/busybox is dynamically linked; install busybox-static" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/images"

minor="$(echo "$KV" | cut -d. -f2)"
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X '$pkg.gitVersion=$KV' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor' -X '$pkg.gitTreeState=clean'"
done
echo "building kubelet, kube-proxy, kube-scheduler $KV into $OUT (first run: several minutes)" >&2
(cd "$HERE/node" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$ld" -o "$OUT.tmp/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler) >&2
echo "building coredns $DV, crictl" >&2
(cd "$HERE/node-tools" && go build -trimpath -ldflags "-s -w" -o "$OUT.tmp/" github.com/coredns/coredns \
  sigs.k8s.io/cri-tools/cmd/crictl) >&2

src="$(cd "$HERE/node" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
gcc -Os -static -DVERSION="v$PAUSE_TAG" -o "$OUT.tmp/pause" "$src/build/pause/linux/pause.c"
strip "$OUT.tmp/pause"

# The kubelet's default sandbox image, so nothing is ever pulled for it.
python3 "$HERE/oci-image.py" "$OUT.tmp/images/pause.tar" "registry.k8s.io/pause:$PAUSE_TAG" \
  --file "$OUT.tmp/pause:/pause" --user 65535:65535 --entrypoint '["/pause"]'
python3 "$HERE/oci-image.py" "$OUT.tmp/images/coredns.tar" "registry.k8s.io/coredns/coredns:$DV" \
  --file "$OUT.tmp/coredns:/coredns" --user 65532:65532 --entrypoint '["/coredns"]' --port 53/udp --port 53/tcp
python3 "$HERE/oci-image.py" "$OUT.tmp/images/busybox.tar" "skyport.test/busybox:debian" \
  --file /bin/busybox:/bin/busybox --text "/etc/passwd=root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/:/bin/sh
" --entrypoint '["/bin/busybox"]' --cmd '["sh"]'
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT"

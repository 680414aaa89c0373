#!/usr/bin/env bash
# Builds the real kube-apiserver, kube-controller-manager, kubectl and etcd from the upstream Go
# modules (recipes: tests/env/kube/go.mod, tests/env/etcd/go.mod) into a cache directory keyed by
# the recipes' hash, and prints that directory. A warm cache makes this a no-op.
#
#   SKYPORT_CACHE   cache root (default ~/.cache/skyport); binaries land in $SKYPORT_CACHE/bin/<key>/
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"

# Matches both `require k8s.io/kubernetes vX` and the same line inside a require ( ... ) block.
KV="$(grep -oE 'k8s.io/kubernetes v[0-9.]+' "$HERE/kube/go.mod" | head -1 | cut -d' ' -f2)"
[[ -n "$KV" ]] || { echo "build-control-plane: no k8s.io/kubernetes version in $HERE/kube/go.mod" >&2; exit 1; }
KEY="$(cat "$HERE"/kube/go.mod "$HERE"/kube/go.sum "$HERE"/etcd/go.mod "$HERE"/etcd/go.sum "${BASH_SOURCE[0]}" \
  | sha256sum | cut -c1-12)"
OUT="$CACHE/bin/kube-$KV-$KEY"

if [[ -x "$OUT/kube-apiserver" && -x "$OUT/kube-controller-manager" && -x "$OUT/kubectl" && -x "$OUT/etcd" ]]; then
  echo "$OUT"; exit 0
fi

command -v go >/dev/null || { echo "build-control-plane: Go is required (https://go.dev/dl/)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
mkdir -p "$OUT.tmp"

minor="$(echo "$KV" | cut -d. -f2)"
commit="$(cd "$HERE/kube" && go mod download -json "k8s.io/kubernetes@$KV" 2>/dev/null \
  | sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -1 || true)"
date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ld="-s -w"
# Version stamping as upstream's hack/lib/version.sh does, so clients parsing /version see 1.x.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X '$pkg.gitVersion=$KV' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
  ld+=" -X '$pkg.gitCommit=${commit:-unknown}' -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=$date'"
done

echo "building kube-apiserver, kube-controller-manager, kubectl $KV into $OUT (first run: 10-25 min)" >&2
(cd "$HERE/kube" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$ld" -o "$OUT.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl) >&2
echo "building etcd" >&2
(cd "$HERE/etcd" && go build -trimpath -ldflags "-s -w" -o "$OUT.tmp/etcd" go.etcd.io/etcd/server/v3) >&2
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT"

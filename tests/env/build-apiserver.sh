#!/usr/bin/env bash
# Builds kube-apiserver alone from one recipe directory (tests/env/kube-oldest, tests/env/kube-newest:
# a go.mod pinning k8s.io/kubernetes) into a cache directory keyed by the recipe's hash, and prints
# the binary's path. A warm cache makes this a no-op. tests/env/apiserver-matrix.sh runs the CRDs
# against these; the main environment's control plane comes from build-control-plane.sh.
#
#   build-apiserver.sh RECIPE_DIR
#   SKYPORT_CACHE   cache root (default ~/.cache/skyport); the binary lands in $SKYPORT_CACHE/bin/<key>/
set -euo pipefail
RECIPE="$(cd "${1:?usage: build-apiserver.sh RECIPE_DIR}" && pwd)"
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"

KV="$(grep -oE 'k8s.io/kubernetes v[0-9.]+' "$RECIPE/go.mod" | head -1 | cut -d' ' -f2)"
[[ -n "$KV" ]] || { echo "build-apiserver: no k8s.io/kubernetes version in $RECIPE/go.mod" >&2; exit 1; }
KEY="$(cat "$RECIPE/go.mod" "$RECIPE/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
OUT="$CACHE/bin/apiserver-$KV-$KEY"

[[ -x "$OUT/kube-apiserver" ]] && { echo "$OUT/kube-apiserver"; exit 0; }

command -v go >/dev/null || { echo "build-apiserver: Go is required (https://go.dev/dl/)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
mkdir -p "$OUT.tmp"

minor="$(echo "$KV" | cut -d. -f2)"
commit="$(cd "$RECIPE" && go mod download -json "k8s.io/kubernetes@$KV" 2>/dev/null \
  | sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -1 || true)"
ld="-s -w"
# Version stamping as upstream's hack/lib/version.sh does: /version reports 1.x, which the test
# checks against the recipe.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X '$pkg.gitVersion=$KV' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
  ld+=" -X '$pkg.gitCommit=${commit:-unknown}' -X '$pkg.gitTreeState=clean'"
  ld+=" -X '$pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)'"
done

echo "building kube-apiserver $KV into $OUT (first run: 5-15 min)" >&2
start=$SECONDS
(cd "$RECIPE" && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$ld" -o "$OUT.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver) >&2
echo "built kube-apiserver $KV in $((SECONDS - start))s" >&2
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT/kube-apiserver"

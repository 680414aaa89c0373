#!/usr/bin/env bash
# Builds the helm CLI from its Go module (the Go module proxy; never a downloaded binary) into
# $SKYPORT_CACHE/bin/helm-<version>/ and prints the binary's path. A warm cache makes this a
# no-op; a cold build takes about 7 minutes on 2 cores. Used by tests/deploy.rs through
# tests/run.sh (SKYPORT_HELM).
#
#   SKYPORT_CACHE   cache root (default ~/.cache/skyport)
#   HELM_VERSION    module version to build (default below)
set -euo pipefail
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"
VERSION="${HELM_VERSION:-v4.3.1}"
OUT="$CACHE/bin/helm-$VERSION"

if [[ -x "$OUT/helm" ]]; then
  echo "$OUT/helm"; exit 0
fi
command -v go >/dev/null || { echo "build-helm: Go is required" >&2; exit 1; }
major="${VERSION%%.*}"
echo "building helm $VERSION into $OUT (first run: several minutes)" >&2
mkdir -p "$OUT.tmp"
# Shares the module and build caches with tests/env/build-control-plane.sh.
GOTOOLCHAIN=local GOFLAGS=-trimpath CGO_ENABLED=0 \
  GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOBIN="$OUT.tmp" \
  go install -ldflags "-s -w" "helm.sh/helm/$major/cmd/helm@$VERSION" >&2
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT/helm"

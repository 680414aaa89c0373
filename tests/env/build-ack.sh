#!/usr/bin/env bash
# Builds the ACK SQS controller (github.com/aws-controllers-k8s/sqs-controller), the system
# benches/queues.rs compares skyport with (BENCHMARKS.md, "Side by side with ACK"), from a checkout
# the caller provides, into $SKYPORT_CACHE/bin/ack-sqs-<commit>/ and prints the binary's path.
# Its source is not on the Go module proxy, so it is never fetched here: clone it yourself and
# point SKYPORT_ACK_SRC at the checkout. Every dependency comes from the Go module proxy. A warm
# cache makes this a no-op; a cold build takes about 7 minutes on 2 cores.
#
#   SKYPORT_ACK_SRC   checkout of aws-controllers-k8s/sqs-controller (required; a git work tree)
#   SKYPORT_CACHE     cache root (default ~/.cache/skyport)
#
# The CRDs to install come from the same checkout: $SKYPORT_ACK_SRC/config/crd/bases and
# config/crd/common/bases.
set -euo pipefail
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"
SRC="${SKYPORT_ACK_SRC:?set SKYPORT_ACK_SRC to a checkout of aws-controllers-k8s/sqs-controller}"
[[ -f "$SRC/cmd/controller/main.go" ]] || { echo "build-ack: $SRC has no cmd/controller/main.go" >&2; exit 1; }
command -v go >/dev/null || { echo "build-ack: Go is required" >&2; exit 1; }
# shellcheck source=tests/env/need.sh
. "$(dirname "${BASH_SOURCE[0]}")/need.sh"
need git
COMMIT="$(git -C "$SRC" rev-parse --short=12 HEAD)"
# A dirty tree is a different program than its commit: key it by the diff too.
if [[ -n "$(git -C "$SRC" status --porcelain --untracked-files=no)" ]]; then
  COMMIT="$COMMIT-dirty-$(git -C "$SRC" diff HEAD | sha256sum | cut -c1-8)"
fi
OUT="$CACHE/bin/ack-sqs-$COMMIT"

if [[ -x "$OUT/controller" ]]; then
  echo "$OUT/controller"; exit 0
fi
echo "building the ACK SQS controller ($COMMIT) into $OUT (first run: several minutes)" >&2
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
# Shares the module and build caches with the other Go builds under tests/env/. The toolchain
# here may be older than go.mod asks for; GOTOOLCHAIN=local makes that an error, not a download.
(cd "$SRC" && GOTOOLCHAIN=local GOFLAGS=-trimpath CGO_ENABLED=0 \
  GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" \
  go build -ldflags "-s -w" -o "$OUT.tmp/controller" ./cmd/controller) >&2
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT/controller"

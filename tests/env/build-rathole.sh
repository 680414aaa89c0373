#!/usr/bin/env bash
# Builds rathole, the tunnel server and client skyport runs (see README "Tunnel software"), from
# its crate into $SKYPORT_CACHE/bin/rathole-<version>/ and prints the binary's path. A warm cache
# makes this a no-op; a cold build takes about 5-8 minutes on 2 cores. Used by the Tunnel tests,
# the local provider and the playground (SKYPORT_RATHOLE).
#
# Not `--locked`: rathole 0.5.0's lock file pins `time` 0.3.29, which no longer compiles on Rust
# >= 1.80 (rathole-org/rathole#380). Only the Noise transport is built, which keeps OpenSSL out.
#
#   SKYPORT_CACHE     cache root (default ~/.cache/skyport)
#   RATHOLE_VERSION   crate version to build (default below; keep in step with
#                     providers/src/userdata.rs RATHOLE_VERSION)
set -euo pipefail
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"
VERSION="${RATHOLE_VERSION:-0.5.0}"
OUT="$CACHE/bin/rathole-$VERSION"

if [[ -x "$OUT/bin/rathole" ]]; then
  echo "$OUT/bin/rathole"; exit 0
fi
echo "building rathole $VERSION into $OUT (first run: several minutes)" >&2
rm -rf "$OUT.tmp"
CARGO_TARGET_DIR="$CACHE/cargo-target/rathole-$VERSION" \
  cargo install rathole --version "=$VERSION" --no-default-features \
  --features server,client,noise,hot-reload --root "$OUT.tmp" >&2
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
rm -rf "$CACHE/cargo-target/rathole-$VERSION"
echo "$OUT/bin/rathole"

#!/usr/bin/env bash
# Builds cargo-deny (crates.io, pinned) once into the cache and prints the binary's path, for
# .ci/run's `cargo deny check`. About 6 minutes once on 2 cores; a no-op when cached.
#
#   SKYPORT_CACHE   cache root (default ~/.cache/skyport)
set -euo pipefail
version=0.20.2
root="${SKYPORT_CACHE:-$HOME/.cache/skyport}/tools/cargo-deny-$version"
if [[ ! -x "$root/bin/cargo-deny" ]]; then
  echo "build-cargo-deny: building cargo-deny $version (once)" >&2
  # Its own target directory, so the project's build cache is not churned.
  CARGO_TARGET_DIR="$root/target" cargo install --locked --quiet "cargo-deny@$version" --root "$root" >&2
  rm -rf "$root/target"
fi
echo "$root/bin/cargo-deny"

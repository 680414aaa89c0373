#!/usr/bin/env bash
# Builds the binary the image ships (Dockerfile: static, musl, `dist` profile) into the release
# target directory under ~/.cache/skyport, and prints its path: for the benchmarks'
# SKYPORT_BENCH_EXE, the guests of the guest tests (SKYPORT_GUEST_EXE) and skyport's image on the
# test node (tests/env/build-image.sh). Needs Rust's x86_64-unknown-linux-musl target (added with
# rustup when missing) and Debian's musl-tools, gcc and make for the C parts (ring, jemalloc).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tests/env/need.sh
. tests/env/need.sh
need x86_64-linux-musl-gcc cc make
target=x86_64-unknown-linux-musl
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/skyport/cargo-target/release}"
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
tests/env/cargo-progress.sh "the static skyport binary" --profile dist --locked --target "$target" --bin skyport
echo "$CARGO_TARGET_DIR/$target/dist/skyport"

#!/usr/bin/env bash
# Builds the binary the image ships (Dockerfile: static, musl, `dist` profile) into the release
# target directory under ~/.cache/skyport, and prints its path, for the benchmarks'
# SKYPORT_BENCH_EXE and for the guests of the guest tests (SKYPORT_GUEST_EXE). Needs Rust's x86_64-unknown-linux-musl target (added with rustup when
# missing), gcc and make (ring, jemalloc); Debian's musl-tools may be needed too.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=x86_64-unknown-linux-musl
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/skyport/cargo-target/release}"
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
cargo build --profile dist --locked --target "$target" --bin skyport >&2
echo "$CARGO_TARGET_DIR/$target/dist/skyport"

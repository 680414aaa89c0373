#!/usr/bin/env bash
# `cargo build ARGS...` that says how far it is: every 30 s while it runs, a line such as
#   building skyport: 212/420 crates, 4m10s elapsed, about 5m left (estimate)
# on stderr. Crates count as cargo reports them built or fresh (build scripts not counted); the
# total is the count of the last successful build with the same arguments and target directory
# (kept in $SKYPORT_CACHE/cargo-progress), or, the first time, the packages in Cargo.lock. The time
# left assumes the remaining crates take as long as the finished ones did on average.
#
#   tests/env/cargo-progress.sh WHAT ARGS...      WHAT names the build in the progress lines
#   SKYPORT_PROGRESS_EVERY                         seconds between lines (default 30)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
what="$1"; shift
every="${SKYPORT_PROGRESS_EVERY:-30}"
counts="${SKYPORT_CACHE:-$HOME/.cache/skyport}/cargo-progress"
mkdir -p "$counts"
key="$(printf '%s\n' "${CARGO_TARGET_DIR:-$PWD/target}" "$@" | sha256sum | cut -c1-16)"
total="$(cat "$counts/$key" 2>/dev/null || grep -c '^name = ' Cargo.lock)"

messages="$(mktemp)"
trap 'rm -f "$messages"' EXIT
# JSON messages on stdout (one per crate), compiler diagnostics rendered on stderr as usual.
cargo build --quiet --message-format=json-render-diagnostics "$@" >"$messages" &
cargo=$!
trap 'kill "$cargo" 2>/dev/null; rm -f "$messages"' EXIT

built() { grep '"reason":"compiler-artifact"' "$messages" | grep -vc '"kind":\["custom-build"\]' || true; }
minsec() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

start=$SECONDS
next=$((start + every))
while kill -0 "$cargo" 2>/dev/null; do
  sleep 1
  ((SECONDS >= next)) || continue
  next=$((SECONDS + every))
  n="$(built)" elapsed=$((SECONDS - start))
  ((total > n)) || total=$((n + 1))
  # None finished yet: cargo may be waiting for another build's lock on the target directory.
  left=", none finished yet (another cargo build may hold the target directory)"
  ((n > 0)) && left=", about $(minsec $((elapsed * (total - n) / n))) left (estimate)"
  echo "building $what: $n/$total crates, $(minsec "$elapsed") elapsed$left" >&2
done
rc=0
wait "$cargo" || rc=$?
trap 'rm -f "$messages"' EXIT
if ((rc == 0)); then
  built >"$counts/$key"
  ((SECONDS - start < every)) || echo "built $what in $(minsec $((SECONDS - start)))" >&2
fi
exit "$rc"

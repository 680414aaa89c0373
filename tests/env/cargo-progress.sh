#!/usr/bin/env bash
# `cargo build ARGS...` that says how far it is: every 30 s while it runs, a line such as
#   building skyport: 212/420 crates, 4m10s elapsed, about 5m left (estimate)
# on stderr. Crates count as cargo reports them built or fresh (build scripts not counted). The
# total and the time left come from the last successful build with the same arguments and target
# directory (kept in $SKYPORT_CACHE/cargo-progress: its crate count, and when it reached each
# count; the slowest such build is kept): what that build took from the count reached now to its
# end. The first time, the total is
# the number of packages in Cargo.lock and the time left assumes the remaining crates take as long
# as the finished ones did on average.
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
# "<crates> <seconds>" lines of a successful build (the slowest with this crate count); its last
# line is its end.
last="$counts/$key.timeline"
total="$( (tail -n1 "$last" 2>/dev/null || true) | cut -d' ' -f1)"
[[ -n $total ]] || total="$(grep -c '^name = ' Cargo.lock)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building $what (cargo build $*) ..." >&2
# JSON messages on stdout (one per crate), compiler diagnostics rendered on stderr as usual.
cargo build --quiet --message-format=json-render-diagnostics "$@" >"$work/messages" &
cargo=$!
trap 'kill "$cargo" 2>/dev/null; rm -rf "$work"' EXIT

built() { grep '"reason":"compiler-artifact"' "$work/messages" | grep -vc '"kind":\["custom-build"\]' || true; }
minsec() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
# Seconds the last build took from reaching $1 crates to its end, if it is known.
last_left() {
  [[ -f $last ]] || return 1
  local n t end
  end="$(tail -n1 "$last" | cut -d' ' -f2)"
  while read -r n t; do
    ((n >= $1)) && { echo $((end - t)); return 0; }
  done <"$last"
  return 1
}

start=$SECONDS
next=$((start + every))
seen=0 since=0
while kill -0 "$cargo" 2>/dev/null; do
  sleep 1
  n="$(built)"
  ((n == seen)) || { seen=$n since=$((SECONDS - start)); echo "$n $since" >>"$work/timeline"; }
  ((SECONDS >= next)) || continue
  next=$((SECONDS + every))
  elapsed=$((SECONDS - start))
  ((total >= n)) || total=$n
  if ((n == 0)); then
    # cargo may be waiting for another build's lock on the target directory.
    left=", none finished yet (another cargo build may hold the target directory)"
  elif before="$(last_left "$n")"; then
    before=$((before - (elapsed - since)))
    ((before > 0)) || before=0
    left=", about $(minsec "$before") left (estimate from an earlier build)"
  else
    left=", about $(minsec $((elapsed * (total - n) / n))) left (estimate)"
  fi
  echo "building $what: $n/$total crates, $(minsec "$elapsed") elapsed$left" >&2
done
rc=0
wait "$cargo" || rc=$?
trap 'rm -rf "$work"' EXIT
if ((rc == 0)); then
  n="$(built)" took=$((SECONDS - start))
  echo "$n $took" >>"$work/timeline"
  # The slowest build is kept (a build that found most crates fresh would promise too little),
  # unless the crate count changed.
  read -r last_n last_took < <(tail -n1 "$last" 2>/dev/null || echo "0 0")
  ((n != last_n || took >= last_took)) && mv "$work/timeline" "$last"
  ((SECONDS - start < every)) || echo "built $what in $(minsec $((SECONDS - start)))" >&2
fi
exit "$rc"

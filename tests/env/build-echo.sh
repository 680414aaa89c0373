#!/usr/bin/env bash
# Builds the backend image of the Tunnel tests on the node (tests/env/echo.rs, static, with rustc
# alone) and prints "<archive> <reference>": an OCI archive for `ctr images import` and the
# name:tag it carries. Cached by the hash of its inputs; concurrent callers wait for one build.
#
#   SKYPORT_CACHE   cache root (default ~/.cache/skyport); output in $SKYPORT_CACHE/images/
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}/images"
target=x86_64-unknown-linux-musl
key="$(cat "$HERE/echo.rs" "$HERE/oci-image.py" "${BASH_SOURCE[0]}" <(rustc --version) | sha256sum | cut -c1-12)"
archive="$CACHE/echo-$key.tar"
ref="skyport.test/echo:$key"
mkdir -p "$CACHE"
exec 9>"$CACHE/echo.lock"
flock 9
if [[ ! -f "$archive" ]]; then
  rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  rustc --edition 2021 -C opt-level=2 -C strip=symbols --target "$target" -o "$work/echo" "$HERE/echo.rs" >&2
  python3 "$HERE/oci-image.py" "$work/echo.tar" "$ref" --file "$work/echo:/echo" --user 65534:65534 \
    --entrypoint '["/echo"]' >&2
  rm -f "$CACHE"/echo-*.tar
  mv "$work/echo.tar" "$archive"
fi
echo "$archive $ref"

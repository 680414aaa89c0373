#!/usr/bin/env bash
# Builds skyport's image for the test node (tests/env/node.sh) from the project's Dockerfile with
# buildah (Debian's package; daemonless, no registry) around a skyport binary that is already
# built, and prints "<archive> <reference>": an OCI archive for `ctr images import` and the
# name:tag it carries.
#
#   tests/env/build-image.sh [BINARY]
#
# BINARY is the skyport to ship: tests/playground-node.sh passes the debug build it has,
# tests/run.sh the static musl `dist` binary of tests/env/build-musl.sh (the Dockerfile's); without
# it, that static binary is built here.
#
# The Dockerfile's final stage is built as written (its COPY, USER, EXPOSE, ENTRYPOINT, CMD). The
# two things it takes from a registry cannot be pulled here, so each comes from local content
# through buildah's --build-context, without changing the Dockerfile:
#   - the `build` stage (rust:alpine + apk): a folder holding BINARY, stripped, as /skyport;
#   - the base gcr.io/distroless/static-debian12:nonroot: a stand-in made with `buildah from
#     scratch` holding what the project relies on from distroless: Debian's CA bundle at
#     /etc/ssl/certs/ca-certificates.crt (and SSL_CERT_FILE naming it), root/nobody/nonroot in
#     /etc/passwd and /etc/group, /tmp, /home/nonroot, no shell. For a dynamically linked BINARY
#     it also holds the shared libraries `ldd` names, copied from this host (Debian 12, as
#     distroless's debian12 images are), at the paths the binary looks for them.
# The tag is the hash of what went in (binary, libraries, Dockerfile, base), so a change is a new
# image. Archives are kept in $SKYPORT_CACHE/images (default ~/.cache/skyport/images).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}/images"
# shellcheck source=tests/env/need.sh
. "$ROOT/tests/env/need.sh"
need buildah strip

binary="${1:-$("$ROOT/tests/env/build-musl.sh")}"
[[ -x "$binary" ]] || { echo "build-image: no executable at $binary" >&2; exit 1; }
# The base image reference the Dockerfile's final stage names.
base_ref="$(sed -n 's/^FROM \([^ ]*\)$/\1/p' "$ROOT/Dockerfile" | tail -n1)"
[[ -n "$base_ref" ]] || { echo "build-image: no final-stage FROM in the Dockerfile" >&2; exit 1; }
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || { echo "build-image: no CA bundle (Debian's ca-certificates)" >&2; exit 1; }

mkdir -p "$CACHE"
exec 9>"$CACHE/skyport-image.lock"
flock 9
work="$(mktemp -d "$CACHE/skyport-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Debug info is most of a debug build's size and nothing in the image reads it. The `build`
# stage's stand-in is a folder holding only what the final stage copies from it: /skyport.
mkdir -p "$work/build-stage"
strip -o "$work/build-stage/skyport" "$binary"

# The shared libraries of a dynamic binary: the paths of ldd's `name => /path (addr)` lines and of
# the loader's `/path (addr)` line (a static binary has none).
libs=()
if ldd "$binary" >/dev/null 2>&1; then
  while read -r path; do
    libs+=("$path")
  done < <(ldd "$binary" | sed -n -e 's|^.*=> \(/[^ ]*\) (0x.*$|\1|p' -e 's|^[[:space:]]*\(/[^ ]*\) (0x.*$|\1|p' | sort -u)
fi
kind=static
((${#libs[@]} == 0)) || kind=glibc

sum="$( { cat "$work/build-stage/skyport" "$ROOT/Dockerfile" "${BASH_SOURCE[0]}" /etc/ssl/certs/ca-certificates.crt
  for lib in "${libs[@]}"; do echo "$lib"; cat "$lib"; done
  buildah --version; } | sha256sum | cut -c1-16)"
ref="skyport.test/skyport:$kind-$sum"
archive="$CACHE/skyport-$kind-$sum.tar"
if [[ ! -f "$archive" ]]; then
  # A private store per build (vfs: plain directories, no mounts left behind if interrupted).
  b() { buildah --root "$work/root" --runroot "$work/run" --storage-driver vfs "$@"; }

  # The distroless stand-in, from scratch: only files, nothing runs in it.
  base="$(b from scratch)"
  rootfs="$(b mount "$base")"
  install -D -m 644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  install -d -m 1777 "$rootfs/tmp"
  install -d -m 700 -o 65532 -g 65532 "$rootfs/home/nonroot"
  printf '%s\n' root:x:0:0:root:/root:/sbin/nologin nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin \
    nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin >"$rootfs/etc/passwd"
  printf '%s\n' root:x:0: nobody:x:65534: nonroot:x:65532: >"$rootfs/etc/group"
  chmod 644 "$rootfs/etc/passwd" "$rootfs/etc/group"
  # The file behind each path (the host's names are symlinks to versioned files), copied to the
  # path itself.
  for lib in "${libs[@]}"; do install -D -m 755 "$(readlink -f "$lib")" "$rootfs$lib"; done
  b umount "$base" >/dev/null
  b config --user 65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "$base"
  b commit -q --timestamp 0 "$base" localhost/skyport-test/distroless-static:nonroot >/dev/null

  # The Dockerfile. No RUN runs (the stages with RUN are replaced), so no container runtime is
  # involved.
  b build -q --pull=never --timestamp 0 -f "$ROOT/Dockerfile" -t "$ref" \
    --build-context build="$work/build-stage" \
    --build-context "$base_ref=container-image://localhost/skyport-test/distroless-static:nonroot" \
    "$ROOT" >/dev/null
  b push -q "$ref" oci-archive:"$work/image.tar:$ref" >&2
  # One archive of each kind is kept: the playground's (glibc) and the tests' (static).
  rm -f "$CACHE"/skyport-"$kind"-*.tar
  mv "$work/image.tar" "$archive"
fi
echo "$archive $ref"

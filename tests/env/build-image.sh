#!/usr/bin/env bash
# Builds skyport's image for the test node (tests/env/node.sh) from the project's Dockerfile with
# buildah (Debian's package; daemonless, no registry) and prints "<archive> <reference>": an OCI
# archive for `ctr images import` and the name:tag it carries.
#
# The Dockerfile's final stage is built as written (its COPY, USER, EXPOSE, ENTRYPOINT, CMD). The
# two things it takes from a registry cannot be pulled here, so each comes from local content
# through buildah's --build-context, without changing the Dockerfile:
#   - the `build` stage (rust:alpine + apk): the same static musl binary, built with cargo on the
#     host (the `dev` profile by default, for build time; SKYPORT_IMAGE_PROFILE=dist builds the
#     Dockerfile's profile, ~25 min cold on 2 cores);
#   - the base gcr.io/distroless/static-debian12:nonroot: a stand-in made with `buildah from
#     scratch` holding what the project relies on from distroless: Debian's CA bundle at
#     /etc/ssl/certs/ca-certificates.crt (and SSL_CERT_FILE naming it), root/nobody/nonroot in
#     /etc/passwd and /etc/group, /tmp, /home/nonroot, no shell.
# The tag is the hash of what went in (binary, Dockerfile, base), so a change is a new image.
#
#   CARGO_TARGET_DIR   as for cargo (default: target/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target=x86_64-unknown-linux-musl
profile="${SKYPORT_IMAGE_PROFILE:-dev}"
dir="$profile"; [[ "$profile" == dev ]] && dir=debug
out="${CARGO_TARGET_DIR:-$ROOT/target}/$target/$dir"
# The base image reference the Dockerfile's final stage names.
base_ref="$(sed -n 's/^FROM \([^ ]*\)$/\1/p' "$ROOT/Dockerfile" | tail -n1)"
[[ -n "$base_ref" ]] || { echo "build-image: no final-stage FROM in the Dockerfile" >&2; exit 1; }

rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
missing=()
command -v musl-gcc >/dev/null || missing+=(musl-tools)   # C parts of the musl build
command -v buildah >/dev/null || missing+=(buildah)
if ((${#missing[@]})); then
  echo "build-image: installing ${missing[*]}" >&2
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
  # A machine whose package lists are missing or stale needs them fetched first.
  apt_install || { apt-get update -qq >&2 && apt_install; }
fi
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || { echo "build-image: no CA bundle (Debian's ca-certificates)" >&2; exit 1; }
(cd "$ROOT" && cargo build --profile "$profile" --locked --target "$target" --bin skyport >&2)

# Debug info is most of a dev build's size and nothing in the image reads it. The `build` stage's
# stand-in is a folder holding only what the final stage copies from it: /skyport.
mkdir -p "$out/image-build-stage"
strip -o "$out/image-build-stage/skyport" "$out/skyport"

sum="$(cat "$out/image-build-stage/skyport" "$ROOT/Dockerfile" "${BASH_SOURCE[0]}" \
  /etc/ssl/certs/ca-certificates.crt <(buildah --version) | sha256sum | cut -c1-16)"
ref="skyport.test/skyport:$profile-$sum"
archive="$out/skyport-image-$sum.tar"
if [[ ! -f "$archive" ]]; then
  rm -f "$out"/skyport-image-*.tar
  # A private store per build (vfs: plain directories, no mounts left behind if interrupted).
  store="$(mktemp -d "$out/buildah.XXXXXX")"
  trap 'rm -rf "$store"' EXIT
  b() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }

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
  b umount "$base" >/dev/null
  b config --user 65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "$base"
  b commit -q --timestamp 0 "$base" localhost/skyport-test/distroless-static:nonroot >/dev/null

  # The Dockerfile. No RUN runs (the stages with RUN are replaced), so no container runtime is
  # involved.
  b build -q --pull=never --timestamp 0 -f "$ROOT/Dockerfile" -t "$ref" \
    --build-context build="$out/image-build-stage" \
    --build-context "$base_ref=container-image://localhost/skyport-test/distroless-static:nonroot" \
    "$ROOT" >/dev/null
  b push -q "$ref" oci-archive:"$archive.tmp:$ref" >&2
  mv "$archive.tmp" "$archive"
fi
echo "$archive $ref"

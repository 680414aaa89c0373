#!/usr/bin/env bash
# Builds skyport's test image for the node (tests/env/node.sh) and prints "<archive> <reference>":
# an OCI archive for `ctr images import` and the name:tag it carries.
#
# What it is: the Dockerfile's final stage rebuilt without a registry or daemon. The Dockerfile's
# base images (rust:alpine, distroless) cannot be pulled here, so the same static musl binary is
# built with cargo on the host (the `dev` profile by default, for build time; SKYPORT_IMAGE_PROFILE=dist
# builds the Dockerfile's profile, ~25 min cold on 2 cores) and laid out as the final stage has it:
# /skyport, user and group 65532 (distroless "nonroot"), Debian's CA bundle at
# /etc/ssl/certs/ca-certificates.crt, /tmp, no shell, EXPOSE 8080, ENTRYPOINT ["/skyport"],
# CMD ["run"]. The tag is the binary's hash, so a new build is a new image.
#
#   CARGO_TARGET_DIR   as for cargo (default: target/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target=x86_64-unknown-linux-musl
profile="${SKYPORT_IMAGE_PROFILE:-dev}"
dir="$profile"; [[ "$profile" == dev ]] && dir=debug
out="${CARGO_TARGET_DIR:-$ROOT/target}/$target/$dir"

rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
command -v musl-gcc >/dev/null || {
  echo "build-image: installing musl-tools (C parts of the musl build)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools >&2
}
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || { echo "build-image: no CA bundle (Debian's ca-certificates)" >&2; exit 1; }
(cd "$ROOT" && cargo build --profile "$profile" --locked --target "$target" --bin skyport >&2)

# Debug info is most of a dev build's size and nothing in the image reads it.
strip -o "$out/skyport.image" "$out/skyport"
sum="$(sha256sum "$out/skyport.image" | cut -c1-16)"
ref="skyport.test/skyport:$profile-$sum"
archive="$out/skyport-image-$sum.tar"
if [[ ! -f "$archive" ]]; then
  rm -f "$out"/skyport-image-*.tar
  python3 "$ROOT/tests/env/oci-image.py" "$archive.tmp" "$ref" \
    --file "$out/skyport.image:/skyport" \
    --file /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:644 \
    --dir /tmp:1777 \
    --text "/etc/passwd=root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
" --text "/etc/group=root:x:0:
nobody:x:65534:
nonroot:x:65532:
" --user 65532:65532 --port 8080/tcp --entrypoint '["/skyport"]' --cmd '["run"]' \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  mv "$archive.tmp" "$archive"
fi
echo "$archive $ref"

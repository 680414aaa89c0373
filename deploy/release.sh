#!/usr/bin/env bash
# The release's exit-server assets: the binaries the image runs, named as --exit-server-url's
# default expects (skyport-x86_64, skyport-aarch64), each with a .sha256 file, and SHA256SUMS.
# .github/workflows/release.yml calls it on a version tag; `local` is what runs without Docker.
#
#   deploy/release.sh check-version X.Y.Z   the tag names the crate's version (the operator puts
#                                            its own version into the download URL)
#   deploy/release.sh assets DIST OUT       DIST/amd64/skyport and DIST/arm64/skyport (the
#                                            Dockerfile's release-binary stage per platform) into OUT
#   deploy/release.sh local OUT [BINARY]    x86_64 only: the same static `dist` build
#                                            (tests/env/build-musl.sh, or BINARY when given), its
#                                            digest and SHA256SUMS, and the image around it as an
#                                            OCI archive (skyport-image-x86_64.tar, built with
#                                            buildah by tests/env/build-image.sh); tests/run.sh
#                                            runs it, so a tag is never its first run
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

crate_version() {
  sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -1
}

# asset SOURCE OUT ARCH: copies one binary in and writes its digest beside it.
asset() {
  local source=$1 out=$2 arch=$3
  [[ -s "$source" ]] || { echo "release: no binary at $source" >&2; exit 1; }
  install -m 0755 "$source" "$out/skyport-$arch"
  (cd "$out" && sha256sum "skyport-$arch" > "skyport-$arch.sha256")
}

sums() {
  (cd "$1" && cat skyport-*.sha256 > SHA256SUMS)
  cat "$1/SHA256SUMS"
}

case "${1:-}" in
  check-version)
    want="$(crate_version)"
    [[ "${2:-}" == "$want" ]] || { echo "release: tag version ${2:-<none>} is not the crate's $want" >&2; exit 1; }
    ;;
  assets)
    [[ $# == 3 ]] || { echo "usage: $0 assets DIST OUT" >&2; exit 2; }
    mkdir -p "$3"
    asset "$2/amd64/skyport" "$3" x86_64
    asset "$2/arm64/skyport" "$3" aarch64
    sums "$3"
    ;;
  local)
    [[ $# == 2 || $# == 3 ]] || { echo "usage: $0 local OUT [BINARY]" >&2; exit 2; }
    mkdir -p "$2"
    binary="${3:-$(env -u CARGO_TARGET_DIR "$ROOT/tests/env/build-musl.sh")}"
    asset "$binary" "$2" x86_64
    read -r archive _ < <("$ROOT/tests/env/build-image.sh" "$binary")
    install -m 0644 "$archive" "$2/skyport-image-x86_64.tar"
    sums "$2"
    ;;
  *)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

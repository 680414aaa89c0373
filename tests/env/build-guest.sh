#!/usr/bin/env bash
# Builds the root file system of a Debian guest that boots under systemd-nspawn and runs
# cloud-init from a NoCloud seed, like a cloud VM built from a Debian cloud image, into
# $SKYPORT_CACHE/guest-<key>/rootfs and prints its path. The key is a hash of this script's
# commands (the package list and the image settings below), so a changed list builds anew. A
# warm cache makes this a no-op; a cold build takes about 6 minutes (mmdebstrap, Debian packages).
# Used by the guest tests and the guest provider through tests/run.sh (SKYPORT_GUEST_ROOTFS). Needs root.
#
# The image carries what the exit server's user data installs (ca-certificates, curl, nftables),
# as the cloud images skyport targets do, and an empty apt source list: the guest has no route to
# a package mirror, so cloud-init's package step finds everything installed. Image settings, as a
# cloud image has them: the en_US.UTF-8 locale cloud-init sets; cloud-init reads only the NoCloud
# seed; the network is configured by the platform (the test, from outside); nothing waits for a
# network that is already up.
set -euo pipefail
CACHE="${SKYPORT_CACHE:-$HOME/.cache/skyport}"
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,cloud-init,nftables,curl,ca-certificates,iproute2,ifupdown,netbase,sudo,locales
# Comments do not count: only a change to what gets built makes a new root file system.
KEY="$(grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
OUT="$CACHE/guest-$KEY"

if [[ -d "$OUT/rootfs/etc/cloud" ]]; then
  echo "$OUT/rootfs"; exit 0
fi
[[ $(id -u) == 0 ]] || { echo "build-guest: needs root (mmdebstrap, systemd-nspawn)" >&2; exit 1; }
# shellcheck source=tests/env/need.sh
. "$(dirname "${BASH_SOURCE[0]}")/need.sh"
need mmdebstrap systemd-nspawn
echo "building a $SUITE guest root file system into $OUT (first run: several minutes)" >&2
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
mmdebstrap --variant=minbase --include="$PACKAGES" \
  --customize-hook='echo "datasource_list: [ NoCloud, None ]" > "$1/etc/cloud/cloud.cfg.d/90-skyport-guest.cfg"' \
  --customize-hook='echo "network: {config: disabled}" > "$1/etc/cloud/cloud.cfg.d/91-skyport-guest-network.cfg"' \
  --customize-hook='echo "en_US.UTF-8 UTF-8" > "$1/etc/locale.gen" && chroot "$1" locale-gen' \
  --customize-hook='ln -sf /dev/null "$1/etc/systemd/system/systemd-networkd-wait-online.service"' \
  --customize-hook=': > "$1/etc/apt/sources.list"; rm -f "$1"/etc/apt/sources.list.d/*' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  "$SUITE" "$OUT.tmp/rootfs" >&2
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "$OUT/rootfs"

#!/usr/bin/env bash
# Installs the peers benches/tunnel.rs measures the tunnel against, from Debian's packages:
# OpenSSH (sshd and ssh, for `ssh -L` local port forwarding) and socat (a plain userspace relay).
# A no-op when they are present. No system sshd is started: the benchmark runs its own on a
# loopback port with throwaway keys.
set -euo pipefail
# shellcheck source=tests/env/need.sh
. "$(dirname "${BASH_SOURCE[0]}")/need.sh"
need /usr/sbin/sshd ssh ssh-keygen socat

#!/usr/bin/env bash
# Installs the peers benches/tunnel.rs measures the tunnel against, from Debian's packages:
# OpenSSH (sshd and ssh, for `ssh -L` local port forwarding) and socat (a plain userspace relay).
# A no-op when they are present. No system sshd is started: the benchmark runs its own on a
# loopback port with throwaway keys.
set -euo pipefail
missing=()
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
command -v socat >/dev/null || missing+=(socat)
if ((${#missing[@]})); then
  echo "installing ${missing[*]} (benches/tunnel.rs peers)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d 101: the package must not start a system sshd listening on every address.
  had_policy=0; [[ -e /usr/sbin/policy-rc.d ]] && had_policy=1
  ((had_policy)) || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  ((had_policy)) || rm -f /usr/sbin/policy-rc.d
fi

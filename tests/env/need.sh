# `need CMD...`: makes sure each command (a name on PATH, or an absolute path) is there, installing
# the Debian packages tests/env/packages.txt names for the missing ones (apt-get, as root). Sourced
# by the scripts of the environment, which call it at the step that uses the commands; a no-op when
# everything is present. Commands of package `toolchain` or `env` are never installed here: a
# missing one is an error naming it. tests/env/check-packages.py checks that every script needs what
# it calls.
#
# Shell builtins do not count as present: `need kill` wants /bin/kill.

NEED_LIST="${NEED_LIST:-$(dirname "${BASH_SOURCE[0]}")/packages.txt}"

need() {
  local cmd entry pkg missing=() packages=() errors=()
  for cmd in "$@"; do
    if [[ $cmd == /* ]]; then [[ -x $cmd ]] && continue; else type -P "$cmd" >/dev/null && continue; fi
    missing+=("$cmd")
    pkg=
    while read -r entry pkg _; do
      [[ $entry == "$cmd" ]] && break
      pkg=
    done <"$NEED_LIST"
    case "$pkg" in
      "") errors+=("$cmd is not in $NEED_LIST") ;;
      toolchain) errors+=("$cmd is missing; install it first (a prerequisite: see README.md)") ;;
      env) errors+=("$cmd is missing; it comes from the environment: eval \"\$(tests/env.sh up)\"") ;;
      *) [[ " ${packages[*]} " == *" $pkg "* ]] || packages+=("$pkg") ;;
    esac
  done
  ((${#errors[@]} == 0)) || { printf 'need: %s\n' "${errors[@]}" >&2; return 1; }
  ((${#packages[@]})) || return 0
  [[ $(id -u) == 0 ]] || {
    echo "need: ${missing[*]} missing; as root: apt-get install ${packages[*]}" >&2
    return 1
  }
  need_install "${packages[@]}" || return 1
  for cmd in "${missing[@]}"; do
    if [[ $cmd == /* ]]; then [[ -x $cmd ]]; else type -P "$cmd" >/dev/null; fi \
      || { echo "need: installed ${packages[*]}, still no $cmd" >&2; return 1; }
  done
}

# One install at a time on this machine (concurrent scripts would race for dpkg's lock and for
# policy-rc.d below).
need_install() {
  local lock=/run/lock/skyport-need.lock fd rc=0
  [[ -d /run/lock ]] || lock=/tmp/skyport-need.lock
  exec {fd}>"$lock"
  flock "$fd"
  echo "need: installing $* (tests/env/packages.txt)" >&2
  # policy-rc.d 101: packages must not start system services (a system sshd listening on every
  # address, a containerd of the host's own); the environment runs its own.
  local had_policy=0
  [[ -e /usr/sbin/policy-rc.d ]] && had_policy=1
  ((had_policy)) || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }
  local apt=(apt-get -y -qq -o DPkg::Lock::Timeout=600)
  export DEBIAN_FRONTEND=noninteractive
  # A machine whose package lists are missing or stale needs them fetched first.
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null \
    || ! "${apt[@]}" install --no-install-recommends "$@" >&2; then
    { "${apt[@]}" update >&2 && "${apt[@]}" install --no-install-recommends "$@" >&2; } || rc=1
  fi
  ((had_policy)) || rm -f /usr/sbin/policy-rc.d
  exec {fd}>&-
  ((rc == 0)) || echo "need: installing $* failed" >&2
  return $rc
}

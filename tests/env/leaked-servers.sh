#!/usr/bin/env bash
# Exits non-zero, after killing them, if exit server processes that tests started with the local
# provider are still running: once every test is done, each is one a test leaked. It keeps its
# address and ports, so whatever runs next on that address (a benchmark's reserved address, say)
# cannot bind them. Each is listed with its command line, whose --config path names the test's
# state directory. The playground's servers (under the environment's state directory) are not
# the tests' and are left alone.
set -euo pipefail

playground="${SKYPORT_STATE:-/tmp/skyport-env}/"
leaked=()
for dir in /proc/[0-9]*; do
  cmdline="$( (tr '\0' ' ' < "$dir/cmdline") 2>/dev/null || true)"
  # The local provider's servers, and only they, are started with --forward-file: a guest's (a
  # booted container) or a VM's never are.
  if [[ "$cmdline" == *" tunnel server --config "*" --forward-file "* && "$cmdline" != *" --config $playground"* ]]; then
    leaked+=("${dir#/proc/}")
    echo "leaked-servers.sh: exit server still running (pid ${dir#/proc/}): $cmdline" >&2
  fi
done
if [[ ${#leaked[@]} -gt 0 ]]; then
  kill -9 "${leaked[@]}" 2>/dev/null || true
  echo "leaked-servers.sh: ${#leaked[@]} exit server(s) outlived their tests (killed now)" >&2
  exit 1
fi

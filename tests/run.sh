#!/usr/bin/env bash
# The whole test suite: unit tests, the CRD drift check, and the integration tests against a real
# kube-apiserver + LocalStack (started with tests/env.sh, stopped again unless it was already up
# or SKYPORT_KEEP_ENV=1). Extra arguments go to `cargo test` before `--`, e.g. `--test integration queue::`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=tests/env/need.sh
. tests/env/need.sh
# What the tests and benchmarks run as processes (beyond what the scripts below install): /bin/kill
# (processes they start), ip (guests' network), openssl (the guest mirror's CA), git (the ACK
# benchmark's commit); cc and make for cargo's C parts.
need kill ip openssl git cc make

started=0
tests/env.sh env >/dev/null 2>&1 || started=1
exports="$(tests/env.sh up)"
eval "$exports"
test_log="$(mktemp)"
cleanup() {
  if [[ $started == 1 && "${SKYPORT_KEEP_ENV:-0}" != 1 ]]; then tests/env.sh down >&2 || true; fi
  # Last, where a log cut to its head and tail still shows it: what each failed test said. The
  # harness prints it once per failure, among the captured output of every failed test.
  if grep -q "panicked at" "$test_log"; then
    echo "run.sh: the failed tests' panics (the first lines of each; the whole output is above):" >&2
    grep -A3 "panicked at" "$test_log" | cut -c1-400 | head -80 >&2
  fi
  rm -f "$test_log"
}
trap cleanup EXIT

# helm for tests/deploy.rs, built from its Go module once (kept out of the tests so a cold build
# does not compete with them for the CPU).
SKYPORT_HELM="$(tests/env/build-helm.sh)"
export SKYPORT_HELM
# The oldest and the newest kube-apiserver the CRDs, their CEL rules and the admission policies
# are proven on (tests/apiserver_matrix.rs; recipes tests/env/kube-oldest and kube-newest), built
# the same way, once each (20-30 min each cold on 2 busy cores).
SKYPORT_APISERVER_OLDEST="$(tests/env/build-apiserver.sh tests/env/kube-oldest)"
SKYPORT_APISERVER_NEWEST="$(tests/env/build-apiserver.sh tests/env/kube-newest)"
export SKYPORT_APISERVER_OLDEST SKYPORT_APISERVER_NEWEST
# The skyport binary is also the tunnel server and client (`skyport tunnel server|client`); the
# providers crate's tests run it as a process, and Cargo hands other packages' tests no path.
tests/env/cargo-progress.sh skyport --bin skyport
SKYPORT_EXE="${CARGO_TARGET_DIR:-$PWD/target}/debug/skyport"
export SKYPORT_EXE
# The shipped static binary (tests/env/build-musl.sh; ~16 min once on 2 cores, then only what
# changed): the Debian guests of tests/guest.rs, tests/tunnel_guest*.rs and providers/tests/guest*.rs
# download and run it, skyport's image on the test node ships it, and the exit servers of
# providers/tests/local_handover.rs run it (a connection every 10 ms, more than a debug build's
# tunnel keeps up with on loaded cores). The guests boot with
# systemd-nspawn (root only; their root file system is built once, ~6 min). Without root those
# tests fail, unless SKYPORT_SKIP_GUEST_TESTS=1 opts out of them.
if [[ $(id -u) == 0 || -n "${SKYPORT_NODE_KUBECONFIG:-}" ]]; then
  SKYPORT_STATIC_EXE="$(tests/env/build-musl.sh)"
  export SKYPORT_STATIC_EXE
fi
if [[ $(id -u) == 0 ]]; then
  SKYPORT_GUEST_ROOTFS="$(tests/env/build-guest.sh)"
  SKYPORT_GUEST_EXE="$SKYPORT_STATIC_EXE"
  export SKYPORT_GUEST_ROOTFS SKYPORT_GUEST_EXE
elif [[ "${SKYPORT_SKIP_GUEST_TESTS:-0}" != 1 ]]; then
  echo "run.sh: not root, so the guest tests will fail (SKYPORT_SKIP_GUEST_TESTS=1 skips them)" >&2
fi

# skyport's image for the test node (tests/install.rs, and the tunnel client Pods of the Tunnel
# tests there): the Dockerfile built with buildah around the static binary above, the stages that
# need a registry supplied locally (tests/env/build-image.sh, ~5 s), and their backend image
# (tests/env/echo.rs, ~1 s). Only when `tests/env.sh up` started the node; without it those tests
# fail with SKYPORT_NODE_ERROR, or say they are skipped with SKYPORT_NODE=0.
if [[ -n "${SKYPORT_NODE_KUBECONFIG:-}" ]]; then
  SKYPORT_IMAGE="$(tests/env/build-image.sh "$SKYPORT_STATIC_EXE")"
  SKYPORT_ECHO_IMAGE="$(tests/env/build-echo.sh)"
  export SKYPORT_IMAGE SKYPORT_ECHO_IMAGE
fi

# The release path as far as it runs here (deploy/release.sh local): the exit-server asset and
# its digest from the static binary above, SHA256SUMS, and the image archive around it; each
# asset is then checked against SHA256SUMS. A tag is never the first time this runs.
if [[ -n "${SKYPORT_STATIC_EXE:-}" ]]; then
  release_out="$(mktemp -d)"
  deploy/release.sh local "$release_out" "$SKYPORT_STATIC_EXE" >/dev/null
  (cd "$release_out" && sha256sum --check --strict --quiet skyport-x86_64.sha256 && test -s skyport-image-x86_64.tar)
  cmp "$release_out/skyport-x86_64" "$SKYPORT_STATIC_EXE"
  rm -rf "$release_out"
fi

# The tunnel benchmark's peers (OpenSSH, socat) from Debian's packages; the ACK SQS controller the
# Queue benchmark compares with, built only when a checkout is given (SKYPORT_ACK_SRC).
tests/env/install-bench-peers.sh
if [[ -n "${SKYPORT_ACK_SRC:-}" ]]; then
  SKYPORT_ACK="$(tests/env/build-ack.sh)"
  export SKYPORT_ACK
fi

# The integration tests are one binary (tests/main.rs) and mostly wait on real servers, so they
# run several at a time; each starts controllers, exit servers and clients of its own (some boot
# guests), and more than 6 at once on 2 busy cores starve some past their timeouts.
cargo test --workspace --all-targets --no-fail-fast "$@" -- --include-ignored --test-threads 6 2>&1 | tee "$test_log"
# Every exit server a test started is gone with it; one still running is a leak, and holds its
# address and ports against what runs next (tests/env/leaked-servers.sh names the test).
tests/env/leaked-servers.sh

# The benchmarks' quick modes, so they cannot rot: benches/queues.rs (10 Queues, one run, ~2 min,
# most of it SQS's 60 s recreate rule), benches/tunnel.rs (2 runs, ~20 s; one on guests as root) and benches/ack.rs
# (~1 min per run: skyport at its defaults and with its budgets open, and the floor). The dev profile reuses the build above; the figures worth reading come from the full
# runs (BENCHMARKS.md). Skipped when arguments select some of the tests.
if [[ $# == 0 ]]; then
  cargo bench --profile dev --bench queues -- --quick
  cargo bench --profile dev --bench tunnel -- --quick
  # The same path on booted guests (one run, ~2 min), as root.
  if [[ $(id -u) == 0 ]]; then cargo bench --profile dev --bench tunnel -- --quick --guest; fi
  # A highly available Tunnel's failover on booted guests (one run, ~30 s), as root.
  if [[ $(id -u) == 0 ]]; then cargo bench --profile dev --bench tunnel -- --quick --guest --failover; fi
  # A highly available Tunnel's failover on the node (one run of each fault, ~1 min), then on
  # EC2 semantics against LocalStack (~20 s; that arm alone without the node).
  if [[ -n "${SKYPORT_NODE_KUBECONFIG:-}" ]]; then
    cargo bench --profile dev --bench tunnel -- --quick --failover
  else
    cargo bench --profile dev --bench tunnel -- --quick --failover --ec2
  fi
  # skyport side by side with ACK (10 Queues); without SKYPORT_ACK_SRC skyport's arms and the
  # floor only, and it says so.
  cargo bench --profile dev --bench ack -- --quick
  # The same behind the proxy that enforces SQS's tagging quota, as AWS does and LocalStack not.
  cargo bench --profile dev --bench ack -- --quick --sqs-quota
  # Several active replicas against one (500 Queues over 4 accounts, 2 replicas, one killed;
  # 7.5 min on two loaded cores, 60 s per arm of it SQS's recreate rule): steals or double
  # writes fail it.
  cargo bench --profile dev --bench replicas -- --quick
fi

#!/usr/bin/env bash
# The whole test suite: unit tests, the CRD drift check, and the integration tests against a real
# kube-apiserver + LocalStack (started with tests/env.sh, stopped again unless it was already up
# or SKYPORT_KEEP_ENV=1). Extra arguments go to `cargo test` before `--`, e.g. `--test queue`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

started=0
tests/env.sh env >/dev/null 2>&1 || started=1
exports="$(tests/env.sh up)"
eval "$exports"
cleanup() {
  if [[ $started == 1 && "${SKYPORT_KEEP_ENV:-0}" != 1 ]]; then tests/env.sh down >&2 || true; fi
}
trap cleanup EXIT

# helm for tests/deploy.rs, built from its Go module once (kept out of the tests so a cold build
# does not compete with them for the CPU).
SKYPORT_HELM="$(tests/env/build-helm.sh)"
export SKYPORT_HELM
# rathole, the tunnel server and client the Tunnel tests run for real, built from its crate once.
SKYPORT_RATHOLE="$(tests/env/build-rathole.sh)"
export SKYPORT_RATHOLE

# The integration tests wait on real servers, not on the CPU: run them wide.
cargo test --workspace --all-targets "$@" -- --include-ignored --test-threads 16

# The benchmarks' quick modes, so they cannot rot: benches/queues.rs (10 Queues, one run, ~2 min,
# most of it SQS's 60 s recreate rule) and benches/tunnel.rs (2 runs, ~10 s). The dev profile reuses
# the build above; the figures worth reading come from the full runs (BENCHMARKS.md). Skipped when
# arguments select some of the tests.
if [[ $# == 0 ]]; then
  cargo bench --profile dev --bench queues -- --quick
  cargo bench --profile dev --bench tunnel -- --quick
fi

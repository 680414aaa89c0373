//! The install manifests in `deploy/`: the kustomize base and the Helm chart render the same
//! objects, the real API server accepts both (server-side dry run), the CRD copies match
//! `crds/`, and the Deployment is hardened and passes flags the binary accepts.
//!
//! The tests that need `kubectl`, `helm` or the API server are ignored by default; tests/run.sh
//! runs them (it builds helm with tests/env/build-helm.sh and exports SKYPORT_HELM).

pub(crate) mod chart;
mod deployment;
mod files;
pub(crate) mod harness;
mod rbac;
mod rendering;

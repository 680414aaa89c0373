//! The controllers, and the skeleton they share.
//!
//! Every controller folder has the same stages, with the same meaning:
//! `desired` (pure builders and names), `observe` (reads only), `plan` (pure decisions and the
//! types they produce), `act` (all writes), `status` (what the object reports) and `cleanup`
//! (what deleting it takes). `mod.rs` wires the watches and runs the reconcile spine.
//! What they share lives here: [`Context`] (client, Events, backoff, metrics, the memory of
//! their own writes), [`reconciler`] (the finalizer, deletion and failure policy around a
//! controller's [`Reconciler`]), [`status::StatusWriter`], [`owned`] (objects a controller owns),
//! and [`caches`]: what the watches keep of each object, which events wake a reconcile
//! ([`hash_of`]), and whether a cache has synced. [`acting`] holds every reconcile and sweep of a
//! warm standby until it holds the Lease
//! (or, sharded, the Lease of the object's shard: [`shard_of`]).

pub mod acting;
pub mod backoff;
pub mod caches;
pub mod changes;
pub mod context;
pub mod events;
pub mod index;
pub mod memory;
pub mod owned;
pub mod pool;
pub mod queue;
pub mod reconciler;
pub mod resyncs;
pub mod service;
pub mod shard_of;
pub mod shutdown;
pub mod status;
#[cfg(test)]
pub mod testing;
pub mod tunnel;

use std::sync::atomic::{AtomicU64, Ordering};

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

pub use acting::{Acting, Gate, Sharded};
pub use backoff::{Backoff, jittered};
pub use caches::{has_synced, hash_of, primary_stream, slim, spec_trigger, store_synced};
pub use context::{Context, api_beside, error_policy, reconcile_with, scoped_api};
pub use reconciler::Reconciler;

/// Logs what a controller's stream yields, as `.for_each(log_result!(queue))`: a macro so that the
/// lines carry the controller's module as target and the object under the controller's own field
/// (`queue = ns/name`), which log filters and the benchmarks select on. Failed reconciles were
/// logged by [`error_policy`] already, so they are only traced here.
#[macro_export]
macro_rules! log_result {
    ($field:ident) => {
        |result| {
            match result {
                Ok((obj, action)) => tracing::debug!($field = %obj, ?action, "reconciled"),
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    tracing::debug!($field = %obj, error = %e, "reconcile failed")
                }
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    tracing::debug!($field = %obj, "object gone before its reconcile")
                }
                Err(e) => tracing::warn!(error = %e, "controller event"),
            }
            futures::future::ready(())
        }
    };
}

/// Field manager for every server-side apply skyport makes.
pub const FIELD_MANAGER: &str = "skyport";
/// The controller name on every Event skyport publishes.
pub const CONTROLLER_NAME: &str = "skyport";
/// Label on every object skyport creates in the cluster (and the selector of its watches).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "skyport");

/// `MANAGED_BY` as a label selector.
pub fn managed_selector() -> String {
    format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)
}

/// Stable per-object key for backoff and memory: the UID, else namespace/name.
pub fn object_key<K: Resource>(obj: &K) -> String {
    obj.uid().unwrap_or_else(|| format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()))
}

/// Runs one reconcile inside a span naming the object (kind, namespace, name) and records its
/// duration and failure reason.
pub async fn instrumented<K: Resource>(
    kind: &str,
    obj: &K,
    metrics: &crate::metrics::ReconcileMetrics,
    reconcile: impl std::future::Future<Output = crate::Result<kube::runtime::controller::Action>>,
) -> crate::Result<kube::runtime::controller::Action> {
    use tracing::Instrument as _;
    let span = tracing::info_span!("reconcile", kind, namespace = %obj.namespace().unwrap_or_default(), name = %obj.name_any());
    let started = std::time::Instant::now();
    let result = reconcile.instrument(span).await;
    metrics.record(started.elapsed(), result.as_ref().err().map(|e| e.reason().as_str()));
    result
}

/// Counts writes skyport makes to the API server, so tests and benchmarks can prove that a
/// converged object costs none.
#[derive(Debug, Default)]
pub struct ApiWrites(AtomicU64);

impl ApiWrites {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Whether `obj` carries `finalizer`.
pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// Adds `finalizer` to `obj`. The resourceVersion makes the merge patch conditional, so a
/// concurrent change to the finalizer list fails with a conflict instead of being overwritten.
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(finalizer.to_string());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await
}

/// Removes `finalizer` from `obj` (conditional on its resourceVersion, as above). An object
/// already gone counts as done.
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let finalizers: Vec<&String> = obj.finalizers().iter().filter(|f| *f != finalizer).collect();
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    match api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

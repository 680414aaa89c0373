//! Controllers, and what they share: per-object error backoff, resync jitter, finalizer patches.

pub mod queue;
pub mod service;
pub mod tunnel;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use rand::Rng;
use serde::de::DeserializeOwned;
use serde_json::json;

/// Stable per-object key for backoff and memory: the UID, else namespace/name.
pub fn object_key<K: Resource>(obj: &K) -> String {
    obj.uid().unwrap_or_else(|| format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()))
}

/// What wakes a reconcile of a primary object: a new object, a spec change (generation),
/// deletion starting, or finalizers changing. Status writes (ours) are left out.
pub fn spec_trigger<K: Resource>(obj: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    obj.meta().uid.hash(&mut h);
    obj.meta().generation.hash(&mut h);
    obj.meta().deletion_timestamp.is_some().hash(&mut h);
    obj.finalizers().hash(&mut h);
    Some(h.finish())
}

/// Runs one reconcile inside a span naming the object (kind, namespace, name) and records its
/// duration and failure reason.
pub async fn instrumented<K: Resource>(
    kind: &'static str,
    obj: &K,
    metrics: &crate::metrics::ReconcileMetrics,
    reconcile: impl std::future::Future<Output = crate::Result<kube::runtime::controller::Action>>,
) -> crate::Result<kube::runtime::controller::Action> {
    use tracing::Instrument as _;
    let span = tracing::info_span!("reconcile", kind, namespace = %obj.namespace().unwrap_or_default(), name = %obj.name_any());
    let started = std::time::Instant::now();
    let result = reconcile.instrument(span).await;
    metrics.record(started.elapsed(), result.as_ref().err().map(crate::Error::reason));
    result
}

/// Drops what the caches never read and what costs the most memory per object: `managedFields`
/// (every field's owner, often larger than the object) and kubectl's last-applied annotation.
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Field manager for every server-side apply skyport makes.
pub const FIELD_MANAGER: &str = "skyport";

/// Per-object exponential backoff for transient errors (kube-runtime has none built in).
///
/// The delay doubles with each consecutive failure of the same object, up to `max`, with
/// random jitter so that many objects failing together (an unreachable endpoint) do not retry
/// in lockstep. A success forgets the object's history.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max: max.max(min), failures: Mutex::default() }
    }

    /// Records a failure of `key` and returns how long to wait before retrying.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        let delay = self.delay_for(*n);
        *n = n.saturating_add(1);
        delay
    }

    /// The delay after `n` earlier consecutive failures, before jitter.
    pub fn delay_for(&self, n: u32) -> Duration {
        let factor = 2u32.saturating_pow(n.min(20));
        let base = self.min.saturating_mul(factor).min(self.max);
        // Up to 25% less, never more, so `max` stays a true bound.
        base.mul_f64(1.0 - rand::rng().random_range(0.0..0.25))
    }

    pub fn reset(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    pub fn failures(&self, key: &str) -> u32 {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }
}

/// `period` shortened by up to 10% at random: spreads periodic resyncs of objects created
/// together without ever exceeding the configured period.
pub fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 - rand::rng().random_range(0.0..0.1))
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

/// Waits until `store`'s reflector has listed everything once; `false` if it never will.
///
/// `Store::wait_until_ready` wakes only the last of several concurrent waiters (a single-waker
/// oneshot inside kube-runtime), and the controller waits on the same store; so this polls.
pub async fn store_synced<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(result) = tokio::time::timeout(std::time::Duration::from_millis(200), store.wait_until_ready()).await
        {
            return result.is_ok();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let d0 = b.next_delay("a");
        let d1 = b.next_delay("a");
        let d2 = b.next_delay("a");
        assert!(d0 <= Duration::from_secs(1) && d0 >= Duration::from_millis(750), "{d0:?}");
        assert!(d1 <= Duration::from_secs(2) && d1 >= Duration::from_millis(1500), "{d1:?}");
        assert!(d2 <= Duration::from_secs(4) && d2 >= Duration::from_secs(3), "{d2:?}");
        for _ in 0..50 {
            assert!(b.next_delay("a") <= Duration::from_secs(10));
        }
        assert_eq!(b.failures("b"), 0, "objects back off independently");
        b.reset("a");
        assert!(b.next_delay("a") <= Duration::from_secs(1));
    }

    #[test]
    fn jitter_never_exceeds_the_period() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(60));
            assert!(d <= Duration::from_secs(60) && d >= Duration::from_secs(54));
        }
    }
}

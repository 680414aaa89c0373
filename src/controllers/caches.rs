//! The caches the controllers read: what each keeps of an object, which of its watch events wake
//! a reconcile, and whether it has listed everything once.

use futures::FutureExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{Lookup, Store};
use serde::de::DeserializeOwned;

/// A 64-bit hash of `parts`: what a watch compares to decide whether an event wakes a reconcile
/// (a trigger such as [`spec_trigger`]), and what the memories compare. Never persisted: the
/// standard hasher is enough, and it is the same within one process.
pub fn hash_of(parts: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// What wakes a reconcile of a primary object: a new object, a spec change (generation),
/// deletion starting, or finalizers changing. Status writes (ours) are left out.
pub fn spec_trigger<K: Resource>(obj: &K) -> Option<u64> {
    let meta = obj.meta();
    Some(hash_of((&meta.uid, meta.generation, meta.deletion_timestamp.is_some(), &meta.finalizers)))
}

/// Drops what the caches never read and what costs the most memory per object: `managedFields`
/// (every field's owner, often larger than the object) and kubectl's last-applied annotation.
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// The watch of a controller's primary objects: a cache fed through `cache` (its writer, or a
/// [`Feed`](super::index::Feed) that keeps an index beside it) with what `trim` leaves of each
/// object (at least [`slim`]), and a stream that wakes a reconcile only when `trigger` changes
/// (skyport's own status writes do not).
pub fn primary_stream<K>(
    api: Api<K>,
    mut cache: impl super::index::Reflect<K>,
    trim: fn(&mut K),
    trigger: fn(&K) -> Option<u64>,
) -> impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default + Send + Sync,
{
    use futures::TryStreamExt;
    use kube::runtime::WatchStreamExt;
    let mut changes = super::changes::Changes::new(trigger);
    kube::runtime::watcher(api, kube::runtime::watcher::Config::default())
        .default_backoff()
        .modify(trim)
        // As `.reflect(writer)` does, through whatever index is kept beside the cache.
        .inspect_ok(move |event| cache.apply_watcher_event(event))
        .map_ok(move |event| changes.woken(event).map(unversioned))
        .try_filter_map(futures::future::ok)
}

/// What the controller keeps of a trigger: the scheduler holds two `ObjectRef`s made from it per
/// object until its reconcile runs (in a storm of new objects, thousands wait), and an
/// `ObjectRef` copies the uid and the resourceVersion along with the name. Nothing reads them
/// there (the reconcile gets the cached object, which keeps both): two allocations fewer per copy.
fn unversioned<K: Resource>(mut obj: K) -> K {
    let meta = obj.meta_mut();
    meta.uid = None;
    meta.resource_version = None;
    obj
}

/// Waits until `store`'s reflector has listed everything once; `false` if it never will.
///
/// `Store::wait_until_ready` wakes only the last of several concurrent waiters (a single-waker
/// oneshot inside kube-runtime), and the controller waits on the same store; so this polls.
pub async fn store_synced<K>(store: &Store<K>) -> bool
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut said = false;
    loop {
        if let Ok(result) = tokio::time::timeout(std::time::Duration::from_millis(200), store.wait_until_ready()).await
        {
            return result.is_ok();
        }
        // Once per wait: a reconcile that seems stuck says what it waits for.
        if !std::mem::replace(&mut said, true) {
            let cache = std::any::type_name::<K>().rsplit("::").next().unwrap_or_default();
            tracing::debug!(cache, "reconcile waits for a cache that has not listed everything yet");
        }
    }
}

/// Whether `store` has finished its first list, without waiting.
///
/// Only for after shutdown (see [`super::shutdown::run_until_stopped`]): a store that is not
/// ready wakes a single waiter (see [`store_synced`]), and this check would take that place from
/// the controller while its watch could still make the store ready.
pub fn has_synced<K>(store: &Store<K>) -> bool
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    use super::*;
    use crate::controllers::testing::ready_store;

    #[test]
    fn has_synced_follows_the_first_list() {
        let (never, _writer) = reflector::store::<ConfigMap>();
        assert!(!has_synced(&never));
        let (listed, _writer) = ready_store::<ConfigMap>();
        assert!(has_synced(&listed));
        // Asking again gives the same answer (the first answer is remembered by the store).
        assert!(has_synced(&listed));
        let (dropped, writer) = reflector::store::<ConfigMap>();
        drop(writer);
        assert!(!has_synced(&dropped), "a cache whose watch is gone never synced");
    }
}

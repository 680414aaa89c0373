//! When converged objects are looked at again, kept in 32 bytes each.
//!
//! A reconcile that returns `Action::requeue` leaves its object in kube-runtime's scheduler until
//! then: a delay-queue slot and a map entry, each with its own copy of the object's name and
//! namespace, about 440 bytes per object (heaptrack, 3,000 Queues). Every converged Queue waits
//! there for its next resync, so at 10,000 Queues the timers alone took 4 MB. Here a due time is
//! a [`compact_key`] and an `Instant`, and a sweep over the controller's cache wakes the objects
//! that are due; kube-runtime's scheduler keeps only what is retried soon (errors, waits).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
// tokio's clock, so that tests with paused time see resyncs fall due.
use tokio::time::Instant;

use super::memory::compact_key;
use super::object_key;

/// Per object (by [`object_key`]): when its next resync is due.
#[derive(Debug, Default)]
pub struct Resyncs {
    due: Mutex<HashMap<u128, Instant>>,
}

impl Resyncs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Instant>> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the object `key` after `delay`, instead of any resync it had before.
    pub fn after(&self, key: &str, delay: Duration) {
        self.lock().insert(compact_key(key), Instant::now() + delay);
    }

    /// No resync for `key`: it is being reconciled now, or it is gone.
    pub fn forget(&self, key: &str) {
        self.lock().remove(&compact_key(key));
    }

    /// How long until `key`'s resync, if one is due.
    pub fn due_in(&self, key: &str) -> Option<Duration> {
        self.lock().get(&compact_key(key)).map(|at| at.saturating_duration_since(Instant::now()))
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects in `cache` due at `now`, forgotten here (their reconcile schedules the next
    /// one). A due entry whose object is no longer cached is dropped.
    pub fn take_due<K>(&self, cache: &Store<K>, now: Instant) -> Vec<ObjectRef<K>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let mut due = self.lock();
        if !due.values().any(|at| *at <= now) {
            return Vec::new();
        }
        let mut woken = Vec::new();
        for obj in cache.state() {
            // `object_key` is the UID when there is one: read in place, not copied, as this
            // runs over every cached object once per tick while resyncs are due.
            let key = match obj.meta().uid.as_deref() {
                Some(uid) => compact_key(uid),
                None => compact_key(&object_key(&*obj)),
            };
            if due.get(&key).is_some_and(|at| *at <= now) {
                due.remove(&key);
                // Name and namespace only: the reconcile reads the object from the cache.
                let obj_ref = ObjectRef::new(&obj.name_any());
                woken.push(match obj.namespace() {
                    Some(ns) => obj_ref.within(&ns),
                    None => obj_ref,
                });
            }
        }
        due.retain(|_, at| *at > now);
        woken
    }
}

/// How often [`sweep`] looks: a twentieth of the resync, between 100 ms and 1 s (a resync is at
/// most that much late).
pub fn tick(resync: Duration) -> Duration {
    (resync / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The objects of `cache` whose resync is due, looked for every `tick`: a trigger stream for the
/// controller (`reconcile_on`).
pub fn sweep<K>(resyncs: Arc<Resyncs>, cache: Store<K>, tick: Duration) -> impl Stream<Item = ObjectRef<K>> + Send
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    futures::stream::unfold((resyncs, cache), move |(resyncs, cache)| async move {
        tokio::time::sleep(tick).await;
        let woken = resyncs.take_due(&cache, Instant::now());
        Some((futures::stream::iter(woken), (resyncs, cache)))
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;

    use super::*;
    use crate::controllers::testing::ready_store;

    fn object(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.uid = Some(format!("uid-{name}"));
        cm
    }

    #[test]
    fn due_objects_are_woken_once_and_gone_ones_forgotten() {
        let (cache, mut writer) = ready_store::<ConfigMap>();
        for name in ["a", "b", "c"] {
            writer.apply_watcher_event(&watcher::Event::Apply(object(name)));
        }
        let resyncs = Resyncs::default();
        let now = Instant::now();
        resyncs.after("uid-a", Duration::ZERO);
        resyncs.after("uid-b", Duration::from_secs(60));
        assert!(resyncs.due_in("uid-b").is_some_and(|d| d > Duration::from_secs(59)));
        assert_eq!(resyncs.due_in("uid-c"), None);

        let woken = resyncs.take_due(&cache, now + Duration::from_millis(1));
        assert_eq!(woken, vec![ObjectRef::new("a").within("ns")]);
        assert!(resyncs.take_due(&cache, now + Duration::from_millis(2)).is_empty(), "woken once");
        assert_eq!(resyncs.len(), 1);

        // A later resync replaces the earlier one.
        resyncs.after("uid-b", Duration::from_secs(600));
        assert!(resyncs.take_due(&cache, now + Duration::from_secs(61)).is_empty());
        assert_eq!(resyncs.take_due(&cache, now + Duration::from_secs(601)), vec![ObjectRef::new("b").within("ns")]);

        // An object deleted before its resync: its entry goes when it falls due.
        resyncs.after("uid-c", Duration::from_secs(60));
        writer.apply_watcher_event(&watcher::Event::Delete(object("c")));
        assert!(resyncs.take_due(&cache, now + Duration::from_secs(59)).is_empty());
        assert_eq!(resyncs.len(), 1);
        assert!(resyncs.take_due(&cache, now + Duration::from_secs(61)).is_empty());
        assert!(resyncs.is_empty(), "nothing kept for objects no longer cached");
        resyncs.after("uid-a", Duration::from_secs(60));
        resyncs.forget("uid-a");
        assert!(resyncs.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_wakes_an_object_when_it_is_due() {
        let (cache, mut writer) = ready_store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Apply(object("a")));
        let resyncs = Arc::new(Resyncs::default());
        resyncs.after("uid-a", Duration::from_secs(5));
        let mut woken = std::pin::pin!(sweep(resyncs.clone(), cache, tick(Duration::from_secs(60))));
        let started = tokio::time::Instant::now();
        assert_eq!(woken.next().await, Some(ObjectRef::new("a").within("ns")));
        let waited = started.elapsed();
        assert!(waited >= Duration::from_secs(5) && waited <= Duration::from_secs(6), "{waited:?}");
        assert!(resyncs.is_empty());
    }

    #[test]
    fn the_sweep_is_at_most_a_second_late() {
        assert_eq!(tick(Duration::from_secs(60)), Duration::from_secs(1));
        assert_eq!(tick(Duration::from_secs(4)), Duration::from_millis(200));
        assert_eq!(tick(Duration::from_millis(100)), Duration::from_millis(100));
    }
}

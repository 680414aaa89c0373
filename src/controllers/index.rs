//! Secondary indexes over a reflector's cache, fed from the same watch events as the cache.
//!
//! A reconcile that must find "the objects that name this one" by passing over a whole cache
//! costs a compare per cached object; done once per reconcile, the work per resync period grows
//! with the square of the number of objects (BENCHMARKS.md: half the operator's CPU at 5,000
//! Queues). An [`Index`] answers the same question by key.
//!
//! An index may name an object that is gone or has changed (each name it gives is read back
//! through the cache, which decides), but it never misses one the cache holds: [`Feed`] adds an
//! object's entries before the cache shows it and removes them after the cache dropped them.

use std::collections::BTreeSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use kube::runtime::reflector::{Lookup, Store, store::Writer};
use kube::runtime::watcher;

/// Every (key, name) pair in one ordered set: the names of a key are one range of it. A map of
/// sets would cost a B-tree node (eleven slots) per key, and most keys have one name.
type Entries<Key, Name> = BTreeSet<(Key, Name)>;

/// Names by key: which cached objects answer to `Key`. `Name::default()` must sort before every
/// other name (as the empty string, and tuples of strings, do).
#[derive(Debug)]
pub struct Index<Key, Name>(Mutex<Lists<Key, Name>>);

#[derive(Debug)]
struct Lists<Key, Name> {
    live: Entries<Key, Name>,
    /// While the watch lists again: what the new list holds, which replaces `live` when the
    /// cache is replaced by it.
    relist: Option<Entries<Key, Name>>,
}

impl<Key, Name> Default for Index<Key, Name> {
    fn default() -> Self {
        Index(Mutex::new(Lists { live: BTreeSet::new(), relist: None }))
    }
}

impl<Key: Ord + Clone, Name: Ord + Clone + Default> Index<Key, Name> {
    // A panic elsewhere while holding the lock leaves a plain set behind, still consistent
    // enough to answer from: the cache decides every name anyway.
    fn lock(&self) -> MutexGuard<'_, Lists<Key, Name>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The names under `key`, copied out so that no lock is held while the cache is read.
    pub fn get(&self, key: &Key) -> Vec<Name> {
        let lists = self.lock();
        let from = (key.clone(), Name::default());
        lists.live.range(from..).take_while(|(k, _)| k == key).map(|(_, name)| name.clone()).collect()
    }

    /// How many entries it holds (for tests and sizing).
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn add(&self, entries: Vec<(Key, Name)>) {
        let mut lists = self.lock();
        for entry in entries {
            if let Some(relist) = lists.relist.as_mut() {
                relist.insert(entry.clone());
            }
            lists.live.insert(entry);
        }
    }

    fn remove(&self, entries: Vec<(Key, Name)>) {
        let mut lists = self.lock();
        for entry in entries {
            lists.live.remove(&entry);
        }
    }
}

/// A cache's writer and an index over it, kept in step: use in place of the writer.
pub struct Feed<K, Key, Name>
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    writer: Writer<K>,
    /// The cache as it stands before an event is applied: an object's earlier entries.
    cache: Store<K>,
    index: Arc<Index<Key, Name>>,
    /// The index entries of one object. Two objects never share an entry.
    entries: fn(&K) -> Vec<(Key, Name)>,
}

impl<K, Key, Name> Feed<K, Key, Name>
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    Key: Ord + Clone,
    Name: Ord + Clone + Default,
{
    pub fn new(writer: Writer<K>, index: Arc<Index<Key, Name>>, entries: fn(&K) -> Vec<(Key, Name)>) -> Self {
        Feed { cache: writer.as_reader(), writer, index, entries }
    }

    fn earlier(&self, obj: &K) -> Vec<(Key, Name)> {
        self.cache.get(&obj.to_object_ref(Default::default())).map(|old| (self.entries)(&old)).unwrap_or_default()
    }

    /// Applies `event` to the cache and the index, in the order that keeps the index naming at
    /// least what the cache holds: an entry is added first and removed last.
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        use watcher::Event::*;
        match event {
            Apply(obj) => {
                let (now, earlier) = ((self.entries)(obj), self.earlier(obj));
                let dropped = earlier.into_iter().filter(|e| !now.contains(e)).collect();
                self.index.add(now);
                self.writer.apply_watcher_event(event);
                self.index.remove(dropped);
            }
            // The cache shows the new list only at InitDone: nothing leaves the index before.
            InitApply(obj) => {
                self.index.add((self.entries)(obj));
                self.writer.apply_watcher_event(event);
            }
            Delete(obj) => {
                let mut gone = self.earlier(obj);
                self.writer.apply_watcher_event(event);
                gone.extend((self.entries)(obj));
                self.index.remove(gone);
            }
            Init => {
                self.writer.apply_watcher_event(event);
                self.index.lock().relist = Some(BTreeSet::new());
            }
            InitDone => {
                self.writer.apply_watcher_event(event);
                let mut lists = self.index.lock();
                if let Some(relist) = lists.relist.take() {
                    lists.live = relist;
                }
            }
        }
    }
}

/// A reflector's writer, or a [`Feed`] that keeps an index beside it.
pub trait Reflect<K>: Send + 'static {
    fn apply_watcher_event(&mut self, event: &watcher::Event<K>);
}

impl<K> Reflect<K> for Writer<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        Writer::apply_watcher_event(self, event)
    }
}

impl<K, Key, Name> Reflect<K> for Feed<K, Key, Name>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
    Key: Ord + Clone + Send + Sync + 'static,
    Name: Ord + Clone + Default + Send + Sync + 'static,
{
    fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        Feed::apply_watcher_event(self, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::testing::ready_store;
    use k8s_openapi::api::core::v1::ConfigMap;
    use watcher::Event::*;

    /// A ConfigMap `name` whose label `points-at` is its one entry.
    fn cm(name: &str, points_at: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.labels = Some([("points-at".to_string(), points_at.to_string())].into());
        cm
    }

    fn points_at(cm: &ConfigMap) -> Vec<(String, String)> {
        let target = cm.metadata.labels.as_ref().and_then(|l| l.get("points-at")).cloned();
        target.into_iter().map(|t| (t, cm.metadata.name.clone().unwrap_or_default())).collect()
    }

    type Fed = (Store<ConfigMap>, Arc<Index<String, String>>, Feed<ConfigMap, String, String>);

    fn fed() -> Fed {
        let (cache, writer) = ready_store();
        let index = Arc::new(Index::default());
        (cache, index.clone(), Feed::new(writer, index, points_at))
    }

    #[test]
    fn a_change_moves_the_entry_and_a_delete_drops_it() {
        let (cache, index, mut feed) = fed();
        feed.apply_watcher_event(&Apply(cm("a", "x")));
        feed.apply_watcher_event(&Apply(cm("b", "x")));
        assert_eq!(index.get(&"x".into()), ["a", "b"]);
        assert_eq!(cache.state().len(), 2);

        feed.apply_watcher_event(&Apply(cm("a", "y")));
        assert_eq!((index.get(&"x".into()), index.get(&"y".into())), (vec!["b".into()], vec!["a".to_string()]));
        feed.apply_watcher_event(&Apply(cm("a", "y")));
        assert_eq!(index.get(&"y".into()), ["a"], "an unchanged entry stays");

        // The delete event may carry an older state than the cache's: both leave.
        feed.apply_watcher_event(&Delete(cm("a", "x")));
        feed.apply_watcher_event(&Delete(cm("b", "x")));
        assert!(index.is_empty(), "nothing stale is kept");
    }

    #[test]
    fn a_relist_replaces_the_index_and_never_hides_what_the_cache_holds() {
        let (cache, index, mut feed) = fed();
        feed.apply_watcher_event(&Apply(cm("gone", "x")));
        feed.apply_watcher_event(&Apply(cm("kept", "x")));

        feed.apply_watcher_event(&Init);
        feed.apply_watcher_event(&InitApply(cm("kept", "y")));
        assert!(cache.get(&kube::runtime::reflector::ObjectRef::new("gone").within("ns")).is_some());
        assert_eq!(index.get(&"x".into()), ["gone", "kept"], "the cache holds the old list until done");
        assert_eq!(index.get(&"y".into()), ["kept"]);
        feed.apply_watcher_event(&InitDone);
        assert_eq!((index.get(&"x".into()), index.get(&"y".into())), (vec![], vec!["kept".to_string()]));
        assert_eq!(index.len(), 1, "what the new list lacks leaves the index");
    }
}

//! The cache of the ConfigMaps skyport manages, holding only what the Queue controller decides
//! with: name, UID, the controlling owner and a hash of the data.
//!
//! A whole ConfigMap in a reflector costs about 2 KiB even when it carries three short values:
//! its label and its data are B-tree maps, each allocating a node of eleven slots. With one per
//! Queue, that was the largest share of the operator's memory at 10,000 Queues (BENCHMARKS.md).
//! Drift is still seen exactly: the hash is of the data the watch delivered. Only a write that
//! finds the hash different reads the whole object first, so the patch is built from what is
//! really there.

use crate::controllers::hash_of;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::desired::{configmap_name, configmap_name_of};
use crate::controllers::index;
use crate::controllers::memory::compact_key;
use crate::crd::queue::Queue;

/// What the cache keeps of one managed ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedConfigMap {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The controlling owner reference's name and UID when it is a Queue's.
    pub queue: Option<(String, String)>,
    /// [`data_hash`] of the data the watch delivered.
    pub data_hash: u64,
}

impl CachedConfigMap {
    /// Whether `queue` controls this ConfigMap (the controlling owner reference has its UID).
    pub fn controlled_by(&self, queue: &Queue) -> bool {
        self.queue.as_ref().is_some_and(|(_, uid)| Some(uid) == queue.metadata.uid.as_ref())
    }

    /// Whether the ConfigMap holds exactly `data`.
    pub fn holds(&self, data: &Option<BTreeMap<String, String>>) -> bool {
        self.data_hash == data_hash(data)
    }
}

impl From<&ConfigMap> for CachedConfigMap {
    fn from(cm: &ConfigMap) -> Self {
        let (kind, group) = (<Queue as Resource>::kind(&()), <Queue as Resource>::group(&()));
        let queue = cm
            .owner_references()
            .iter()
            .find(|r| r.controller == Some(true) && r.kind == kind && r.api_version.split('/').next() == Some(&*group))
            .map(|r| (r.name.clone(), r.uid.clone()));
        CachedConfigMap {
            name: cm.name_any(),
            namespace: cm.namespace().unwrap_or_default(),
            uid: cm.uid().unwrap_or_default(),
            queue,
            data_hash: data_hash(&cm.data),
        }
    }
}

/// A hash of a ConfigMap's data: keys and values in key order. A missing map and an empty one are
/// the same to the apps that read it.
pub fn data_hash(data: &Option<BTreeMap<String, String>>) -> u64 {
    hash_of(data.iter().flatten().collect::<Vec<_>>())
}

// Lets kube-runtime's store and its keys hold this type instead of a ConfigMap.
impl kube::runtime::reflector::Lookup for CachedConfigMap {
    type DynamicType = ();

    fn kind(dt: &()) -> Cow<'_, str> {
        <ConfigMap as Resource>::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        <ConfigMap as Resource>::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        <ConfigMap as Resource>::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        <ConfigMap as Resource>::plural(dt)
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.namespace))
    }
    // The store's key would copy these two (one allocation each per ConfigMap), and nothing reads
    // them from a key.
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        None
    }
    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

/// The key of `name` in `namespace` in the cache.
pub fn key(name: &str, namespace: &str) -> ObjectRef<CachedConfigMap> {
    ObjectRef::new(name).within(namespace)
}

fn project(event: watcher::Event<ConfigMap>) -> watcher::Event<CachedConfigMap> {
    use watcher::Event::*;
    match event {
        Apply(cm) => Apply((&cm).into()),
        Delete(cm) => Delete((&cm).into()),
        Init => Init,
        InitApply(cm) => InitApply((&cm).into()),
        InitDone => InitDone,
    }
}

/// The ConfigMaps each Queue controls besides its own `<name>-sqs`: those of its `spec.exports`,
/// and any it wrote under a name since dropped from them, as (namespace, name) by the Queue's UID
/// ([`compact_key`]). Each reconcile asks for them; most Queues have none, so the index is mostly
/// empty. It may name more than the cache holds, never less ([`index`]).
pub type Exported = index::Index<u128, (String, String)>;

/// The ConfigMap cache's writer and its [`Exported`] index, kept in step.
pub type Feed = index::Feed<CachedConfigMap, u128, (String, String)>;

/// The feed of `writer` and `exported`.
pub fn feed(writer: Writer<CachedConfigMap>, exported: Arc<Exported>) -> Feed {
    Feed::new(writer, exported, entry)
}

/// The index entry of `cm`, if a Queue controls it under another name than its own ConfigMap's.
fn entry(cm: &CachedConfigMap) -> Vec<(u128, (String, String))> {
    let Some((owner, uid)) = cm.queue.as_ref() else { return Vec::new() };
    if cm.name == configmap_name_of(owner) {
        return Vec::new();
    }
    vec![(compact_key(uid), (cm.namespace.clone(), cm.name.clone()))]
}

/// The ConfigMaps of `queue`'s namespace it controls, other than its own, as `cache` holds them.
pub fn exported_by(queue: &Queue, exported: &Exported, cache: &Store<CachedConfigMap>) -> Vec<Arc<CachedConfigMap>> {
    let (Some(uid), Some(ns)) = (queue.metadata.uid.as_deref(), queue.metadata.namespace.as_deref()) else {
        return Vec::new();
    };
    // A ConfigMap whose owner reference names another Queue than this UID's is indexed even
    // under this Queue's own name: that one is never an export to drop.
    let own = configmap_name(queue);
    let names = exported.get(&compact_key(uid));
    let names = names.iter().filter(|(n, name)| n == ns && *name != own);
    names.filter_map(|(_, name)| cache.get(&key(name, ns))).filter(|cm| cm.controlled_by(queue)).collect()
}

/// Watches the managed ConfigMaps (`selector`) into `feed` and yields the Queue each change
/// concerns, as `owns` would. Watch errors are retried with backoff and logged here, since this
/// stream reaches the controller as plain wake-ups.
pub fn watch(
    api: Api<ConfigMap>,
    selector: &str,
    mut feed: Feed,
) -> impl Stream<Item = ObjectRef<Queue>> + Send + 'static {
    watcher(api, watcher::Config::default().labels(selector)).default_backoff().filter_map(move |event| {
        let woken = match event {
            Ok(event) => {
                let event = project(event);
                feed.apply_watcher_event(&event);
                match event {
                    watcher::Event::Apply(cm) | watcher::Event::Delete(cm) | watcher::Event::InitApply(cm) => {
                        cm.queue.map(|(name, _)| ObjectRef::new(&name).within(&cm.namespace))
                    }
                    watcher::Event::Init | watcher::Event::InitDone => None,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "ConfigMap watch failed; retrying with backoff");
                None
            }
        };
        futures::future::ready(woken)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn cm(owner: Option<OwnerReference>, data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("orders-sqs".into()),
                namespace: Some("ns".into()),
                uid: Some("cm-uid".into()),
                resource_version: Some("7".into()),
                owner_references: owner.map(|o| vec![o]),
                ..Default::default()
            },
            data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    fn owner(kind: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: Queue::api_version(&()).into(),
            kind: kind.into(),
            name: "orders".into(),
            uid: "uid-1".into(),
            controller: Some(controller),
            ..Default::default()
        }
    }

    fn queue(uid: &str) -> Queue {
        let mut q = Queue::new("orders", Default::default());
        q.metadata.uid = Some(uid.into());
        q
    }

    #[test]
    fn the_cache_keeps_the_controlling_queue_and_sees_any_change_of_data() {
        let cached = CachedConfigMap::from(&cm(Some(owner("Queue", true)), &[("QUEUE_URL", "u")]));
        assert_eq!(cached.queue, Some(("orders".into(), "uid-1".into())));
        assert!(cached.controlled_by(&queue("uid-1")));
        assert!(!cached.controlled_by(&queue("uid-2")));
        let want = |pairs: &[(&str, &str)]| Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        assert!(cached.holds(&want(&[("QUEUE_URL", "u")])));
        assert!(!cached.holds(&want(&[("QUEUE_URL", "v")])), "a changed value");
        assert!(!cached.holds(&want(&[("QUEUE_URL", "u"), ("QUEUE_ARN", "a")])), "an added key");
        assert!(!cached.holds(&want(&[("QUEUE_UR", "Lu")])), "key and value are not run together");
        assert!(!cached.holds(&None));
    }

    #[test]
    fn only_a_controlling_queue_owns_the_cached_configmap() {
        assert_eq!(CachedConfigMap::from(&cm(Some(owner("Queue", false)), &[])).queue, None);
        assert_eq!(CachedConfigMap::from(&cm(Some(owner("Tunnel", true)), &[])).queue, None);
        assert_eq!(CachedConfigMap::from(&cm(None, &[])).queue, None);
        assert!(!CachedConfigMap::from(&cm(None, &[])).controlled_by(&queue("uid-1")));
    }

    /// A ConfigMap named `name` in `ns` controlled by the Queue `owner` with UID `uid`.
    fn controlled(ns: &str, name: &str, owner: &str, uid: &str) -> CachedConfigMap {
        let queue = Some((owner.to_string(), uid.to_string()));
        CachedConfigMap { name: name.into(), namespace: ns.into(), uid: format!("cm-{name}"), queue, data_hash: 0 }
    }

    fn names(found: Vec<Arc<CachedConfigMap>>) -> Vec<String> {
        let mut names: Vec<String> = found.iter().map(|cm| cm.name.clone()).collect();
        names.sort();
        names
    }

    /// An empty cache, its index and their feed, and the Queue `orders` (`uid-1`) in `ns`.
    fn fed() -> (Store<CachedConfigMap>, Arc<Exported>, Feed, Queue) {
        let (cache, writer) = crate::controllers::testing::ready_store();
        let exported = Arc::new(Exported::default());
        let mut orders = queue("uid-1");
        orders.metadata.namespace = Some("ns".into());
        (cache, exported.clone(), feed(writer, exported), orders)
    }

    #[test]
    fn a_queue_finds_the_other_configmaps_it_controls_in_its_namespace_only() {
        let (cache, exported, mut feed, orders) = fed();
        for cm in [
            controlled("ns", "orders-sqs", "orders", "uid-1"),
            controlled("ns", "orders-env", "orders", "uid-1"),
            controlled("ns", "billing-env", "billing", "uid-2"),
            controlled("other", "orders-copy", "orders", "uid-1"),
        ] {
            feed.apply_watcher_event(&watcher::Event::Apply(cm));
        }
        assert_eq!(
            names(exported_by(&orders, &exported, &cache)),
            ["orders-env"],
            "not its own, not another namespace's"
        );
        assert_eq!(exported.len(), 3, "the Queue's own ConfigMap is not indexed");

        // Another Queue takes it over: its entry moves to that Queue.
        feed.apply_watcher_event(&watcher::Event::Apply(controlled("ns", "orders-env", "billing", "uid-2")));
        assert!(exported_by(&orders, &exported, &cache).is_empty());
        feed.apply_watcher_event(&watcher::Event::Delete(controlled("ns", "orders-env", "billing", "uid-2")));
        assert!(exported_by(&orders, &exported, &cache).is_empty());
    }
}

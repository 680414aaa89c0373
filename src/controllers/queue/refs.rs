//! What each Queue names, indexed the other way round: the Queues whose `deadLetter` names a
//! Queue (its sources, in SQS's words), and the Queues whose `accountRef` names an AwsAccount.
//!
//! Both are asked at each transition of the Queue or account named: a source is woken when its
//! target becomes Ready or is deleted, and an account reconcile (one per Queue released during a
//! mass delete) counts its users. Answered by a pass over every cached Queue, a mass create or
//! delete cost a compare per Queue per Queue (8 % of the operator's CPU while 5,000 Queues were
//! created, and growing with their number); the [`Index`], fed from the Queue watch, answers by
//! key.

use std::sync::Arc;

use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Context;
use crate::controllers::hash_of;
use crate::controllers::index::{self, Index};
use crate::crd::queue::Queue;

/// (namespace, name) of the Queues that name a thing, by a hash of what they name ([`Named`]).
/// A hash may name a Queue that names something else: each lookup reads the Queue back from the
/// cache and decides.
pub type Refs = Index<u64, (String, String)>;

/// The Queue cache's writer and its [`Refs`] index, kept in step.
pub type Feed = index::Feed<Queue, u64, (String, String)>;

/// The feed of `writer` and `refs`.
pub fn feed(writer: Writer<Queue>, refs: Arc<Refs>) -> Feed {
    Feed::new(writer, refs, entries)
}

/// What a Queue may name, each in the namespace it is in.
#[derive(Hash)]
enum Named<'a> {
    /// A dead-letter target by `queueRef`: the Queue's name.
    DeadLetter(&'a str, &'a str),
    /// A dead-letter target by `targetArn`.
    DeadLetterArn(&'a str, &'a str),
    /// An AwsAccount by `accountRef`.
    Account(&'a str, &'a str),
}

impl Named<'_> {
    fn key(&self) -> u64 {
        hash_of(self)
    }
}

fn entries(queue: &Queue) -> Vec<(u64, (String, String))> {
    let (Some(ns), Some(name)) = (queue.metadata.namespace.as_deref(), queue.metadata.name.as_ref()) else {
        return Vec::new();
    };
    let d = queue.spec.dead_letter.as_deref();
    let named = d.and_then(|d| d.queue_ref.as_ref()).map(|r| Named::DeadLetter(ns, &r.name));
    let by_arn = d.and_then(|d| d.target_arn.as_deref()).map(|arn| Named::DeadLetterArn(ns, arn));
    let account = queue.spec.account_ref.as_deref().map(|r| r.target(ns)).map(|(n, a)| Named::Account(n, a));
    let keys = named.into_iter().chain(by_arn).chain(account).map(|n| n.key());
    keys.map(|key| (key, (ns.to_string(), name.clone()))).collect()
}

/// The cached Queues under `named` that `keep` accepts.
fn lookup(refs: &Refs, queues: &Store<Queue>, named: Named, keep: impl Fn(&Queue) -> bool) -> Vec<Arc<Queue>> {
    let cached =
        refs.get(&named.key()).into_iter().filter_map(|(ns, name)| queues.get(&ObjectRef::new(&name).within(&ns)));
    cached.filter(|q| keep(q)).collect()
}

/// Whether `source`'s deadLetter names the Queue `name` of namespace `ns`, or the queue `arn`.
fn sends_to(source: &Queue, ns: &str, name: &str, arn: Option<&str>) -> bool {
    let Some(d) = source.spec.dead_letter.as_ref().filter(|_| source.metadata.namespace.as_deref() == Some(ns)) else {
        return false;
    };
    d.queue_ref.as_ref().is_some_and(|r| r.name == name) || (arn.is_some() && d.target_arn.as_deref() == arn)
}

/// The Queues of `queue`'s namespace whose deadLetter names it, as the cache holds them.
pub fn sources(queue: &Queue, ctx: &Context) -> Vec<Arc<Queue>> {
    let (Some(ns), Some(name)) = (queue.metadata.namespace.as_deref(), queue.metadata.name.as_deref()) else {
        return Vec::new();
    };
    let arn = queue.status.as_ref().and_then(|s| s.queue_arn.as_deref());
    let keep = |q: &Queue| sends_to(q, ns, name, arn);
    let mut found = lookup(&ctx.refs, &ctx.queues, Named::DeadLetter(ns, name), keep);
    if let Some(arn) = arn {
        // A Queue names its target one way only (admission checks it): no source is found twice.
        found.extend(lookup(&ctx.refs, &ctx.queues, Named::DeadLetterArn(ns, arn), keep));
    }
    found
}

/// Reconciles `queue`'s sources now: when it becomes Ready (or is made again under its ARN).
pub fn wake_sources(queue: &Queue, ctx: &Context) {
    for q in sources(queue, ctx) {
        let _ = ctx.dependents.unbounded_send(ObjectRef::from_obj(&*q));
    }
}

/// The cached Queues whose accountRef names the AwsAccount `name` in `ns`.
pub fn account_users(refs: &Refs, queues: &Store<Queue>, (ns, name): (&str, &str)) -> Vec<Arc<Queue>> {
    let names = |q: &Queue| {
        let queue_ns = q.metadata.namespace.as_deref().unwrap_or_default();
        q.spec.account_ref.as_deref().is_some_and(|r| r.target(queue_ns) == (ns, name))
    };
    lookup(refs, queues, Named::Account(ns, name), names)
}

//! A Queue's dead-letter sources, found through the index of what Queues name ([`refs::Refs`]),
//! and woken when it becomes Ready.

use super::*;
use crate::crd::queue::{DeadLetter, LocalQueueRef};
use kube::ResourceExt;

/// The Queue `name` in `ns` whose deadLetter names the Queue `to` (or, with `arn:`, that ARN).
fn sending(ns: &str, name: &str, to: &str) -> Queue {
    let (queue_ref, target_arn) = match to.strip_prefix("arn:") {
        Some(_) => (None, Some(to.to_string())),
        None => (Some(LocalQueueRef { name: to.into() }), None),
    };
    let dead_letter = Some(Box::new(DeadLetter { queue_ref, target_arn, max_receive_count: 3 }));
    let mut q = queue(QueueSpec { dead_letter, ..Default::default() });
    q.metadata.namespace = Some(ns.into());
    q.metadata.name = Some(name.into());
    q.metadata.uid = Some(format!("uid-{ns}-{name}"));
    q
}

fn names(found: Vec<Arc<Queue>>) -> Vec<String> {
    let mut names: Vec<String> = found.iter().map(|q| q.name_any()).collect();
    names.sort();
    names
}

const ARN: &str = "arn:aws:sqs:eu-west-1:000000000000:ns-orders";

/// `orders` in `ns`, with `ARN` recorded.
fn orders() -> Queue {
    let mut orders = queue(QueueSpec::default());
    orders.status = Some(crate::crd::queue::QueueStatus { queue_arn: Some(ARN.into()), ..Default::default() });
    orders
}

#[tokio::test]
async fn a_queue_finds_its_sources_by_name_and_by_arn_in_its_namespace_only() {
    let mut h = harness();
    h.cache_others(50);
    for q in [
        sending("ns", "by-name", "orders"),
        sending("ns", "by-arn", ARN),
        sending("ns", "elsewhere", "billing"),
        sending("other", "same-name-other-namespace", "orders"),
        sending("other", "same-arn-other-namespace", ARN),
    ] {
        h.queues.apply_watcher_event(&watcher::Event::Apply(q));
    }
    assert_eq!(names(refs::sources(&orders(), &h.ctx)), ["by-arn", "by-name"]);
    assert_eq!(names(refs::sources(&queue(QueueSpec::default()), &h.ctx)), ["by-name"], "no ARN recorded yet");

    // A source that sends elsewhere now, or is gone, is no longer one.
    h.queues.apply_watcher_event(&watcher::Event::Apply(sending("ns", "by-name", "billing")));
    h.queues.apply_watcher_event(&watcher::Event::Delete(sending("ns", "by-arn", ARN)));
    assert!(refs::sources(&orders(), &h.ctx).is_empty());
    assert_eq!(h.ctx.refs.len(), 4, "nothing stale is indexed: the three others and by-name's new target");
}

#[tokio::test]
async fn a_queue_that_becomes_ready_wakes_its_sources_only() {
    let mut h = harness();
    h.cache_others(20);
    h.queues.apply_watcher_event(&watcher::Event::Apply(sending("ns", "source", "orders")));
    h.queues.apply_watcher_event(&watcher::Event::Apply(sending("ns", "elsewhere", "billing")));
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::True, "Available".into())));
    let woken = h.woken.try_recv().expect("a Queue was woken");
    assert_eq!((woken.name.as_str(), woken.namespace.as_deref()), ("source", Some("ns")));
    assert!(h.woken.try_recv().is_err(), "no other Queue is woken");
}

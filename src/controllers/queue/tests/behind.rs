//! A Queue read from a cache that is behind the API server: a standby that takes over before its
//! watch resumes reconciles Queues the former leader already deleted. No SQS queue is created
//! for a Queue the API server no longer has live; a Queue it has live gets its queue again.

use providers::QueueBackend;

use super::*;
use crate::controllers::testing::requeue_secs;

/// A Queue made and converged, then its SQS queue deleted and its memory gone, as a new leader
/// finds it. Returns the cache's copy and the queue's name.
async fn converged_then_queue_gone(h: &Harness) -> (Arc<Queue>, String) {
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    let cached = h.current();
    let status = cached.status.clone().unwrap();
    h.sqs.delete_queue(&status.queue_url.unwrap()).await.unwrap();
    h.ctx.written.forget(&object_key(&cached));
    h.ctx.verified.forget(cached.metadata.uid.as_deref().unwrap());
    (Arc::new(cached), status.queue_name.unwrap().to_string())
}

/// What the reconcile of the cache's copy did: whether it created a queue, and its API writes.
/// When it created none, it wakes again within a resync, should no watch event come.
async fn reconcile_behind(h: &Harness, cached: Arc<Queue>, name: &str) -> (bool, usize) {
    let creates = || h.sqs.calls().iter().filter(|c| **c == "create_queue").count();
    let (writes, before) = (h.api.writes().len(), creates());
    let action = h.reconcile(cached).await.unwrap();
    let created = creates() > before;
    if !created {
        let resync = requeue_secs(&action);
        assert!(resync > 0.0 && resync <= h.ctx.settings.resync.as_secs_f64(), "{action:?}");
    }
    assert_eq!(created, h.sqs.exists(name));
    (created, h.api.writes().len() - writes)
}

#[tokio::test]
async fn a_queue_the_api_server_deleted_is_not_created_from_the_cache() {
    let h = harness();
    let (cached, name) = converged_then_queue_gone(&h).await;
    // The former leader deleted the SQS queue and released the finalizer: the Queue is gone.
    h.api.remove(PATH);
    assert_eq!(reconcile_behind(&h, cached, &name).await, (false, 0));
}

#[tokio::test]
async fn a_queue_being_deleted_or_replaced_is_not_created_from_the_cache() {
    let h = harness();
    let (cached, name) = converged_then_queue_gone(&h).await;
    let mut deleting = h.current();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    h.put(&deleting);
    assert_eq!(reconcile_behind(&h, cached.clone(), &name).await, (false, 0));

    // Another Queue of that name, made since: the old one's copy creates nothing for it.
    let mut other = queue(QueueSpec::default());
    other.metadata.uid = Some("uid-2".into());
    h.put(&other);
    assert_eq!(reconcile_behind(&h, cached, &name).await, (false, 0));
}

#[tokio::test]
async fn a_queue_the_api_server_has_live_gets_its_sqs_queue_again() {
    let h = harness();
    let (cached, name) = converged_then_queue_gone(&h).await;
    let (created, writes) = reconcile_behind(&h, cached, &name).await;
    assert!(created && writes > 0, "recreated and recorded");
    assert_eq!(h.api.event_reasons(), ["Created", "Recreated"]);
}

/// A CreateQueue that timed out may still be carried out by SQS. The Queue deleted meanwhile:
/// its cleanup finds no queue yet and keeps the finalizer, looking again once such a late create
/// would have landed; the queue it made then is found by its owner tag and deleted.
#[tokio::test]
async fn a_create_without_an_answer_keeps_the_cleanup_looking_until_a_late_create_would_have_landed() {
    use crate::controllers::queue::desired::TAG_OWNER_UID;
    let h = harness();
    h.sqs.fail_next("create_queue", QueueError::Unavailable("operation timed out".into()));
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap_err();
    let mut deleting = h.current();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let deleting = h.put(&deleting);
    let action = h.reconcile(deleting.clone()).await.unwrap();
    let wait = requeue_secs(&action);
    assert!(wait > 40.0 && wait <= 45.0, "{action:?}");
    assert_eq!(h.current().metadata.finalizers, Some(vec![FINALIZER.to_string()]), "the finalizer stays");

    // The abandoned create lands.
    let name = desired::queue_name("ns", "orders", &deleting.spec, None);
    h.sqs.insert(&name, [(TAG_OWNER_UID.to_string(), "uid-1".to_string())].into());
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert!(!h.sqs.exists(&name), "deleted by its owner tag");
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
}

/// A CreateQueue of unknown outcome by the replica (or process) that acted before this one is in
/// no memory here. So the cleanup of a Queue older than this replica's takeover that finds no
/// queue keeps the finalizer until such a create would have landed; a Queue made since the
/// takeover was never acted on before, and goes at once.
#[tokio::test]
async fn a_queue_older_than_the_takeover_keeps_its_finalizer_until_a_former_leaders_create_would_have_landed() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    for (made_ago, waits) in [(600, true), (0, false)] {
        let h = harness();
        let (cached, _) = converged_then_queue_gone(&h).await;
        let mut deleting = (*cached).clone();
        deleting.metadata.creation_timestamp = Some(Time(Timestamp::now() - std::time::Duration::from_secs(made_ago)));
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let action = h.reconcile(h.put(&deleting)).await.unwrap();
        let finalizers = h.current().metadata.finalizers.unwrap_or_default();
        if waits {
            let wait = requeue_secs(&action);
            assert!(wait > 40.0 && wait <= 45.0, "{action:?}");
            assert_eq!(finalizers, [FINALIZER], "the finalizer stays");
        } else {
            assert!(finalizers.is_empty(), "nothing acted on it before this replica: {finalizers:?}");
        }
    }
}

/// The Queue deleted and its finalizer released (by a replica acting in this one's place) while
/// this one's CreateQueue was under way: the queue it made belongs to no Queue, and is deleted
/// at once, unless the Queue asked to keep its queue.
#[tokio::test]
async fn a_queue_made_while_its_queue_was_deleted_is_deleted_again() {
    for (policy, kept) in [(None, false), (Some(DeletionPolicy::Retain), true)] {
        let h = harness();
        let spec = QueueSpec { deletion_policy: policy, ..Default::default() };
        let api = h.api.clone();
        h.sqs.meanwhile("create_queue", move || {
            api.remove(PATH);
        });
        let name = desired::queue_name("ns", "orders", &spec, None);
        let action = h.reconcile(h.put(&queue(spec))).await.expect("nothing left to retry");
        assert_eq!(h.sqs.exists(&name), kept, "{policy:?}");
        assert_eq!(action, Action::await_change(), "nothing to retry for a Queue that is gone");
    }
}

//! The Queue reconcile against in-process fakes of the Kubernetes API and SQS: finalizer,
//! status, Events, cleanup, and their failure branches.

use std::sync::Arc;

use futures::channel::mpsc::unbounded;
use hyper::Method;
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use providers::QueueError;
use providers::sqs::Tags;
use serde_json::json;

use super::*;
use crate::controllers::testing::sqs::FakeSqs;
use crate::controllers::testing::{FakeApi, ready_store};
use crate::crd::condition::ConditionStatus;
use crate::crd::queue::{DeletionPolicy, QueueSpec};

mod behind;
mod exports;
mod pacing;
mod wakes;

const PATH: &str = "/apis/skyport.dev/v1alpha1/namespaces/ns/queues/orders";

struct Harness {
    ctx: Arc<Context>,
    api: FakeApi,
    sqs: Arc<FakeSqs>,
    configmaps: configmaps::Feed,
    queues: refs::Feed,
    /// The Queues woken as dead-letter sources ([`refs::wake_sources`]).
    woken: futures::channel::mpsc::UnboundedReceiver<ObjectRef<Queue>>,
    accounts: Writer<AwsAccount>,
}

fn harness() -> Harness {
    harness_with(FakeSqs::default())
}

fn harness_with(sqs: FakeSqs) -> Harness {
    let (client, api) = FakeApi::start();
    let sqs = Arc::new(sqs);
    let (queues, queue_writer) = ready_store();
    let (configmaps, cm_writer) = ready_store();
    let exported = Arc::new(configmaps::Exported::default());
    let refs = Arc::new(refs::Refs::default());
    let (tx, woken) = unbounded();
    let settings = QueueArgs::default();
    let backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
    let (accounts, account_writer) = ready_store();
    let state = State {
        sqs: sqs.clone(),
        accounts: super::accounts::Accounts::new(accounts, Default::default()),
        settings,
        queues,
        configmaps,
        exported: exported.clone(),
        refs: refs.clone(),
        usage: account_use::Usage::new().0,
        secrets: Default::default(),
        verified: Default::default(),
        unsettled: Default::default(),
        redrives: Default::default(),
        resyncs: Default::default(),
        pacing: Default::default(),
        gate: fair::Gate::new(QueueArgs::default().concurrency, tx.clone()),
        dependents: tx,
        reported: Default::default(),
    };
    Harness {
        ctx: Arc::new(Context::new(client, backoff, state)),
        api,
        sqs,
        configmaps: configmaps::feed(cm_writer, exported),
        queues: refs::feed(queue_writer, refs),
        woken,
        accounts: account_writer,
    }
}

impl Harness {
    /// `n` other Queues in the controller's cache, as a large install has.
    fn cache_others(&mut self, n: usize) {
        for i in 0..n {
            let mut other = queue(QueueSpec::default());
            other.metadata.name = Some(format!("q-{i}"));
            other.metadata.uid = Some(format!("uid-q-{i}"));
            self.queues.apply_watcher_event(&watcher::Event::Apply(other));
        }
    }

    /// Stores `queue` in the fake API and returns it as the API has it.
    fn put(&self, queue: &Queue) -> Arc<Queue> {
        Arc::new(serde_json::from_value(self.api.put(PATH, serde_json::to_value(queue).unwrap())).unwrap())
    }

    fn current(&self) -> Queue {
        serde_json::from_value(self.api.get(PATH).expect("queue stored")).unwrap()
    }

    async fn reconcile(&self, queue: Arc<Queue>) -> Result<Action> {
        reconcile(queue, self.ctx.clone()).await
    }
}

fn queue(spec: QueueSpec) -> Queue {
    let mut q = Queue::new("orders", spec);
    q.metadata.namespace = Some("ns".into());
    q.metadata.uid = Some("uid-1".into());
    q.metadata.generation = Some(1);
    q
}

fn ready_reason(q: &Queue) -> Option<(ConditionStatus, String)> {
    crate::controllers::status::ready_condition(q).map(|c| (c.status, c.reason.to_string()))
}

#[tokio::test]
async fn a_new_queue_gets_finalizer_queue_configmap_event_and_ready_status() {
    let h = harness();
    let action = h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    let q = h.current();
    // Resynced from skyport's own timers, not kube-runtime's scheduler.
    assert_eq!(action, Action::await_change());
    let resync = h.ctx.resyncs.due_in(&object_key(&q)).expect("a Ready queue is resynced");
    assert!(resync > h.ctx.settings.resync.mul_f64(0.89) && resync <= h.ctx.settings.resync, "{resync:?}");
    assert_eq!(q.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert_eq!(ready_reason(&q), Some((ConditionStatus::True, "Available".into())));
    let status = q.status.unwrap();
    let name = status.queue_name.clone().unwrap();
    assert!(h.sqs.exists(&name));
    assert_eq!(
        status.queue_url.as_deref(),
        Some(format!("{}{name}", crate::controllers::testing::sqs::URL_PREFIX).as_str())
    );
    assert_eq!(h.api.event_reasons(), ["Created"]);
    let cm = h.api.get("/api/v1/namespaces/ns/configmaps/orders-sqs").expect("ConfigMap applied");
    assert_eq!(cm["data"]["QUEUE_NAME"], json!(name));
    assert_eq!(cm["metadata"]["ownerReferences"][0]["uid"], json!("uid-1"));
    // finalizer, ConfigMap, Event, status: and every write was counted.
    assert_eq!(h.api.writes().len(), 4, "{:?}", h.api.writes());
    assert_eq!(h.ctx.api_writes.get(), 4);
}

#[tokio::test]
async fn the_follow_up_of_our_own_writes_is_answered_from_memory_and_a_converged_queue_costs_nothing() {
    let mut h = harness();
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    let sqs_calls = h.sqs.calls().len();
    // Woken by our own ConfigMap, the cache shows the finalizer but not yet the status.
    let stale = Queue { status: None, ..h.current() };
    h.reconcile(Arc::new(stale)).await.unwrap();
    assert_eq!(h.sqs.calls().len(), sqs_calls, "the follow-up asks SQS nothing");

    // A resync: nothing remembered, the ConfigMap cached, the status current.
    h.ctx.written.forget(&object_key(&h.current()));
    let cm: ConfigMap =
        serde_json::from_value(h.api.get("/api/v1/namespaces/ns/configmaps/orders-sqs").unwrap()).unwrap();
    h.configmaps.apply_watcher_event(&watcher::Event::Apply((&cm).into()));
    let writes = h.api.writes().len();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(h.api.writes().len(), writes, "{:?}", &h.api.writes()[writes..]);
    // CreateQueue gave no CreatedTimestamp, but the queue found was made no later than the proof
    // at create: the tags are not read again (tagging has SQS's tightest quota) until they are
    // due, and the timestamp is remembered from now on.
    assert_eq!(&h.sqs.calls()[sqs_calls..], ["attributes"], "one GetQueueAttributes, tags not due");
    let sqs_calls = h.sqs.calls().len();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(h.api.writes().len(), writes, "{:?}", &h.api.writes()[writes..]);
    assert_eq!(&h.sqs.calls()[sqs_calls..], ["attributes"], "one GetQueueAttributes, tags not due");
}

#[tokio::test]
async fn a_configmap_edited_by_someone_is_read_whole_and_patched_back() {
    let mut h = harness();
    h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    let path = "/api/v1/namespaces/ns/configmaps/orders-sqs";
    let mut edited = h.api.get(path).unwrap();
    let url = edited["data"]["QUEUE_URL"].clone();
    edited["data"]["QUEUE_URL"] = json!("http://elsewhere.example");
    edited["data"]["EXTRA"] = json!("x");
    let edited: ConfigMap = serde_json::from_value(h.api.put(path, edited)).unwrap();
    h.configmaps.apply_watcher_event(&watcher::Event::Apply((&edited).into()));
    h.ctx.written.forget(&object_key(&h.current()));

    let calls = h.api.calls().len();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let cm = h.api.get(path).unwrap();
    assert_eq!(cm["data"]["QUEUE_URL"], url);
    assert!(cm["data"].get("EXTRA").is_none(), "{cm}");
    let touched: Vec<_> = h.api.calls()[calls..].iter().filter(|c| c.path == path).map(|c| c.method.clone()).collect();
    // The cache holds a hash of the data: the object is read before the patch is built.
    assert_eq!(touched, [Method::GET, Method::PATCH]);

    // Once the cache shows the data back, nothing more is read or written.
    let restored: ConfigMap = serde_json::from_value(h.api.get(path).unwrap()).unwrap();
    h.configmaps.apply_watcher_event(&watcher::Event::Apply((&restored).into()));
    let calls = h.api.calls().len();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert!(h.api.calls()[calls..].iter().all(|c| c.path != path), "{:?}", &h.api.calls()[calls..]);
}

#[tokio::test]
async fn a_finalizer_conflict_fails_before_touching_sqs() {
    let h = harness();
    h.api.fail(Method::PATCH, "/queues/orders", 409, 1);
    let err = h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap_err();
    assert_eq!(err.reason(), "KubernetesApiError");
    assert!(h.sqs.calls().is_empty());
    assert!(h.api.event_reasons().is_empty());
}

#[tokio::test]
async fn a_transient_sqs_failure_is_reported_once_and_returned_for_backoff() {
    let h = harness();
    h.sqs.fail_next("create_queue", QueueError::Unavailable("connection reset".into()));
    let err = h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap_err();
    assert_eq!(err.reason(), "SqsUnavailable");
    let q = h.current();
    assert_eq!(ready_reason(&q), Some((ConditionStatus::False, "SqsUnavailable".into())));
    assert_eq!(h.api.event_reasons(), ["SqsUnavailable"]);
    // The same failure again: status unchanged, no second Event.
    h.sqs.fail_next("create_queue", QueueError::Unavailable("connection reset".into()));
    let writes = h.api.writes().len();
    h.reconcile(Arc::new(q)).await.unwrap_err();
    assert_eq!(h.api.event_reasons(), ["SqsUnavailable"]);
    assert_eq!(h.api.writes().len(), writes);
    // The error policy backs off per object.
    let delay = error_policy(Arc::new(h.current()), &err, h.ctx.clone());
    assert!(delay != Action::await_change());
    assert_eq!(h.ctx.backoff.failures(&object_key(&h.current())), 1);
}

/// The finalizer this reconcile wrote wakes the Queue again while its SQS call
/// fails; kube-runtime runs that wake-up right after, ahead of the error policy's delay. The
/// retry must wait out the backoff (no second SQS call) unless the user edited the Queue.
#[tokio::test]
async fn a_wake_up_during_a_failing_reconcile_waits_out_the_backoff_but_an_edit_does_not() {
    let h = harness();
    h.sqs.fail_next("create_queue", QueueError::Unavailable("connection reset".into()));
    let err = h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap_err();
    error_policy(Arc::new(h.current()), &err, h.ctx.clone());
    let calls = h.sqs.calls().len();
    // The finalizer's watch event: same generation, so the same spec.
    let action = h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(h.sqs.calls().len(), calls, "no SQS call before the backoff ends");
    assert!(action != Action::await_change(), "retried when the backoff ends");
    // An edit goes ahead at once.
    let mut edited = h.current();
    edited.metadata.generation = Some(edited.metadata.generation.unwrap_or(1) + 1);
    edited.spec.visibility_timeout_seconds = Some(45);
    h.reconcile(h.put(&edited)).await.unwrap();
    assert!(h.sqs.calls().len() > calls, "the edit reached SQS");
}

#[tokio::test]
async fn a_failed_status_write_does_not_hide_the_sqs_error() {
    let h = harness();
    let q = h.put(&queue(QueueSpec::default()));
    h.api.fail(Method::PATCH, "/queues/orders/status", 500, 1);
    h.sqs.fail_next("create_queue", QueueError::Unavailable("timeout".into()));
    let err = h.reconcile(q).await.unwrap_err();
    assert_eq!(err.reason(), "SqsUnavailable");
}

#[tokio::test]
async fn a_permanent_failure_waits_for_a_spec_change() {
    let h = harness();
    h.sqs.fail_next(
        "create_queue",
        QueueError::Invalid { code: "InvalidAttributeValue".into(), message: "bad policy".into() },
    );
    let action = h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(h.ctx.resyncs.is_empty(), "no periodic retry either");
    let q = h.current();
    let ready = crate::controllers::status::ready_condition(&q).unwrap();
    assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::False, "InvalidAttribute"));
    assert!(ready.message.contains("nothing is retried until it changes"), "{}", ready.message);
    assert_eq!(h.api.event_reasons(), ["InvalidAttribute"]);
}

#[tokio::test]
async fn a_queue_of_the_same_name_not_ours_is_not_taken_over() {
    let h = harness();
    let q = h.put(&queue(QueueSpec::default()));
    let name = desired::queue_name("ns", "orders", &q.spec, None);
    h.sqs.insert(&name, Default::default());
    let action = h.reconcile(q).await.unwrap();
    // Looked at again every resync: its owner may delete it or hand it over.
    assert!(action != Action::await_change(), "{action:?}");
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::False, "AlreadyExists".into())));
    // Create-first: CreateQueue answers with the existing queue's URL, its owner tag is not ours,
    // and nothing is written to it.
    let calls = h.sqs.calls();
    assert_eq!(calls[..2], ["create_queue", "tags"], "{calls:?}");
    assert!(calls.iter().all(|c| !["set_attributes", "tag", "untag", "delete_queue"].contains(c)), "{calls:?}");
    assert_eq!(h.sqs.tags_of(&name), Tags::new(), "the foreign queue keeps its tags");
}

#[tokio::test]
async fn a_recently_deleted_name_is_retried_on_its_own_schedule() {
    let h = harness();
    h.sqs.fail_next("create_queue", QueueError::DeletedRecently("wait 60 s".into()));
    let action = h.reconcile(h.put(&queue(QueueSpec::default()))).await.unwrap();
    assert_eq!(action, Action::requeue(h.ctx.settings.recently_deleted_retry));
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::False, "RecentlyDeleted".into())));
}

/// Creates the queue through a reconcile, then marks the Queue deleted.
async fn created_then_deleted(h: &Harness, policy: DeletionPolicy) -> Arc<Queue> {
    let spec = QueueSpec { deletion_policy: Some(policy), ..Default::default() };
    h.reconcile(h.put(&queue(spec))).await.unwrap();
    let mut q = h.current();
    q.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    h.put(&q)
}

#[tokio::test]
async fn deleting_a_queue_deletes_the_sqs_queue_then_releases_the_finalizer() {
    let h = harness();
    let q = created_then_deleted(&h, DeletionPolicy::Delete).await;
    let name = q.status.as_ref().unwrap().queue_name.clone().unwrap();
    assert_eq!(h.reconcile(q).await.unwrap(), Action::await_change());
    assert!(!h.sqs.exists(&name));
    assert_eq!(h.api.event_reasons(), ["Created", "Deleted"]);
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
}

#[tokio::test]
async fn retain_keeps_the_sqs_queue() {
    let h = harness();
    let q = created_then_deleted(&h, DeletionPolicy::Retain).await;
    let name = q.status.as_ref().unwrap().queue_name.clone().unwrap();
    h.reconcile(q).await.unwrap();
    assert!(h.sqs.exists(&name));
    assert!(!h.sqs.calls().contains(&"delete_queue"));
    assert_eq!(h.api.event_reasons(), ["Created", "Retained"]);
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
}

#[tokio::test]
async fn a_failed_sqs_delete_keeps_the_finalizer() {
    let h = harness();
    let q = created_then_deleted(&h, DeletionPolicy::Delete).await;
    h.sqs.fail_next("delete_queue", QueueError::Unavailable("timeout".into()));
    assert_eq!(h.reconcile(q).await.unwrap_err().reason(), "SqsUnavailable");
    assert_eq!(h.current().metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert_eq!(h.api.event_reasons(), ["Created"]);
}

#[tokio::test]
async fn a_failed_finalizer_release_is_an_error_to_retry() {
    let h = harness();
    let q = created_then_deleted(&h, DeletionPolicy::Delete).await;
    h.api.fail(Method::PATCH, "/queues/orders", 500, 1);
    assert_eq!(h.reconcile(q.clone()).await.unwrap_err().reason(), "KubernetesApiError");
    // The retry finds the SQS queue gone already and releases the finalizer.
    h.reconcile(q).await.unwrap();
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
}

#[tokio::test]
async fn an_unreachable_dead_letter_queue_is_waited_for() {
    let h = harness();
    let spec = QueueSpec {
        dead_letter: Some(Box::new(crate::crd::queue::DeadLetter {
            queue_ref: Some(crate::crd::queue::LocalQueueRef { name: "dlq".into() }),
            target_arn: None,
            max_receive_count: 3,
        })),
        ..Default::default()
    };
    let action = h.reconcile(h.put(&queue(spec))).await.unwrap();
    assert_eq!(action, Action::requeue(h.ctx.settings.resync));
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::False, "DeadLetterQueueNotReady".into())));
    assert!(h.sqs.calls().is_empty());
}

/// A redrive stays only while its target proves this namespace's: taken off when the target is
/// gone at the next proof, and not written back while a queue of that name is another's.
#[tokio::test]
async fn a_redrive_whose_target_went_away_is_taken_off_and_not_written_back_to_anothers() {
    use crate::controllers::queue::desired::{TAG_CLUSTER, TAG_OWNER_NAME, TAG_OWNER_NAMESPACE, TAG_OWNER_UID};
    use providers::QueueBackend;
    let h = harness();
    let owned = |ns: &str| -> Tags {
        [(TAG_OWNER_UID, "uid-dlq"), (TAG_OWNER_NAMESPACE, ns), (TAG_OWNER_NAME, "dlq"), (TAG_CLUSTER, "")]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    h.sqs.insert("ns_dlq", owned("ns"));
    let dead_letter = crate::crd::queue::DeadLetter {
        queue_ref: None,
        target_arn: Some("arn:aws:sqs:fake:000000000000:ns_dlq".into()),
        max_receive_count: 3,
    };
    let spec = QueueSpec { dead_letter: Some(Box::new(dead_letter)), ..Default::default() };
    h.reconcile(h.put(&queue(spec))).await.unwrap();
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::True, "Available".into())));
    let source = format!("{}ns_orders", crate::controllers::testing::sqs::URL_PREFIX);
    let redrive = async || h.sqs.attributes(&source).await.unwrap().unwrap_or_default()["RedrivePolicy"].clone();
    assert!(redrive().await.contains("ns_dlq"));

    h.sqs.delete_queue(&format!("{}ns_dlq", crate::controllers::testing::sqs::URL_PREFIX)).await.unwrap();
    // The owner-tag cadence has passed: the proof is void.
    h.ctx.redrives.forget("uid-1");
    h.ctx.written.forget(&object_key(&h.current()));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::False, "DeadLetterQueueNotFound".into())));
    assert_eq!(redrive().await, "", "taken off");

    h.sqs.insert("ns_dlq", owned("other"));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(ready_reason(&h.current()), Some((ConditionStatus::False, "DeadLetterNotAllowed".into())));
    assert_eq!(redrive().await, "", "never written to another namespace's queue");
}

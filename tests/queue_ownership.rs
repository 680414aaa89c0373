//! Who owns an SQS queue, against a real kube-apiserver and real LocalStack: a queue is a Queue's
//! only while its owner-UID tag says so, checked against SQS before any write and any delete;
//! adoption writes only what the spec declares; observe-only never writes.
//!
//! Run with `tests/run.sh`, or `eval "$(tests/env.sh up)" && cargo test --test integration queue_ownership:: -- --include-ignored`.

use crate::common;

mod observe_only;
mod sealed;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// SQS (and LocalStack with SQS_DELAY_RECENTLY_DELETED=1) refuses a deleted name for 60 s.
const RECENTLY_DELETED: Duration = Duration::from_secs(100);
const OWNER_UID: &str = "skyport.dev/owner-uid";

fn status_of(q: &Queue) -> skyport::crd::QueueStatus {
    q.status.clone().expect("status")
}

fn message(q: &Queue) -> String {
    q.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.to_string())
        .unwrap_or_default()
}

/// `status.adopted`, read raw (it is new; the typed client of older builds would drop it).
async fn adopted(api: &Api<Queue>, name: &str) -> bool {
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        api.clone().into_client(),
        api.namespace().unwrap_or_default(),
        &kube::discovery::ApiResource::erase::<Queue>(&()),
    );
    let q = raw.get(name).await.expect("get Queue");
    q.data["status"]["adopted"].as_bool().unwrap_or(false)
}

async fn tags(url: &str) -> HashMap<String, String> {
    sqs().await.list_queue_tags().queue_url(url).send().await.expect("ListQueueTags").tags.unwrap_or_default()
}

async fn url_for(name: &str) -> String {
    sqs().await.get_queue_url().queue_name(name).send().await.expect("GetQueueUrl").queue_url.unwrap()
}

/// Creates a queue as someone other than skyport would, waiting out SQS's 60-second rule.
async fn create_foreign(name: &str, attributes: &[(QueueAttributeName, &str)], tags: &[(&str, &str)]) -> String {
    let sqs = sqs().await;
    eventually(&format!("foreign queue {name} created"), RECENTLY_DELETED, || async {
        let mut req = sqs.create_queue().queue_name(name);
        for (k, v) in attributes {
            req = req.attributes(k.clone(), *v);
        }
        for (k, v) in tags {
            req = req.tags(*k, *v);
        }
        match req.send().await {
            Ok(out) => out.queue_url,
            Err(e) => {
                let text = format!("{:?}", e.into_service_error());
                assert!(text.contains("DeletedRecently"), "unexpected CreateQueue failure: {text}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                None
            }
        }
    })
    .await
}

async fn delete_sqs_queue(name: &str) {
    let sqs = sqs().await;
    if let Ok(out) = sqs.get_queue_url().queue_name(name).send().await {
        let _ = sqs.delete_queue().queue_url(out.queue_url.unwrap()).send().await;
    }
}

fn upstream() -> String {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    endpoint.trim_start_matches("http://").trim_end_matches('/').to_string()
}

const WRITES: [&str; 5] = ["CreateQueue", "SetQueueAttributes", "TagQueue", "UntagQueue", "DeleteQueue"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_recorded_url_whose_queue_was_recreated_by_someone_else_is_not_written_or_deleted() {
    let ns = TestNs::new("own-reuse").await;
    let proxy = proxy::Proxy::start(&upstream()).await;
    let op = Operator::start_with_endpoint(&ns, fast_settings(), Some(proxy.url())).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("q", json!({"visibilityTimeoutSeconds": 45}))).await.unwrap();
    let q = wait_ready(&queues, "q", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let name = status_of(&q).queue_name.unwrap().to_string();

    // While skyport cannot reach SQS, someone deletes the queue and makes their own of that name.
    proxy.cut().await;
    let sqs = sqs().await;
    sqs.delete_queue().queue_url(url_for(&name).await).send().await.unwrap();
    let theirs =
        create_foreign(&name, &[(QueueAttributeName::VisibilityTimeout, "11")], &[("owner", "another-team")]).await;
    proxy.restore().await;

    let q = wait_ready(&queues, "q", ConditionStatus::False, "AlreadyExists", READY_TIMEOUT).await;
    assert!(message(&q).contains(&name), "{}", message(&q));
    assert_eq!(attributes(&sqs, &theirs).await["VisibilityTimeout"], "11", "their queue is not written");
    let t = tags(&theirs).await;
    assert_eq!(t.get("owner").map(String::as_str), Some("another-team"), "their tags stay: {t:?}");
    assert!(!t.contains_key(OWNER_UID), "not re-tagged as ours: {t:?}");

    queues.delete("q", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "q", READY_TIMEOUT).await;
    assert!(queue_exists(&sqs, &name).await, "deleting the Queue leaves their queue alone");
    delete_sqs_queue(&name).await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn deleting_a_queue_whose_name_was_reused_by_someone_else_keeps_their_queue() {
    let ns = TestNs::new("own-delreuse").await;
    let proxy = proxy::Proxy::start(&upstream()).await;
    let op = Operator::start_with_endpoint(&ns, fast_settings(), Some(proxy.url())).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("q", json!({}))).await.unwrap();
    let q = wait_ready(&queues, "q", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let name = status_of(&q).queue_name.unwrap().to_string();

    proxy.cut().await;
    let sqs = sqs().await;
    sqs.delete_queue().queue_url(url_for(&name).await).send().await.unwrap();
    create_foreign(&name, &[], &[("owner", "another-team")]).await;
    // Deleted while the recorded URL points at a queue that is no longer ours.
    queues.delete("q", &DeleteParams::default()).await.unwrap();
    proxy.restore().await;
    wait_gone(&queues, "q", READY_TIMEOUT).await;
    assert!(queue_exists(&sqs, &name).await, "their queue survives the Queue's deletion");
    delete_sqs_queue(&name).await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn two_queues_racing_for_one_name_end_with_exactly_one_owner() {
    let a = TestNs::new("own-race-a").await;
    let b = TestNs::new("own-race-b").await;
    let names: Vec<String> = (0..8).map(|i| format!("race-{}-{i}", &a.name[11..])).collect();
    let (qa, qb): (Api<Queue>, Api<Queue>) = (a.api(), b.api());
    for (i, name) in names.iter().enumerate() {
        for api in [&qa, &qb] {
            api.create(&PostParams::default(), &queue(&format!("r{i}"), json!({"queueName": name}))).await.unwrap();
        }
    }
    // Both controllers start on the same names at once.
    let (opa, opb) = tokio::join!(Operator::start(&a, fast_settings()), Operator::start(&b, fast_settings()));
    for (i, name) in names.iter().enumerate() {
        let r = format!("r{i}");
        let settled = |q: &Queue| {
            ready(q).filter(|(s, r)| {
                (*s == ConditionStatus::True && r == "Available")
                    || (*s == ConditionStatus::False && r == "AlreadyExists")
            })
        };
        let (x, y) = eventually(&format!("both Queues for {name} settled"), READY_TIMEOUT, || async {
            let (x, y) = (qa.get(&r).await.ok()?, qb.get(&r).await.ok()?);
            (settled(&x).is_some() && settled(&y).is_some()).then_some((x, y))
        })
        .await;
        let owners: Vec<&Queue> =
            [&x, &y].into_iter().filter(|q| ready(q).is_some_and(|(s, _)| s == ConditionStatus::True)).collect();
        assert_eq!(owners.len(), 1, "{name}: exactly one owner, got {:?} and {:?}", ready(&x), ready(&y));
        let t = tags(&url_for(name).await).await;
        assert_eq!(t.get(OWNER_UID), owners[0].metadata.uid.as_ref(), "{name}: the tag names the Ready one");
    }
    // Only the owner deletes; the other releases its finalizer without touching the queue.
    finish(opa, a).await;
    finish(opb, b).await;
    for name in &names {
        assert!(!queue_exists(&sqs().await, name).await, "{name} deleted by its owner");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn adopt_refuses_a_queue_another_live_queue_owns_and_takes_it_once_that_owner_is_gone() {
    let ns = TestNs::new("own-adopt").await;
    let name = format!("shared-{}", &ns.name[10..]);
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    queues
        .create(&PostParams::default(), &queue("first", json!({"queueName": name, "deletionPolicy": "Retain"})))
        .await
        .unwrap();
    let first = wait_ready(&queues, "first", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    queues
        .create(
            &PostParams::default(),
            &queue("second", json!({"queueName": name, "adopt": true, "visibilityTimeoutSeconds": 77})),
        )
        .await
        .unwrap();
    let second = wait_ready(&queues, "second", ConditionStatus::False, "OwnedByAnotherQueue", READY_TIMEOUT).await;
    let text = message(&second);
    assert!(text.contains("Queue first"), "the reason names the owner of its own namespace: {text}");
    let url = url_for(&name).await;
    assert_eq!(tags(&url).await.get(OWNER_UID), first.metadata.uid.as_ref(), "still the first Queue's");
    assert_ne!(attributes(&sqs().await, &url).await["VisibilityTimeout"], "77");

    // The owner goes away (its queue is retained): the periodic recheck lets the adopter in.
    queues.delete("first", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "first", READY_TIMEOUT).await;
    let second = wait_ready(&queues, "second", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert!(adopted(&queues, "second").await);
    assert_eq!(tags(&url).await.get(OWNER_UID), second.metadata.uid.as_ref());
    assert_eq!(attributes(&sqs().await, &url).await["VisibilityTimeout"], "77");
    finish(op, ns).await;
    delete_sqs_queue(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn already_exists_is_rechecked_periodically_without_a_hot_loop() {
    let ns = TestNs::new("own-recheck").await;
    let name = format!("taken-{}", &ns.name[12..]);
    let theirs = create_foreign(&name, &[], &[("owner", "another-team")]).await;
    let settings = fast_settings();
    let resync = settings.resync;
    let op = Operator::start(&ns, settings).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("mine", json!({"queueName": name}))).await.unwrap();
    wait_ready(&queues, "mine", ConditionStatus::False, "AlreadyExists", READY_TIMEOUT).await;
    let before = op.sqs_calls();
    tokio::time::sleep(resync * 5).await;
    let after = op.sqs_calls();
    let reads: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    assert!(reads >= 2, "rechecked while waiting: {before:?} -> {after:?}");
    assert!(reads <= 5 * 3 + 3, "at most one look (3 calls) per resync: {before:?} -> {after:?}");
    for write in WRITES {
        assert_eq!(after.get(write), before.get(write), "{write} on a queue that is not ours");
    }

    // Its owner deletes it; without any change to the Queue, skyport creates its own.
    sqs().await.delete_queue().queue_url(&theirs).send().await.unwrap();
    let q = wait_ready(&queues, "mine", ConditionStatus::True, "Available", RECENTLY_DELETED).await;
    assert_eq!(tags(&status_of(&q).queue_url.unwrap()).await.get(OWNER_UID), q.metadata.uid.as_ref());
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn default_names_do_not_collide_across_namespaces_and_recorded_names_are_kept() {
    let base = format!("own-names-{:06x}", rand::random::<u32>() & 0xffffff);
    let team = TestNs::named(base.clone()).await;
    let team_a = TestNs::named(format!("{base}-a")).await;
    let (op1, op2) = (Operator::start(&team, fast_settings()).await, Operator::start(&team_a, fast_settings()).await);
    let (q1, q2): (Api<Queue>, Api<Queue>) = (team.api(), team_a.api());
    q1.create(&PostParams::default(), &queue("a-orders", json!({}))).await.unwrap();
    q2.create(&PostParams::default(), &queue("orders", json!({}))).await.unwrap();
    let x = wait_ready(&q1, "a-orders", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let y = wait_ready(&q2, "orders", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert_eq!(status_of(&x).queue_name.unwrap(), format!("{base}_a-orders"));
    assert_eq!(status_of(&y).queue_name.unwrap(), format!("{base}-a_orders"));

    // A Queue whose status records a name (`<namespace>-<name>`) keeps its queue.
    op1.stop().await;
    q1.create(&PostParams::default(), &queue("legacy", json!({}))).await.unwrap();
    let legacy = q1.get("legacy").await.unwrap();
    let uid = legacy.metadata.uid.clone().unwrap();
    let old_name = format!("{base}-legacy");
    let url = create_foreign(
        &old_name,
        &[],
        &[
            ("skyport.dev/managed-by", "skyport"),
            (OWNER_UID, &uid),
            ("skyport.dev/owner-namespace", &base),
            ("skyport.dev/owner-name", "legacy"),
        ],
    )
    .await;
    q1.patch_status(
        "legacy",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"queueName": old_name, "queueUrl": url}})),
    )
    .await
    .unwrap();
    let op1 = Operator::start(&team, fast_settings()).await;
    let legacy = wait_ready(&q1, "legacy", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert_eq!(status_of(&legacy).queue_name.unwrap(), old_name);
    assert!(!queue_exists(&sqs().await, &format!("{base}_legacy")).await, "no second queue under the new default");
    finish(op1, team).await;
    finish(op2, team_a).await;
    assert!(!queue_exists(&sqs().await, &old_name).await, "the legacy queue is deleted with its Queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_configmap_skyport_does_not_own_is_never_taken_over() {
    let ns = TestNs::new("own-cm").await;
    let cms: Api<ConfigMap> = ns.api();
    let mine: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "app-sqs"}, "data": {"MINE": "1"}})).unwrap();
    cms.create(&PostParams::default(), &mine).await.unwrap();
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("app", json!({}))).await.unwrap();
    let q = wait_ready(&queues, "app", ConditionStatus::False, "ConfigMapConflict", READY_TIMEOUT).await;
    assert!(message(&q).contains("app-sqs"), "{}", message(&q));
    let cm = cms.get("app-sqs").await.unwrap();
    assert_eq!(cm.data.clone().unwrap(), [("MINE".to_string(), "1".to_string())].into(), "user data untouched");
    assert!(cm.metadata.owner_references.unwrap_or_default().is_empty(), "no owner reference: never GC'd");

    queues.delete("app", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "app", READY_TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(cms.get("app-sqs").await.unwrap().data.unwrap()["MINE"], "1", "still there after the Queue");
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_name_too_long_for_its_configmap_is_refused_at_admission() {
    let ns = TestNs::new("own-longname").await;
    let queues: Api<Queue> = ns.api();
    let err = queues.create(&PostParams::default(), &queue(&"q".repeat(250), json!({}))).await.expect_err("refused");
    let kube::Error::Api(e) = err else { panic!("unexpected error {err}") };
    assert_eq!(e.code, 422, "{}", e.message);
    assert!(e.message.contains("249"), "{}", e.message);
    queues.create(&PostParams::default(), &queue(&"q".repeat(249), json!({}))).await.expect("249 is fine");
    queues.delete(&"q".repeat(249), &DeleteParams::default()).await.unwrap();
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn adoption_writes_only_declared_fields_and_keeps_the_queue_by_default() {
    let ns = TestNs::new("own-gentle").await;
    let sqs = sqs().await;
    let name = format!("existing-{}", &ns.name[11..]);
    let dlq = create_foreign(&format!("{name}-dlq"), &[], &[]).await;
    let dlq_arn = attributes(&sqs, &dlq).await["QueueArn"].clone();
    let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}]}).to_string();
    let redrive = json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}).to_string();
    let allow = json!({"redrivePermission": "denyAll"}).to_string();
    let url = create_foreign(
        &name,
        &[
            (QueueAttributeName::VisibilityTimeout, "11"),
            (QueueAttributeName::Policy, &policy),
            (QueueAttributeName::RedrivePolicy, &redrive),
            (QueueAttributeName::RedriveAllowPolicy, &allow),
        ],
        &[("cost-center", "42")],
    )
    .await;
    let op = Operator::start(&ns, granting(&ns.name, "existing-*")).await;
    let queues: Api<Queue> = ns.api();
    queues
        .create(
            &PostParams::default(),
            &queue(
                "gentle",
                json!({"queueName": name, "adopt": true, "visibilityTimeoutSeconds": 50, "tags": {"team": "a"}}),
            ),
        )
        .await
        .unwrap();
    let q = wait_ready(&queues, "gentle", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert!(adopted(&queues, "gentle").await, "status says the queue was adopted");
    let a = attributes(&sqs, &url).await;
    assert_eq!(a["VisibilityTimeout"], "50", "the declared field is written");
    assert!(a.get("Policy").is_some_and(|p| p.contains("sqs:SendMessage")), "access policy kept: {a:?}");
    assert!(a.get("RedrivePolicy").is_some_and(|p| p.contains(&dlq_arn)), "redrive kept: {a:?}");
    assert!(a.get("RedriveAllowPolicy").is_some_and(|p| p.contains("denyAll")), "redrive allow kept: {a:?}");
    let t = tags(&url).await;
    assert_eq!(t.get("cost-center").map(String::as_str), Some("42"), "foreign tag kept: {t:?}");
    assert_eq!(t.get("team").map(String::as_str), Some("a"));
    assert_eq!(t.get(OWNER_UID), q.metadata.uid.as_ref());

    // No deletionPolicy: an adopted queue is kept.
    queues.delete("gentle", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "gentle", READY_TIMEOUT).await;
    assert!(queue_exists(&sqs, &name).await, "adopted queues default to Retain");
    delete_sqs_queue(&name).await;
    delete_sqs_queue(&format!("{name}-dlq")).await;
    finish(op, ns).await;
}

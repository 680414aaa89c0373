//! A redrive never points at a queue that is not this namespace's, at any time: a dead-letter
//! queue deleted and its name taken by another namespace (SQS lets anyone create a freed name
//! after 60 s) must not receive this namespace's failed messages. The redrive is taken off the
//! source queue when its Queue is deleted, when a re-check at the owner-tag cadence finds the
//! target gone, and when an operator that was away finds it owned by another namespace.

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::{create_outside, delete_sqs_queue, message};
use crate::common::*;

/// Long enough for SQS's 60 s before a deleted queue's name can be created again.
const REUSE: Duration = Duration::from_secs(61);
const TIMEOUT: Duration = Duration::from_secs(30);

/// The owner tags a Queue of namespace `ns` in the test cluster puts on its queue.
fn owned_by(ns: &str) -> [(&'static str, String); 4] {
    [
        ("skyport.dev/owner-uid", format!("{:08x}-0000-4000-8000-000000000000", rand::random::<u32>())),
        ("skyport.dev/owner-namespace", ns.to_string()),
        ("skyport.dev/owner-name", "dlq".to_string()),
        ("skyport.dev/cluster", TEST_CLUSTER.to_string()),
    ]
}

async fn create_owned(name: &str, ns: &str) -> String {
    let tags = owned_by(ns);
    let tags: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (*k, v.as_str())).collect();
    create_outside(name, &[], &tags).await
}

fn arn_of(url: &str) -> String {
    let name = url.rsplit('/').next().unwrap();
    format!("arn:aws:sqs:us-east-1:000000000000:{name}")
}

async fn redrive(url: &str) -> String {
    attributes(&sqs().await, url).await.get("RedrivePolicy").cloned().unwrap_or_default()
}

async fn wait_redrive_gone(url: &str, within: Duration) {
    eventually("the redrive policy taken off the source queue", within, || async {
        redrive(url).await.is_empty().then_some(())
    })
    .await;
}

/// Sends one message to `source` and receives it `times` times without deleting it (each receive
/// is a failed processing); then `catcher` must have nothing and `source` still the message.
async fn fail_one_message(source: &str, times: usize, catcher: &str) {
    let sqs = sqs().await;
    sqs.send_message().queue_url(source).message_body("secret order").send().await.expect("SendMessage");
    for _ in 0..times {
        let out = sqs.receive_message().queue_url(source).visibility_timeout(0).wait_time_seconds(1).send().await;
        out.expect("ReceiveMessage");
    }
    let caught = sqs.receive_message().queue_url(catcher).wait_time_seconds(2).send().await.expect("ReceiveMessage");
    assert!(caught.messages.unwrap_or_default().is_empty(), "another namespace's queue got a dead letter");
    let kept = sqs.receive_message().queue_url(source).wait_time_seconds(2).send().await.expect("ReceiveMessage");
    assert_eq!(kept.messages.unwrap_or_default().len(), 1, "the failed message stays in the source queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_deleted_dead_letter_queues_name_taken_by_another_namespace_never_gets_its_dead_letters() {
    let (a, b) = (TestNs::new("redrive-a").await, TestNs::new("redrive-b").await);
    let (opa, opb) = (Operator::start(&a, fast_settings()).await, Operator::start(&b, fast_settings()).await);
    let (qa, qb): (Api<Queue>, Api<Queue>) = (a.api(), b.api());
    let name = format!("failed-{}", &a.name[10..]);
    qa.create(&PostParams::default(), &queue("dlq", json!({"queueName": name}))).await.unwrap();
    let dead_letter = json!({"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 1}});
    qa.create(&PostParams::default(), &queue("work", dead_letter)).await.unwrap();
    let work = wait_ready(&qa, "work", ConditionStatus::True, "Available", TIMEOUT).await;
    let url = work.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    assert!(redrive(&url).await.contains(&name), "in place before");

    qa.delete("dlq", &DeleteParams::default()).await.unwrap();
    wait_gone(&qa, "dlq", TIMEOUT).await;
    wait_redrive_gone(&url, Duration::from_secs(10)).await;

    // B takes the freed name as soon as SQS lets it.
    tokio::time::sleep(REUSE).await;
    qb.create(&PostParams::default(), &queue("catch", json!({"queueName": name}))).await.unwrap();
    let catch = wait_ready(&qb, "catch", ConditionStatus::True, "Available", TIMEOUT).await;
    let catcher = catch.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    fail_one_message(&url, 3, &catcher).await;
    assert!(redrive(&url).await.is_empty(), "never written back");
    let refused = wait_ready(&qa, "work", ConditionStatus::False, "DeadLetterQueueNotReady", TIMEOUT).await;
    assert!(!message(&refused).contains(&b.name), "{}", message(&refused));
    finish(opa, a).await;
    finish(opb, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_dead_letter_target_that_vanished_is_taken_off_at_the_next_owner_tag_check() {
    let ns = TestNs::new("redrive-gone").await;
    let settings = skyport::config::QueueArgs { tag_resync: Duration::from_secs(3), ..fast_settings() };
    let op = Operator::start(&ns, settings).await;
    let queues: Api<Queue> = ns.api();
    let name = format!("{}_target", ns.name);
    let target = create_owned(&name, &ns.name).await;
    let dead_letter = json!({"deadLetter": {"targetArn": arn_of(&target), "maxReceiveCount": 1}});
    queues.create(&PostParams::default(), &queue("jobs", dead_letter)).await.unwrap();
    let jobs = wait_ready(&queues, "jobs", ConditionStatus::True, "Available", TIMEOUT).await;
    let url = jobs.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    assert!(redrive(&url).await.contains(&name), "in place before");

    // Deleted behind skyport's back: no Queue event says so, the re-check does.
    sqs().await.delete_queue().queue_url(&target).send().await.unwrap();
    wait_redrive_gone(&url, Duration::from_secs(15)).await;
    let q = wait_ready(&queues, "jobs", ConditionStatus::False, "DeadLetterQueueNotFound", TIMEOUT).await;
    assert!(message(&q).contains("taken off"), "{}", message(&q));
    let events = ns.api::<k8s_openapi::api::events::v1::Event>();
    eventually("a Warning Event", TIMEOUT, || async {
        let list = events.list(&Default::default()).await.ok()?.items;
        list.iter()
            .any(|e| {
                e.reason.as_deref() == Some("DeadLetterQueueNotFound")
                    && e.note.as_deref().is_some_and(|n| n.contains("taken off"))
            })
            .then_some(())
    })
    .await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_operator_back_from_away_takes_off_a_redrive_to_another_namespaces_queue() {
    let (a, b) = (TestNs::new("redrive-away").await, TestNs::new("redrive-other").await);
    let queues: Api<Queue> = a.api();
    let name = format!("target-{}", &a.name[13..]);
    let target = create_owned(&name, &a.name).await;
    let op = Operator::start(&a, fast_settings()).await;
    let dead_letter = json!({"deadLetter": {"targetArn": arn_of(&target), "maxReceiveCount": 1}});
    queues.create(&PostParams::default(), &queue("jobs", dead_letter)).await.unwrap();
    let jobs = wait_ready(&queues, "jobs", ConditionStatus::True, "Available", TIMEOUT).await;
    let url = jobs.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap();
    op.stop().await;

    // While no operator looks, the name changes hands.
    sqs().await.delete_queue().queue_url(&target).send().await.unwrap();
    tokio::time::sleep(REUSE).await;
    let theirs = create_owned(&name, &b.name).await;
    assert!(redrive(&url).await.contains(&name), "still in place while away");

    let op = Operator::start(&a, fast_settings()).await;
    wait_redrive_gone(&url, TIMEOUT).await;
    let q = wait_ready(&queues, "jobs", ConditionStatus::False, "DeadLetterNotAllowed", TIMEOUT).await;
    assert!(!message(&q).contains(&b.name), "names nothing of theirs: {}", message(&q));
    fail_one_message(&url, 3, &theirs).await;
    let attrs = sqs().await.get_queue_attributes().queue_url(&theirs).attribute_names(QueueAttributeName::All);
    let count = attrs.send().await.unwrap().attributes.unwrap_or_default();
    assert_eq!(count.get(&QueueAttributeName::ApproximateNumberOfMessages).map(String::as_str), Some("0"));
    delete_sqs_queue(&name).await;
    finish(op, a).await;
    b.cleanup().await;
}

//! Dead-letter queues: one named by reference is waited for, then followed when the reference
//! changes or goes; a FIFO one for a standard queue is reported, never created.

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::{READY_TIMEOUT, url_of};
use crate::common::{
    Operator, TestNs, attributes, eventually, fast_settings, finish, queue, queue_exists, sqs, wait_gone, wait_ready,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn dead_letter_queue_by_reference_is_awaited_then_followed() {
    let ns = TestNs::new("sq-dlq").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    // The user first, its dead-letter queue later.
    queues
        .create(
            &PostParams::default(),
            &queue("work", json!({"deadLetter": {"queueRef": {"name": "work-dlq"}, "maxReceiveCount": 4}})),
        )
        .await
        .unwrap();
    wait_ready(&queues, "work", ConditionStatus::False, "DeadLetterQueueNotReady", READY_TIMEOUT).await;
    assert!(!queue_exists(&sqs().await, &format!("{}_work", ns.name)).await, "nothing is created before its DLQ");

    queues.create(&PostParams::default(), &queue("work-dlq", json!({}))).await.unwrap();
    let dlq = wait_ready(&queues, "work-dlq", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let work = wait_ready(&queues, "work", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let dlq_arn = dlq.status.unwrap().queue_arn.unwrap();
    let redrive: serde_json::Value =
        serde_json::from_str(&attributes(&sqs().await, &url_of(&work)).await["RedrivePolicy"]).unwrap();
    assert_eq!(redrive["deadLetterTargetArn"], dlq_arn);
    assert_eq!(redrive["maxReceiveCount"].to_string().trim_matches('"'), "4");

    // Point at another DLQ: the redrive policy follows.
    queues.create(&PostParams::default(), &queue("other-dlq", json!({}))).await.unwrap();
    let other = wait_ready(&queues, "other-dlq", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let other_arn = other.status.unwrap().queue_arn.unwrap();
    queues
        .patch(
            "work",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deadLetter": {"queueRef": {"name": "other-dlq"}}}})),
        )
        .await
        .unwrap();
    let sqs = sqs().await;
    eventually("redrive policy follows the new DLQ", READY_TIMEOUT, || async {
        let a = attributes(&sqs, &url_of(&work)).await;
        a.get("RedrivePolicy")?.contains(&other_arn).then_some(())
    })
    .await;

    // Removing deadLetter removes the redrive policy.
    queues.patch("work", &PatchParams::default(), &Patch::Merge(json!({"spec": {"deadLetter": null}}))).await.unwrap();
    eventually("redrive policy removed", READY_TIMEOUT, || async {
        let a = attributes(&sqs, &url_of(&work)).await;
        a.get("RedrivePolicy").is_none_or(|p| p.is_empty()).then_some(())
    })
    .await;
    for name in ["work", "work-dlq", "other-dlq"] {
        queues.delete(name, &DeleteParams::default()).await.unwrap();
    }
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn fifo_dead_letter_queue_for_a_standard_queue_is_reported_with_a_warning_event() {
    let ns = TestNs::new("sq-dlqkind").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("dlq", json!({"fifo": true}))).await.unwrap();
    queues
        .create(
            &PostParams::default(),
            &queue("std", json!({"deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 2}})),
        )
        .await
        .unwrap();
    let q = wait_ready(&queues, "std", ConditionStatus::False, "InvalidDeadLetterQueue", READY_TIMEOUT).await;
    let message = q.status.unwrap().conditions[0].message.clone();
    assert!(message.contains("FIFO") && message.contains("standard"), "{message}");

    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let warning = eventually("Warning Event for the Queue", READY_TIMEOUT, || async {
        events.list(&Default::default()).await.ok()?.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("std") && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    assert_eq!(warning.reason.as_deref(), Some("InvalidDeadLetterQueue"));
    assert!(!queue_exists(&sqs().await, &format!("{}_std", ns.name)).await, "nothing created for an unusable spec");
    // A Queue that never became usable can still be deleted.
    for name in ["std", "dlq"] {
        queues.delete(name, &DeleteParams::default()).await.unwrap();
        wait_gone(&queues, name, READY_TIMEOUT).await;
    }
    finish(op, ns).await;
}

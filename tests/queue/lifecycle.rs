//! A Queue's life in SQS: created with its attributes, tags and ConfigMap (kept as written),
//! edited in place, recreated when deleted behind our back, deleted or retained with the Queue,
//! and FIFO.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::{READY_TIMEOUT, tags, url_of};
use crate::common::{
    Operator, TestNs, attributes, eventually, fast_settings, finish, queue, queue_exists, sqs, wait_gone, wait_ready,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn created_queue_becomes_ready_with_url_arn_attributes_tags_and_configmap() {
    let ns = TestNs::new("sq-create").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let spec = json!({
        "visibilityTimeoutSeconds": 45,
        "delaySeconds": 5,
        "messageRetentionSeconds": 3600,
        "tags": {"team": "shop"},
        "policy": {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}]}
    });
    queues.create(&PostParams::default(), &queue("orders", spec)).await.unwrap();

    let q = wait_ready(&queues, "orders", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let status = q.status.clone().unwrap();
    let name = format!("{}_orders", ns.name);
    assert_eq!(status.queue_name.as_deref(), Some(name.as_str()));
    assert!(status.queue_arn.as_deref().unwrap().ends_with(&format!(":{name}")), "{status:?}");
    assert_eq!(status.observed_generation, q.metadata.generation);
    assert!(q.metadata.finalizers.clone().unwrap_or_default().contains(&"queues.skyport.dev/cleanup".to_string()));

    let url = url_of(&q);
    let attrs = attributes(&sqs().await, &url).await;
    assert_eq!(attrs["VisibilityTimeout"], "45");
    assert_eq!(attrs["DelaySeconds"], "5");
    assert_eq!(attrs["MessageRetentionPeriod"], "3600");
    let policy: serde_json::Value = serde_json::from_str(&attrs["Policy"]).unwrap();
    assert_eq!(policy["Statement"][0]["Action"], "sqs:SendMessage");
    let t = tags(&url).await;
    assert_eq!(t["team"], "shop");
    assert_eq!(t["skyport.dev/owner-uid"], q.metadata.uid.clone().unwrap());
    assert_eq!(t["skyport.dev/owner-namespace"], ns.name);
    assert_eq!(t["skyport.dev/owner-name"], "orders");

    let cms: Api<ConfigMap> = ns.api();
    let cm = eventually("ConfigMap orders-sqs", READY_TIMEOUT, || async { cms.get("orders-sqs").await.ok() }).await;
    let data = cm.data.clone().unwrap();
    assert_eq!(data["QUEUE_URL"], url);
    assert_eq!(data["QUEUE_ARN"], status.queue_arn.clone().unwrap());
    assert_eq!(data["QUEUE_NAME"], name);
    assert_eq!(cm.metadata.owner_references.unwrap()[0].uid, q.metadata.uid.clone().unwrap());

    // Deleted by someone: it comes back.
    let old_uid = cm.metadata.uid.clone();
    cms.delete("orders-sqs", &DeleteParams::default()).await.unwrap();
    let back = eventually("ConfigMap recreated", READY_TIMEOUT, || async {
        cms.get("orders-sqs").await.ok().filter(|c| c.metadata.uid != old_uid)
    })
    .await;
    assert_eq!(back.data.unwrap()["QUEUE_URL"], url);

    // Edited by someone (the cache holds only a hash of the data): put back, the added key gone.
    let edit = json!({"data": {"QUEUE_URL": "http://elsewhere.example", "EXTRA": "x"}});
    cms.patch("orders-sqs", &PatchParams::default(), &Patch::Merge(&edit)).await.unwrap();
    let restored = eventually("ConfigMap restored", READY_TIMEOUT, || async {
        cms.get("orders-sqs").await.ok().and_then(|c| c.data).filter(|d| d.get("QUEUE_URL") == Some(&url))
    })
    .await;
    assert!(!restored.contains_key("EXTRA"), "{restored:?}");
    assert_eq!(restored["QUEUE_ARN"], status.queue_arn.clone().unwrap());

    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn spec_edits_converge_attributes_and_tags_in_place() {
    let ns = TestNs::new("sq-update").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    queues
        .create(
            &PostParams::default(),
            &queue("q", json!({"visibilityTimeoutSeconds": 45, "tags": {"a": "1", "b": "2"}})),
        )
        .await
        .unwrap();
    let q = wait_ready(&queues, "q", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let url = url_of(&q);

    let patch = json!({"spec": {"visibilityTimeoutSeconds": 90, "receiveWaitTimeSeconds": 10, "tags": {"a": "changed", "b": null, "c": "3"}}});
    queues.patch("q", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let sqs = sqs().await;
    eventually("attributes updated in SQS", READY_TIMEOUT, || async {
        let a = attributes(&sqs, &url).await;
        (a["VisibilityTimeout"] == "90" && a["ReceiveMessageWaitTimeSeconds"] == "10").then_some(())
    })
    .await;
    eventually("tags updated in SQS", READY_TIMEOUT, || async {
        let t = tags(&url).await;
        (t.get("a").map(String::as_str) == Some("changed")
            && !t.contains_key("b")
            && t.get("c").map(String::as_str) == Some("3"))
        .then_some(())
    })
    .await;
    let q = eventually("observedGeneration follows", READY_TIMEOUT, || async {
        let q = queues.get("q").await.ok()?;
        (q.status.as_ref()?.observed_generation == q.metadata.generation).then_some(q)
    })
    .await;
    assert_eq!(url_of(&q), url, "updated in place, not recreated");

    // Drift made outside skyport is repaired at the next resync.
    sqs.set_queue_attributes()
        .queue_url(&url)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "7")
        .send()
        .await
        .unwrap();
    eventually("out-of-band attribute change reverted", READY_TIMEOUT, || async {
        (attributes(&sqs, &url).await["VisibilityTimeout"] == "90").then_some(())
    })
    .await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn queue_deleted_out_of_band_is_recreated_after_the_sixty_second_rule() {
    let ns = TestNs::new("sq-oob").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("gone", json!({"delaySeconds": 3}))).await.unwrap();
    let q = wait_ready(&queues, "gone", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let url = url_of(&q);
    let sqs = sqs().await;
    sqs.delete_queue().queue_url(&url).send().await.unwrap();

    // SQS (LocalStack with SQS_DELAY_RECENTLY_DELETED=1) refuses the name for 60 s.
    wait_ready(&queues, "gone", ConditionStatus::False, "RecentlyDeleted", Duration::from_secs(20)).await;
    let creates_while_waiting = op.sqs_calls().get("CreateQueue").copied().unwrap_or(0);
    let q = wait_ready(&queues, "gone", ConditionStatus::True, "Available", Duration::from_secs(100)).await;
    assert_eq!(url_of(&q), url);
    assert_eq!(attributes(&sqs, &url).await["DelaySeconds"], "3", "recreated with the spec's attributes");
    let creates = op.sqs_calls()["CreateQueue"];
    // First create, then retries every 5 s (recently_deleted_retry) for at most ~60 s: bounded,
    // no hot loop.
    assert!(creates <= creates_while_waiting + 15, "CreateQueue attempts: {creates}");
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn deleting_the_queue_removes_the_sqs_queue_and_the_finalizer_unless_retained() {
    let ns = TestNs::new("sq-delete").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("doomed", json!({}))).await.unwrap();
    queues.create(&PostParams::default(), &queue("kept", json!({"deletionPolicy": "Retain"}))).await.unwrap();
    wait_ready(&queues, "doomed", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    wait_ready(&queues, "kept", ConditionStatus::True, "Available", READY_TIMEOUT).await;

    queues.delete("doomed", &DeleteParams::default()).await.unwrap();
    queues.delete("kept", &DeleteParams::default()).await.unwrap();
    for name in ["doomed", "kept"] {
        wait_gone(&queues, name, READY_TIMEOUT).await;
    }
    let sqs = sqs().await;
    assert!(!queue_exists(&sqs, &format!("{}_doomed", ns.name)).await, "Delete policy removes the SQS queue");
    let kept = format!("{}_kept", ns.name);
    assert!(queue_exists(&sqs, &kept).await, "Retain keeps the SQS queue");
    let url = sqs.get_queue_url().queue_name(&kept).send().await.unwrap().queue_url.unwrap();
    sqs.delete_queue().queue_url(url).send().await.unwrap();
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn fifo_queue_gets_the_suffix_and_fifo_attributes() {
    let ns = TestNs::new("sq-fifo").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let spec = json!({"fifo": true, "contentBasedDeduplication": true, "deduplicationScope": "messageGroup", "fifoThroughputLimit": "perMessageGroupId"});
    queues.create(&PostParams::default(), &queue("events", spec)).await.unwrap();
    let q = wait_ready(&queues, "events", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert_eq!(q.status.as_ref().unwrap().queue_name.as_deref(), Some(format!("{}_events.fifo", ns.name).as_str()));
    let a = attributes(&sqs().await, &url_of(&q)).await;
    assert_eq!(a["FifoQueue"], "true");
    assert_eq!(a["ContentBasedDeduplication"], "true");
    assert_eq!(a["DeduplicationScope"], "messageGroup");
    assert_eq!(a["FifoThroughputLimit"], "perMessageGroupId");
    queues.delete("events", &DeleteParams::default()).await.unwrap();
    finish(op, ns).await;
}

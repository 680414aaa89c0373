//! An SQS outage turns Ready false and heals on its own, edits included; a converged Queue
//! costs reads only, no writes, across resyncs.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::{READY_TIMEOUT, url_of};
use crate::common::{Operator, TestNs, attributes, eventually, fast_settings, finish, proxy, queue, sqs, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn unreachable_sqs_turns_ready_false_and_recovers_when_it_returns() {
    let ns = TestNs::new("sq-outage").await;
    let upstream = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let proxy = proxy::Proxy::start(upstream.trim_start_matches("http://").trim_end_matches('/')).await;
    let op = Operator::start_with_endpoint(&ns, fast_settings(), Some(proxy.url())).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("flaky", json!({"visibilityTimeoutSeconds": 31}))).await.unwrap();
    wait_ready(&queues, "flaky", ConditionStatus::True, "Available", READY_TIMEOUT).await;

    proxy.cut().await;
    let q = wait_ready(&queues, "flaky", ConditionStatus::False, "SqsUnavailable", READY_TIMEOUT).await;
    assert!(q.status.as_ref().unwrap().queue_url.is_some(), "URL kept while SQS is unreachable");
    // A spec edit during the outage is applied once SQS is back.
    queues
        .patch("flaky", &PatchParams::default(), &Patch::Merge(json!({"spec": {"visibilityTimeoutSeconds": 32}})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.restore().await;
    let q = wait_ready(&queues, "flaky", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert_eq!(attributes(&sqs().await, &url_of(&q)).await["VisibilityTimeout"], "32");
    queues.delete("flaky", &DeleteParams::default()).await.unwrap();
    eventually("Queue deleted", READY_TIMEOUT, || async { queues.get("flaky").await.is_err().then_some(()) }).await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn converged_queue_costs_no_writes_over_several_resyncs() {
    let ns = TestNs::new("sq-steady").await;
    let settings = fast_settings();
    let resync = settings.resync;
    let op = Operator::start(&ns, settings).await;
    let queues: Api<Queue> = ns.api();
    let cms: Api<ConfigMap> = ns.api();
    queues
        .create(&PostParams::default(), &queue("calm", json!({"visibilityTimeoutSeconds": 40, "tags": {"x": "y"}, "policy": {"Version": "2012-10-17", "Statement": []}})))
        .await
        .unwrap();
    wait_ready(&queues, "calm", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    eventually("ConfigMap", READY_TIMEOUT, || async { cms.get("calm-sqs").await.ok() }).await;
    // Let the first follow-up reconcile settle.
    tokio::time::sleep(resync * 2).await;

    let writes_before = op.ctx.api_writes.get();
    let calls_before = op.sqs_calls();
    let rv_queue = queues.get("calm").await.unwrap().metadata.resource_version;
    let rv_cm = cms.get("calm-sqs").await.unwrap().metadata.resource_version;
    tokio::time::sleep(resync * 4).await;
    let calls_after = op.sqs_calls();

    assert_eq!(op.ctx.api_writes.get(), writes_before, "no API server writes while converged");
    assert_eq!(queues.get("calm").await.unwrap().metadata.resource_version, rv_queue);
    assert_eq!(cms.get("calm-sqs").await.unwrap().metadata.resource_version, rv_cm);
    let delta = |op: &str| calls_after.get(op).unwrap_or(&0) - calls_before.get(op).unwrap_or(&0);
    for write in ["CreateQueue", "SetQueueAttributes", "TagQueue", "UntagQueue", "DeleteQueue"] {
        assert_eq!(delta(write), 0, "{write} while converged: {calls_after:?}");
    }
    let reads = delta("GetQueueAttributes");
    assert!(reads >= 3, "resyncs kept reading SQS ({reads} reads in {:?})", resync * 4);
    assert_eq!(delta("GetQueueUrl") + delta("ListQueueTags"), 0, "one call per resync: {calls_after:?}");
    queues.delete("calm", &DeleteParams::default()).await.unwrap();
    finish(op, ns).await;
}

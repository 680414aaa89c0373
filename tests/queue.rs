//! Queue controller against a real kube-apiserver and real LocalStack (`tests/env.sh up`).
//!
//! Run with `tests/run.sh`, or `eval "$(tests/env.sh up)" && cargo test --test queue -- --include-ignored`.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn url_of(q: &Queue) -> String {
    q.status.as_ref().and_then(|s| s.queue_url.clone()).expect("status.queueUrl")
}

async fn tags(url: &str) -> std::collections::HashMap<String, String> {
    sqs().await.list_queue_tags().queue_url(url).send().await.expect("ListQueueTags").tags.unwrap_or_default()
}

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
async fn foreign_queue_is_untouched_without_adopt_and_managed_with_it() {
    let ns = TestNs::new("sq-adopt").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let sqs = sqs().await;
    let name = format!("legacy-{}", ns.name);
    let url = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "11")
        .tags("owner", "another-team")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();

    queues
        .create(
            &PostParams::default(),
            &queue("legacy", json!({"queueName": name, "visibilityTimeoutSeconds": 50, "deletionPolicy": "Delete"})),
        )
        .await
        .unwrap();
    let q = wait_ready(&queues, "legacy", ConditionStatus::False, "AlreadyExists", READY_TIMEOUT).await;
    let message = &q.status.unwrap().conditions[0].message;
    assert!(message.contains("adopt"), "the message says how to proceed: {message}");
    assert_eq!(attributes(&sqs, &url).await["VisibilityTimeout"], "11", "foreign queue untouched");
    assert_eq!(tags(&url).await.get("owner").map(String::as_str), Some("another-team"));

    queues.patch("legacy", &PatchParams::default(), &Patch::Merge(json!({"spec": {"adopt": true}}))).await.unwrap();
    let q = wait_ready(&queues, "legacy", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    assert_eq!(url_of(&q), url);
    assert_eq!(attributes(&sqs, &url).await["VisibilityTimeout"], "50");
    assert_eq!(tags(&url).await["skyport.dev/owner-uid"], q.metadata.uid.unwrap());
    queues.delete("legacy", &DeleteParams::default()).await.unwrap();
    eventually("adopted queue deleted with its Queue (deletionPolicy Delete)", READY_TIMEOUT, || async {
        (!queue_exists(&sqs, &name).await).then_some(())
    })
    .await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn invalid_specs_are_refused_by_the_api_server_with_a_clear_message() {
    let ns = TestNs::new("sq-invalid").await;
    let queues: Api<Queue> = ns.api();
    // Raw objects: some invalid values cannot even be represented by the Rust types.
    let resource = kube::discovery::ApiResource::erase::<Queue>(&());
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
    let cases = [
        (json!({"visibilityTimeoutSeconds": 99999}), "43200"),
        (json!({"delaySeconds": -1}), "0"),
        (json!({"receiveWaitTimeSeconds": 21}), "20"),
        (json!({"queueName": "bad name!"}), "queueName"),
        (json!({"queueName": "plain", "fifo": true}), "must end in '.fifo'"),
        (json!({"queueName": "x.fifo"}), "must end in '.fifo'"),
        (json!({"contentBasedDeduplication": true}), "only to FIFO"),
        (json!({"deadLetter": {"maxReceiveCount": 3}}), "exactly one of queueRef and targetArn"),
        (
            json!({"deadLetter": {"queueRef": {"name": "a"}, "targetArn": "arn:aws:sqs:us-east-1:000000000000:b", "maxReceiveCount": 3}}),
            "exactly one",
        ),
        (json!({"deadLetter": {"targetArn": "not-an-arn", "maxReceiveCount": 3}}), "targetArn"),
        (json!({"sqsManagedEncryption": true, "kmsKeyId": "alias/aws/sqs"}), "not both"),
        (json!({"tags": {"skyport.dev/owner-uid": "x"}}), "reserved"),
        (json!({"deletionPolicy": "Keep"}), "deletionPolicy"),
        (json!({"redriveAllowPolicy": {"redrivePermission": "byQueue"}}), "sourceQueueArns"),
    ];
    for (i, (spec, expected)) in cases.iter().enumerate() {
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "skyport.dev/v1alpha1", "kind": "Queue",
            "metadata": {"name": format!("bad-{i}")}, "spec": spec,
        }))
        .unwrap();
        let err = raw.create(&PostParams::default(), &obj).await.expect_err(&format!("spec {spec} must be refused"));
        let kube::Error::Api(e) = err else { panic!("unexpected error {err}") };
        assert_eq!(e.code, 422, "{spec}: {}", e.message);
        assert!(e.message.contains(expected), "{spec}: message {:?} should mention {expected:?}", e.message);
    }

    // Immutable fields.
    queues
        .create(&PostParams::default(), &queue("fixed", json!({"queueName": format!("fixed-{}", ns.name)})))
        .await
        .unwrap();
    for (patch, expected) in [
        (json!({"spec": {"queueName": "renamed"}}), "immutable"),
        (json!({"spec": {"queueName": null}}), "immutable"),
        (json!({"spec": {"fifo": true, "queueName": format!("fixed-{}.fifo", ns.name)}}), "immutable"),
    ] {
        let err = queues.patch("fixed", &PatchParams::default(), &Patch::Merge(&patch)).await.expect_err("immutable");
        let kube::Error::Api(e) = err else { panic!("unexpected error {err}") };
        assert!(e.message.contains(expected), "{patch}: {}", e.message);
    }
    ns.cleanup().await;
}

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

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_repeated_event_is_one_event_with_a_series_and_another_note_is_another_event() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event;
    use skyport::controllers::events::{EventType, Events};
    let ns = TestNs::new("sq-events").await;
    let events = Events::new(ns.client.clone(), "skyport.dev/test", None);
    let regarding = ObjectReference {
        api_version: Some("skyport.dev/v1alpha1".into()),
        kind: Some("Queue".into()),
        name: Some("orders".into()),
        namespace: Some(ns.name.clone()),
        uid: Some("8c0b3a55-0000-4000-8000-000000000001".into()),
        ..Default::default()
    };
    for _ in 0..3 {
        events.publish(&regarding, EventType::Warning, "Failed", "Reconcile", "SQS said no").await.unwrap();
    }
    events.publish(&regarding, EventType::Warning, "Failed", "Reconcile", "SQS said no again").await.unwrap();
    let api: Api<Event> = ns.api();
    let mut seen: Vec<(String, i32)> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| (e.note.unwrap_or_default(), e.series.map_or(1, |s| s.count)))
        .collect();
    seen.sort();
    assert_eq!(seen, [("SQS said no".to_string(), 3), ("SQS said no again".to_string(), 1)]);
    assert_eq!(events.remembered(), 2);
}

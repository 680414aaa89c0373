//! What is refused: specs the API server rejects (CRD validation, immutable fields), and a
//! foreign SQS queue of the same name, left untouched until the Queue says `adopt`.

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::{READY_TIMEOUT, tags, url_of};
use crate::common::{Operator, TestNs, attributes, eventually, finish, granting, queue, queue_exists, sqs, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn foreign_queue_is_untouched_without_adopt_and_managed_with_it() {
    let ns = TestNs::new("sq-adopt").await;
    let op = Operator::start(&ns, granting(&ns.name, "legacy-*")).await;
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

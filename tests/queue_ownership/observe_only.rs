//! Observe-only Queues publish an existing queue and never write to SQS.

use aws_sdk_sqs::types::QueueAttributeName;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn observe_only_publishes_an_existing_queue_and_never_writes_to_sqs() {
    let ns = TestNs::new("own-observe").await;
    let sqs = sqs().await;
    let name = format!("watched-{}", &ns.name[12..]);
    let url =
        create_foreign(&name, &[(QueueAttributeName::VisibilityTimeout, "11")], &[("owner", "another-team")]).await;
    let op = Operator::start(&ns, fast_settings()).await;
    let queues: Api<Queue> = ns.api();
    let spec = json!({"queueName": name, "managementPolicy": "Observe", "visibilityTimeoutSeconds": 50});
    queues.create(&PostParams::default(), &queue("watched", spec)).await.unwrap();
    let q = wait_ready(&queues, "watched", ConditionStatus::True, "Available", READY_TIMEOUT).await;
    let status = status_of(&q);
    assert_eq!(status.queue_name.as_deref(), Some(name.as_str()));
    assert!(status.queue_arn.as_deref().is_some_and(|a| a.ends_with(&format!(":{name}"))), "{status:?}");
    let cms: Api<ConfigMap> = ns.api();
    let cm = eventually("ConfigMap watched-sqs", READY_TIMEOUT, || async { cms.get("watched-sqs").await.ok() }).await;
    assert_eq!(cm.data.unwrap()["QUEUE_NAME"], name);
    // A missing queue is reported, not created.
    queues
        .create(
            &PostParams::default(),
            &queue("absent", json!({"queueName": format!("{name}-x"), "managementPolicy": "Observe"})),
        )
        .await
        .unwrap();
    wait_ready(&queues, "absent", ConditionStatus::False, "NotFound", READY_TIMEOUT).await;

    queues.delete("watched", &DeleteParams::default()).await.unwrap();
    queues.delete("absent", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "watched", READY_TIMEOUT).await;
    wait_gone(&queues, "absent", READY_TIMEOUT).await;
    let calls = op.sqs_calls();
    for write in WRITES {
        assert_eq!(calls.get(write).copied().unwrap_or(0), 0, "{write} under Observe: {calls:?}");
    }
    assert_eq!(attributes(&sqs, &url).await["VisibilityTimeout"], "11");
    assert_eq!(tags(&url).await.len(), 1, "tags untouched");
    assert!(queue_exists(&sqs, &name).await, "never deleted");

    // Observe can never be combined with deleting.
    let err = queues
        .create(
            &PostParams::default(),
            &queue("bad", json!({"queueName": name, "managementPolicy": "Observe", "deletionPolicy": "Delete"})),
        )
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("never deletes"), "{err}");
    delete_sqs_queue(&name).await;
    finish(op, ns).await;
}

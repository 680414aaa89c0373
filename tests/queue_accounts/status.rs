//! Status is not ownership: a tenant who may write its Queues' status (`queues/status`, as
//! `resources: ["*"]` roles grant) cannot point their cleanup at another tenant's role, region or
//! endpoint. Cleanup assumes only what an AwsAccount the namespace may use names now.

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{AwsAccount, ConditionStatus, Queue};

use super::common::sts::{Sts, external_id};
use super::common::*;
use super::sqs_faults::FaultProxy;
use super::{TIMEOUT, account};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn cleanup_never_assumes_a_role_nor_uses_an_endpoint_written_into_status() {
    const VICTIM: &str = "arn:aws:iam::000000000012:role/victim";
    let (victim, forger) = (TestNs::new("acct-victim").await, TestNs::new("acct-forger").await);
    let sts = Sts::start().await;
    sts.trust(VICTIM, &external_id(&victim.name));
    let team = account("team", VICTIM, "eu-west-1", json!({}));
    victim.api::<AwsAccount>().create(&PostParams::default(), &team).await.unwrap();
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let trap = FaultProxy::start(endpoint.trim_start_matches("http://").trim_end_matches('/')).await;
    let op = Operator::start_with_sts(&forger, fast_settings(), &sts, true).await;
    let queues: Api<Queue> = forger.api();
    let borrowed = json!({"accountRef": {"name": "team", "namespace": victim.name}});
    queues.create(&PostParams::default(), &queue("borrowed", borrowed)).await.unwrap();
    queues.create(&PostParams::default(), &queue("plain", json!({}))).await.unwrap();
    wait_ready(&queues, "borrowed", ConditionStatus::False, "AccountNotAllowed", TIMEOUT).await;
    wait_ready(&queues, "plain", ConditionStatus::True, "Available", TIMEOUT).await;
    op.stop().await;

    // With no operator looking, the tenant records the victim's role and its own endpoint.
    let forged = json!({"status": {"roleArn": VICTIM, "region": "eu-west-1", "endpointUrl": trap.url(),
        "queueName": format!("{}_payments", victim.name)}});
    for name in ["borrowed", "plain"] {
        queues.patch_status(name, &PatchParams::default(), &Patch::Merge(&forged)).await.unwrap();
        queues.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let op = Operator::start_with_sts(&forger, fast_settings(), &sts, true).await;
    for name in ["borrowed", "plain"] {
        wait_gone(&queues, name, TIMEOUT).await;
    }
    assert!(sts.calls().iter().all(|c| c.role_arn != VICTIM), "assumed the victim's role: {:?}", sts.calls());
    assert!(trap.calls().is_empty(), "signed requests sent to the forged endpoint: {:?}", trap.calls());
    let events = forger.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap().items;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("NotDeleted")), "the refusal says why");
    assert!(!queue_exists(&sqs().await, &format!("{}_plain", forger.name)).await, "its own queue deleted as usual");
    finish(op, forger).await;
    victim.cleanup().await;
}

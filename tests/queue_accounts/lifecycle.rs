//! AwsAccounts over their Queues' lifetime: a new endpoint is a move (the Queue is refused, not
//! moved), its cleanup goes only through what the AwsAccount names now (never through what status
//! records), and deleting a namespace deletes its Queues' SQS queues through their AwsAccount,
//! which stays until they are gone.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{AwsAccount, ConditionStatus, Queue};

use super::common::sts::{Sts, external_id};
use super::common::*;
use super::sqs_faults::FaultProxy;
use super::{IN_USE, TIMEOUT, account, message, sqs_as, status};

fn localstack() -> String {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL");
    endpoint.trim_start_matches("http://").trim_end_matches('/').to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_new_endpoint_is_a_move_and_cleanup_goes_only_through_what_the_account_names_now() {
    const ROLE: &str = "arn:aws:iam::000000000009:role/vpce";
    let ns = TestNs::new("acct-endpoint").await;
    let sts = Sts::start().await;
    sts.trust(ROLE, &external_id(&ns.name));
    let op = Operator::start_with_sts(&ns, fast_settings(), &sts, true).await;
    // Two endpoints in front of the same SQS, each recording the calls it carries.
    let (old, new) = (FaultProxy::start(&localstack()).await, FaultProxy::start(&localstack()).await);
    let accounts: Api<AwsAccount> = ns.api();
    let team = account("team", ROLE, "eu-west-1", json!({"endpointUrl": old.url()}));
    accounts.create(&PostParams::default(), &team).await.unwrap();
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("orders", json!({"accountRef": {"name": "team"}}))).await.unwrap();
    let q = wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let s = status(&q);
    assert_eq!(s.endpoint_url.as_deref().map(String::as_str), Some(old.url().as_str()));
    let name = s.queue_name.clone().unwrap().to_string();

    let patch = json!({"spec": {"endpointUrl": new.url()}});
    accounts.patch("team", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let q = wait_ready(&queues, "orders", ConditionStatus::False, "AccountChanged", TIMEOUT).await;
    assert!(message(&q).contains(&old.url()) && message(&q).contains(&new.url()), "{}", message(&q));

    assert!(new.calls().is_empty(), "a refused Queue calls nothing through the new endpoint: {:?}", new.calls());
    let before = old.calls().len();

    // Both endpoints reach the same SQS here: the queue is found through the new one, and its
    // owner tag says it is this Queue's.
    queues.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "orders", TIMEOUT).await;
    assert!(sqs_as(ROLE, "eu-west-1").await.get_queue_url().queue_name(&name).send().await.is_err(), "deleted");
    assert!(new.calls().iter().any(|c| c.operation == "DeleteQueue" && c.queue == name), "{:?}", new.calls());
    assert_eq!(old.calls().len(), before, "nothing through the endpoint status records: {:?}", old.calls());
    eventually("the finalizer released with the last Queue", TIMEOUT, || async {
        let a = accounts.get("team").await.ok()?;
        (!a.metadata.finalizers.unwrap_or_default().contains(&IN_USE.to_string())).then_some(())
    })
    .await;
    finish(op, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn deleting_a_namespace_deletes_its_queues_through_its_account() {
    const ROLE: &str = "arn:aws:iam::000000000010:role/team";
    let ns = TestNs::new("acct-nsdel").await;
    let sts = Sts::start().await;
    sts.trust(ROLE, &external_id(&ns.name));
    let op = Operator::start_with_sts(&ns, fast_settings(), &sts, false).await;
    let accounts: Api<AwsAccount> = ns.api();
    accounts.create(&PostParams::default(), &account("team", ROLE, "eu-west-1", json!({}))).await.unwrap();
    let queues: Api<Queue> = ns.api();
    let mut names = Vec::new();
    for name in ["orders", "invoices"] {
        queues.create(&PostParams::default(), &queue(name, json!({"accountRef": {"name": "team"}}))).await.unwrap();
        let q = wait_ready(&queues, name, ConditionStatus::True, "Available", TIMEOUT).await;
        names.push(status(&q).queue_name.unwrap().to_string());
    }
    let team = accounts.get("team").await.unwrap();
    assert!(team.metadata.finalizers.unwrap_or_default().contains(&IN_USE.to_string()), "held while in use");

    Api::<Namespace>::all(ns.client.clone()).delete(&ns.name, &DeleteParams::default()).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    eventually("the namespace deleted", Duration::from_secs(120), || async {
        matches!(namespaces.get(&ns.name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    let as_role = sqs_as(ROLE, "eu-west-1").await;
    for name in &names {
        assert!(as_role.get_queue_url().queue_name(name).send().await.is_err(), "{name} deleted with its Queue");
    }
    assert!(sts.calls().iter().all(|c| c.allowed), "every AssumeRole was trusted: {:?}", sts.calls());
    op.stop().await;
}

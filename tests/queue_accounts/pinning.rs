//! A tenant naming another namespace's AwsAccount, which does not allow it, learns nothing and
//! holds nothing: a missing and a forbidden account read the same, and the refused Queue never
//! puts the in-use finalizer on the account, so the owners delete it, and their namespace, at will.
//! Needs an operator over several namespaces, so it runs in a private environment.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{AwsAccount, ConditionStatus, Queue};

use super::common::private_env::PrivateEnv;
use super::common::*;
use super::{IN_USE, TIMEOUT, account, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment (it starts a private one with tests/env.sh)"]
async fn a_queue_refused_another_namespaces_account_neither_pins_it_nor_learns_it_exists() {
    let env = PrivateEnv::up("pin").await;
    let client = env.client().await;
    let named = |prefix: &str| format!("{prefix}-{:08x}", rand::random::<u32>());
    let owner = TestNs::in_cluster(client.clone(), named("pin-owner")).await;
    let thief = TestNs::in_cluster(client.clone(), named("pin-thief")).await;
    let op = Operator::everywhere(client.clone(), fast_settings(), env.exports["AWS_ENDPOINT_URL"].clone()).await;
    let accounts: Api<AwsAccount> = owner.api();
    let team = account("team", "arn:aws:iam::000000000011:role/team", "eu-west-1", json!({"allowedNamespaces": ["x"]}));
    accounts.create(&PostParams::default(), &team).await.unwrap();

    let queues: Api<Queue> = thief.api();
    for (name, target) in [("pin", "team"), ("probe", "ghost")] {
        let spec = json!({"accountRef": {"name": target, "namespace": owner.name}});
        queues.create(&PostParams::default(), &queue(name, spec)).await.unwrap();
    }
    let pin = wait_ready(&queues, "pin", ConditionStatus::False, "AccountNotAllowed", TIMEOUT).await;
    let probe = wait_ready(&queues, "probe", ConditionStatus::False, "AccountNotAllowed", TIMEOUT).await;
    assert_eq!(message(&pin).replace("team", "NAME"), message(&probe).replace("ghost", "NAME"), "the same words");

    // The account reconciler looks at the account again after any change of its spec.
    let patch = json!({"spec": {"allowedNamespaces": ["x", "y"]}});
    accounts.patch("team", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the account reconciled", TIMEOUT, || async {
        let a = accounts.get("team").await.ok()?;
        a.status?.external_id.is_some().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let finalizers = accounts.get("team").await.unwrap().metadata.finalizers.unwrap_or_default();
    assert!(!finalizers.contains(&IN_USE.to_string()), "held by a Queue it refuses: {finalizers:?}");

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(&owner.name, &DeleteParams::default()).await.unwrap();
    eventually("the owners' namespace deleted", Duration::from_secs(90), || async {
        matches!(namespaces.get(&owner.name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    let pin = queues.get("pin").await.unwrap();
    assert_eq!(ready(&pin).map(|r| r.1), Some("AccountNotAllowed".into()), "still refused, nothing else learned");
    finish(op, thief).await;
    env.down().await;
}

//! Every AwsAccount call path of the Queue controller under the shipped RBAC: the finalizer's
//! conflict path reads the account again (`get`).

use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::controllers::queue::account_use::{ACCOUNT_FINALIZER, hold};
use skyport::controllers::queue::accounts::Placement;
use skyport::crd::AwsAccount;

use super::install::{install_deploy_once, service_account_client};
use crate::common::{TestNs, client, fast_settings};

/// Adding the AwsAccount finalizer to a copy older than the stored account (a status write or
/// another Queue moved it) reads the account again, and lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_account_finalizer_of_a_stale_copy_lands_under_the_shipped_rbac() {
    let admin = client().await;
    install_deploy_once().await;
    let sa = service_account_client(&admin).await;
    let ns = TestNs::new("rbac-acct").await;
    let account: AwsAccount = serde_json::from_value(json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount", "metadata": {"name": "team"},
        "spec": {"roleArn": "arn:aws:iam::000000000002:role/team", "region": "eu-west-1"},
    }))
    .unwrap();
    let accounts: Api<AwsAccount> = ns.api();
    let stale = accounts.create(&PostParams::default(), &account).await.unwrap();
    let keep = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    accounts.patch("team", &PatchParams::default(), &Patch::Merge(&keep)).await.unwrap();
    // The Queue controller's context, with the ServiceAccount's identity; its controllers are
    // not run (the AwsAccount reconciler would release an account no Queue uses).
    let aws = providers::SqsSettings::default();
    let sqs = Arc::new(providers::SqsProvider::from_env(&aws).await);
    let (ctx, _run) = skyport::controllers::queue::controller(
        sa.clone(),
        sqs.clone(),
        aws,
        fast_settings(),
        Some(ns.name.clone()),
        skyport::controllers::Acting::always(),
        std::future::pending::<()>(),
    );
    let placement = Placement {
        sqs,
        account: "team".into(),
        region: None,
        role_arn: None,
        endpoint_url: None,
        holder: Some(Arc::new(stale)),
        budget: Default::default(),
    };
    hold(&placement, &ctx).await.expect("the finalizer added after the conflict");
    let now = accounts.get("team").await.unwrap();
    let held = vec!["example.com/keep".to_string(), ACCOUNT_FINALIZER.to_string()];
    assert_eq!(now.metadata.finalizers, Some(held));
    let release = json!({"metadata": {"finalizers": null}});
    accounts.patch("team", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
    ns.cleanup().await;
}

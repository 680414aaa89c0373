//! Roles a tenant cannot borrow: the external id and session name come from the AwsAccount's
//! namespace, so a role trusting one namespace refuses every other; and an AwsAccount cannot
//! send the role's requests over plain HTTP unless the platform allows it.

use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::{AwsAccount, ConditionStatus, Queue};

use super::common::sts::{Sts, external_id};
use super::common::*;
use super::{TIMEOUT, account, account_ready, any_queue_with_prefix, message, sqs_as, status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tenant_cannot_assume_a_role_that_trusts_another_namespace() {
    const ROLE: &str = "arn:aws:iam::000000000007:role/team-b-queues";
    let (thief, owner) = (TestNs::new("acct-thief").await, TestNs::new("acct-owner").await);
    let sts = Sts::start().await;
    // The owner's platform team wrote what the owner's AwsAccount status shows into the role.
    sts.trust_session(ROLE, &external_id(&owner.name), &format!("skyport-{}", owner.name));
    let op_thief = Operator::start_with_sts(&thief, fast_settings(), &sts, false).await;
    let op_owner = Operator::start_with_sts(&owner, fast_settings(), &sts, false).await;
    for ns in [&thief, &owner] {
        let team = account("team", ROLE, "eu-west-1", json!({}));
        ns.api::<AwsAccount>().create(&PostParams::default(), &team).await.unwrap();
        let payments = queue("payments", json!({"accountRef": {"name": "team"}}));
        ns.api::<Queue>().create(&PostParams::default(), &payments).await.unwrap();
    }

    // The owner's Queue works, in the role's account.
    let mine = wait_ready(&owner.api(), "payments", ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(status(&mine).queue_arn.unwrap().starts_with("arn:aws:sqs:eu-west-1:000000000007:"));

    // The thief's is refused by STS, with what to fix, and nothing is created.
    let thief_queues: Api<Queue> = thief.api();
    let refused = wait_ready(&thief_queues, "payments", ConditionStatus::False, "AssumeRoleDenied", TIMEOUT).await;
    assert!(message(&refused).contains("sts:ExternalId"), "{}", message(&refused));
    assert!(message(&refused).contains("status.externalId"), "{}", message(&refused));
    let as_role = sqs_as(ROLE, "eu-west-1").await;
    assert!(!any_queue_with_prefix(&as_role, &format!("{}_", thief.name)).await, "nothing created as the role");
    assert!(!any_queue_with_prefix(&sqs().await, &format!("{}_", thief.name)).await, "nor as the operator");
    let calls = sts.calls();
    let asked = calls.iter().find(|c| !c.allowed).expect("the thief's AssumeRole reached STS");
    assert_eq!(asked.external_id.as_deref(), Some(external_id(&thief.name).as_str()), "its own namespace's id");
    assert_eq!(asked.session_name, format!("skyport-{}", thief.name), "CloudTrail names the namespace");
    assert!(calls.iter().filter(|c| c.allowed).all(|c| c.external_id == Some(external_id(&owner.name))));

    // Each AwsAccount shows the exact value for the trust policy.
    for ns in [&owner, &thief] {
        let accounts: Api<AwsAccount> = ns.api();
        let shown = eventually("status.externalId", TIMEOUT, || async {
            let a = accounts.get("team").await.ok()?;
            a.status.as_ref()?.external_id.is_some().then_some(a)
        })
        .await;
        let s = shown.status.clone().unwrap();
        assert_eq!(s.external_id, Some(format!("skyport:{TEST_CLUSTER}:{}", ns.name)));
        assert_eq!(s.role_session_name, Some(format!("skyport-{}", ns.name)));
        assert_eq!(account_ready(&shown), Some((ConditionStatus::True, "Usable".into())));
    }

    // A Queue that never got the role is not stuck in its finalizer, nor its AwsAccount.
    thief_queues.delete("payments", &DeleteParams::default()).await.unwrap();
    wait_gone(&thief_queues, "payments", TIMEOUT).await;
    let accounts: Api<AwsAccount> = thief.api();
    accounts.delete("team", &DeleteParams::default()).await.unwrap();
    eventually("the thief's AwsAccount deleted", TIMEOUT, || async {
        matches!(accounts.get("team").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    finish(op_thief, thief).await;
    finish(op_owner, owner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_plain_http_endpoint_needs_the_platforms_consent() {
    const ROLE: &str = "arn:aws:iam::000000000008:role/lab";
    let ns = TestNs::new("acct-http").await;
    let sts = Sts::start().await;
    sts.trust(ROLE, &external_id(&ns.name));
    let op = Operator::start_with_sts(&ns, fast_settings(), &sts, false).await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    assert!(endpoint.starts_with("http://"), "LocalStack speaks plain HTTP: {endpoint}");
    let lab = account("lab", ROLE, "eu-west-1", json!({"endpointUrl": endpoint}));
    ns.api::<AwsAccount>().create(&PostParams::default(), &lab).await.unwrap();
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("q", json!({"accountRef": {"name": "lab"}}))).await.unwrap();

    let q = wait_ready(&queues, "q", ConditionStatus::False, "InsecureEndpoint", TIMEOUT).await;
    assert!(message(&q).contains("--allow-http-account-endpoints"), "{}", message(&q));
    let accounts: Api<AwsAccount> = ns.api();
    eventually("the AwsAccount says why", TIMEOUT, || async {
        let a = accounts.get("lab").await.ok()?;
        (account_ready(&a)? == (ConditionStatus::False, "InsecureEndpoint".into())).then_some(())
    })
    .await;
    let events = ns.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap().items;
    let warned = |e: &k8s_openapi::api::events::v1::Event| {
        e.reason.as_deref() == Some("InsecureEndpoint") && e.type_.as_deref() == Some("Warning")
    };
    assert_eq!(events.iter().filter(|e| warned(e)).count(), 1, "one Warning Event");
    assert!(sts.calls().is_empty(), "the role was never assumed: {:?}", sts.calls());
    assert!(op.ctx.accounts.budgets().is_empty(), "no SQS call with it");
    op.stop().await;

    // The same AwsAccount works where the platform allows plain HTTP.
    let op = Operator::start_with_sts(&ns, fast_settings(), &sts, true).await;
    let q = wait_ready(&queues, "q", ConditionStatus::True, "Available", TIMEOUT).await;
    assert_eq!(status(&q).endpoint_url.as_deref().map(String::as_str), Some(endpoint.as_str()));
    finish(op, ns).await;
}

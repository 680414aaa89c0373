//! AwsAccount: per-namespace AWS identity and region, against a real kube-apiserver and real
//! LocalStack (which implements STS: a queue created with an assumed role's credentials lives
//! in the role's account, so the account number in a queue's ARN proves whose identity made it).
//! The operator assumes roles through an STS stand-in (`tests/common/sts.rs`) that enforces the
//! roles' trust (external id, session name) as AWS does and LocalStack does not.
//!
//! Run with `tests/run.sh`, or `eval "$(tests/env.sh up)" && cargo test --test integration queue_accounts:: -- --include-ignored`.

use crate::common;
// Records which SQS endpoint each call went through.
use crate::common::sqs_faults;

mod fairness;
mod lifecycle;
mod pinning;
mod status;
mod trust;

use std::time::Duration;

use aws_sdk_sqs::Client as SqsClient;
use common::sts::{Sts, external_id, sqs_as};
use common::*;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::controllers::status::ObjectStatus;
use skyport::crd::{AwsAccount, ConditionStatus, Queue};

const TIMEOUT: Duration = Duration::from_secs(40);

/// The finalizer that keeps an AwsAccount while Queues use it.
const IN_USE: &str = "awsaccounts.skyport.dev/in-use";

fn account(name: &str, role: &str, region: &str, extra: serde_json::Value) -> AwsAccount {
    let mut spec = json!({"roleArn": role, "region": region});
    spec.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    serde_json::from_value(json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount",
        "metadata": {"name": name}, "spec": spec}))
    .expect("valid AwsAccount")
}

/// Whether SQS as `role` has a queue whose name starts with `prefix`.
async fn any_queue_with_prefix(sqs: &SqsClient, prefix: &str) -> bool {
    let listed = sqs.list_queues().queue_name_prefix(prefix).send().await.expect("ListQueues");
    !listed.queue_urls.unwrap_or_default().is_empty()
}

/// The AwsAccount's Ready condition as (status, reason), once it has one.
fn account_ready(a: &AwsAccount) -> Option<(ConditionStatus, String)> {
    let c = a.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason.to_string()))
}

fn status(q: &Queue) -> skyport::crd::QueueStatus {
    q.status.clone().expect("status")
}

fn message(q: &Queue) -> String {
    q.status.as_ref().and_then(|s| s.ready()).map(|c| c.message.to_string()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn two_namespaces_use_their_own_accounts_and_regions_at_once() {
    const ROLE_B: &str = "arn:aws:iam::000000000002:role/team-b";
    const ROLE_C: &str = "arn:aws:iam::000000000003:role/team-c";
    let (a, b) = (TestNs::new("acct-a").await, TestNs::new("acct-b").await);
    let sts = Sts::start().await;
    sts.trust(ROLE_B, &external_id(&a.name));
    sts.trust(ROLE_C, &external_id(&b.name));
    let op_a = Operator::start_with_sts(&a, fast_settings(), &sts, false).await;
    let op_b = Operator::start_with_sts(&b, fast_settings(), &sts, false).await;
    a.api::<AwsAccount>()
        .create(&PostParams::default(), &account("team", ROLE_B, "eu-west-1", json!({})))
        .await
        .unwrap();
    b.api::<AwsAccount>()
        .create(&PostParams::default(), &account("team", ROLE_C, "us-west-2", json!({})))
        .await
        .unwrap();

    let (qa, qb): (Api<Queue>, Api<Queue>) = (a.api(), b.api());
    let with_account = json!({"accountRef": {"name": "team"}});
    qa.create(&PostParams::default(), &queue("orders", with_account.clone())).await.unwrap();
    qb.create(&PostParams::default(), &queue("orders", with_account)).await.unwrap();
    qa.create(&PostParams::default(), &queue("plain", json!({}))).await.unwrap();
    let orders_a = wait_ready(&qa, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let orders_b = wait_ready(&qb, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let plain = wait_ready(&qa, "plain", ConditionStatus::True, "Available", TIMEOUT).await;

    let (sa, sb, sp) = (status(&orders_a), status(&orders_b), status(&plain));
    assert!(sa.queue_arn.as_deref().unwrap().starts_with("arn:aws:sqs:eu-west-1:000000000002:"), "{sa:?}");
    assert!(sb.queue_arn.as_deref().unwrap().starts_with("arn:aws:sqs:us-west-2:000000000003:"), "{sb:?}");
    assert!(sp.queue_arn.as_deref().unwrap().contains(":000000000000:"), "default identity: {sp:?}");
    assert_eq!((sa.account.as_deref(), sa.region.as_deref()), (Some("team"), Some("eu-west-1")));
    assert_eq!((sb.account.as_deref(), sb.region.as_deref()), (Some("team"), Some("us-west-2")));
    assert_eq!(sa.role_arn.as_deref().map(String::as_str), Some(ROLE_B));
    assert_eq!(sp.account.as_deref(), Some("default"));
    assert_eq!(sp.role_arn, None);

    // Each queue is in its account, and only there.
    let as_b = sqs_as(ROLE_B, "eu-west-1").await;
    let name_a = sa.queue_name.clone().unwrap().to_string();
    let url = as_b.get_queue_url().queue_name(&name_a).send().await.expect("queue in team-b's account").queue_url;
    assert_eq!(url.as_deref(), sa.queue_url.as_deref());
    assert!(!queue_exists(&sqs().await, &name_a).await, "not in the operator's own account");
    // One budget per account and region, used by exactly those calls.
    let budgets = op_a.ctx.accounts.budgets();
    assert_eq!(budgets.len(), 1, "{:?}", budgets.iter().map(|(k, _)| k).collect::<Vec<_>>());
    assert_eq!(budgets[0].0, ("000000000002".to_string(), "eu-west-1".to_string()));
    // Successful calls: a create that timed out on a loaded machine is retried, and counted again
    // among the attempts.
    let in_account = &budgets[0].1.counters;
    assert_eq!(in_account.succeeded().get("CreateQueue"), Some(&1), "{:?}", in_account.outcomes());
    let default = op_a.ctx.sqs.limiter().counters.outcomes();
    assert_eq!(
        op_a.sqs_succeeded().get("CreateQueue"),
        Some(&1),
        "the default budget made only plain's queue: {default:?}"
    );

    // accountRef cannot be changed: the queue would be orphaned in the old account.
    let patch = json!({"spec": {"accountRef": null}});
    let err = qa.patch("orders", &PatchParams::default(), &Patch::Merge(&patch)).await.expect_err("immutable");
    assert!(err.to_string().contains("accountRef is immutable"), "{err}");

    // Editing the AwsAccount to another role does not move the queue: refused, then restored.
    let moved = json!({"spec": {"roleArn": "arn:aws:iam::000000000004:role/elsewhere"}});
    a.api::<AwsAccount>().patch("team", &PatchParams::default(), &Patch::Merge(&moved)).await.unwrap();
    let q = wait_ready(&qa, "orders", ConditionStatus::False, "AccountChanged", TIMEOUT).await;
    assert!(message(&q).contains(ROLE_B), "{}", message(&q));
    let back = json!({"spec": {"roleArn": ROLE_B}});
    a.api::<AwsAccount>().patch("team", &PatchParams::default(), &Patch::Merge(&back)).await.unwrap();
    wait_ready(&qa, "orders", ConditionStatus::True, "Available", TIMEOUT).await;

    // Deleting the AwsAccount first: it stays, serving only the cleanup of the Queues using it.
    let accounts_a: Api<AwsAccount> = a.api();
    assert!(accounts_a.get("team").await.unwrap().metadata.finalizers.unwrap_or_default().contains(&IN_USE.into()));
    accounts_a.delete("team", &DeleteParams::default()).await.unwrap();
    wait_ready(&qa, "orders", ConditionStatus::False, "AccountDeleting", TIMEOUT).await;
    qa.create(&PostParams::default(), &queue("late", json!({"accountRef": {"name": "team"}}))).await.unwrap();
    let late = wait_ready(&qa, "late", ConditionStatus::False, "AccountDeleting", TIMEOUT).await;
    assert!(message(&late).contains("being deleted"), "{}", message(&late));
    let team = accounts_a.get("team").await.expect("kept while Queues use it");
    assert_eq!(account_ready(&team), Some((ConditionStatus::False, "Deleting".into())));
    qa.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_gone(&qa, "orders", TIMEOUT).await;
    let gone = as_b.get_queue_url().queue_name(&name_a).send().await;
    assert!(gone.is_err(), "the queue in team-b's account was deleted");
    assert!(accounts_a.get("team").await.is_ok(), "late still names it");
    qa.delete("late", &DeleteParams::default()).await.unwrap();
    wait_gone(&qa, "late", TIMEOUT).await;
    eventually("AwsAccount team gone with its last Queue", TIMEOUT, || async {
        matches!(accounts_a.get("team").await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    assert!(sts.calls().iter().all(|c| c.allowed), "{:?}", sts.calls());
    let as_c = sqs_as(ROLE_C, "us-west-2").await;
    let name_b = sb.queue_name.clone().unwrap().to_string();
    qb.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_gone(&qb, "orders", TIMEOUT).await;
    assert!(as_c.get_queue_url().queue_name(&name_b).send().await.is_err(), "deleted in team-c's account");
    assert_no_failures(&op_b.ctx.metrics, "team-c's reconciles failed");
    finish(op_a, a).await;
    finish(op_b, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_namespace_cannot_use_an_account_it_may_not_and_waits_for_a_missing_one() {
    const ROLE: &str = "arn:aws:iam::000000000005:role/owner";
    const MINE: &str = "arn:aws:iam::000000000006:role/mine";
    let (owner, other) = (TestNs::new("acct-own").await, TestNs::new("acct-other").await);
    let sts = Sts::start().await;
    sts.trust(ROLE, &external_id(&owner.name));
    sts.trust(MINE, &external_id(&other.name));
    owner
        .api::<AwsAccount>()
        .create(&PostParams::default(), &account("shared", ROLE, "eu-west-1", json!({})))
        .await
        .unwrap();
    let op = Operator::start_with_sts(&other, fast_settings(), &sts, false).await;
    let queues: Api<Queue> = other.api();

    // Another namespace's account, not allowed: refused, and nothing is created anywhere.
    let foreign = json!({"accountRef": {"name": "shared", "namespace": owner.name}});
    queues.create(&PostParams::default(), &queue("stolen", foreign)).await.unwrap();
    let q = wait_ready(&queues, "stolen", ConditionStatus::False, "AccountNotAllowed", TIMEOUT).await;
    assert!(message(&q).contains(&format!("{}/shared", owner.name)), "{}", message(&q));
    assert_eq!(op.sqs_calls().values().sum::<u64>(), 0, "no SQS call as the operator either");
    assert!(op.ctx.accounts.budgets().is_empty(), "the role was never assumed");
    assert!(sts.calls().is_empty(), "{:?}", sts.calls());

    // A missing account: AccountNotFound with one Warning, until it appears (the watch wakes it).
    queues.create(&PostParams::default(), &queue("later", json!({"accountRef": {"name": "mine"}}))).await.unwrap();
    wait_ready(&queues, "later", ConditionStatus::False, "AccountNotFound", TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let events = other.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap().items;
    let refusals = [Some("AccountNotFound"), Some("AccountNotAllowed")];
    let warnings = events.iter().filter(|e| refusals.contains(&e.reason.as_deref())).count();
    assert_eq!(warnings, 2, "one Warning per Queue (stolen and later), not one per resync");
    let mine = account("mine", MINE, "eu-central-1", json!({}));
    other.api::<AwsAccount>().create(&PostParams::default(), &mine).await.unwrap();
    let q = wait_ready(&queues, "later", ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(status(&q).queue_arn.unwrap().starts_with("arn:aws:sqs:eu-central-1:000000000006:"));
    assert_eq!(ready(&queues.get("stolen").await.unwrap()).map(|r| r.0), Some(ConditionStatus::False));
    finish(op, other).await;
    owner.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn bad_accounts_are_refused_at_admission() {
    let ns = TestNs::new("acct-admit").await;
    let api: Api<AwsAccount> = ns.api();
    for (role, region, extra, needle) in [
        ("arn:aws:iam::12:role/x", "eu-west-1", json!({}), "roleArn"),
        ("arn:aws:iam::000000000002:user/x", "eu-west-1", json!({}), "roleArn"),
        ("arn:aws:iam::000000000002:role/x", "Europe", json!({}), "region"),
        (
            "arn:aws:iam::000000000002:role/x",
            "eu-west-1",
            json!({"allowedNamespaces": ["Not_A_Namespace"]}),
            "allowedNamespaces",
        ),
        ("arn:aws:iam::000000000002:role/x", "eu-west-1", json!({"endpointUrl": "localhost:4566"}), "endpointUrl"),
        (
            "arn:aws:iam::000000000002:role/x",
            "eu-west-1",
            json!({"externalId": "chosen-by-the-tenant"}),
            "externalId is derived by skyport (status.externalId)",
        ),
    ] {
        let err = api.create(&PostParams::default(), &account("bad", role, region, extra)).await.expect_err("refused");
        assert!(err.to_string().contains(needle), "expected {needle:?} in {err}");
    }
    ns.cleanup().await;
}

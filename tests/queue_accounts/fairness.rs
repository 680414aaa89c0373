//! Fairness between accounts: while one AwsAccount's SQS endpoint answers nothing (every call
//! runs into the operation timeout), that account holds at most all workers but one, and the
//! Queues of another account still become Ready. Each account's drift check period shows in its
//! status.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::{AwsAccount, ConditionStatus, Queue};

use super::common::sts::{Sts, external_id};
use super::common::*;
use super::sqs_faults::FaultProxy;
use super::{TIMEOUT, account};

const SLOW: &str = "arn:aws:iam::000000000021:role/slow";
const FAST: &str = "arn:aws:iam::000000000022:role/fast";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_stalled_account_does_not_hold_every_worker() {
    let ns = TestNs::new("acct-fair").await;
    let sts = Sts::start().await;
    sts.trust(SLOW, &external_id(&ns.name));
    sts.trust(FAST, &external_id(&ns.name));
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let stalled = FaultProxy::start(endpoint.trim_start_matches("http://").trim_end_matches('/')).await;
    stalled.set_stall(Some(Duration::from_secs(60)));
    let accounts: Api<AwsAccount> = ns.api();
    let slow = account("slow", SLOW, "eu-west-1", json!({"endpointUrl": stalled.url()}));
    accounts.create(&PostParams::default(), &slow).await.unwrap();
    accounts.create(&PostParams::default(), &account("fast", FAST, "eu-west-1", json!({}))).await.unwrap();
    let settings = fast_settings();
    let workers = usize::from(settings.concurrency);
    let op = Operator::start_with_sts(&ns, settings, &sts, true).await;

    // 32 Queues whose every call takes the 5 s operation timeout: 40 s of work per pass over
    // them with 4 workers, queued before the other account's.
    let queues: Api<Queue> = ns.api();
    for i in 0..32 {
        let slow = queue(&format!("slow-{i}"), json!({"accountRef": {"name": "slow"}}));
        queues.create(&PostParams::default(), &slow).await.unwrap();
    }
    let budget = ("000000000021".to_string(), "eu-west-1".to_string());
    eventually("the stalled account's calls to hold workers", TIMEOUT, || async {
        (op.ctx.gate.load(&budget).0 == workers - 1).then_some(())
    })
    .await;
    for i in 0..3 {
        let fast = queue(&format!("fast-{i}"), json!({"accountRef": {"name": "fast"}}));
        queues.create(&PostParams::default(), &fast).await.unwrap();
    }
    for i in 0..3 {
        let name = format!("fast-{i}");
        wait_ready(&queues, &name, ConditionStatus::True, "Available", Duration::from_secs(15)).await;
    }
    let (in_flight, parked) = op.ctx.gate.load(&budget);
    assert!(in_flight < workers, "the stalled account never holds every worker: {in_flight}");
    assert!(parked > 0, "its other Queues wait for a turn, off the workers");
    assert!(stalled.calls().iter().all(|c| c.queue.contains("slow")), "{:?}", stalled.calls());

    // The fast account's status shows what its 3 Queues get: the flag, far below half its budget.
    eventually("the fast account's drift check period in status", TIMEOUT, || async {
        let status = accounts.get("fast").await.ok()?.status?;
        (status.budget_queues == Some(3)).then_some(status.drift_check_period)
    })
    .await
    .filter(|period| period == "2s")
    .expect("--queue-resync of the test settings");

    // Deleting the namespace deletes every queue through its account, the stalled one answering again.
    stalled.set_stall(None);
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    namespaces.delete(&ns.name, &DeleteParams::default()).await.unwrap();
    eventually("the namespace deleted", Duration::from_secs(120), || async {
        matches!(namespaces.get(&ns.name).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    op.stop().await;
}

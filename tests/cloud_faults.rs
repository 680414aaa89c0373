//! Fault suite, a misbehaving cloud: the real binary talks to SQS through a proxy
//! (`tests/common/sqs_faults.rs`) that fails half the requests (throttling errors, 500s,
//! connection resets, 2 s delays) while Queues are created, edited and deleted. Checks, from the
//! proxy's record of every request: the call rate never exceeds the governor budget set with
//! `--sqs-rate`/`--sqs-burst` (the SDK must not retry behind the limiter's back), no Queue is
//! called again sooner than its error backoff after a failed call, and once the faults stop the
//! backlog drains: every live Queue Ready with its spec in SQS, every deleted one gone. Queues
//! aimed at another tenant's queues (adopt, dead letters; `tests/common/bait.rs`), made while
//! the cloud misbehaves, stay refused, and those queues unchanged (steals counted, as in the
//! crash and two-operator runs): a failed or retried call must not skip the ownership check.
//!
//! CI: 12 Queues, 30 s of faults. Full run (figures in RELIABILITY.md):
//! `SKYPORT_FAULTS_QUEUES=60 SKYPORT_FAULTS_SECONDS=180 cargo test --test integration cloud_faults:: -- --include-ignored --nocapture`

use crate::common;
// Shared with benches/ack.rs, which uses its tagging quota and not its random faults.
#[allow(dead_code)]
use crate::common::sqs_faults;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::bait::{Attempt, Bait};
use common::private_env::{Skyport, audit, setting};
use common::*;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};
use sqs_faults::{Call, FaultProxy};

const RATE: usize = 5;
const BURST: usize = 5;
const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The backoff's jitter takes up to a quarter off.
const SHORTEST_RETRY: Duration = Duration::from_millis(750);
/// Arrival times at the proxy differ from the limiter's admissions: by a few milliseconds on an
/// idle machine, by a few hundred when `tests/run.sh` runs six tests on two cores (the proxy
/// stamps a call once it has read its body). A missing limiter or backoff is off by far more:
/// tens of calls a second, retries within milliseconds.
const JITTER: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn under_throttling_errors_resets_and_slow_answers_the_budget_and_backoff_hold_and_all_converges() {
    let count = setting("SKYPORT_FAULTS_QUEUES", 12) as usize;
    let fault_time = Duration::from_secs(setting("SKYPORT_FAULTS_SECONDS", 30));
    let ns = TestNs::new("faults").await;
    let queues: Api<Queue> = ns.api();
    let cluster = format!("faults-{}", ns.name);
    // Laid directly in LocalStack, not through the faulty proxy.
    let bait = Bait::lay(&format!("bait-{}", ns.name), &ns.name, &cluster).await;
    let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap();
    let proxy = FaultProxy::start(endpoint.trim_start_matches("http://").trim_end_matches('/')).await;
    let args: Vec<String> = [
        "--namespace",
        &ns.name,
        "--cluster-id",
        &cluster,
        "--queue-resync",
        "10s",
        "--error-backoff-min",
        &format!("{}ms", BACKOFF_MIN.as_millis()),
        "--error-backoff-max",
        "8s",
        "--sqs-rate",
        &RATE.to_string(),
        "--sqs-burst",
        &BURST.to_string(),
        "--sqs-tag-rate",
        &RATE.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let skyport = Skyport::spawn(vec![("AWS_ENDPOINT_URL".into(), proxy.url())], &args);

    proxy.set_faulty(true);
    let faults_on = Instant::now();
    let mut live: BTreeMap<String, i32> = BTreeMap::new();
    for i in 0..count {
        let name = format!("q{i}");
        queues.create(&PostParams::default(), &queue(&name, json!({"visibilityTimeoutSeconds": 30}))).await.unwrap();
        live.insert(name, 30);
    }
    // One Queue per bait queue: the early-retry check below goes by SQS queue name, and two
    // Queues calling about the same queue would look like one retrying.
    let mut aimed = BTreeMap::new();
    for (i, attempt) in [Attempt::Adopt, Attempt::DeadLetter].into_iter().cycle().take(bait.queues.len()).enumerate() {
        let (spec, reason) = bait.spec(i, attempt);
        queues.create(&PostParams::default(), &queue(&format!("steal{i}"), spec)).await.unwrap();
        aimed.insert(format!("steal{i}"), reason);
    }
    // Some of them change and some go while the cloud misbehaves.
    tokio::time::sleep(fault_time / 3).await;
    let mut deleted = BTreeSet::new();
    for i in (0..count).step_by(4) {
        let name = format!("q{i}");
        queues.delete(&name, &DeleteParams::default()).await.unwrap();
        live.remove(&name);
        deleted.insert(name);
    }
    for i in (1..count).step_by(4) {
        let name = format!("q{i}");
        let patch = json!({"spec": {"visibilityTimeoutSeconds": 45}});
        queues.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        live.insert(name, 45);
    }
    let settled = Instant::now() + Duration::from_secs(2);
    tokio::time::sleep(fault_time.saturating_sub(faults_on.elapsed())).await;
    proxy.set_faulty(false);
    let faults_off = Instant::now();

    let sqs = sqs().await;
    let converged = eventually("the backlog drains", Duration::from_secs(180), || async {
        let list = queues.list(&ListParams::default()).await.ok()?;
        let by_name: BTreeMap<String, &Queue> =
            list.items.iter().map(|q| (q.metadata.name.clone().unwrap_or_default(), q)).collect();
        for (name, timeout) in &live {
            let q = by_name.get(name)?;
            let status = q.status.as_ref()?;
            if ready(q) != Some((ConditionStatus::True, "Available".into()))
                || status.observed_generation != q.metadata.generation
            {
                return None;
            }
            let attrs = sqs
                .get_queue_attributes()
                .queue_url(status.queue_url.clone()?)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
                .send()
                .await
                .ok()?
                .attributes?;
            (attrs.values().next()? == &timeout.to_string()).then_some(())?;
        }
        let refused = aimed.iter().all(|(n, reason)| {
            by_name.get(n).is_some_and(|q| ready(q) == Some((ConditionStatus::False, reason.to_string())))
        });
        (refused && deleted.iter().all(|n| !by_name.contains_key(n))).then(|| faults_off.elapsed())
    })
    .await;
    let (leaks, duplicates, stuck) = audit(&sqs, &queues, &ns.name).await;
    let steals = bait.steals().await;
    let calls = proxy.calls();
    let above_budget = above_budget(&calls);
    // The Queues the test edited or deleted are acted on at once when that change reaches the
    // operator, which may be seconds later (a reconcile already in flight, queued behind the
    // budget, finishes first, and may fail): their calls say nothing of the backoff.
    let touched: BTreeSet<String> = deleted
        .iter()
        .chain(live.keys())
        .filter(|n| edited_or_deleted(n, count))
        .map(|n| format!("{}_{n}", ns.name))
        .collect();
    let too_soon = retried_too_soon(&calls, settled, &touched);
    let (mut faults, mut operations) = (BTreeMap::<String, usize>::new(), BTreeMap::<&str, usize>::new());
    for c in &calls {
        *faults.entry(c.fault.map_or("none".into(), |f| format!("{f:?}"))).or_default() += 1;
        *operations.entry(c.operation.as_str()).or_default() += 1;
    }
    let panics = skyport.panics();
    println!(
        "misbehaving cloud: {fault_time:?} of faults at 50% ({faults:?}), SQS calls {} {operations:?}, Queues created {count} / edited {} / \
         deleted {}, backlog drained {converged:?} after the faults stopped, leaks {leaks}, duplicates {duplicates}, \
         stuck finalizers {stuck}, refused steals {} (steals {steals}), calls above budget ({RATE}/s, burst {BURST}) \
         {above_budget}, retries sooner than the backoff {too_soon}, panics {panics}",
        calls.len(),
        (1..count).step_by(4).count(),
        deleted.len(),
        aimed.len(),
    );
    assert_eq!((leaks, duplicates, stuck, steals, above_budget, too_soon, panics), (0, 0, 0, 0, 0, 0, 0));

    let _ = queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    eventually("all Queues deleted", Duration::from_secs(60), || async {
        queues.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    assert_eq!(bait.steals().await, 0, "deleting the Queues that aimed at another tenant's queues changed them");
    bait.remove().await;
    skyport.stop().await;
    ns.cleanup().await;
}

/// The most calls any one-second window holds beyond the budget (burst plus one second of rate,
/// with [`JITTER`] of slack for arrival times).
fn above_budget(calls: &[Call]) -> usize {
    let allowed = BURST + RATE * (Duration::from_secs(1) + JITTER).as_millis() as usize / 1000;
    let times: Vec<Instant> = calls.iter().map(|c| c.at).collect();
    let mut worst = 0;
    for (i, start) in times.iter().enumerate() {
        let inside = times[i..].iter().take_while(|t| t.duration_since(*start) < Duration::from_secs(1)).count();
        worst = worst.max(inside.saturating_sub(allowed));
    }
    worst
}

/// Calls for a queue that came sooner than the shortest backoff (less [`JITTER`]) after a failed
/// call for it.
/// Counted only after `settled` and for queues not in `touched` (the test's own edits and
/// deletes wake a Queue at once).
fn retried_too_soon(calls: &[Call], settled: Instant, touched: &BTreeSet<String>) -> usize {
    let mut last_failure: BTreeMap<&str, &Call> = BTreeMap::new();
    let mut too_soon = 0;
    for c in calls {
        if c.queue.is_empty() || touched.contains(&c.queue) {
            continue;
        }
        if let Some(failed) = last_failure.remove(c.queue.as_str())
            && c.at > settled
            && c.at.duration_since(failed.at) < SHORTEST_RETRY.saturating_sub(JITTER)
        {
            // Both calls, so a failure says which path retried early.
            println!(
                "retried too soon: {} {} failed ({:?}), then {} after {:?}",
                failed.queue,
                failed.operation,
                failed.fault,
                c.operation,
                c.at.duration_since(failed.at)
            );
            too_soon += 1;
        }
        if c.fault.is_some_and(|f| f.failed()) {
            last_failure.insert(&c.queue, c);
        }
    }
    too_soon
}

/// Whether the test edits or deletes Queue `name` (`q<i>`: every fourth from 0 is deleted, every
/// fourth from 1 edited).
fn edited_or_deleted(name: &str, count: usize) -> bool {
    name.strip_prefix('q').and_then(|i| i.parse::<usize>().ok()).is_some_and(|i| i < count && i % 4 < 2)
}

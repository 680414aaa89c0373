//! Fault suite, bad input: a table of bad manifests and edits, applied with `kubectl apply` to the
//! real API server while the Queue, Tunnel and Service controllers run in-process. Each one is
//! refused at admission with a message that says what to do, or (what only the controllers can
//! judge) reaches Ready=False with a reason and exactly one Warning Event; a few valid inputs at
//! the edges are served. No panic, no hot loop, and a good Queue and a good Tunnel are served
//! throughout. The figures are printed (`-- --nocapture` shows them).
//!
//! Run: `eval "$(tests/env.sh up)" && cargo test --test integration bad_input:: -- --include-ignored --nocapture`.

use crate::common;
use crate::common::tunnels;

pub mod cases;
mod harness;
pub mod refused;
mod reported;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cases::Expect::*;
use cases::{Case, lb, long, q};
use common::*;
use futures::StreamExt;
use harness::{apply, good_still_served, ready_of, target, warnings};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue, Tunnel};

const TIMEOUT: Duration = Duration::from_secs(60);
/// For every case's outcome together: the Tunnel with 100 ports starts a client with 100 services,
/// which under the whole suite's load (8 tests at once on 2 cores) once took longer than a minute.
const OUTCOMES: Duration = Duration::from_secs(180);

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic outside the test code in this process (the controllers, whichever test
/// started them), then reports it as usual. Other tests share the process: their failed
/// assertions panic in tests/ and are theirs to report.
fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.location().is_some_and(|at| at.file().starts_with("tests/")) {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info)
        }));
    });
}

/// Every case: the admission refusals, then what the controllers report or serve.
fn table(sqs_taken: &str) -> Vec<Case> {
    let mut cases = refused::cases();
    cases.extend(reported::cases(sqs_taken));
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn bad_input_is_refused_or_reported_and_good_objects_keep_being_served() {
    count_panics();
    let ns = TestNs::new("bad-input").await;
    let op = Operator::start(&ns, fast_settings()).await;
    let tun = tunnels::TunnelOperator::start(&ns, tunnels::fast_tunnel_settings()).await;
    // Active needs each Tunnel's client running (as a kubelet would run its Deployment).
    let _kubelet = common::kubelet::AllClients::start(ns.client.clone(), &ns.name);

    // An SQS queue someone else made, which a Queue must not take over.
    let taken = format!("{}-not-ours", ns.name);
    sqs().await.create_queue().queue_name(&taken).send().await.expect("create an unrelated SQS queue");

    apply(&ns.name, &q("good", json!({"visibilityTimeoutSeconds": 30}))).await.unwrap();
    apply(&ns.name, &lb("good-web", json!([{"port": 8080}]))).await.unwrap();
    good_still_served(&ns, "before the bad input").await;

    let cases = table(&taken);
    let tried = cases.len();
    let mut failures = Vec::new();
    let mut watched = Vec::new();
    let (mut refused, mut reported, mut served) = (0, 0, 0);
    let outcomes: Vec<_> = futures::stream::iter(cases)
        .map(|c| {
            let ns_ref = &ns;
            let ns = ns.name.clone();
            async move {
                for b in &c.before {
                    if let Err(e) = apply(&ns, b).await {
                        return (c, Err(format!("setup object refused: {e}")));
                    }
                    // The case's object must find this one in the controller's cache.
                    if b["kind"] == "Queue" {
                        let name = b["metadata"]["name"].as_str().unwrap_or_default();
                        eventually("setup Queue reconciled", TIMEOUT, || ready_of(ns_ref, "Queue", name)).await;
                    }
                }
                let result = apply(&ns, &c.apply).await;
                (c, result)
            }
        })
        .buffer_unordered(6)
        .collect()
        .await;
    for (c, result) in outcomes {
        match (&c.expect, result) {
            (Refused(needles), Err(message)) => {
                refused += 1;
                if let Some(n) = needles.iter().find(|n| !message.contains(**n)) {
                    failures.push(format!("{}: refused, but the message lacks {n:?}: {message}", c.what));
                }
            }
            (Refused(_), Ok(())) => failures.push(format!("{}: accepted, expected a refusal at admission", c.what)),
            (_, Err(message)) => failures.push(format!("{}: refused at admission: {message}", c.what)),
            (expect, Ok(())) => watched.push((c.what, target(&c.apply), expect.clone())),
        }
    }
    good_still_served(&ns, "after the refusals").await;

    // Outcomes in status: all cases together, within OUTCOMES.
    let deadline = tokio::time::Instant::now() + OUTCOMES;
    for (what, (kind, name), expect) in &watched {
        let (ok, last) = loop {
            let last = ready_of(&ns, kind, name).await;
            let done = match (expect, &last) {
                (Reported(reason), Some((s, r, m))) => s == "False" && r == reason && !m.is_empty(),
                (Served, Some((s, _, _))) => s == "True",
                _ => false,
            };
            if done || tokio::time::Instant::now() > deadline {
                break (done, last);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        if !ok {
            failures.push(format!(
                "{what}: {kind} {}: expected {expect:?}, last Ready condition {last:?}",
                &name[..name.len().min(40)]
            ));
        }
    }
    // Give repeated reports time to show, then: exactly one Warning Event per reported case.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (what, (kind, name), expect) in &watched {
        let Reported(reason) = expect else {
            served += 1;
            continue;
        };
        reported += 1;
        let w = warnings(&ns, kind, name).await;
        if w != [(reason.to_string(), 1)] {
            failures.push(format!("{what}: expected exactly one Warning Event {reason}, found (reason, count) {w:?}"));
        }
    }
    // The Queue at the name limit has its ConfigMap.
    let cms: Api<ConfigMap> = ns.api();
    if cms.get(&format!("{}-sqs", long(249))).await.is_err() {
        failures.push("Queue name of 249 characters: no ConfigMap <name>-sqs".into());
    }

    // Nothing spins: with everything settled, reconciles stay near one per object per resync (2 s).
    let objects = watched.len() + 12;
    let before = op.ctx.metrics.reconciles() + tun.ctx.metrics.reconciles();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let per_second = (op.ctx.metrics.reconciles() + tun.ctx.metrics.reconciles() - before) as f64 / 6.0;
    if per_second > objects as f64 {
        failures.push(format!("{per_second:.1} reconciles/s for {objects} objects: something is retried hot"));
    }

    for f in &failures {
        eprintln!("handled badly: {f}");
    }

    // The good objects still follow edits.
    let queues: Api<Queue> = ns.api();
    queues
        .patch("good", &PatchParams::default(), &Patch::Merge(json!({"spec": {"visibilityTimeoutSeconds": 31}})))
        .await
        .unwrap();
    eventually("good Queue converges after an edit", TIMEOUT, || async {
        let g = queues.get("good").await.ok()?;
        (g.status.as_ref()?.observed_generation == g.metadata.generation
            && ready(&g) == Some((ConditionStatus::True, "Available".into())))
        .then_some(())
    })
    .await;
    let tunnels_api: Api<Tunnel> = ns.api();
    apply(&ns.name, &lb("good-web", json!([{"name": "a", "port": 8080}, {"name": "b", "port": 8081}]))).await.unwrap();
    eventually("good Tunnel exposes the new port", TIMEOUT, || async {
        let t = tunnels_api.get("good-web-tunnel").await.ok()?;
        (t.status?.ports.len() == 2).then_some(())
    })
    .await;
    good_still_served(&ns, "at the end").await;

    let panics = PANICS.load(Ordering::SeqCst);
    println!(
        "bad input: tried {tried}, refused at admission {refused}, reported in status {reported}, valid edge cases served {served}, panics {panics}, reconciles/s when settled {per_second:.1}"
    );
    assert!(failures.is_empty(), "{} of {tried} cases handled badly:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(panics, 0, "the controllers panicked");

    let _ = sqs()
        .await
        .delete_queue()
        .queue_url(sqs().await.get_queue_url().queue_name(&taken).send().await.unwrap().queue_url.unwrap())
        .send()
        .await;
    tun_finish(op, tun, ns).await;
}

async fn tun_finish(op: Operator, tun: tunnels::TunnelOperator, ns: TestNs) {
    // The cases' pools are cluster-scoped: they would outlive the namespace.
    let pools: Api<skyport::crd::pool::ExitServerPool> = Api::all(ns.client.clone());
    for pool in pools.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
        let name = pool.metadata.name.unwrap_or_default();
        if name.starts_with("bad-input-") {
            let _ = pools.delete(&name, &Default::default()).await;
        }
    }
    let queues: Api<Queue> = ns.api();
    let _ = queues.delete_collection(&Default::default(), &Default::default()).await;
    eventually("all Queues deleted", TIMEOUT, || async {
        queues.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    op.stop().await;
    tunnels::finish_tunnels(tun, ns).await;
}

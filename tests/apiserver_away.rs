//! Fault suite, the API server goes away: two `skyport run` processes with leader election serve
//! a namespace of a private environment while Queues are created and deleted; kube-apiserver is
//! stopped for longer than the lease (the leader cannot renew: it must exit, and is restarted as
//! a kubelet would) and etcd is killed for a few seconds. Afterwards: watches resumed (every live
//! Queue Ready at its generation, every deleted one gone), no duplicate SQS queue, no lost delete
//! (no queue of a deleted Queue left), no stuck finalizer, and no two processes leading at once
//! (from their logs: acquired → lost/released intervals never overlap).
//!
//! CI: 1 round. Full run (figures in RELIABILITY.md):
//! `SKYPORT_AWAY_ROUNDS=5 cargo test --test integration apiserver_away:: -- --include-ignored --nocapture`

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::private_env::{PrivateEnv, Server, Skyport, audit, setting};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rand::Rng;
use serde_json::{Value, json};
use skyport::crd::{ConditionStatus, Queue};
use tokio::sync::Mutex;

const LEASE: Duration = Duration::from_secs(6);
const REPLICAS: usize = 2;

/// One process's exit code (`None`: still running at the end) and log lines.
type Run = (Option<i32>, Vec<Value>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment (it starts a private one with tests/env.sh)"]
async fn watches_resume_and_leadership_passes_cleanly_when_the_api_server_goes_away() {
    let rounds = setting("SKYPORT_AWAY_ROUNDS", 1);
    let env = Arc::new(PrivateEnv::up("away").await);
    let ns = TestNs::in_cluster(env.client().await, format!("away-{:08x}", rand::random::<u32>())).await;
    let queues: Api<Queue> = ns.api();
    let leases: Api<Lease> = ns.api();
    let args: Vec<String> = [
        "--namespace",
        &ns.name,
        "--leader-elect",
        "--lease-namespace",
        &ns.name,
        &format!("--lease-duration={}s", LEASE.as_secs()),
        "--queue-resync",
        "3s",
        "--error-backoff-min",
        "200ms",
        "--error-backoff-max",
        "2s",
        "--sqs-tag-rate",
        "40",
    ]
    .map(String::from)
    .to_vec();

    // A kubelet of sorts: a process that exits is started again.
    let stop = Arc::new(AtomicBool::new(false));
    let fleet = Arc::new(Mutex::new((0..REPLICAS).map(|_| Skyport::start(&env, &args)).collect::<Vec<_>>()));
    let ended: Arc<Mutex<Vec<Run>>> = Arc::default();
    let supervisor = tokio::spawn({
        let (env, fleet, ended, stop, args) = (env.clone(), fleet.clone(), ended.clone(), stop.clone(), args.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                for slot in fleet.lock().await.iter_mut() {
                    if let Ok(Some(status)) = slot.child.try_wait() {
                        let old = std::mem::replace(slot, Skyport::start(&env, &args));
                        let logs = old.logs.lock().unwrap().clone();
                        ended.lock().await.push((status.code(), logs));
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });

    let workload = tokio::spawn(work(queues.clone(), stop.clone()));
    let (mut apiserver_restarts, mut etcd_stops) = (0, 0);
    let mut last_back = Instant::now();
    for _ in 0..rounds {
        // A leader holds a fresh Lease, then cannot renew it for longer than it lasts.
        eventually("a leader renewing its Lease", Duration::from_secs(120), || async {
            let spec = leases.get("skyport").await.ok()?.spec?;
            let age = Timestamp::now().duration_since(spec.renew_time?.0);
            (spec.holder_identity.is_some() && age.as_secs() < 2).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        env.stop(Server::KubeApiserver, false).await;
        tokio::time::sleep(LEASE + Duration::from_secs(2)).await;
        env.start().await;
        apiserver_restarts += 1;
        tokio::time::sleep(Duration::from_secs(4)).await;
        env.stop(Server::Etcd, true).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        env.start().await;
        etcd_stops += 1;
        last_back = Instant::now();
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (live, deleted, created) = workload.await.unwrap();
    supervisor.await.unwrap();

    let converged = eventually(
        "every live Queue Ready at its generation, every deleted one gone",
        Duration::from_secs(180),
        || async {
            let list = queues.list(&ListParams::default()).await.ok()?;
            let by_name: BTreeMap<String, &Queue> =
                list.items.iter().map(|q| (q.metadata.name.clone().unwrap_or_default(), q)).collect();
            let ready_all = live.iter().all(|n| {
                by_name.get(n).is_some_and(|q| {
                    ready(q) == Some((ConditionStatus::True, "Available".into()))
                        && q.status.as_ref().and_then(|s| s.observed_generation) == q.metadata.generation
                })
            });
            (ready_all && deleted.iter().all(|n| !by_name.contains_key(n))).then(|| last_back.elapsed())
        },
    )
    .await;
    let sqs = env.sqs().await;
    let (leaks, duplicates, stuck) = audit(&sqs, &queues, &ns.name).await;

    let mut runs = std::mem::take(&mut *ended.lock().await);
    for p in std::mem::take(&mut *fleet.lock().await) {
        runs.push((None, p.stop().await));
    }
    let (step_downs, overlaps, takeovers, panics, creates) = leadership(&runs);
    let other_exits = runs.iter().filter(|(code, _)| code.is_some()).count() - step_downs;
    // Why the others exited: their error line (or last line).
    let reasons: BTreeSet<String> = runs
        .iter()
        .filter(|(code, logs)| {
            *code != Some(1) || !logs.iter().any(|l| l.to_string().contains("lost the leader lease"))
        })
        .filter(|(code, _)| code.is_some())
        .filter_map(|(_, logs)| {
            let error = logs.iter().rev().find(|l| l["message"].as_str().is_some_and(|m| m.starts_with("Error:")));
            error.or(logs.last()).map(|l| l["message"].as_str().unwrap_or_default().chars().take(100).collect())
        })
        .collect();
    println!(
        "API server away: kube-apiserver restarts survived {apiserver_restarts} (down {:?} each), etcd kills {etcd_stops}, \
         Queues created {created} / deleted {}, live {}, converged {converged:?} after the last restart, \
         leaks {leaks}, duplicates {duplicates}, stuck finalizers {stuck}; leader step-downs (exit 1, lost the lease) \
         {step_downs}, takeovers {takeovers}, other process exits {other_exits} {reasons:?}, overlapping leaderships {overlaps}, \
         'created SQS queue' logged {creates} times, panics {panics}",
        LEASE + Duration::from_secs(2),
        deleted.len(),
        live.len()
    );
    if leaks > 0 {
        story_of_leaks(&sqs, &queues, &ns.name, &runs).await;
    }
    assert_eq!((leaks, duplicates, stuck, overlaps, panics), (0, 0, 0, 0, 0));
    assert!(step_downs as u64 >= rounds, "a leader that cannot renew for longer than its lease must exit");

    // Clean up with an operator running.
    let skyport = Skyport::start(&env, &args);
    let _ = queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    eventually("all Queues deleted", Duration::from_secs(120), || async {
        queues.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    skyport.stop().await;
    Arc::into_inner(env).expect("no other user of the environment").down().await;
}

/// Creates and deletes Queues until `stop`, retrying each request while the API server is away.
/// Returns (live names, deleted names, Queues created).
async fn work(queues: Api<Queue>, stop: Arc<AtomicBool>) -> (BTreeSet<String>, BTreeSet<String>, usize) {
    let (mut live, mut deleted) = (BTreeSet::new(), BTreeSet::new());
    let mut next = 0;
    while !stop.load(Ordering::Relaxed) {
        let (roll, pick) = (rand::rng().random_range(0..10), rand::rng().random_range(0..live.len().max(1)));
        if live.len() >= 3 && roll < 4 {
            let name: String = live.iter().nth(pick).cloned().unwrap();
            // A 404 means an earlier attempt that seemed to fail went through.
            until_ok(|| async {
                match queues.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => true,
                    Err(kube::Error::Api(e)) => e.code == 404,
                    Err(_) => false,
                }
            })
            .await;
            live.remove(&name);
            deleted.insert(name);
        } else {
            let name = format!("q{next}");
            next += 1;
            let q = queue(&name, json!({"visibilityTimeoutSeconds": 30}));
            until_ok(|| async {
                match queues.create(&PostParams::default(), &q).await {
                    Ok(_) => true,
                    Err(kube::Error::Api(e)) => e.code == 409,
                    Err(_) => false,
                }
            })
            .await;
            live.insert(name);
        }
        let pause = Duration::from_millis(rand::rng().random_range(100..400));
        tokio::time::sleep(pause).await;
    }
    (live, deleted, next)
}

/// Prints, for each leaked queue, every log line of every process that names it, in time order
/// with the process's index: which leader created it, and when, against when its Queue went.
async fn story_of_leaks(sqs: &aws_sdk_sqs::Client, queues: &Api<Queue>, ns: &str, runs: &[Run]) {
    let live: BTreeSet<String> = queues
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|q| q.metadata.uid)
        .collect();
    let owners = common::private_env::queues_by_owner(sqs, ns).await;
    for url in owners.iter().filter(|(uid, _)| !live.contains(*uid)).flat_map(|(_, urls)| urls) {
        let name = url.rsplit('/').next().unwrap_or_default();
        // The queue's URL, or the span of its Queue (named after the part past `<ns>_`).
        let span = format!("\"name\":\"{}\"", name.strip_prefix(&format!("{ns}_")).unwrap_or(name));
        let mut lines: Vec<(String, usize, String)> = runs
            .iter()
            .enumerate()
            .flat_map(|(i, (_, logs))| logs.iter().map(move |l| (i, l)))
            .filter(|(_, l)| l.to_string().contains(name) || l.to_string().contains(&span))
            .map(|(i, l)| (l["timestamp"].as_str().unwrap_or_default().to_string(), i, l.to_string()))
            .collect();
        lines.sort();
        println!("leaked {url}: {} log lines name it", lines.len());
        for (_, process, line) in lines {
            println!("  process {process}: {}", line.chars().take(400).collect::<String>());
        }
    }
}

async fn until_ok<F: Future<Output = bool>>(mut f: impl FnMut() -> F) {
    while !f().await {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// From every process's logs: (step-downs, overlapping leaderships, takeovers, panics, queue
/// creations logged). A leadership runs from "acquired the leader lease" to "lost the leader
/// lease" or "released the leader lease", or to the last line of a process that was killed.
fn leadership(runs: &[Run]) -> (usize, usize, usize, usize, usize) {
    let at = |l: &Value| l["timestamp"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
    let says = |l: &Value, m: &str| l["message"].as_str().is_some_and(|s| s.starts_with(m));
    let mut terms = Vec::new();
    let (mut step_downs, mut panics, mut creates) = (0, 0, 0);
    for (code, logs) in runs {
        let lost = logs.iter().any(|l| says(l, "lost the leader lease"));
        if lost && *code == Some(1) {
            step_downs += 1;
        }
        panics += logs.iter().filter(|l| l.to_string().contains("panicked")).count();
        creates += logs.iter().filter(|l| says(l, "created SQS queue")).count();
        let Some(start) = logs.iter().find(|l| says(l, "acquired the leader lease")).and_then(at) else { continue };
        let end = logs
            .iter()
            .find(|l| says(l, "lost the leader lease") || says(l, "released the leader lease"))
            .or(logs.iter().rev().find(|l| at(l).is_some()))
            .and_then(at)
            .unwrap_or(start);
        terms.push((start, end));
    }
    terms.sort();
    let overlaps = terms.windows(2).filter(|w| w[1].0 < w[0].1).count();
    (step_downs, overlaps, terms.len().saturating_sub(1), panics, creates)
}

//! Fault suite, crashes: the real binary (`skyport run`) is killed with SIGKILL at seeded random
//! points while Queues are created, edited and deleted, and restarted each time. Afterwards:
//! every live Queue is Ready with its latest spec in SQS, exactly one SQS queue per live Queue,
//! no SQS queue owned by a deleted Queue (no leak), no Queue stuck on its finalizer, no panic.
//! The figures and the seed are printed; `SKYPORT_CRASH_SEED` replays a run.
//!
//! CI runs a small loop. The full run (figures in RELIABILITY.md):
//! `SKYPORT_CRASH_KILLS=50 SKYPORT_CRASH_OPS=400 cargo test --test crash -- --include-ignored --nocapture`

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::process::{Lines, panics, spawn_operator};
use common::*;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};
use tokio::process::Child;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One operator process; its output is kept to look for panics.
fn start(ns: &str, output: &Lines) -> Child {
    let args = ["--namespace", ns, "--listen-address", "127.0.0.1:0", "--log-format", "json"];
    let fast = ["--queue-resync", "3s", "--error-backoff-min", "200ms", "--error-backoff-max", "2s"];
    let budget = ["--recently-deleted-retry", "5s", "--sqs-rate", "50", "--sqs-burst", "100"];
    let all: Vec<&str> = args.into_iter().chain(fast).chain(budget).collect();
    spawn_operator(&all, &[("RUST_LOG", "warn")], output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigkill_at_random_points_loses_leaks_and_duplicates_nothing() {
    let kills = setting("SKYPORT_CRASH_KILLS", 4);
    let ops = setting("SKYPORT_CRASH_OPS", 24);
    let seed = setting("SKYPORT_CRASH_SEED", rand::random::<u32>().into());
    println!("crash loop: seed {seed} (SKYPORT_CRASH_SEED={seed} replays it), {kills} kills, {ops} operations");
    let mut rng = StdRng::seed_from_u64(seed);
    let ns = TestNs::new("crash").await;
    let queues: Api<Queue> = ns.api();
    let output = Lines::default();

    // name → the visibility timeout last written to its spec; plus the names deleted.
    let mut live: BTreeMap<String, i32> = BTreeMap::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    let (mut created, mut edited, mut removed, mut next) = (0u64, 0u64, 0u64, 0u64);
    let per_round = ops.div_ceil(kills + 1);
    let started = Instant::now();
    for round in 0..=kills {
        let mut child = start(&ns.name, &output);
        for _ in 0..per_round {
            let choice = rng.random_range(0..10);
            if live.len() < 3 || choice < 5 {
                let name = format!("q{next}");
                next += 1;
                let timeout = rng.random_range(10..100);
                queues
                    .create(&PostParams::default(), &queue(&name, json!({"visibilityTimeoutSeconds": timeout})))
                    .await
                    .unwrap();
                live.insert(name, timeout);
                created += 1;
            } else if choice < 8 {
                let name = live.keys().nth(rng.random_range(0..live.len())).unwrap().clone();
                let timeout = rng.random_range(10..100);
                let patch = json!({"spec": {"visibilityTimeoutSeconds": timeout}});
                queues.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
                live.insert(name, timeout);
                edited += 1;
            } else {
                let name = live.keys().nth(rng.random_range(0..live.len())).unwrap().clone();
                queues.delete(&name, &DeleteParams::default()).await.unwrap();
                live.remove(&name);
                deleted.insert(name);
                removed += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..150))).await;
        }
        if round < kills {
            // Somewhere in the middle of the work those operations started.
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..1500))).await;
            child.start_kill().unwrap();
            let _ = child.wait().await;
        } else {
            // The last process stays and must converge everything.
            let converged = converge(&queues, &live, &deleted).await;
            let elapsed = started.elapsed();
            let (leaks, duplicates, missing) = audit(&ns.name, &queues, &live).await;
            let _ = child.start_kill();
            let _ = child.wait().await;
            let panics = panics(&output);
            let stuck = queues
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|q| q.metadata.deletion_timestamp.is_some())
                .count();
            println!(
                "crash loop: kills survived {kills}, Queues created {created} / edited {edited} / deleted {removed}, live {}, \
                 converged after the last restart in {converged:?} (whole run {elapsed:?}), leaks {leaks}, duplicates {duplicates}, \
                 missing {missing}, stuck finalizers {stuck}, panics {panics}",
                live.len()
            );
            assert_eq!((leaks, duplicates, missing, stuck, panics), (0, 0, 0, 0, 0), "seed {seed}");
        }
    }
    // Clean up with an operator running.
    let mut child = start(&ns.name, &output);
    let _ = queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    eventually("all Queues deleted", Duration::from_secs(60), || async {
        queues.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    ns.cleanup().await;
}

/// Waits until every live Queue is Ready at its latest generation and every deleted one is gone.
async fn converge(queues: &Api<Queue>, live: &BTreeMap<String, i32>, deleted: &BTreeSet<String>) -> Duration {
    let since = Instant::now();
    eventually(
        "every live Queue Ready at its generation, every deleted one gone",
        Duration::from_secs(120),
        || async {
            let list = queues.list(&ListParams::default()).await.ok()?;
            let by_name: BTreeMap<String, &Queue> =
                list.items.iter().map(|q| (q.metadata.name.clone().unwrap(), q)).collect();
            let all_ready = live.keys().all(|n| {
                by_name.get(n).is_some_and(|q| {
                    ready(q) == Some((ConditionStatus::True, "Available".into()))
                        && q.status.as_ref().and_then(|s| s.observed_generation) == q.metadata.generation
                })
            });
            let all_gone = deleted.iter().all(|n| !by_name.contains_key(n));
            (all_ready && all_gone).then_some(())
        },
    )
    .await;
    since.elapsed()
}

/// SQS queues of this namespace by owner: (leaked, duplicated, live Queues without a queue or
/// with a stale attribute).
async fn audit(ns: &str, queues: &Api<Queue>, live: &BTreeMap<String, i32>) -> (usize, usize, usize) {
    let sqs = sqs().await;
    let owners: BTreeMap<String, usize> =
        common::private_env::queues_by_owner(&sqs, ns).await.into_iter().map(|(uid, urls)| (uid, urls.len())).collect();
    let mut live_uids = BTreeSet::new();
    let mut missing = 0;
    for (name, timeout) in live {
        let q = queues.get(name).await.unwrap();
        let uid = q.metadata.uid.clone().unwrap();
        let url = q.status.and_then(|s| s.queue_url).unwrap_or_default();
        let current =
            if url.is_empty() { None } else { attributes(&sqs, &url).await.get("VisibilityTimeout").cloned() };
        if owners.get(&uid).copied().unwrap_or_default() == 0 || current != Some(timeout.to_string()) {
            missing += 1;
        }
        live_uids.insert(uid);
    }
    let leaks = owners.iter().filter(|(uid, _)| !live_uids.contains(*uid)).map(|(_, n)| n).sum();
    let duplicates = owners.iter().filter(|(uid, _)| live_uids.contains(*uid)).map(|(_, n)| n - 1).sum();
    (leaks, duplicates, missing)
}

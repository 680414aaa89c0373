//! Fault suite, crashes: the real binary (`skyport run --provider local`) serving Queues and
//! Tunnels together is killed with SIGKILL at seeded random points while Queues and LoadBalancer
//! Services are created, edited and deleted, and restarted each time. The exit servers are real
//! `skyport tunnel server` processes that outlive the operator, as VMs would. Afterwards, with
//! every tunnel client running: every live Queue is Ready with its latest spec in SQS, exactly
//! one SQS queue per live Queue and none owned by a deleted one; every live Service's Tunnel is
//! Active and its ingress carries bytes to the Service's current port, exactly one exit server
//! per live Tunnel and none without one once the orphan sweep ran; no finalizer stuck, no panic;
//! and no steal: Queues created along the way to adopt, or send dead letters to, queues of another
//! namespace, another cluster or made outside skyport stay refused, and those queues unchanged.
//! The figures and the seed are printed; `SKYPORT_CRASH_SEED` replays a run.
//!
//! CI runs a small loop. The full run (figures in RELIABILITY.md; ~200 Queues and ~20 Tunnels):
//! `SKYPORT_CRASH_KILLS=10 SKYPORT_CRASH_OPS=400 SKYPORT_CRASH_TUNNEL_OPS=40 cargo test --test integration crash:: -- --include-ignored --nocapture`

use crate::common;
use crate::common::crash;

use std::time::{Duration, Instant};

use common::private_env::setting;
use common::process::{Lines, panics, spawn_operator};
use common::*;
use crash::{QueueAudit, Queues, Tunnels};
use providers::local::{LocalProvider, LocalSettings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::Child;

/// One operator process serving Queues, Services and Tunnels of `ns` (local provider), with
/// short resyncs and backoffs so a run converges quickly; its output is kept to look for panics.
fn start(ns: &str, cluster: &str, state: &str, output: &Lines) -> Child {
    let args = ["--namespace", ns, "--listen-address", "127.0.0.1:0", "--log-format", "json"];
    let queues = ["--queue-resync", "3s", "--error-backoff-min", "200ms", "--error-backoff-max", "2s"];
    let budget = ["--recently-deleted-retry", "5s", "--sqs-rate", "50", "--sqs-burst", "100", "--sqs-tag-rate", "50"];
    let tunnels = ["--provider", "local", "--cluster-id", cluster, "--local-state-dir", state];
    let fast = ["--tunnel-resync", "2s", "--tunnel-error-backoff-min", "200ms", "--tunnel-error-backoff-max", "2s"];
    let sweep = ["--orphan-sweep-interval", "4s", "--service-error-backoff-min", "200ms"];
    let all: Vec<&str> = [&args[..], &queues, &budget, &tunnels, &fast, &sweep].concat();
    spawn_operator(&all, &[("RUST_LOG", "warn")], output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigkill_at_random_points_loses_leaks_and_duplicates_nothing() {
    let kills = setting("SKYPORT_CRASH_KILLS", 3);
    let queue_ops = setting("SKYPORT_CRASH_OPS", 24);
    let tunnel_ops = setting("SKYPORT_CRASH_TUNNEL_OPS", 12);
    let seed = setting("SKYPORT_CRASH_SEED", rand::random::<u32>().into());
    println!(
        "crash loop: seed {seed} (SKYPORT_CRASH_SEED={seed} replays it), {kills} kills, {queue_ops} Queue and \
         {tunnel_ops} Service operations"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let ns = TestNs::new("crash").await;
    let cluster = format!("crash-{}", ns.name);
    let state = std::env::temp_dir().join(format!("skyport-crash-hosts-{}", ns.name));
    let state_arg = state.to_string_lossy().into_owned();
    let local = LocalProvider::new(LocalSettings::new(&state, common::kubelet::skyport_exe())).unwrap();
    // Another tenant's queues, which the churn keeps trying to adopt or send dead letters to.
    let bait = common::bait::Bait::lay(&format!("bait-{}", ns.name), &ns.name, &cluster).await;
    let mut queues = Queues::new(ns.api()).with_bait(bait);
    let mut tunnels = Tunnels::new(ns.api(), ns.api());
    let output = Lines::default();

    let (queue_round, tunnel_round) = (queue_ops.div_ceil(kills + 1), tunnel_ops.div_ceil(kills + 1));
    let started = Instant::now();
    let mut child = start(&ns.name, &cluster, &state_arg, &output);
    for round in 0..=kills {
        // The two workloads interleaved, as teams sharing one operator would write them.
        for i in 0..queue_round.max(tunnel_round) {
            if i < queue_round {
                queues.step(&mut rng).await;
            }
            if i < tunnel_round {
                tunnels.step(&mut rng).await;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..150))).await;
        }
        if round < kills {
            // Somewhere in the middle of the work those operations started.
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..3000))).await;
            child.start_kill().unwrap();
            let _ = child.wait().await;
            child = start(&ns.name, &cluster, &state_arg, &output);
        }
    }

    // The last process stays and must converge everything.
    let (queue_time, (_clients, carried, tunnel_time)) = tokio::join!(
        queues.converge(Duration::from_secs(120)),
        tunnels.converge(&ns.client, &ns.name, Duration::from_secs(150)),
    );
    // Exit servers by owner, once a sweep ran after the last restart.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let q = queues.audit(&ns.name).await;
    let t = tunnels.audit(&local, &cluster).await;
    let panics = panics(&output);
    println!(
        "crash loop: kills survived {kills}; Queues created {} / edited {} / deleted {}, live {}, converged after the last \
         restart in {queue_time:?}, leaks {}, duplicates {}, missing {}, stuck finalizers {}, refused steals {} (steals {}); \
         Services created {} / edited {} \
         / deleted {}, live {} (carrying bytes {carried}), converged in {tunnel_time:?}, exit servers {}, leaks {}, \
         duplicates {}, stuck finalizers {}; panics {panics}; whole run {:?}",
        queues.counts.created,
        queues.counts.edited,
        queues.counts.deleted,
        queues.live.len(),
        q.leaks,
        q.duplicates,
        q.missing,
        q.stuck,
        queues.refused.len(),
        q.steals,
        tunnels.counts.created,
        tunnels.counts.edited,
        tunnels.counts.deleted,
        tunnels.live.len(),
        t.hosts,
        t.leaks,
        t.duplicates,
        t.stuck,
        started.elapsed(),
    );
    assert_eq!(q, QueueAudit { leaks: 0, duplicates: 0, missing: 0, stuck: 0, steals: 0 }, "seed {seed}");
    assert_eq!(
        (t.leaks, t.duplicates, t.stuck, panics),
        (0, 0, 0, 0),
        "seed {seed}; exit servers per Tunnel: {:?}",
        t.per_owner
    );

    // Clean up with the operator running: every SQS queue and exit server goes with its owner.
    queues.remove_all().await;
    queues.remove_bait().await;
    let left = tunnels.remove_all(&local, &cluster).await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    assert!(left.is_empty(), "exit servers left after every Tunnel was deleted: {left:?}");
    ns.cleanup().await;
}

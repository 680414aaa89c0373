//! Fault suite, crashes with Tunnels: the real binary (`skyport run --provider local`) is killed
//! with SIGKILL at seeded random points while LoadBalancer Services are created, edited (their
//! port) and deleted, and restarted each time. The exit servers are real `skyport tunnel server`
//! processes that outlive the operator, as VMs would. Afterwards, with every client Deployment
//! running: every live Service's Tunnel is Active, its ingress carries bytes to the Service's
//! current port, exactly one exit server per live Tunnel, none without one once the orphan sweep
//! ran (no leak), no Tunnel stuck on its finalizer, no panic. `SKYPORT_CRASH_SEED` replays a run.
//!
//! CI runs a small loop. The full run (figures in RELIABILITY.md):
//! `SKYPORT_CRASH_KILLS=10 SKYPORT_CRASH_OPS=60 cargo test --test crash_tunnels -- --include-ignored --nocapture`

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::kubelet::{Backends, ClientRunner, tcp_echo};
use common::process::{Lines, panics, spawn_operator};
use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use providers::HostProvider;
use providers::hosts::{TAG_CLUSTER, TAG_TUNNEL_UID};
use providers::local::{LocalProvider, LocalSettings};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use skyport::crd::{Tunnel, TunnelPhase};
use tokio::process::Child;

const CONVERGE: Duration = Duration::from_secs(150);

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One operator process serving Services and Tunnels of `ns` with the local provider.
fn start(ns: &str, cluster: &str, state: &str, output: &Lines) -> Child {
    let args = ["--namespace", ns, "--listen-address", "127.0.0.1:0", "--log-format", "json"];
    let tunnels = ["--provider", "local", "--cluster-id", cluster, "--local-state-dir", state];
    let fast = ["--tunnel-resync", "2s", "--tunnel-error-backoff-min", "200ms", "--tunnel-error-backoff-max", "2s"];
    let sweep = ["--orphan-sweep-interval", "4s", "--service-error-backoff-min", "200ms"];
    let all: Vec<&str> = args.into_iter().chain(tunnels).chain(fast).chain(sweep).collect();
    spawn_operator(&all, &[("RUST_LOG", "warn")], output)
}

fn service(name: &str, port: u16) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": [{"port": port}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn sigkill_with_tunnels_leaks_and_duplicates_no_exit_server() {
    let kills = setting("SKYPORT_CRASH_KILLS", 3);
    let ops = setting("SKYPORT_CRASH_OPS", 12);
    let seed = setting("SKYPORT_CRASH_SEED", rand::random::<u32>().into());
    println!("tunnel crash loop: seed {seed} (SKYPORT_CRASH_SEED={seed} replays it), {kills} kills, {ops} operations");
    let mut rng = StdRng::seed_from_u64(seed);
    let ns = TestNs::new("crash-tun").await;
    let cluster = format!("crash-{}", ns.name);
    let state = std::env::temp_dir().join(format!("skyport-crash-hosts-{}", ns.name));
    let state_arg = state.to_string_lossy().into_owned();
    let local = LocalProvider::new(LocalSettings::new(&state, common::kubelet::skyport_exe())).unwrap();
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let output = Lines::default();

    // Service name → its current port; plus the names deleted.
    let mut live: BTreeMap<String, u16> = BTreeMap::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    let (mut created, mut edited, mut removed, mut next) = (0u64, 0u64, 0u64, 0u64);
    let per_round = ops.div_ceil(kills + 1);
    let started = Instant::now();
    let mut child = start(&ns.name, &cluster, &state_arg, &output);
    for round in 0..=kills {
        for _ in 0..per_round {
            let choice = rng.random_range(0..10);
            let port = rng.random_range(20000..30000);
            if live.len() < 2 || choice < 5 {
                let name = format!("web{next}");
                next += 1;
                services.create(&PostParams::default(), &service(&name, port)).await.unwrap();
                live.insert(name, port);
                created += 1;
            } else if choice < 8 {
                let name = live.keys().nth(rng.random_range(0..live.len())).unwrap().clone();
                let patch = json!({"spec": {"ports": [{"port": port}]}});
                services.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
                live.insert(name, port);
                edited += 1;
            } else {
                let name = live.keys().nth(rng.random_range(0..live.len())).unwrap().clone();
                services.delete(&name, &DeleteParams::default()).await.unwrap();
                live.remove(&name);
                deleted.insert(name);
                removed += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        }
        if round < kills {
            // Somewhere in the middle of the exit servers being created, reconfigured, deleted.
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..3000))).await;
            child.start_kill().unwrap();
            let _ = child.wait().await;
            child = start(&ns.name, &cluster, &state_arg, &output);
        }
    }

    // The last process stays; the clients run, as the kubelet would have run them all along.
    let backends = Backends::default();
    let _clients: Vec<ClientRunner> = live
        .keys()
        .map(|s| ClientRunner::start(ns.client.clone(), &ns.name, &format!("{s}-tunnel-client"), backends.clone()))
        .collect();
    let since = Instant::now();
    let carried =
        eventually("every live Tunnel Active and carrying bytes, every deleted one gone", CONVERGE, || async {
            let list = tunnels.list(&ListParams::default()).await.ok()?;
            let by_name: BTreeMap<String, &Tunnel> =
                list.items.iter().map(|t| (t.metadata.name.clone().unwrap(), t)).collect();
            if deleted.iter().any(|s| by_name.contains_key(&format!("{s}-tunnel"))) {
                return None;
            }
            let mut carried = 0;
            for (svc, port) in &live {
                let t = by_name.get(&format!("{svc}-tunnel"))?;
                let status = t.status.as_ref()?;
                if status.phase != Some(TunnelPhase::Active) {
                    return None;
                }
                let ip = services.get(svc).await.ok()?.status?.load_balancer?.ingress?.first()?.ip.clone()?;
                let (tag, echoed) = tcp_echo(&ip, *port, b"crash").await?;
                (tag == *port && echoed == b"crash").then_some(())?;
                carried += 1;
            }
            Some(carried)
        })
        .await;
    let converged = since.elapsed();

    // Exit servers by owner, once a sweep ran after the last restart.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let live_uids: BTreeSet<String> = tunnels
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|t| t.metadata.uid.clone())
        .collect();
    let hosts = local.list_by_tag(TAG_CLUSTER, &cluster).await.unwrap();
    let mut per_owner: BTreeMap<String, usize> = BTreeMap::new();
    for h in &hosts {
        *per_owner.entry(h.tags.get(TAG_TUNNEL_UID).cloned().unwrap_or_default()).or_default() += 1;
    }
    let leaks: usize = per_owner.iter().filter(|(uid, _)| !live_uids.contains(*uid)).map(|(_, n)| n).sum();
    let duplicates: usize = per_owner.iter().filter(|(uid, _)| live_uids.contains(*uid)).map(|(_, n)| n - 1).sum();
    let stuck = tunnels
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_some())
        .count();
    let panics = panics(&output);
    println!(
        "tunnel crash loop: kills survived {kills}, Services created {created} / edited {edited} / deleted {removed}, \
         live {} (carrying bytes {carried}), converged after the last restart in {converged:?} (whole run {:?}), \
         exit servers {}, leaks {leaks}, duplicates {duplicates}, stuck finalizers {stuck}, panics {panics}",
        live.len(),
        started.elapsed(),
        hosts.len()
    );
    assert_eq!((leaks, duplicates, stuck, panics), (0, 0, 0, 0), "seed {seed}; exit servers per Tunnel: {per_owner:?}");

    // Clean up with the operator running: every exit server goes with its Tunnel.
    let _ = services.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
    eventually("all Tunnels deleted", Duration::from_secs(60), || async {
        tunnels.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    let left = local.list_by_tag(TAG_CLUSTER, &cluster).await.unwrap();
    let _ = child.start_kill();
    let _ = child.wait().await;
    for h in &left {
        let _ = local.delete(&h.id).await;
    }
    assert!(left.is_empty(), "exit servers left after every Tunnel was deleted: {left:?}");
    ns.cleanup().await;
}

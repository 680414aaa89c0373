//! `--failover`: what a client of a highly available Tunnel sees when a machine goes, on the test
//! node (local provider; the tunnel clients are Pods of skyport's image, the backend a Pod behind
//! kube-proxy; tests/node/pair.rs). A request (a fresh TCP connection, 4 bytes echoed, 1 s
//! allowed) goes to the reserved address every 100 ms while one of these happens:
//! - **exit server killed**: the active exit server's process gets SIGKILL;
//! - **exit server hung**: the active exit server's process gets SIGSTOP (SIGCONT once measured):
//!   it keeps its sockets and the provider reports it running, so only its checks, timing out,
//!   find it;
//! - **client Pod gone**: the active server's client Pod is deleted and kept from starting again
//!   (the namespace's Pod quota), as when its node dies;
//! - **planned roll**: a port added to the Service, so both clients roll for the new config;
//! - **operator and client Pod gone together**: the operator (holding its leader Lease) is killed
//!   and the active server's client Pod goes with it, as when the node running both dies. A warm
//!   standby (watches running, acting gated on the Lease, as `skyport run --leader-elect` waits)
//!   takes the Lease once it expires (`--lease-duration`, 15 s by default) and moves the address
//!   as any leader does: after the active server failed its checks.
//!
//! Per fault: when the address was on the other server, the longest time between two answered
//! requests, and the requests not answered. The peer a user would pick instead, the tailscale
//! operator's HA proxies, is reported by its users to lose traffic for about ten minutes when a
//! node dies; that figure is quoted, not measured here.
//!
//! Figures only: the exit status is non-zero only when the Tunnel never recovers.

use anyhow::bail;

use super::median;
use crate::common::standby::Standby;
use crate::common::tunnels;
use crate::node::pair::Pair;

const FAULTS: [&str; 5] = [
    "exit server killed",
    "exit server hung (SIGSTOP)",
    "client Pod gone",
    "planned roll of both clients",
    "operator and client Pod gone together",
];
/// The hung server's fault.
const HUNG: usize = 1;
/// The planned one: no failed request is the target.
const PLANNED: usize = 3;
/// The operator killed with the client Pod.
const OPERATOR: usize = 4;
/// About ten minutes: the traffic loss users report for the tailscale operator's HA proxies.
const PEER_GAP: f64 = 600.0;

/// (address on the other server, longest gap, requests failed, requests sent) of one fault.
struct Sample {
    moved: f64,
    gap: f64,
    failed: usize,
    sent: usize,
}

async fn once(fault: usize) -> anyhow::Result<Sample> {
    let Some(pair) = Pair::start("bench-ha").await else {
        bail!("the failover benchmark needs the test node (tests/env.sh up as root, without SKYPORT_NODE=0)")
    };
    let standby = match fault {
        OPERATOR => Some(Standby::start(&pair.ns, &pair.op, Vec::new()).await?),
        _ => None,
    };
    let m = pair
        .measure(
            async |p| match fault {
                0 => tunnels::kill_exit_server(&p.op, &p.active),
                HUNG => tunnels::signal_exit_server(&p.op, &p.active, "STOP"),
                2 => p.stop_client(p.active_slot().await).await,
                PLANNED => p.add_port().await,
                _ => {
                    standby.as_ref().expect("the standby").lose_leader();
                    p.op.kill();
                    p.stop_client(p.active_slot().await).await;
                }
            },
            fault == PLANNED,
        )
        .await;
    if fault == HUNG {
        tunnels::signal_exit_server(&pair.op, &pair.active, "CONT");
    }
    // The node stays this benchmark's until the pair is gone (its guard drops with it).
    let Pair { ns, op, .. } = pair;
    match standby {
        Some(standby) => {
            tunnels::finish_tunnels(standby.into_operator(), ns).await;
            op.stop().await;
        }
        None => tunnels::finish_tunnels(op, ns).await,
    }
    let (moved, gap) = (m.moved_after.as_secs_f64(), m.gap.as_secs_f64());
    Ok(Sample { moved, gap, failed: m.sent - m.answered, sent: m.sent })
}

/// `hung_only`: the hung exit server alone.
pub async fn run(runs: usize, hung_only: bool) -> anyhow::Result<()> {
    let mut samples: Vec<Vec<Sample>> = (0..FAULTS.len()).map(|_| Vec::new()).collect();
    for run in 0..runs {
        for (fault, name) in FAULTS.iter().enumerate().filter(|(fault, _)| !hung_only || *fault == HUNG) {
            let sample = once(fault).await?;
            println!(
                "run {}: {name}: address moved after {:.2} s; longest gap {:.2} s; {} of {} requests failed",
                run + 1,
                sample.moved,
                sample.gap,
                sample.failed,
                sample.sent
            );
            samples[fault].push(sample);
        }
    }
    println!("\nfailover of a highly available Tunnel (local provider on the test node), medians of {runs} run(s):");
    println!(
        "| Fault | Address moved after | Longest gap without an answer | Requests failed | Gap / the peer's ~600 s |"
    );
    println!("|---|---|---|---|---|");
    for (fault, name) in FAULTS.iter().enumerate().filter(|(fault, _)| !samples[*fault].is_empty()) {
        let list = &samples[fault];
        let moved = median(&mut list.iter().map(|s| s.moved).collect::<Vec<_>>());
        let gap = median(&mut list.iter().map(|s| s.gap).collect::<Vec<_>>());
        let failed: Vec<String> = list.iter().map(|s| format!("{} of {}", s.failed, s.sent)).collect();
        let ratio = if fault == PLANNED {
            "(planned: target 0 failed)".to_string()
        } else {
            format!("{:.4} ×", gap / PEER_GAP)
        };
        println!("| {name} | {moved:.2} s | {gap:.2} s | {} | {ratio} |", failed.join(", "));
    }
    Ok(())
}

//! `--guest --failover`: what a client of a highly available Tunnel on booted guests sees when a
//! machine goes (the `guest` provider; tests/common/guest_pair.rs): a request (a fresh TCP
//! connection, 4 bytes echoed, 1 s allowed) goes to the reserved address every 100 ms while one
//! of these happens to the active guest's side:
//! - **powered off**: the guest shuts down in order;
//! - **killed**: SIGKILL to every process of the guest, as when its host dies (its exit server
//!   closes nothing);
//! - **exit server hung**: SIGSTOP to the exit server inside the guest (SIGCONT once measured):
//!   the guest runs and the server's sockets stay open, so only its checks find it;
//! - **client gone**: the active server's client killed and never started again, as when its
//!   node dies;
//! - **operator and client gone together**: the operator (holding its leader Lease) killed with
//!   that client; a warm standby takes the Lease once it expires (15 s) and moves the address
//!   (`common::standby`).
//!
//! Per run and fault: when the address was on the other guest (this machine's route to it
//! re-pointed), the longest time between two answered requests, and the requests not answered.
//! The tailscale operator's ~10 minutes (`tunnel/failover.rs`) is quoted, not measured.
//!
//! Figures only. Needs root, `SKYPORT_GUEST_ROOTFS` (tests/env/build-guest.sh) and the static
//! build (`SKYPORT_GUEST_EXE`, tests/env/build-musl.sh).

use super::median;
use crate::common::guest;
use crate::common::guest_pair::{GuestPair, PowerOff};
use crate::common::standby::Standby;

/// About ten minutes: the traffic loss users report for the tailscale operator's HA proxies.
const PEER_GAP: f64 = 600.0;

const FAULTS: [&str; 5] = [
    "active guest powered off",
    "active guest killed",
    "active exit server hung (SIGSTOP)",
    "active server's client gone",
    "operator and active client gone together",
];

/// One run of fault `fault` on a fresh pair.
async fn once(fault: usize, rootfs: &std::path::Path, exe: &std::path::Path) -> anyhow::Result<PowerOff> {
    let pair = GuestPair::start("bench-guest-ha", rootfs, exe).await;
    let standby = match fault {
        4 => Some(Standby::start(&pair.ns, &pair.op, vec![pair.guests.clone()]).await?),
        _ => None,
    };
    let m = match fault {
        0 => pair.power_off(&pair.active).await,
        1 => pair.kill(&pair.active).await,
        2 => pair.measure(&pair.active, async |p| p.signal_server(&p.active, "STOP")).await,
        3 => pair.measure(&pair.active, async |p| p.stop_active_client().await).await,
        _ => {
            pair.measure(&pair.active, async |p| {
                standby.as_ref().expect("the standby").lose_leader();
                p.op.kill();
                p.stop_active_client().await;
            })
            .await
        }
    };
    if fault == 2 {
        pair.signal_server(&pair.active, "CONT");
    }
    match standby {
        Some(standby) => pair.finish_with(standby.into_operator()).await,
        None => pair.finish().await,
    }
    Ok(m)
}

pub async fn run(runs: usize) -> anyhow::Result<()> {
    let rootfs = guest::available().map_err(|why| anyhow::anyhow!("cannot boot guests here: {why}"))?;
    let exe = guest::guest_exe();
    // Per fault: (moved after, longest gap, "failed of sent").
    let mut samples: [Vec<(f64, f64, String)>; 5] = Default::default();
    for run in 0..runs {
        for (fault, name) in FAULTS.iter().enumerate() {
            let m = once(fault, &rootfs, &exe).await?;
            let (after, gap) = (m.moved_after.as_secs_f64(), m.gap.as_secs_f64());
            let failed = format!("{} of {}", m.sent - m.answered, m.sent);
            println!(
                "run {}: {name}: address moved after {after:.2} s; longest gap {gap:.2} s; {failed} requests failed",
                run + 1
            );
            samples[fault].push((after, gap, failed));
        }
    }
    println!("\nfailover of a highly available Tunnel on booted guests (guest provider), medians of {runs} run(s):");
    println!(
        "| Fault | Address moved after | Longest gap without an answer | Requests failed | Gap / the peer's ~600 s |"
    );
    println!("|---|---|---|---|---|");
    for (name, list) in FAULTS.iter().zip(samples) {
        let moved = median(&mut list.iter().map(|s| s.0).collect::<Vec<_>>());
        let gap = median(&mut list.iter().map(|s| s.1).collect::<Vec<_>>());
        let failed: Vec<String> = list.into_iter().map(|s| s.2).collect();
        println!("| {name} | {moved:.2} s | {gap:.2} s | {} | {:.4} × |", failed.join(", "), gap / PEER_GAP);
    }
    Ok(())
}

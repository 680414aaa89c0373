//! `--guest --failover`: what a client of a highly available Tunnel on booted guests sees when the
//! active guest goes (the `guest` provider; tests/common/guest_pair.rs): a request (a fresh TCP
//! connection, 4 bytes echoed, 1 s allowed) goes to the reserved address every 100 ms while the
//! active guest powers off in order, or is killed (SIGKILL to all its processes, as when its host
//! dies: its exit server closes nothing). Per run and fault: when the address was on the other
//! guest (this machine's route to it re-pointed), the longest time between two answered
//! requests, and the requests not answered. The tailscale operator's ~10 minutes
//! (`tunnel/failover.rs`) is quoted, not measured.
//!
//! Figures only. Needs root, `SKYPORT_GUEST_ROOTFS` (tests/env/build-guest.sh) and the static
//! build (`SKYPORT_GUEST_EXE`, tests/env/build-musl.sh).

use super::median;
use crate::common::guest;
use crate::common::guest_pair::GuestPair;

/// About ten minutes: the traffic loss users report for the tailscale operator's HA proxies.
const PEER_GAP: f64 = 600.0;

const FAULTS: [&str; 2] = ["active guest powered off", "active guest killed"];

pub async fn run(runs: usize) -> anyhow::Result<()> {
    let rootfs = guest::available().map_err(|why| anyhow::anyhow!("cannot boot guests here: {why}"))?;
    let exe = guest::guest_exe();
    // Per fault: (moved after, longest gap, "failed of sent").
    let mut samples: [Vec<(f64, f64, String)>; 2] = Default::default();
    for run in 0..runs {
        for (fault, name) in FAULTS.iter().enumerate() {
            let pair = GuestPair::start("bench-guest-ha", &rootfs, &exe).await;
            let m = if fault == 0 { pair.power_off(&pair.active).await } else { pair.kill(&pair.active).await };
            pair.finish().await;
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

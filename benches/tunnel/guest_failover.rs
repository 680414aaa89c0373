//! `--guest --failover`: what a client of a highly available Tunnel on booted guests sees when the
//! active guest powers off (the `guest` provider; tests/common/guest_pair.rs): a request (a fresh
//! TCP connection, 4 bytes echoed, 1 s allowed) goes to the reserved address every 100 ms while
//! the active guest shuts down. Per run: when the address was on the other guest (this machine's
//! route to it re-pointed), the longest time between two answered requests, and the requests not
//! answered. The tailscale operator's ~10 minutes (`tunnel/failover.rs`) is quoted, not measured.
//!
//! Figures only. Needs root, `SKYPORT_GUEST_ROOTFS` (tests/env/build-guest.sh) and the static
//! build (`SKYPORT_GUEST_EXE`, tests/env/build-musl.sh).

use super::median;
use crate::common::guest;
use crate::common::guest_pair::GuestPair;

/// About ten minutes: the traffic loss users report for the tailscale operator's HA proxies.
const PEER_GAP: f64 = 600.0;

pub async fn run(runs: usize) -> anyhow::Result<()> {
    let rootfs = guest::available().map_err(|why| anyhow::anyhow!("cannot boot guests here: {why}"))?;
    let exe = guest::guest_exe();
    let (mut moved, mut gaps, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let pair = GuestPair::start("bench-guest-ha", &rootfs, &exe).await;
        let m = pair.power_off(&pair.active).await;
        pair.finish().await;
        let (after, gap) = (m.moved_after.as_secs_f64(), m.gap.as_secs_f64());
        println!(
            "run {}: address moved after {after:.2} s; longest gap {gap:.2} s; {} of {} requests failed",
            run + 1,
            m.sent - m.answered,
            m.sent
        );
        moved.push(after);
        gaps.push(gap);
        failed.push(format!("{} of {}", m.sent - m.answered, m.sent));
    }
    let gap = median(&mut gaps);
    println!("\nfailover of a highly available Tunnel on booted guests (guest provider), medians of {runs} run(s):");
    println!(
        "| Fault | Address moved after | Longest gap without an answer | Requests failed | Gap / the peer's ~600 s |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| active guest powered off | {:.2} s | {gap:.2} s | {} | {:.4} × |",
        median(&mut moved),
        failed.join(", "),
        gap / PEER_GAP
    );
    Ok(())
}

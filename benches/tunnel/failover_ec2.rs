//! `--failover`, EC2 arm: a highly available Tunnel on EC2 semantics against LocalStack, through
//! the operator (tests/tunnel_ec2_ha/pair.rs), with the failover settings the operator runs with
//! by default (a move after 3 failed checks in a row spanning at least 2 s, a pass every 1 s,
//! the cloud re-read at the 60 s resync while both servers pass).
//! Per run, on one pair:
//! - **instance terminated**: the active instance is terminated behind the operator's back;
//! - **check failing**: the active server's check stops passing.
//!
//! Measured: from the fault to DescribeAddresses showing the Elastic IP on the other instance
//! (polled every 50 ms). LocalStack boots no VM, so the exit servers' checks are a stand-in that
//! answers as the benchmark says, and **no bytes flow**: this is the operator's detection and
//! its EC2 calls, not the data path. On AWS the Elastic IP's remapping inside EC2's network and
//! the standby's client being connected come on top of it; a gap seen by clients is measured only
//! on the local provider (the node arm).
//!
//! Figures only: the exit status is non-zero only when the address never moves.

use std::time::{Duration, Instant};

use super::median;
use crate::common::eventually;
use crate::common::tunnels::fast_tunnel_settings;
use crate::ec2_pair::{Ec2Pair, ha};

/// One run's figures, in seconds.
struct Sample {
    /// To the Elastic IP on the other instance, after the termination and after the check failed.
    terminated: f64,
    failing: f64,
    /// EC2 calls per second of the steady pair, and the time they waited for the rate limiter.
    calls_per_second: f64,
    waited: f64,
}

/// EC2 calls made and time spent waiting for the limiter so far.
fn counted(p: &Ec2Pair) -> (u64, Duration) {
    let counters = &providers::HostProvider::limiter(p.ec2.as_ref()).counters;
    (counters.total(), counters.waits().1)
}

/// The failover settings the operator runs with by default, and its default resync.
fn settings() -> skyport::config::TunnelArgs {
    skyport::config::TunnelArgs { resync: skyport::config::TunnelArgs::default().resync, ..fast_tunnel_settings() }
}

async fn once() -> Sample {
    let p = Ec2Pair::start_with("bench-ec2-ha", settings()).await;
    // The pass that saw both servers pass first reads the cloud once more; steady is after it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (calls, waited, steady) = (counted(&p), Instant::now(), Duration::from_secs(10));
    tokio::time::sleep(steady).await;
    let (calls_after, waited_after) = counted(&p);
    let calls_per_second = (calls_after - calls.0) as f64 / waited.elapsed().as_secs_f64();
    let waited = (waited_after - calls.1).as_secs_f64();
    let (first, second) = (p.active.clone(), p.standby.clone());
    let started = Instant::now();
    p.terminate(&first).await;
    let (terminated, _) = p.moved_off(&first, started).await;

    // The terminated slot is filled again; once its server answers, fail the active one's check.
    let own = p.own_addresses(&[&first]).await;
    let fresh = own.keys().find(|id| **id != second).expect("a new instance").clone();
    p.stand_in.answer(&own[&fresh], true);
    eventually("both servers passing again", Duration::from_secs(60), || async {
        let t = p.tunnels.get("web-tunnel").await.ok()?;
        ha(&t).servers.iter().all(|s| s.healthy).then_some(())
    })
    .await;
    let started = Instant::now();
    p.stand_in.answer(&own[&second], false);
    let (failing, _) = p.moved_off(&second, started).await;
    p.finish(&[first, second, fresh]).await;
    Sample { terminated: terminated.as_secs_f64(), failing: failing.as_secs_f64(), calls_per_second, waited }
}

pub async fn run(runs: usize) -> anyhow::Result<()> {
    let s = settings();
    println!(
        "EC2 (LocalStack) arm: failover after {} failed checks over at least {:?}, a pass every {:?}, resync {:?}; \
         no bytes flow (detection and EC2 calls only)",
        s.failover_failures, s.failover_after, s.failover_probe_interval, s.resync
    );
    let mut samples = Vec::new();
    for run in 0..runs {
        let s = once().await;
        println!(
            "run {}: Elastic IP on the other instance {:.2} s after the active instance was terminated, \
             {:.2} s after its check started failing; steady pair: {:.2} EC2 calls/s, {:.2} s waited for the rate limiter in 10 s",
            run + 1,
            s.terminated,
            s.failing,
            s.calls_per_second,
            s.waited
        );
        samples.push(s);
    }
    let med = |f: fn(&Sample) -> f64| median(&mut samples.iter().map(f).collect::<Vec<_>>());
    println!("\nfailover of a highly available Tunnel on EC2 (LocalStack, no data path), medians of {runs} run(s):");
    println!("| Fault | Elastic IP on the other instance after (DescribeAddresses) |");
    println!("|---|---|");
    println!("| active instance terminated | {:.2} s |", med(|s| s.terminated));
    println!("| active server's check failing | {:.2} s |", med(|s| s.failing));
    println!("steady pair: {:.2} EC2 calls/s (the region's default budget: 5/s)", med(|s| s.calls_per_second));
    Ok(())
}

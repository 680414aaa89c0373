//! The table printed per N, one row per arm, and the ratios against the targets.

use std::time::Duration;

use crate::measure::Figures;
use crate::operators::{Arm, Kind};
use crate::request_log::describe_calls;
use crate::{SKYPORT_RESYNC_S, TAGGING_QUOTA};

fn mark(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

pub(crate) fn report(n: usize, rows: &[(Arm, Figures)], idle: Duration, quota: bool) {
    let under = if quota {
        format!(", SQS's tagging quota enforced ({TAGGING_QUOTA}/s)")
    } else {
        ", no SQS quota (LocalStack)".to_string()
    };
    println!("\n-- N = {n}{under}");
    println!(
        "   {:<58} {:>9} {:>9} {:>9} {:>12} {:>9} {:>6}  SQS calls per Queue to Ready (by action); in the idle window",
        "arm", "Ready s", "RSS MiB", "peak MiB", "CPU s/idle min", "delete s", "left"
    );
    for (arm, f) in rows {
        println!(
            "   {:<58} {:>9.1} {:>9.1} {:>9.1} {:>12.2} {:>9.1} {:>6}  {}; idle {:.0} s: {}",
            arm.label,
            f.ready_s,
            f.rss,
            f.peak,
            f.idle_cpu_per_min,
            f.delete_s,
            f.left_behind,
            describe_calls(&f.create_calls, n as f64),
            idle.as_secs_f64(),
            describe_calls(&f.idle_calls, n as f64),
        );
        if let Some(r) =
            arm.ack_resync_s.map(f64::from).or((arm.kind == Kind::Skyport).then_some(SKYPORT_RESYNC_S as f64))
        {
            let periods = idle.as_secs_f64() / r;
            println!(
                "   {:<58} SQS calls per Queue per resync ({r:.0} s, {periods:.1} periods in the idle window): {}",
                "",
                describe_calls(&f.idle_calls, n as f64 * periods)
            );
        }
        println!("   {:<58} SQS calls per Queue to delete: {}", "", describe_calls(&f.delete_calls, n as f64));
        if quota {
            println!(
                "   {:<58} through the quota proxy until all Ready: {} requests, {} answered RequestThrottled ({:.2} per Queue)",
                "",
                f.proxied,
                f.throttled,
                f.throttled as f64 / n as f64
            );
        }
    }
    let get = |k: &str| rows.iter().find(|(a, _)| a.key == k).map(|(_, f)| f);
    // No target: how much room each target leaves, from the floor's time measured in this run.
    if let Some(fl) = get("floor") {
        for (key, what) in [
            ("ack-c", "ACK at equal concurrency (target for skyport <= 0.5)"),
            ("ack", "ACK at its defaults (target for skyport <= 1.0)"),
        ] {
            if let Some(a) = get(key) {
                println!("   time to Ready, floor / {what}: {:.2}", fl.ready_s / a.ready_s);
            }
        }
        for key in ["skyport", "skyport-open"] {
            if let Some(s) = get(key) {
                println!("   time to Ready, {key} / floor: {:.2}", s.ready_s / fl.ready_s);
            }
        }
    }
    if let Some(s) = get("skyport-open") {
        for (key, what) in [("ack-c", "ACK at equal concurrency"), ("ack", "ACK at its defaults")] {
            if let Some(a) = get(key) {
                println!(
                    "   time to Ready, skyport-open / {what}: {:.2} (no target: skyport not at its defaults)",
                    s.ready_s / a.ready_s
                );
            }
        }
    }
    if let Some(s) = get("skyport") {
        if let Some(a) = get("ack-c") {
            let r = s.ready_s / a.ready_s;
            println!(
                "   time to Ready, skyport / ACK at equal concurrency: {r:.2} -> target <= 0.5: {}",
                mark(r <= 0.5)
            );
        }
        if let Some(a) = get("ack") {
            let r = s.ready_s / a.ready_s;
            println!(
                "   time to Ready, skyport / ACK both at defaults:      {r:.2} -> target <= 1.0: {}",
                mark(r <= 1.0)
            );
        }
        for key in ["ack", "ack-c"] {
            if let Some(a) = get(key) {
                let (r, p) = (s.rss / a.rss, s.peak / a.peak);
                println!(
                    "   RSS skyport / {key}: {r:.2} after Ready, {p:.2} peak -> target <= 0.5: {}",
                    mark(r <= 0.5 && p <= 0.5)
                );
            }
        }
    }
}

//! Several active replicas against one: N Queues spread over A AwsAccounts (LocalStack accounts
//! through assumed roles), each account reaching SQS through a proxy of its own that enforces
//! SQS's tagging quota as AWS does per account (`tests/common/sqs_faults.rs`; LocalStack enforces
//! none) and counts the account's calls. One arm runs 1 replica, the other R (`skyport run
//! --sharding`, separate processes of the built binary, shards by AwsAccount), each in a fresh
//! namespace. Per arm:
//!
//! - time from the first create until every Queue is Ready, and SQS calls per Queue until then;
//! - steady-state SQS calls per second per account (at the proxies) once all are Ready;
//! - peak RSS (`VmHWM`) of every replica;
//! - drift: K queues deleted out of band, time until each exists again (p50/p99; SQS refuses a
//!   deleted name for 60 s, so 60 s is the floor);
//! - takeover (R > 1): the replica holding most shards killed (-9); time until its shards are held
//!   by the others, and until a Queue created in each of them after the kill is Ready;
//! - steals (an SQS write by a replica not holding the Queue's shard then, per the shard Leases
//!   polled every 100 ms) and double writes (a queue created or updated twice, the recreated
//!   ones aside): both must be 0.
//!
//! Figures and ratios are printed, never asserted on time. The exit status is non-zero only when
//! something is broken: a Queue never Ready, a deleted queue never recreated, shards never taken
//! over, a steal or a double write, an error from the environment.
//!
//! ```sh
//! eval "$(tests/env.sh up)"
//! cargo bench --bench replicas -- --queues 10000 --accounts 10 --replicas 3   # release build
//! cargo bench --profile dev --bench replicas -- --quick   # 2,000 Queues, 4 accounts, 2 replicas (tests/run.sh)
//! cargo bench --bench replicas -- --help
//! ```
//!
//! No other skyport may watch the benchmark's namespaces (a cluster-wide `skyport run` against
//! the same environment would reconcile its Queues too).

#[macro_use]
mod entry;

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

// After `entry`: a module sees only the macros (progress!) declared above it.
#[path = "replicas/arm.rs"]
mod arm;
#[path = "replicas/options.rs"]
mod options;
#[path = "replicas/replica.rs"]
mod replica;
#[path = "replicas/world.rs"]
mod world;
// The Queue benchmark's Ready watch and statistics.
#[path = "queues/ready_watch.rs"]
mod ready_watch;
#[allow(dead_code)]
#[path = "queues/stats.rs"]
mod stats;

use arm::Figures;
use options::{Opts, parse_args};
use stats::percentile;

fn main() -> std::process::ExitCode {
    entry::main("replicas", parse_args, run)
}

async fn run(o: Opts) -> anyhow::Result<bool> {
    let started = Instant::now();
    let driver = common::client().await;
    let version = driver.apiserver_version().await?;
    println!("skyport replicas benchmark{}", if o.quick { " (quick)" } else { "" });
    println!(
        "  {} Queues over {} AwsAccounts, 1 replica vs {}; kube-apiserver {}, SQS at {} through one quota proxy per account ({}/s tagging), {} CPUs",
        o.queues,
        o.accounts,
        o.replicas,
        version.git_version,
        std::env::var("AWS_ENDPOINT_URL").unwrap_or_default(),
        world::TAGGING_QUOTA,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    );
    println!("  skyport binary {}; skyport run --sharding {}", entry::skyport_build(), o.skyport_args.join(" "));
    let mut arms = vec![1];
    if o.replicas > 1 {
        arms.push(o.replicas);
    }
    let (mut rows, mut broken) = (vec![], vec![]);
    for n in arms {
        progress!("arm: {n} replica(s)");
        match arm::run(driver.clone(), &o, n).await {
            Ok(f) => {
                broken.extend(verdict(&f));
                rows.push(f);
            }
            Err(e) => broken.push(format!("{n} replica(s): {e:#}")),
        }
    }
    report(&o, &rows);
    for b in &broken {
        println!("  BROKEN: {b}");
    }
    println!(
        "done in {:.0} s; {}",
        started.elapsed().as_secs_f64(),
        if broken.is_empty() { "nothing broken" } else { "BROKEN (see above)" }
    );
    Ok(broken.is_empty())
}

/// What is broken in an arm's figures (not missed targets: steals and double writes).
fn verdict(f: &Figures) -> Vec<String> {
    let mut v = vec![];
    if f.foreign > 0 {
        v.push(format!(
            "{} replica(s): another operator reconciled the benchmark's namespace ({} InsecureEndpoint Events): figures disturbed",
            f.replicas, f.foreign
        ));
    }
    if !f.steals.is_empty() {
        v.push(format!("{} replica(s): {} steals: {:#?}", f.replicas, f.steals.len(), f.steals));
    }
    if !f.doubles.is_empty() {
        v.push(format!("{} replica(s): {} double writes: {:?}", f.replicas, f.doubles.len(), f.doubles));
    }
    v
}

fn report(o: &Opts, rows: &[Figures]) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{s:.1} s"));
    println!(
        "\n| replicas | all Ready | SQS calls / Queue to Ready | steady SQS calls/s per account (min-max; throttled) | peak RSS per replica | drift recreated p50 / p99 | takeover: shards held / Queues acted on | SQS writes | steals | double writes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for f in rows {
        let rates: Vec<f64> = f.steady.iter().map(|(r, _)| *r).collect();
        let throttled: usize = f.steady.iter().map(|(_, t)| t).sum();
        let peaks: Vec<String> = f.peak_mib.iter().map(|m| format!("{m:.0}")).collect();
        println!(
            "| {} | {:.1} s | {:.2} | {:.2}-{:.2} ({throttled} throttled) | {} MiB | {:.1} s / {:.1} s | {} / {} ({} shards) | {} | {} | {} |",
            f.replicas,
            f.ready_s,
            f.calls_per_queue,
            percentile(&rates, 0.0),
            percentile(&rates, 1.0),
            peaks.join(", "),
            percentile(&f.drift, 0.5),
            percentile(&f.drift, 0.99),
            opt(f.takeover_s),
            opt(f.acted_s),
            f.lost,
            f.written,
            f.steals.len(),
            f.doubles.len(),
        );
    }
    if let [one, many] = rows {
        println!(
            "\ntime to all Ready, 1 replica / {}: {:.2} (above 1: the replicas were faster; goal at 100,000 x 10 accounts with 3: >= 2 where the budget allows)",
            many.replicas,
            one.ready_s / many.ready_s
        );
    }
    println!(
        "(steady window {:?} after all were Ready; drift: {} queues per arm; resync {})",
        o.steady,
        o.drift_k,
        o.skyport_args.iter().find(|a| a.starts_with("--queue-resync")).map_or("60s (default)", |a| a.as_str())
    );
}

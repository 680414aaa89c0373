//! Benchmarks of the Queue controller against the real test environment: how fast and
//! how cheaply skyport converges, measured against a minimal baseline and against the limits.
//!
//! 1. time to Ready for N Queues created at once, vs a baseline loop making only the minimal
//!    calls per queue (finalizer patch, CreateQueue, status patch) with the same clients,
//!    governor and concurrency; the ratio skyport / baseline comes from the same run;
//! 2. steady state: API-server writes, SQS calls per reconcile and per Queue per resync, the
//!    calls checked against the governor budget (rate × time + burst) in every window, and a
//!    restart's writes (none expected);
//! 3. drift repair latency, for attributes changed and for queues deleted out of band;
//! 4. peak RSS of the real `skyport run` binary (a separate process) per number of Queues.
//!
//! Figures and ratios are printed; nothing here is a timed assertion. The exit status is
//! non-zero only when something is broken (Queues never Ready, drift never repaired, SQS calls
//! above the governor budget, an error from the environment), never for a missed target.
//!
//! ```sh
//! eval "$(tests/env.sh up)"
//! cargo bench --bench queues                 # everything, release build, medians of 3 runs (~1 h)
//! cargo bench --bench queues -- --quick      # 10 Queues, one run (~2 min)
//! cargo bench --profile dev --bench queues -- --quick   # the same on the test build: tests/run.sh
//! cargo bench --bench queues -- --help
//! ```
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it only says how to run it.
//! No other skyport may watch the same namespaces (a cluster-wide `skyport run` against the same
//! environment would reconcile the benchmark's Queues too): use a dedicated environment
//! (`SKYPORT_STATE=... tests/env.sh up`, see BENCHMARKS.md) for figures worth recording.

#[macro_use]
mod entry;
#[path = "entry/minimal.rs"]
mod minimal;

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Mutex;
use std::time::Instant;

// After `entry`: a module sees only the macros (progress!) declared above it.
#[path = "queues/budget.rs"]
mod budget;
#[path = "queues/drift.rs"]
mod drift;
#[path = "queues/harness.rs"]
mod harness;
#[path = "queues/memory.rs"]
mod memory;
#[path = "queues/options.rs"]
mod options;
#[path = "queues/profile.rs"]
mod profile;
#[path = "queues/ready_watch.rs"]
mod ready_watch;
#[path = "queues/stats.rs"]
mod stats;
#[path = "queues/steady.rs"]
mod steady;
#[path = "queues/time_to_ready.rs"]
mod time_to_ready;

use harness::{Bench, provider};
use options::{Opts, parse_args};
use stats::{EnvProcs, secs};

// ---- main -----------------------------------------------------------------------------------------

fn main() -> std::process::ExitCode {
    entry::main("queues", parse_args, run)
}

async fn run(o: Opts) -> anyhow::Result<bool> {
    if o.profile {
        profile::install();
    } else if std::env::var_os("RUST_LOG").is_some() {
        skyport::telemetry::init(skyport::telemetry::LogFormat::Text);
    }
    let started = Instant::now();
    let bench = Bench {
        kube: common::client().await,
        driver: common::client().await,
        oob: common::sqs().await,
        janitor: provider(1000, 1000, 1000).await,
        procs: EnvProcs::find(),
        failures: Mutex::default(),
    };
    let version = bench.driver.apiserver_version().await?;
    println!("skyport queues benchmark{}", if o.quick { " (quick)" } else { "" });
    println!(
        "  kube-apiserver {}, SQS at {}, {} CPUs, build profile {}",
        version.git_version,
        std::env::var("AWS_ENDPOINT_URL").unwrap_or_default(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    let wants = |s: &str| o.scenarios.iter().any(|x| x == s);
    if wants("ready") {
        bench.time_to_ready(&o).await?;
    }
    if wants("steady") || wants("drift") {
        bench.steady_and_drift(&o, wants("drift")).await?;
    }
    if wants("memory") {
        bench.memory(&o).await?;
    }
    println!("\n(Tunnel figures: `cargo bench --bench tunnel`, benches/tunnel.rs.)");
    let failures = bench.failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!(
        "done in {:.0} s; {}",
        secs(started.elapsed()),
        if failures.is_empty() { "nothing broken".to_string() } else { format!("BROKEN: {failures:?}") }
    );
    Ok(failures.is_empty())
}

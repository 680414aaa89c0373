//! skyport side by side with the ACK SQS controller (github.com/aws-controllers-k8s/sqs-controller),
//! the system a user would pick instead. Both run as real processes against
//! the same kube-apiserver and LocalStack, one after the other in one benchmark run, each watching
//! its own namespace, on the same N Queues (same attributes and tag):
//!
//! - time until every Queue is Ready (skyport: `Ready=True`; ACK: `ACK.ResourceSynced=True` and
//!   `status.queueURL`), skyport at its defaults and with its SQS budgets open, ACK at its
//!   defaults (1 worker, 10 h resync) and at skyport's settings (8 workers, 60 s resync), and the
//!   floor: the least any controller can do (`ack/floor.rs`), which shows how much room each
//!   target leaves;
//! - RSS after all are Ready and peak RSS (`VmHWM`) of the operator process;
//! - CPU seconds per idle minute once everything is Ready, and the SQS calls in that window;
//! - time to delete all Queue objects, and SQS queues left behind (must be 0);
//! - SQS calls per Queue until all are Ready and per resync, counted the same way for both: from
//!   LocalStack's request log (`AWS sqs.<Action> => <status>` lines), which is why the arms run
//!   one at a time and the benchmark itself makes no SQS call while an arm is measured.
//!
//! With `--sqs-quota` both operators reach SQS through a proxy that enforces SQS's published
//! tagging quota (30 calls per second per account; `tests/common/sqs_faults.rs`) the way AWS
//! does, with `RequestThrottled`: LocalStack enforces none, so without it the figures are those of
//! an account where tagging is free. Throttled requests are counted at the proxy.
//!
//! ACK is never fetched or built here: point `SKYPORT_ACK_SRC` at a checkout of
//! aws-controllers-k8s/sqs-controller; `tests/env/build-ack.sh` builds it (or set `SKYPORT_ACK`
//! to a built controller binary). Without a checkout only skyport's arms run, and it says so.
//! ACK needs an STS that answers GetCallerIdentity: LocalStack's (`SERVICES` includes `sts`,
//! localstack/start.sh).
//!
//! ```sh
//! eval "$(tests/env.sh up)"; export SKYPORT_ACK_SRC=/path/to/sqs-controller
//! cargo bench --bench ack                     # N = 100 and 1000, release build (BENCHMARKS.md)
//! cargo bench --profile dev --bench ack -- --quick   # N = 10, short windows (tests/run.sh)
//! cargo bench --bench ack -- --help
//! ```
//!
//! Figures are printed, never asserted on time; the exit status is non-zero only when something
//! is broken (a Queue never Ready or never deleted, a queue left behind, an operator that exited).

mod entry;
#[path = "entry/minimal.rs"]
mod minimal;

#[path = "../tests/common/mod.rs"]
mod common;
// Shared with tests/cloud_faults.rs, which uses its random faults and not its tagging quota.
use common::sqs_faults;

#[path = "ack/floor.rs"]
mod floor;
#[path = "ack/measure.rs"]
mod measure;
#[path = "ack/objects.rs"]
mod objects;
#[path = "ack/operators.rs"]
mod operators;
#[path = "ack/options.rs"]
mod options;
#[path = "ack/report.rs"]
mod report;
#[path = "ack/request_log.rs"]
mod request_log;

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;

use measure::Bench;
use operators::{Ack, arms};
use options::{Opts, parse_args};
use report::report;
use request_log::RequestLog;

/// SQS's tagging quota per account (calls per second), which `--sqs-quota` enforces.
const TAGGING_QUOTA: u32 = providers::sqs::TAGGING_QUOTA_PER_SECOND;
/// skyport's default reconcile concurrency, which the "ACK at skyport's settings" arm copies.
const SKYPORT_CONCURRENCY: u32 = 8;
/// skyport's default resync, likewise.
const SKYPORT_RESYNC_S: u32 = 60;

fn progress(msg: &str) {
    eprintln!("[{}] {msg}", humantime::format_rfc3339_seconds(std::time::SystemTime::now()));
}

async fn run(o: Opts) -> anyhow::Result<bool> {
    let driver = common::client().await;
    let ack = Ack::from_env()?;
    let quota = if o.sqs_quota {
        let endpoint = std::env::var("AWS_ENDPOINT_URL").context("AWS_ENDPOINT_URL")?;
        let proxy = sqs_faults::FaultProxy::start(endpoint.trim_start_matches("http://").trim_end_matches('/')).await;
        proxy.set_tagging_quota(Some(TAGGING_QUOTA));
        Some(proxy)
    } else {
        None
    };
    let bench =
        Bench { driver, oob: common::sqs().await, log: RequestLog::find()?, ack, quota, failures: Mutex::default() };
    let version = bench.driver.apiserver_version().await?;
    println!("skyport vs ACK SQS controller{}", if o.quick { " (quick)" } else { "" });
    println!(
        "  kube-apiserver {}, SQS at {}, {} CPUs, skyport build profile {}",
        version.git_version,
        std::env::var("AWS_ENDPOINT_URL").unwrap_or_default(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    println!("  skyport binary {}", entry::skyport_build());
    if let Some(p) = &bench.quota {
        println!(
            "  SQS's tagging quota enforced: both reach SQS through {} ({TAGGING_QUOTA}/s, RequestThrottled beyond)",
            p.url()
        );
    }
    match &bench.ack {
        Some(a) => {
            println!("  ACK sqs-controller {} ({}), binary {}", a.commit, a.src.display(), a.bin.display());
            a.install_crds(&bench.driver).await?;
        }
        None => println!(
            "  no ACK checkout given (SKYPORT_ACK_SRC): skyport's arms and the floor only, no comparison with ACK (see BENCHMARKS.md)"
        ),
    }
    let arms = arms(&o, bench.ack.as_ref());
    for &n in &o.n {
        let mut rows = vec![];
        for arm in &arms {
            progress(&format!("{} at N = {n}", arm.label));
            if let Ok(f) = bench.run_arm(arm, n, &o).await {
                rows.push((arm.clone(), f));
            }
            // SQS's 60 s recreate rule does not matter (names are per namespace); let the
            // apiserver and LocalStack settle between arms.
            tokio::time::sleep(Duration::from_secs(if o.quick { 1 } else { 10 })).await;
        }
        report(n, &rows, o.idle, o.sqs_quota);
    }
    let failures = bench.failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!("{}", if failures.is_empty() { "nothing broken".to_string() } else { format!("BROKEN: {failures:?}") });
    Ok(failures.is_empty())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, ns] = args.as_slice()
        && flag == floor::FLAG
    {
        return floor::main(ns);
    }
    entry::main("ack", parse_args, run)
}

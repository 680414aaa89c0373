//! Benchmarks of the Queue controller against the real test environment (issue 5): how fast and
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

mod entry;

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use async_trait::async_trait;
use futures::channel::mpsc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use providers::sqs::{Attributes, Tags};
use providers::{Limiter, QueueBackend, QueueError, SqsProvider, SqsSettings};
use serde_json::json;
use skyport::config::QueueArgs;
use skyport::controllers::queue::desired::{Owner, desired, queue_name};
use skyport::controllers::queue::{Context, FINALIZER, controller};
use skyport::controllers::{add_finalizer, remove_finalizer};
use skyport::crd::{Condition, ConditionStatus, Queue, QueueStatus};
use tokio::sync::oneshot;

/// Queue objects created in parallel by the benchmark (the "kubectl apply" side, same for both
/// arms of the time-to-Ready comparison).
const CREATE_CONCURRENCY: usize = 32;
/// Parallel requests of the clean-up (not measured).
const CLEANUP_CONCURRENCY: usize = 32;
/// The spec of every benchmark Queue: a few managed attributes and a user tag.
fn spec() -> serde_json::Value {
    json!({"visibilityTimeoutSeconds": 45, "messageRetentionSeconds": 3600, "tags": {"bench": "queues"}})
}
const SPEC_VISIBILITY: &str = "45";

fn queue_names(range: std::ops::Range<usize>) -> impl Iterator<Item = String> {
    range.map(|i| format!("q-{i:05}"))
}

/// Progress on stderr (figures go to stdout), with the time since the start.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("[{:>7.1}s] {}", START.get_or_init(Instant::now).elapsed().as_secs_f64(), format!($($arg)*))
    };
}
static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

// ---- options -------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Governor {
    /// skyport's defaults (`--sqs-rate 48 --sqs-burst 48 --sqs-tag-rate 24`): what a user gets.
    Default,
    /// So high that it never waits: exposes the reconcile path itself.
    Open,
}

impl Governor {
    /// (rate, burst, tagging rate).
    fn settings(self) -> (u32, u32, u32) {
        match self {
            Governor::Default => {
                let d = SqsSettings::default();
                (d.rate_per_second.get(), d.burst.get(), d.tag_rate_per_second.get())
            }
            Governor::Open => (100_000, 100_000, 100_000),
        }
    }
    fn describe(self) -> String {
        let (rate, burst, tags) = self.settings();
        match self {
            Governor::Default => format!("default governor ({rate}/s, burst {burst}, tagging {tags}/s)"),
            Governor::Open => format!("open governor ({rate}/s, burst {burst}: never waits)"),
        }
    }
}

#[derive(Debug, Clone)]
struct Opts {
    quick: bool,
    scenarios: Vec<String>,
    runs: usize,
    ready_n: Vec<usize>,
    governors: Vec<Governor>,
    concurrency: u16,
    steady_n: usize,
    resync: Duration,
    periods: u32,
    drift_k: usize,
    budget_window: Duration,
    memory_n: Vec<usize>,
    memory_rate: u32,
    profile: bool,
}

const USAGE: &str = "\
usage: cargo bench --bench queues -- [--quick] [options]
  --quick               small N, one run (CI): same as --runs 1 --ready-n 10 --governor default
                        --steady-n 10 --resync 2s --periods 3 --drift-k 2 --memory-n 10,20
  --only LIST           scenarios to run, from ready,steady,drift,memory (default: all;
                        drift needs steady's Queues and runs inside it)
  --runs N              runs of each time-to-Ready comparison (default 3)
  --ready-n LIST        Queue counts for time to Ready (default 100,1000)
  --governor LIST       governor settings for time to Ready: default,open (default both)
  --concurrency N       reconciles in parallel, skyport and baseline alike (default 8, skyport's)
  --steady-n N          Ready Queues in the steady-state scenario (default 1000)
  --resync DURATION     resync of the steady-state and drift scenarios (default 10s)
  --periods N           resync periods observed in steady state (default 6)
  --drift-k N           Queues disturbed per drift kind (default 20)
  --budget-window DUR   observation window of the restart under the default governor (default 60s)
  --memory-n LIST       Queue counts for the memory scenario (default 1000,10000)
  --memory-rate N       --sqs-rate (and burst) of the measured operator process (default 500)
  --profile             print a latency profile (per API call kind) of both time-to-Ready arms";

fn parse_list<T: std::str::FromStr>(s: &str) -> anyhow::Result<Vec<T>> {
    s.split(',').map(|x| x.trim().parse::<T>().map_err(|_| anyhow!("bad list item {x:?} in {s:?}"))).collect()
}

fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        scenarios: vec!["ready".into(), "steady".into(), "drift".into(), "memory".into()],
        runs: if quick { 1 } else { 3 },
        ready_n: if quick { vec![10] } else { vec![100, 1000] },
        governors: if quick { vec![Governor::Default] } else { vec![Governor::Default, Governor::Open] },
        concurrency: QueueArgs::default().concurrency,
        steady_n: if quick { 10 } else { 1000 },
        resync: Duration::from_secs(if quick { 2 } else { 10 }),
        periods: if quick { 3 } else { 6 },
        drift_k: if quick { 2 } else { 20 },
        budget_window: Duration::from_secs(if quick { 5 } else { 60 }),
        memory_n: if quick { vec![10, 20] } else { vec![1000, 10000] },
        memory_rate: 500,
        profile: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| anyhow!("{a} needs a value"));
        match a.as_str() {
            "--quick" | "--bench" => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--only" => o.scenarios = value()?.split(',').map(str::to_string).collect(),
            "--runs" => o.runs = value()?.parse()?,
            "--ready-n" => o.ready_n = parse_list(&value()?)?,
            "--governor" => {
                o.governors = value()?
                    .split(',')
                    .map(|g| match g {
                        "default" => Ok(Governor::Default),
                        "open" => Ok(Governor::Open),
                        other => Err(anyhow!("unknown governor {other:?} (default, open)")),
                    })
                    .collect::<anyhow::Result<_>>()?
            }
            "--concurrency" => o.concurrency = value()?.parse()?,
            "--steady-n" => o.steady_n = value()?.parse()?,
            "--resync" => o.resync = humantime::parse_duration(&value()?)?,
            "--periods" => o.periods = value()?.parse()?,
            "--drift-k" => o.drift_k = value()?.parse()?,
            "--budget-window" => o.budget_window = humantime::parse_duration(&value()?)?,
            "--memory-n" => o.memory_n = parse_list(&value()?)?,
            "--memory-rate" => o.memory_rate = value()?.parse()?,
            "--profile" => o.profile = true,
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    for s in &o.scenarios {
        if !["ready", "steady", "drift", "memory"].contains(&s.as_str()) {
            bail!("unknown scenario {s:?}\n{USAGE}");
        }
    }
    if o.runs == 0 || o.periods == 0 || o.concurrency == 0 {
        bail!("--runs, --periods and --concurrency must be positive");
    }
    Ok(o)
}

// ---- small statistics and /proc helpers ------------------------------------------------------

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n.is_multiple_of(2) => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        n => s[n / 2],
    }
}

/// Nearest-rank percentile (`q` in 0..=1) of `v`; NaN when empty.
fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// User + system CPU seconds of a process (`/proc/<pid>/stat`, USER_HZ = 100).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64 / 100.0)
}

/// A `Vm*` line of `/proc/<pid>/status`, in KiB.
fn vm_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The processes of the test environment, to show where the CPU went.
struct EnvProcs(Vec<(&'static str, u32)>);

impl EnvProcs {
    fn find() -> Self {
        let mut procs = vec![("bench+operator", std::process::id())];
        if let Some(state) = std::env::var_os("SKYPORT_TEST_ENV").map(PathBuf::from) {
            for (name, file) in [
                ("kube-apiserver", state.join("run/kube-apiserver.pid")),
                ("etcd", state.join("run/etcd.pid")),
                ("localstack", state.join("localstack/localstack.pid")),
            ] {
                if let Some(pid) = std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse().ok()) {
                    procs.push((name, pid));
                }
            }
        }
        EnvProcs(procs)
    }
    fn snapshot(&self) -> Vec<f64> {
        self.0.iter().map(|(_, pid)| cpu_seconds(*pid).unwrap_or(f64::NAN)).collect()
    }
    fn describe(&self, before: &[f64], after: &[f64], wall: Duration) -> String {
        self.0
            .iter()
            .zip(before.iter().zip(after))
            .map(|((name, _), (b, a))| format!("{name} {:.0}%", 100.0 * (a - b) / secs(wall)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

// ---- latency profile (tracing spans of the kube client, the AWS SDK and reconcile) ------------

mod profile {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use tracing::field::{Field, Visit};
    use tracing::{Subscriber, span};
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::util::SubscriberInitExt;

    static STATS: Mutex<BTreeMap<String, (u64, Duration)>> = Mutex::new(BTreeMap::new());

    struct Timing {
        label: String,
        start: Instant,
    }

    #[derive(Default)]
    struct HttpFields {
        method: String,
        url: String,
    }

    impl Visit for HttpFields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            match field.name() {
                "http.method" => self.method = format!("{value:?}"),
                "http.url" => self.url = format!("{value:?}"),
                _ => {}
            }
        }
    }

    /// `PATCH queues/status`, `POST events`, ...; `None` for watches (they last for ever).
    fn classify(method: &str, url: &str) -> Option<String> {
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        if query.split('&').any(|p| p == "watch=true" || p == "watch=1") {
            return None;
        }
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let rest: Vec<&str> = match segs.iter().position(|s| *s == "namespaces") {
            Some(i) if segs.len() > i + 2 => segs[i + 2..].to_vec(),
            _ => vec![segs.last().copied().unwrap_or("?")],
        };
        let what = match rest.as_slice() {
            [resource, _, sub, ..] => format!("{resource}/{sub}"),
            [resource, ..] => resource.to_string(),
            [] => "?".into(),
        };
        Some(format!("kube {method} {what}"))
    }

    struct Profiler;

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Profiler {
        fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
            let name = attrs.metadata().name();
            let label = if name == "HTTP" {
                let mut f = HttpFields::default();
                attrs.record(&mut f);
                match classify(&f.method, &f.url) {
                    Some(l) => l,
                    None => return,
                }
            } else if let Some(op) = name.strip_prefix("SQS.") {
                format!("sqs  {op}")
            } else {
                "reconcile (whole, incl. governor waits)".into()
            };
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(Timing { label, start: Instant::now() });
            }
        }

        fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(&id)
                && let Some(t) = span.extensions().get::<Timing>()
            {
                let mut stats = STATS.lock().unwrap_or_else(|p| p.into_inner());
                let e = stats.entry(t.label.clone()).or_default();
                e.0 += 1;
                e.1 += t.start.elapsed();
            }
        }
    }

    /// Times every kube request, SQS operation and reconcile from now on.
    pub fn install() {
        let filter = filter_fn(|m| {
            m.is_span() && (m.name() == "HTTP" || m.name().starts_with("SQS.") || m.name() == "reconcile")
        });
        tracing_subscriber::registry().with(Profiler.with_filter(filter)).init();
    }

    /// The figures since the last call: label → (count, total time).
    pub fn take() -> BTreeMap<String, (u64, Duration)> {
        std::mem::take(&mut *STATS.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn print(arm: &str, n: usize, stats: &BTreeMap<String, (u64, Duration)>) {
        println!("    profile of {arm} (per queue: calls and time spent in them; mean latency per call):");
        for (label, (count, total)) in stats {
            println!(
                "      {label:<46} {:>5.2} calls/queue {:>7.1} ms/queue {:>7.1} ms/call",
                *count as f64 / n as f64,
                total.as_secs_f64() * 1000.0 / n as f64,
                total.as_secs_f64() * 1000.0 / *count as f64
            );
        }
    }
}

// ---- an SQS backend wrapper counting calls per queue ----------------------------------------

/// Delegates to the real provider (same limiter, same counters) and counts calls per queue
/// (URL, or name for the calls that take one), to show the distribution over Queues.
struct PerQueue {
    inner: Arc<SqsProvider>,
    calls: Mutex<HashMap<String, u64>>,
}

impl PerQueue {
    fn count(&self, key: &str) {
        let key = key.rsplit('/').next().unwrap_or(key).to_string();
        *self.calls.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default() += 1;
    }
    fn snapshot(&self) -> HashMap<String, u64> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl QueueBackend for PerQueue {
    async fn queue_url(&self, name: &str) -> Result<Option<String>, QueueError> {
        self.count(name);
        self.inner.queue_url(name).await
    }
    async fn create_queue(&self, name: &str, attributes: &Attributes, tags: &Tags) -> Result<String, QueueError> {
        self.count(name);
        self.inner.create_queue(name, attributes, tags).await
    }
    async fn attributes(&self, url: &str) -> Result<Option<Attributes>, QueueError> {
        self.count(url);
        self.inner.attributes(url).await
    }
    async fn set_attributes(&self, url: &str, attributes: &Attributes) -> Result<(), QueueError> {
        self.count(url);
        self.inner.set_attributes(url, attributes).await
    }
    async fn tags(&self, url: &str) -> Result<Tags, QueueError> {
        self.count(url);
        self.inner.tags(url).await
    }
    async fn tag(&self, url: &str, tags: &Tags) -> Result<(), QueueError> {
        self.count(url);
        self.inner.tag(url, tags).await
    }
    async fn untag(&self, url: &str, keys: &[String]) -> Result<(), QueueError> {
        self.count(url);
        self.inner.untag(url, keys).await
    }
    async fn delete_queue(&self, url: &str) -> Result<(), QueueError> {
        self.count(url);
        self.inner.delete_queue(url).await
    }
    fn limiter(&self) -> &Limiter {
        self.inner.limiter()
    }
    fn region(&self) -> Option<String> {
        self.inner.region()
    }
}

// ---- governor budget: samples of the call counter ---------------------------------------------

/// Samples the limiter's call total every 20 ms.
struct Sampler {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(sqs: Arc<dyn QueueBackend>) -> Self {
        let samples: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
        let (tx, mut rx) = oneshot::channel();
        let s = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let total = sqs.limiter().counters.total();
                        s.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), total));
                    }
                    _ = &mut rx => break,
                }
            }
        });
        Sampler { samples, stop: Some(tx), task }
    }

    async fn finish(mut self) -> Vec<(Instant, u64)> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The governor's promise: in any window of length t at most `burst + rate × t` calls start.
struct Budget {
    calls: u64,
    window: Duration,
    /// Largest (calls in a window − budget of that window) over all sampled windows; ≤ 0 when
    /// the budget held (sampling adds up to one call of slack).
    max_excess: f64,
    /// Most calls in any window of about one second.
    peak_1s: u64,
}

fn budget(samples: &[(Instant, u64)], rate: f64, burst: f64) -> Budget {
    let mut max_excess = f64::NEG_INFINITY;
    let mut peak_1s = 0;
    for (i, (ti, ci)) in samples.iter().enumerate() {
        for (tj, cj) in &samples[i + 1..] {
            let t = secs(*tj - *ti);
            let calls = (cj - ci) as f64;
            max_excess = max_excess.max(calls - (burst + rate * t));
            if t <= 1.0 {
                peak_1s = peak_1s.max(cj - ci);
            }
        }
    }
    let (first, last) = (samples.first().copied(), samples.last().copied());
    let (calls, window) = match (first, last) {
        (Some(f), Some(l)) => (l.1 - f.1, l.0 - f.0),
        _ => (0, Duration::ZERO),
    };
    Budget { calls, window, max_excess, peak_1s }
}

// ---- watching Ready conditions ------------------------------------------------------------------

type Transitions = HashMap<String, Vec<(Instant, ConditionStatus, String)>>;

/// Records, per Queue, every change of its Ready condition with the time it was seen.
struct ReadyWatch {
    transitions: Arc<Mutex<Transitions>>,
    ready: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    /// Starts watching and returns once the initial list is in.
    async fn start(api: Api<Queue>) -> anyhow::Result<Self> {
        let transitions: Arc<Mutex<Transitions>> = Arc::default();
        let (ready_tx, ready) = tokio::sync::watch::channel(0usize);
        let (synced_tx, synced_rx) = oneshot::channel();
        let t = transitions.clone();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
            let mut ready_names = 0usize;
            while let Some(event) = stream.next().await {
                let q = match event {
                    Ok(watcher::Event::Apply(q) | watcher::Event::InitApply(q)) => q,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(s) = synced.take() {
                            let _ = s.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let now = Instant::now();
                let Some((status, reason)) = common::ready(&q) else { continue };
                let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
                let history = t.entry(q.name_any()).or_default();
                let was_ready = history.last().is_some_and(|(_, s, _)| *s == ConditionStatus::True);
                if history.last().is_none_or(|(_, s, r)| *s != status || *r != reason) {
                    history.push((now, status, reason));
                }
                let is_ready = status == ConditionStatus::True;
                if is_ready != was_ready {
                    ready_names = if is_ready { ready_names + 1 } else { ready_names - 1 };
                    let _ = ready_tx.send(ready_names);
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), synced_rx)
            .await
            .context("the benchmark's Queue watch did not sync in 60 s")?
            .context("the benchmark's Queue watch ended")?;
        Ok(ReadyWatch { transitions, ready, task })
    }

    /// Waits until `n` Queues are Ready; returns when the last of them was first seen Ready.
    async fn all_ready(&mut self, n: usize, timeout: Duration) -> anyhow::Result<Instant> {
        let reached = tokio::time::timeout(timeout, self.ready.wait_for(|c| *c >= n)).await.is_ok_and(|r| r.is_ok());
        if !reached {
            bail!("only {} of {n} Queues Ready after {timeout:?}", *self.ready.borrow());
        }
        let t = self.transitions.lock().unwrap_or_else(|p| p.into_inner());
        t.values()
            .filter_map(|h| h.iter().find(|(_, s, _)| *s == ConditionStatus::True).map(|(at, _, _)| *at))
            .max()
            .ok_or_else(|| anyhow!("no Ready Queue"))
    }

    fn history(&self, name: &str) -> Vec<(Instant, ConditionStatus, String)> {
        self.transitions.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned().unwrap_or_default()
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---- the benchmark environment --------------------------------------------------------------

struct Bench {
    /// The client the operator (and the baseline) use.
    kube: Client,
    /// The benchmark's own client: creating Queues, watching, cleaning up.
    driver: Client,
    /// SQS behind skyport's back (drift), independent of its adapter.
    oob: aws_sdk_sqs::Client,
    /// Deletes SQS queues during clean-up, without touching the measured limiters.
    janitor: Arc<SqsProvider>,
    procs: EnvProcs,
    /// Things that are broken (not missed targets): make the exit status non-zero.
    failures: Mutex<Vec<String>>,
}

fn sqs_settings(rate: u32, burst: u32, tags: u32) -> SqsSettings {
    SqsSettings {
        rate_per_second: NonZeroU32::new(rate).expect("rate > 0"),
        burst: NonZeroU32::new(burst).expect("burst > 0"),
        tag_rate_per_second: NonZeroU32::new(tags).expect("tagging rate > 0"),
        ..Default::default()
    }
}

async fn provider(rate: u32, burst: u32, tags: u32) -> Arc<SqsProvider> {
    Arc::new(SqsProvider::from_env(&sqs_settings(rate, burst, tags)).await)
}

/// An in-process Queue controller for one namespace.
struct Operator {
    ctx: Arc<Context>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    /// `aws`: the settings `sqs` was built with, as `skyport run` has them (the controller builds
    /// AwsAccounts' clients from them).
    async fn start(
        client: Client,
        sqs: Arc<dyn QueueBackend>,
        aws: SqsSettings,
        settings: QueueArgs,
        ns: &str,
    ) -> Self {
        let (stop, rx) = oneshot::channel::<()>();
        let (ctx, run) = controller(client, sqs, aws, settings, Some(ns.to_string()), async {
            let _ = rx.await;
        });
        let task = tokio::spawn(run);
        // Not Store::wait_until_ready: it wakes only one of several waiters (see store_synced).
        skyport::controllers::store_synced(&ctx.queues).await;
        skyport::controllers::store_synced(&ctx.configmaps).await;
        Operator { ctx, stop, task }
    }

    async fn stop(mut self) {
        let _ = self.stop.send(());
        if tokio::time::timeout(Duration::from_secs(30), &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Bench {
    fn fail(&self, what: String) {
        println!("  BROKEN: {what}");
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    async fn namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let name = format!("bench-{prefix}-{:08x}", rand::random::<u32>());
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"skyport.dev/bench": "true"}}
        }))?;
        Api::<Namespace>::all(self.driver.clone()).create(&PostParams::default(), &ns).await?;
        Ok(name)
    }

    /// Creates Queues `range` in `ns`, CREATE_CONCURRENCY at a time, handing each created object
    /// to `created` (the baseline's work queue).
    async fn create_queues(
        &self,
        ns: &str,
        range: std::ops::Range<usize>,
        created: Option<mpsc::UnboundedSender<Queue>>,
    ) -> anyhow::Result<()> {
        let api: Api<Queue> = Api::namespaced(self.driver.clone(), ns);
        futures::stream::iter(queue_names(range))
            .map(|name| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &common::queue(&name, spec())).await }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .map_err(anyhow::Error::from)
            .try_for_each(|q| {
                if let Some(tx) = &created {
                    let _ = tx.unbounded_send(q);
                }
                futures::future::ready(Ok(()))
            })
            .await
    }

    /// Deletes every Queue of `ns` and its SQS queue (directly, with no controller running),
    /// waits until the Queue objects are gone, then deletes the namespace.
    async fn cleanup(&self, ns: &str) -> anyhow::Result<()> {
        progress!("cleaning up {ns}");
        let api: Api<Queue> = Api::namespaced(self.driver.clone(), ns);
        api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let left = api.list(&ListParams::default()).await?.items;
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!("{} Queues still in {ns} after 10 minutes of clean-up", left.len());
            }
            futures::stream::iter(left)
                .for_each_concurrent(CLEANUP_CONCURRENCY, |q| {
                    let api = api.clone();
                    async move {
                        let url = match q.status.as_ref().and_then(|s| s.queue_url.clone()) {
                            Some(url) => Some(url),
                            None => self
                                .janitor
                                .queue_url(&queue_name(ns, &q.name_any(), &q.spec, None))
                                .await
                                .ok()
                                .flatten(),
                        };
                        if let Some(url) = url {
                            let _ = self.janitor.delete_queue(&url).await;
                        }
                        let _ = remove_finalizer(&api, &q, FINALIZER).await;
                    }
                })
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let _ = Api::<Namespace>::all(self.driver.clone()).delete(ns, &DeleteParams::default()).await;
        Ok(())
    }
}

// ---- 1. time to Ready ---------------------------------------------------------------------------

struct Arm {
    wall: Duration,
    sqs_calls: u64,
    api_writes: u64,
    cpu: String,
    profile: BTreeMap<String, (u64, Duration)>,
}

fn ready_timeout(n: usize, rate: u32) -> Duration {
    // Generous: only a stuck controller takes this long (3 SQS calls per new Queue).
    Duration::from_secs(180)
        + Duration::from_secs_f64(6.0 * n as f64 / rate as f64)
        + Duration::from_millis(200) * n as u32
}

impl Bench {
    async fn arm_skyport(
        &self,
        n: usize,
        concurrency: u16,
        sqs: Arc<SqsProvider>,
        aws: SqsSettings,
    ) -> anyhow::Result<Arm> {
        let rate = aws.rate_per_second.get();
        let ns = self.namespace("ready-skyport").await?;
        progress!("skyport arm, N = {n}, namespace {ns}: starting the controller");
        let settings = QueueArgs { concurrency, ..Default::default() };
        let op = Operator::start(self.kube.clone(), sqs.clone(), aws, settings, &ns).await;
        progress!("controller started");
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        progress!("watch synced; creating {n} Queues");
        let (calls0, writes0, cpu0) = (sqs.limiter().counters.total(), op.ctx.api_writes.get(), self.procs.snapshot());
        profile::take();
        let t0 = Instant::now();
        self.create_queues(&ns, 0..n, None).await?;
        let done = watch.all_ready(n, ready_timeout(n, rate)).await;
        let (calls, writes, cpu) = (sqs.limiter().counters.total(), op.ctx.api_writes.get(), self.procs.snapshot());
        let profile = profile::take();
        drop(watch);
        op.stop().await;
        self.cleanup(&ns).await?;
        let wall = done? - t0;
        Ok(Arm {
            wall,
            sqs_calls: calls - calls0,
            api_writes: writes - writes0,
            cpu: self.procs.describe(&cpu0, &cpu, wall),
            profile,
        })
    }

    /// The minimal work per Queue, with the operator's kube client and SQS provider: finalizer
    /// patch, CreateQueue, status patch; `concurrency` Queues at a time, fed as they are created.
    async fn arm_baseline(&self, n: usize, concurrency: u16, sqs: Arc<SqsProvider>, rate: u32) -> anyhow::Result<Arm> {
        let ns = self.namespace("ready-baseline").await?;
        progress!("baseline arm, N = {n}, namespace {ns}");
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        let api: Api<Queue> = Api::namespaced(self.kube.clone(), &ns);
        let writes = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::unbounded::<Queue>();
        let worker = {
            let (sqs, writes, errors) = (sqs.clone(), writes.clone(), errors.clone());
            tokio::spawn(rx.for_each_concurrent(concurrency as usize, move |q| {
                let (api, sqs, writes, errors) = (api.clone(), sqs.clone(), writes.clone(), errors.clone());
                async move {
                    // Retried like a controller would, so a hiccup costs time instead of the run.
                    for attempt in 0..5 {
                        match baseline_one(&api, sqs.as_ref(), &q, &writes).await {
                            Ok(()) => return,
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                if attempt == 4 {
                                    println!("  baseline: giving up on {}: {e:#}", q.name_any());
                                }
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }
                }
            }))
        };
        let (calls0, cpu0) = (sqs.limiter().counters.total(), self.procs.snapshot());
        profile::take();
        let t0 = Instant::now();
        self.create_queues(&ns, 0..n, Some(tx)).await?;
        let done = watch.all_ready(n, ready_timeout(n, rate)).await;
        let (calls, cpu) = (sqs.limiter().counters.total(), self.procs.snapshot());
        let profile = profile::take();
        drop(watch);
        let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
        let errors = errors.load(Ordering::Relaxed);
        if errors > 0 {
            println!("  baseline: {errors} failed attempts (retried)");
        }
        self.cleanup(&ns).await?;
        let wall = done? - t0;
        Ok(Arm {
            wall,
            sqs_calls: calls - calls0,
            api_writes: writes.load(Ordering::Relaxed),
            cpu: self.procs.describe(&cpu0, &cpu, wall),
            profile,
        })
    }

    async fn time_to_ready(&self, o: &Opts) -> anyhow::Result<()> {
        println!("\n== 1. time to Ready: N Queues created at once, skyport vs minimal baseline");
        println!(
            "   both arms: same kube Client, same SqsProvider (same governor), concurrency {}; Queues created {} at a time",
            o.concurrency, CREATE_CONCURRENCY
        );
        for &governor in &o.governors {
            let (rate, burst, tags) = governor.settings();
            let sqs = provider(rate, burst, tags).await;
            for &n in &o.ready_n {
                println!("\n-- N = {n}, {}, {} run(s)", governor.describe(), o.runs);
                let (mut s_wall, mut b_wall, mut ratios) = (vec![], vec![], vec![]);
                for run in 0..o.runs {
                    // Alternate which arm goes first, so slow drift of the machine cancels out.
                    let refill = Duration::from_secs_f64(burst as f64 / rate as f64 + 1.0).min(Duration::from_secs(5));
                    let (s, b) = if run % 2 == 0 {
                        let b = self.arm_baseline(n, o.concurrency, sqs.clone(), rate).await?;
                        tokio::time::sleep(refill).await;
                        (self.arm_skyport(n, o.concurrency, sqs.clone(), sqs_settings(rate, burst, tags)).await?, b)
                    } else {
                        let s =
                            self.arm_skyport(n, o.concurrency, sqs.clone(), sqs_settings(rate, burst, tags)).await?;
                        tokio::time::sleep(refill).await;
                        (s, self.arm_baseline(n, o.concurrency, sqs.clone(), rate).await?)
                    };
                    tokio::time::sleep(refill).await;
                    let ratio = secs(s.wall) / secs(b.wall);
                    println!(
                        "   run {}: skyport {:7.2} s, baseline {:7.2} s, ratio {:.2}",
                        run + 1,
                        secs(s.wall),
                        secs(b.wall),
                        ratio
                    );
                    for (name, arm) in [("skyport", &s), ("baseline", &b)] {
                        println!(
                            "     {name:<8} per Queue until all Ready: {:.2} SQS calls, {:.2} API writes; CPU: {}",
                            arm.sqs_calls as f64 / n as f64,
                            arm.api_writes as f64 / n as f64,
                            arm.cpu
                        );
                    }
                    if o.profile {
                        profile::print("skyport", n, &s.profile);
                        profile::print("baseline", n, &b.profile);
                    }
                    s_wall.push(secs(s.wall));
                    b_wall.push(secs(b.wall));
                    ratios.push(ratio);
                }
                let r = median(&ratios);
                println!(
                    "   median: skyport {:.2} s, baseline {:.2} s, ratio {:.2} (runs: {}) -> target <= 1.25: {}",
                    median(&s_wall),
                    median(&b_wall),
                    r,
                    ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
                    if r <= 1.25 { "met" } else { "MISSED" }
                );
                println!(
                    "   throughput: skyport {:.1} Queues/s, baseline {:.1} Queues/s",
                    n as f64 / median(&s_wall),
                    n as f64 / median(&b_wall)
                );
            }
        }
        Ok(())
    }
}

async fn baseline_one(api: &Api<Queue>, sqs: &dyn QueueBackend, q: &Queue, writes: &AtomicU64) -> anyhow::Result<()> {
    let q = if q.finalizers().iter().any(|f| f == FINALIZER) {
        q.clone()
    } else {
        writes.fetch_add(1, Ordering::Relaxed);
        add_finalizer(api, q, FINALIZER).await?
    };
    let ns = q.namespace().unwrap_or_default();
    let uid = q.uid().unwrap_or_default();
    let name = q.name_any();
    let d = desired(&q.spec, &Owner { namespace: &ns, name: &name, uid: &uid, recorded_name: None }, None);
    let url = sqs.create_queue(&d.name, &d.create_attributes(q.spec.fifo), &d.tags).await?;
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let conditions = [("Ready", "Available", "the SQS queue exists"), ("Synced", "ReconcileSuccess", "")]
        .into_iter()
        .map(|(t, reason, message)| Condition {
            observed_generation: q.metadata.generation,
            last_transition_time: now.as_str().into(),
            ..Condition::new(t, ConditionStatus::True, reason, message)
        })
        .collect();
    let status = QueueStatus {
        queue_url: Some(url),
        queue_arn: None,
        queue_name: Some(d.name.into()),
        adopted: false,
        observed_generation: q.metadata.generation,
        conditions,
        ..Default::default()
    };
    writes.fetch_add(1, Ordering::Relaxed);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await?;
    Ok(())
}

// ---- 2. steady state, 3. drift --------------------------------------------------------------------

type Versions = HashMap<String, Option<String>>;

async fn versions_of<K>(api: Api<K>) -> anyhow::Result<Versions>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.iter().map(|o| (o.name_any(), o.resource_version())).collect())
}

/// How many objects of `after` are new or have another resourceVersion than in `before`.
fn changed(before: &Versions, after: &Versions) -> usize {
    after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).count()
}

impl Bench {
    async fn steady_and_drift(&self, o: &Opts, drift: bool) -> anyhow::Result<()> {
        let m = o.steady_n;
        // A governor that does not bind: the steady state needs m / resync calls per second.
        let rate = ((3.0 * m as f64 / secs(o.resync)).ceil() as u32).max(50);
        println!("\n== 2. steady state: {m} Ready Queues, resync {:?}, {} periods", o.resync, o.periods);
        println!("   governor {rate}/s, burst {rate} (3x the expected need); concurrency {}", o.concurrency);
        let ns = self.namespace("steady").await?;
        let real = provider(rate, rate, rate).await;
        let per_queue = Arc::new(PerQueue { inner: real.clone(), calls: Mutex::default() });
        let settings = QueueArgs { resync: o.resync, concurrency: o.concurrency, ..Default::default() };
        let op = Operator::start(
            self.kube.clone(),
            per_queue.clone(),
            sqs_settings(rate, rate, rate),
            settings.clone(),
            &ns,
        )
        .await;
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        let t0 = Instant::now();
        self.create_queues(&ns, 0..m, None).await?;
        let all = watch.all_ready(m, ready_timeout(m, rate)).await?;
        println!("   {m} Queues Ready after {:.1} s; settling for 2 resyncs", secs(all - t0));
        tokio::time::sleep(o.resync * 2).await;

        let (q_rv0, cm_rv0) = self.versions(&ns).await?;
        let (writes0, ops0, per0) = (op.ctx.api_writes.get(), real.limiter().counters.snapshot(), per_queue.snapshot());
        let reconciles0 = op.ctx.metrics.reconciles();
        let sampler = Sampler::start(per_queue.clone());
        let window = o.resync * o.periods;
        tokio::time::sleep(window).await;
        let samples = sampler.finish().await;
        let (writes1, ops1, per1) = (op.ctx.api_writes.get(), real.limiter().counters.snapshot(), per_queue.snapshot());
        let reconciles = op.ctx.metrics.reconciles() - reconciles0;
        let (q_rv1, cm_rv1) = self.versions(&ns).await?;

        let writes = writes1 - writes0;
        let delta: BTreeMap<&str, u64> =
            ops1.iter().map(|(k, v)| (*k, v - ops0.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect();
        let total: u64 = delta.values().sum();
        let per_resync = total as f64 / (m as f64 * o.periods as f64);
        let per_q: Vec<f64> = per1
            .iter()
            .filter(|(k, _)| k.starts_with(&ns))
            .map(|(k, v)| (v - per0.get(k).copied().unwrap_or(0)) as f64 / o.periods as f64)
            .collect();
        println!("   over {:.0} s ({} resyncs):", secs(window), o.periods);
        println!(
            "   API-server writes: {writes} (counter); objects whose resourceVersion changed: {} Queues, {} ConfigMaps -> target 0: {}",
            changed(&q_rv0, &q_rv1),
            changed(&cm_rv0, &cm_rv1),
            if writes == 0 { "met" } else { "MISSED" }
        );
        println!("   SQS calls: {total} {delta:?}");
        let per_reconcile = total as f64 / reconciles.max(1) as f64;
        println!(
            "   SQS calls per reconcile: {per_reconcile:.3} ({reconciles} reconciles) -> target <= 1: {}",
            if per_reconcile <= 1.0 { "met" } else { "MISSED" }
        );
        println!(
            "   SQS calls per Queue per nominal resync period: {per_resync:.3} (per Queue: min {:.2}, median {:.2}, max {:.2})",
            percentile(&per_q, 0.0),
            median(&per_q),
            percentile(&per_q, 1.0),
        );
        println!(
            "   (each resync is shortened by up to 10% at random, so about 1/0.95 = 1.05 reads per nominal period is one per resync)"
        );
        let b = budget(&samples, rate as f64, rate as f64);
        self.print_budget(&b, rate, rate);

        if drift {
            self.drift(o, &ns, &watch).await?;
        }

        // Restart under skyport's default governor: every Queue is reconciled at once (its tags
        // are due after a restart), which is what the governor is for.
        let (d_rate, d_burst, d_tags) = Governor::Default.settings();
        println!(
            "\n-- operator restart with the {m} Ready Queues, under the {}: {:.0} s window",
            Governor::Default.describe(),
            secs(o.budget_window)
        );
        op.stop().await;
        let ((q_rv0, cm_rv0), events0) = (self.versions(&ns).await?, self.events(&ns).await?);
        let limited = provider(d_rate, d_burst, d_tags).await;
        let sampler = Sampler::start(limited.clone());
        let op =
            Operator::start(self.kube.clone(), limited.clone(), sqs_settings(d_rate, d_burst, d_tags), settings, &ns)
                .await;
        tokio::time::sleep(o.budget_window).await;
        let samples = sampler.finish().await;
        let b = budget(&samples, d_rate as f64, d_burst as f64);
        let ((q_rv1, cm_rv1), events1) = (self.versions(&ns).await?, self.events(&ns).await?);
        let events: BTreeMap<&String, u64> = events1
            .iter()
            .map(|(reason, n)| (reason, n - events0.get(reason).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let writes = op.ctx.api_writes.get();
        println!(
            "   API-server writes during the restart: {writes} (counter; objects whose resourceVersion changed: {} Queues, {} ConfigMaps; Events {events:?}) -> target 0: {}",
            changed(&q_rv0, &q_rv1),
            changed(&cm_rv0, &cm_rv1),
            if writes == 0 { "met" } else { "MISSED" }
        );
        println!("   SQS calls {:?}", limited.limiter().counters.snapshot());
        self.print_budget(&b, d_rate, d_burst);
        let (waits, waited) = limited.limiter().counters.waits();
        println!("   governor waits: {waits} calls waited, {:.1} s in total", secs(waited));
        op.stop().await;
        drop(watch);
        self.cleanup(&ns).await
    }

    /// resourceVersion per Queue and per ConfigMap in `ns`.
    async fn versions(&self, ns: &str) -> anyhow::Result<(Versions, Versions)> {
        let queues = versions_of(Api::<Queue>::namespaced(self.driver.clone(), ns)).await?;
        Ok((queues, versions_of(Api::<ConfigMap>::namespaced(self.driver.clone(), ns)).await?))
    }

    /// Events in `ns` by reason, a series counted as its repeats.
    async fn events(&self, ns: &str) -> anyhow::Result<BTreeMap<String, u64>> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.driver.clone(), ns);
        let mut by_reason = BTreeMap::new();
        for e in api.list(&ListParams::default()).await?.items {
            let n = e.series.as_ref().map_or(1, |s| u64::try_from(s.count).unwrap_or(1));
            *by_reason.entry(e.reason.unwrap_or_default()).or_insert(0) += n;
        }
        Ok(by_reason)
    }

    fn print_budget(&self, b: &Budget, rate: u32, burst: u32) {
        let avg = b.calls as f64 / secs(b.window).max(1e-9);
        println!(
            "   governor budget {rate}/s + burst {burst}: {} calls in {:.1} s = {:.1}/s; peak in any 1 s: {} (budget {}); largest excess over rate x t + burst in any window: {:+.1} calls -> {}",
            b.calls,
            secs(b.window),
            avg,
            b.peak_1s,
            rate + burst,
            b.max_excess,
            if b.max_excess <= 1.0 { "never exceeded" } else { "EXCEEDED" }
        );
        if b.max_excess > 1.0 {
            self.fail(format!("SQS calls exceeded the governor budget by {:.1}", b.max_excess));
        }
    }

    /// Attribute drift (SetQueueAttributes behind skyport's back) and deletion drift
    /// (DeleteQueue), each on `drift_k` Queues. Deletions go first, because SQS refuses to
    /// recreate a name for 60 s: the attribute rounds run while that wait is on.
    async fn drift(&self, o: &Opts, ns: &str, watch: &ReadyWatch) -> anyhow::Result<()> {
        let k = o.drift_k.min(o.steady_n / 2).max(1);
        let queues: Api<Queue> = Api::namespaced(self.driver.clone(), ns);
        let urls: BTreeMap<String, String> = queues
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|q| Some((q.name_any(), q.status?.queue_url?)))
            .collect();
        let names: Vec<String> = urls.keys().cloned().collect();
        let (deleted, changed) = (&names[..k], &names[k..2 * k]);
        let retry = QueueArgs::default().recently_deleted_retry;
        println!(
            "\n== 3. drift repair: {k} queues deleted and {} changed out of band, resync {:?}",
            changed.len(),
            o.resync
        );

        // Deletion.
        let t_del = Instant::now();
        futures::future::try_join_all(deleted.iter().map(|n| self.oob.delete_queue().queue_url(&urls[n]).send()))
            .await?;
        let del_polls = futures::future::join_all(deleted.iter().map(|n| {
            let sqs_name = format!("{ns}_{n}");
            async move {
                let deadline = t_del + Duration::from_secs(300) + o.resync * 2;
                loop {
                    if common::queue_exists(&self.oob, &sqs_name).await {
                        return Some(Instant::now());
                    }
                    if Instant::now() > deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }));
        let attr_rounds = async {
            let mut latencies = vec![];
            for round in 0..2 {
                if round > 0 {
                    // Start the second round at another phase of the resync cycle.
                    tokio::time::sleep(o.resync.mul_f64(0.37)).await;
                }
                let results = futures::future::join_all(changed.iter().map(|n| async {
                    let url = &urls[n];
                    self.oob
                        .set_queue_attributes()
                        .queue_url(url)
                        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "7")
                        .send()
                        .await
                        .ok()?;
                    let t = Instant::now();
                    let deadline = t + o.resync * 3 + Duration::from_secs(60);
                    loop {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if visibility(&self.oob, url).await.as_deref() == Some(SPEC_VISIBILITY) {
                            return Some(Instant::now() - t);
                        }
                        if Instant::now() > deadline {
                            return None;
                        }
                    }
                }))
                .await;
                latencies.extend(results);
            }
            latencies
        };
        let (del_back, attr) = tokio::join!(del_polls, attr_rounds);

        let r = secs(o.resync);
        let attr_ok: Vec<f64> = attr.iter().flatten().map(|d| secs(*d)).collect();
        if attr_ok.len() < attr.len() {
            self.fail(format!("{} attribute changes were never reverted", attr.len() - attr_ok.len()));
        }
        let max = percentile(&attr_ok, 1.0);
        println!(
            "   attribute drift ({} samples, 2 rounds): repaired after median {:.2} s, p90 {:.2} s, max {:.2} s = {:.2} x resync -> target <= 1.10 x resync: {}",
            attr_ok.len(),
            median(&attr_ok),
            percentile(&attr_ok, 0.9),
            max,
            max / r,
            if max <= 1.1 * r { "met" } else { "MISSED" }
        );

        let mut detect = vec![];
        let mut ready_again = vec![];
        let mut exists = vec![];
        for (n, back) in deleted.iter().zip(&del_back) {
            let h = watch.history(n);
            let after: Vec<_> = h.into_iter().filter(|(t, _, _)| *t >= t_del).collect();
            if let Some((t, _, _)) = after.iter().find(|(_, s, _)| *s == ConditionStatus::False) {
                detect.push(secs(*t - t_del));
                if let Some((t2, _, _)) = after.iter().find(|(t2, s, _)| t2 > t && *s == ConditionStatus::True) {
                    ready_again.push(secs(*t2 - t_del));
                }
            }
            match back {
                Some(t) => exists.push(secs(*t - t_del)),
                None => self.fail(format!("deleted queue of {n} never came back")),
            }
        }
        println!(
            "   deletion ({} queues): noticed (Ready=False, RecentlyDeleted) after median {:.2} s, max {:.2} s = {:.2} x resync",
            deleted.len(),
            median(&detect),
            percentile(&detect, 1.0),
            percentile(&detect, 1.0) / r
        );
        println!(
            "   queue exists again after median {:.1} s, max {:.1} s; Ready again after median {:.1} s, max {:.1} s",
            median(&exists),
            percentile(&exists, 1.0),
            median(&ready_again),
            percentile(&ready_again, 1.0)
        );
        println!(
            "   (SQS refuses the name for 60 s after a deletion; skyport retries every {:?}, so the floor is 60 s and the expected worst case 60 s + {:?} + a resync; beyond the 60 s: median {:.1} s, max {:.1} s)",
            retry,
            retry,
            median(&exists) - 60.0,
            percentile(&exists, 1.0) - 60.0
        );
        Ok(())
    }
}

/// The queue's VisibilityTimeout, read behind skyport's back; `None` on any error.
async fn visibility(oob: &aws_sdk_sqs::Client, url: &str) -> Option<String> {
    let out = oob
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
        .send()
        .await
        .ok()?;
    out.attributes?.get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout).cloned()
}

// ---- 4. memory -------------------------------------------------------------------------------------

struct Process {
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl Process {
    fn spawn(ns: &str, rate: u32, log: PathBuf) -> anyhow::Result<Self> {
        let file = std::fs::File::create(&log)?;
        let child = tokio::process::Command::new(entry::skyport_exe())
            .args(["run", "--namespace", ns, "--log-format", "json", "--listen-address", "127.0.0.1:0"])
            .args([
                "--sqs-rate",
                &rate.to_string(),
                "--sqs-burst",
                &rate.to_string(),
                "--sqs-tag-rate",
                &rate.to_string(),
            ])
            // "reconciled" lines (debug) tell when a restart has been through every Queue.
            .env("RUST_LOG", "info,kube_runtime=warn,skyport::controllers::queue=debug")
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .context("starting skyport run")?;
        let pid = child.id().context("no pid")?;
        Ok(Process { child, pid, log })
    }

    /// How many different Queues the process has reconciled (from its debug log).
    fn reconciled(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let queues: std::collections::HashSet<&str> = log
            .lines()
            .filter(|l| l.contains("\"message\":\"reconciled\""))
            .filter_map(|l| l.split("\"queue\":\"").nth(1)?.split('"').next())
            .collect();
        queues.len()
    }

    /// SIGTERM, then up to 30 s for the graceful shutdown.
    async fn stop(&mut self) -> anyhow::Result<()> {
        let _ = tokio::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().await;
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            self.child.kill().await?;
            bail!("skyport run (pid {}) ignored SIGTERM for 30 s", self.pid);
        }
        Ok(())
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Bench {
    async fn memory(&self, o: &Opts) -> anyhow::Result<()> {
        println!("\n== 4. memory of the operator process: {}", entry::skyport_build());
        println!(
            "   skyport run --namespace <ns> --sqs-rate {0} --sqs-burst {0} --sqs-tag-rate {0} (resync and everything else default)",
            o.memory_rate
        );
        let ns = self.namespace("memory").await?;
        let dir = std::env::temp_dir();
        let mut op = Process::spawn(&ns, o.memory_rate, dir.join(format!("skyport-bench-{ns}-0.log")))?;
        let mut watch = ReadyWatch::start(Api::namespaced(self.driver.clone(), &ns)).await?;
        let settle = Duration::from_secs(if o.quick { 3 } else { 20 });
        tokio::time::sleep(settle.min(Duration::from_secs(5))).await;
        let idle = (vm_kib(op.pid, "VmRSS").unwrap_or(0), vm_kib(op.pid, "VmHWM").unwrap_or(0));
        println!("   no Queues: RSS {:.1} MiB, peak {:.1} MiB", mib(idle.0), mib(idle.1));
        let mut rows = vec![];
        let mut have = 0;
        let mut restarts = 0;
        let result: anyhow::Result<()> = async {
            for &n in &o.memory_n {
                let t0 = Instant::now();
                self.create_queues(&ns, have..n.max(have), None).await?;
                have = have.max(n);
                watch.all_ready(n, ready_timeout(n, o.memory_rate)).await?;
                let grow = Instant::now() - t0;
                tokio::time::sleep(settle).await;
                if !op.alive() {
                    bail!("skyport run exited; log: {}", op.log.display());
                }
                let (rss, hwm) = (vm_kib(op.pid, "VmRSS").unwrap_or(0), vm_kib(op.pid, "VmHWM").unwrap_or(0));
                // A fresh process with all n Queues already there: the initial list plus a
                // reconcile of every Queue (tags are due after a start) at once.
                op.stop().await?;
                restarts += 1;
                op = Process::spawn(&ns, o.memory_rate, dir.join(format!("skyport-bench-{ns}-{restarts}.log")))?;
                let t1 = Instant::now();
                let deadline = t1 + Duration::from_secs(120) + Duration::from_secs_f64(10.0 * n as f64 / o.memory_rate as f64);
                while op.reconciled() < n {
                    if Instant::now() > deadline || !op.alive() {
                        bail!("restarted operator reconciled {} of {n} Queues; log: {}", op.reconciled(), op.log.display());
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let sweep = Instant::now() - t1;
                tokio::time::sleep(settle).await;
                let (rss_r, hwm_r) = (vm_kib(op.pid, "VmRSS").unwrap_or(0), vm_kib(op.pid, "VmHWM").unwrap_or(0));
                println!(
                    "   {n:>6} Queues: grown in {:.0} s: RSS {:.1} MiB, peak {:.1} MiB | restarted (all reconciled in {:.1} s): RSS {:.1} MiB, peak {:.1} MiB",
                    secs(grow),
                    mib(rss),
                    mib(hwm),
                    secs(sweep),
                    mib(rss_r),
                    mib(hwm_r)
                );
                rows.push((n, rss, hwm, rss_r, hwm_r));
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            self.fail(format!("memory scenario: {e:#}"));
        }
        if let (Some(a), Some(b)) = (rows.first(), rows.last())
            && b.0 > a.0
        {
            let per = |x: u64, y: u64| (y as f64 - x as f64) * 1024.0 / (b.0 - a.0) as f64;
            println!(
                "   per Queue ({} -> {}): RSS {:.0} B, peak {:.0} B (grown); RSS {:.0} B, peak {:.0} B (restarted)",
                a.0,
                b.0,
                per(a.1, b.1),
                per(a.2, b.2),
                per(a.3, b.3),
                per(a.4, b.4)
            );
            let peak = mib(b.2.max(b.4));
            println!(
                "   peak at {} Queues: {:.1} MiB -> target <= 48 MiB at 10,000: {}",
                b.0,
                peak,
                if b.0 < 10_000 {
                    "n/a (fewer Queues)"
                } else if peak <= 48.0 {
                    "met"
                } else {
                    "MISSED"
                }
            );
        }
        drop(watch);
        let stopped = op.stop().await;
        self.cleanup(&ns).await?;
        stopped
    }
}

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
    println!("\n(Tunnel figures, issue 5 item 5: `cargo bench --bench tunnel`, benches/tunnel.rs.)");
    let failures = bench.failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!(
        "done in {:.0} s; {}",
        secs(started.elapsed()),
        if failures.is_empty() { "nothing broken".to_string() } else { format!("BROKEN: {failures:?}") }
    );
    Ok(failures.is_empty())
}

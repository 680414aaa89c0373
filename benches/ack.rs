//! skyport side by side with the ACK SQS controller (github.com/aws-controllers-k8s/sqs-controller),
//! the system a user would pick instead (issue 13, item 2). Both run as real processes against
//! the same kube-apiserver and LocalStack, one after the other in one benchmark run, each watching
//! its own namespace, on the same N Queues (same attributes and tag):
//!
//! - time until every Queue is Ready (skyport: `Ready=True`; ACK: `ACK.ResourceSynced=True` and
//!   `status.queueURL`), ACK at its defaults (1 worker, 10 h resync) and at skyport's settings
//!   (8 workers, 60 s resync);
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

#[path = "../tests/common/mod.rs"]
mod common;
// Shared with tests/cloud_faults.rs, which uses its random faults and not its tagging quota.
#[allow(dead_code)]
#[path = "../tests/common/sqs_faults.rs"]
mod sqs_faults;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

const CREATE_CONCURRENCY: usize = 32;
/// SQS's tagging quota per account (calls per second), which `--sqs-quota` enforces.
const TAGGING_QUOTA: u32 = providers::sqs::TAGGING_QUOTA_PER_SECOND;
/// skyport's default reconcile concurrency, which the "ACK at skyport's settings" arm copies.
const SKYPORT_CONCURRENCY: u32 = 8;
/// skyport's default resync, likewise.
const SKYPORT_RESYNC_S: u32 = 60;

const USAGE: &str = "\
usage: cargo bench --bench ack -- [--quick] [options]
  --quick            N = 10, 10 s idle window, every arm once (CI)
  --n LIST           Queue counts (default 100,1000)
  --arms LIST        from skyport,ack,ack-c (default all; ack arms need SKYPORT_ACK_SRC or SKYPORT_ACK)
                     ack = ACK at its defaults (1 worker, 10 h resync);
                     ack-c = ACK at skyport's settings (8 workers, 60 s resync)
  --idle DURATION    idle window after all are Ready (default 120s: two of skyport's resyncs)
  --sqs-quota        both operators reach SQS through a proxy that enforces SQS's tagging quota
                     (30/s per account, RequestThrottled beyond), which LocalStack does not
  --skyport-arg ARG  extra argument for `skyport run` (repeatable), e.g. --skyport-arg=--sqs-rate=500";

#[derive(Debug, Clone)]
struct Opts {
    quick: bool,
    n: Vec<usize>,
    arms: Vec<String>,
    idle: Duration,
    skyport_args: Vec<String>,
    sqs_quota: bool,
}

fn parse_args(args: &[String]) -> anyhow::Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        n: if quick { vec![10] } else { vec![100, 1000] },
        arms: vec!["skyport".into(), "ack".into(), "ack-c".into()],
        idle: Duration::from_secs(if quick { 10 } else { 120 }),
        skyport_args: vec![],
        sqs_quota: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag {
            "--quick" | "--bench" => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--n" => o.n = value()?.split(',').map(|x| x.trim().parse()).collect::<Result<_, _>>()?,
            "--arms" => o.arms = value()?.split(',').map(str::to_string).collect(),
            "--idle" => o.idle = humantime::parse_duration(&value()?)?,
            "--skyport-arg" => o.skyport_args.push(value()?),
            "--sqs-quota" => o.sqs_quota = true,
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    for a in &o.arms {
        if !["skyport", "ack", "ack-c"].contains(&a.as_str()) {
            bail!("unknown arm {a:?}\n{USAGE}");
        }
    }
    Ok(o)
}

// ---- /proc ---------------------------------------------------------------------------------------

/// User + system CPU seconds of a process (USER_HZ = 100).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some((f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?) as f64 / 100.0)
}

/// A `Vm*` line of `/proc/<pid>/status`, in MiB.
fn vm_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    kib as f64 / 1024.0
}

// ---- LocalStack's request log ---------------------------------------------------------------------

/// Counts SQS requests as LocalStack logged them (`localstack.request.aws ... AWS sqs.X => 200`),
/// between two offsets of its log: the same count for any client, whatever its SDK.
struct RequestLog(PathBuf);

impl RequestLog {
    fn find() -> anyhow::Result<Self> {
        let state = std::env::var_os("SKYPORT_TEST_ENV").context("SKYPORT_TEST_ENV is not set (tests/env.sh up)")?;
        let path = Path::new(&state).join("localstack/localstack.log");
        if !path.exists() {
            bail!("no LocalStack log at {}", path.display());
        }
        Ok(RequestLog(path))
    }
    fn offset(&self) -> u64 {
        std::fs::metadata(&self.0).map(|m| m.len()).unwrap_or(0)
    }
    /// SQS action → count, logged since `from`.
    fn sqs_calls_since(&self, from: u64) -> BTreeMap<String, u64> {
        use std::io::{Read, Seek, SeekFrom};
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.0) {
            let _ = f.seek(SeekFrom::Start(from));
            let _ = f.read_to_string(&mut text);
        }
        let mut calls = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.split("AWS sqs.").nth(1)
                && let Some((action, _)) = rest.split_once(" => ")
            {
                *calls.entry(action.to_string()).or_default() += 1;
            }
        }
        calls
    }
}

fn total(calls: &BTreeMap<String, u64>) -> u64 {
    calls.values().sum()
}

fn describe_calls(calls: &BTreeMap<String, u64>, per: f64) -> String {
    let parts: Vec<String> = calls.iter().map(|(k, v)| format!("{k} {:.2}", *v as f64 / per)).collect();
    format!("{:.2} ({})", total(calls) as f64 / per, parts.join(", "))
}

// ---- the two operators -----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Skyport,
    Ack,
}

#[derive(Debug, Clone)]
struct Arm {
    key: &'static str,
    label: String,
    kind: Kind,
    /// ACK's `--reconcile-default-max-concurrent-syncs` and `--reconcile-default-resync-seconds`.
    ack_workers: Option<u32>,
    ack_resync_s: Option<u32>,
}

fn arms(o: &Opts, ack: Option<&Ack>) -> Vec<Arm> {
    let mut v = vec![];
    for key in &o.arms {
        match key.as_str() {
            "skyport" => v.push(Arm {
                key: "skyport",
                label: if o.skyport_args.is_empty() {
                    "skyport (defaults)".into()
                } else {
                    format!("skyport ({})", o.skyport_args.join(" "))
                },
                kind: Kind::Skyport,
                ack_workers: None,
                ack_resync_s: None,
            }),
            "ack" if ack.is_some() => v.push(Arm {
                key: "ack",
                label: "ACK (defaults: 1 worker, resync 10 h)".into(),
                kind: Kind::Ack,
                ack_workers: None,
                ack_resync_s: None,
            }),
            "ack-c" if ack.is_some() => v.push(Arm {
                key: "ack-c",
                label: format!("ACK ({SKYPORT_CONCURRENCY} workers, resync {SKYPORT_RESYNC_S} s: skyport's settings)"),
                kind: Kind::Ack,
                ack_workers: Some(SKYPORT_CONCURRENCY),
                ack_resync_s: Some(SKYPORT_RESYNC_S),
            }),
            _ => {}
        }
    }
    v
}

/// The ACK controller binary and the checkout its CRDs come from.
struct Ack {
    bin: PathBuf,
    src: PathBuf,
    commit: String,
}

impl Ack {
    fn from_env() -> anyhow::Result<Option<Ack>> {
        let Some(src) = std::env::var_os("SKYPORT_ACK_SRC").map(PathBuf::from) else {
            return Ok(None);
        };
        let bin = match std::env::var_os("SKYPORT_ACK") {
            Some(b) => PathBuf::from(b),
            None => {
                let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/env/build-ack.sh");
                let out = std::process::Command::new(script)
                    .env("SKYPORT_ACK_SRC", &src)
                    .stderr(Stdio::inherit())
                    .output()
                    .context("running tests/env/build-ack.sh")?;
                if !out.status.success() {
                    bail!("tests/env/build-ack.sh failed");
                }
                PathBuf::from(String::from_utf8(out.stdout)?.trim())
            }
        };
        let commit = std::process::Command::new("git")
            .arg("-C")
            .arg(&src)
            .args(["log", "-1", "--format=%h %cs"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        Ok(Some(Ack { bin, src, commit }))
    }

    /// Applies the checkout's CRDs (config/crd/bases and config/crd/common/bases).
    async fn install_crds(&self, client: &Client) -> anyhow::Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for dir in ["config/crd/bases", "config/crd/common/bases"] {
            for entry in std::fs::read_dir(self.src.join(dir)).with_context(|| format!("{dir} in the ACK checkout"))? {
                let path = entry?.path();
                if path.extension().is_none_or(|e| e != "yaml") {
                    continue;
                }
                let text = std::fs::read_to_string(&path)?;
                let crd: CustomResourceDefinition =
                    serde_saphyr::from_str(&text).with_context(|| format!("{}", path.display()))?;
                api.patch(&crd.name_any(), &PatchParams::apply("skyport-bench").force(), &Patch::Apply(&crd)).await?;
            }
        }
        // Established before the first create.
        for _ in 0..100 {
            if let Ok(c) = api.get("queues.sqs.services.k8s.aws").await
                && c.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        bail!("the ACK Queue CRD was not Established in 30 s")
    }
}

struct OperatorProcess {
    child: tokio::process::Child,
    pid: u32,
    log: PathBuf,
}

impl OperatorProcess {
    /// `sqs`: where SQS is, when not at LocalStack directly (the quota proxy).
    fn spawn(
        arm: &Arm,
        ns: &str,
        ack: Option<&Ack>,
        skyport_args: &[String],
        sqs: Option<&str>,
    ) -> anyhow::Result<Self> {
        let log = std::env::temp_dir().join(format!("skyport-bench-{ns}.log"));
        let file = std::fs::File::create(&log)?;
        let mut cmd = match arm.kind {
            Kind::Skyport => {
                let mut c = tokio::process::Command::new(entry::skyport_exe());
                c.args(["run", "--namespace", ns, "--log-format", "json", "--listen-address", "127.0.0.1:0"]);
                c.args(skyport_args);
                if let Some(url) = sqs {
                    c.env("AWS_ENDPOINT_URL_SQS", url);
                }
                c
            }
            Kind::Ack => {
                let ack = ack.context("no ACK binary")?;
                let endpoint = std::env::var("AWS_ENDPOINT_URL").context("AWS_ENDPOINT_URL")?;
                let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
                let mut c = tokio::process::Command::new(&ack.bin);
                // Out of cluster: LocalStack for SQS and STS (GetCallerIdentity at start),
                // no cross-account resource management, only its own namespace, and every
                // listener on loopback.
                c.args(["--aws-region", &region, "--aws-endpoint-url", sqs.unwrap_or(&endpoint)])
                    .args(["--aws-identity-endpoint-url", &endpoint, "--allow-unsafe-aws-endpoint-urls"])
                    .args(["--enable-carm=false", "--watch-namespace", ns])
                    .args(["--metrics-addr", "127.0.0.1:0", "--healthz-addr", "127.0.0.1:0"]);
                if let Some(w) = arm.ack_workers {
                    c.args(["--reconcile-default-max-concurrent-syncs", &w.to_string()]);
                }
                if let Some(r) = arm.ack_resync_s {
                    c.args(["--reconcile-default-resync-seconds", &r.to_string()]);
                }
                // With a CA bundle set, every ACK reconcile fails (it has no --kubeconfig flag
                // either: KUBECONFIG comes from the environment).
                c.env_remove("AWS_CA_BUNDLE");
                c
            }
        };
        let child = cmd
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", arm.label))?;
        let pid = child.id().context("no pid")?;
        Ok(OperatorProcess { child, pid, log })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then up to 30 s for a graceful shutdown.
    async fn stop(&mut self) {
        let _ = tokio::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().await;
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

// ---- Queue objects of either kind ----------------------------------------------------------------------

fn resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::Skyport => {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("skyport.dev", "v1alpha1", "Queue"), "queues")
        }
        Kind::Ack => ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("sqs.services.k8s.aws", "v1alpha1", "Queue"),
            "queues",
        ),
    }
}

/// The same queue for both: visibility 45 s, retention 1 h, one user tag. skyport names the SQS
/// queue `<namespace>_<name>`; ACK's is given the same name.
fn object(kind: Kind, ar: &ApiResource, ns: &str, name: &str) -> DynamicObject {
    let spec = match kind {
        Kind::Skyport => {
            json!({"visibilityTimeoutSeconds": 45, "messageRetentionSeconds": 3600, "tags": {"bench": "queues"}})
        }
        Kind::Ack => json!({"queueName": format!("{ns}_{name}"), "visibilityTimeout": "45",
                             "messageRetentionPeriod": "3600", "tags": {"bench": "queues"}}),
    };
    DynamicObject::new(name, ar).within(ns).data(json!({ "spec": spec }))
}

fn condition_true(o: &DynamicObject, type_: &str) -> bool {
    o.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

fn is_ready(kind: Kind, o: &DynamicObject) -> bool {
    match kind {
        Kind::Skyport => condition_true(o, "Ready"),
        Kind::Ack => {
            condition_true(o, "ACK.ResourceSynced")
                && o.data["status"]["queueURL"].as_str().is_some_and(|u| !u.is_empty())
        }
    }
}

/// Watches one namespace's Queues and records when each was first seen Ready.
struct ReadyWatch {
    first_ready: Arc<Mutex<HashMap<String, Instant>>>,
    count: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    async fn start(api: Api<DynamicObject>, kind: Kind) -> anyhow::Result<Self> {
        let first_ready: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let (tx, count) = tokio::sync::watch::channel(0usize);
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let fr = first_ready.clone();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let o = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(s) = synced.take() {
                            let _ = s.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                if is_ready(kind, &o) {
                    let mut m = fr.lock().unwrap_or_else(|p| p.into_inner());
                    m.entry(o.name_any()).or_insert_with(Instant::now);
                    let _ = tx.send(m.len());
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), synced_rx).await.context("watch did not sync")??;
        Ok(ReadyWatch { first_ready, count, task })
    }

    /// When the last of `n` Queues was first seen Ready.
    async fn all_ready(&mut self, n: usize, timeout: Duration) -> anyhow::Result<Instant> {
        if tokio::time::timeout(timeout, self.count.wait_for(|c| *c >= n)).await.is_err() {
            bail!("only {} of {n} Queues Ready after {timeout:?}", *self.count.borrow());
        }
        let m = self.first_ready.lock().unwrap_or_else(|p| p.into_inner());
        m.values().max().copied().ok_or_else(|| anyhow!("no Ready Queue"))
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---- one arm -------------------------------------------------------------------------------------------

#[derive(Debug, Default, Clone)]
struct Figures {
    ready_s: f64,
    create_calls: BTreeMap<String, u64>,
    rss: f64,
    peak: f64,
    idle_cpu_per_min: f64,
    idle_calls: BTreeMap<String, u64>,
    delete_s: f64,
    delete_calls: BTreeMap<String, u64>,
    left_behind: usize,
    /// Requests through the quota proxy until all were Ready, and those it answered
    /// `RequestThrottled`.
    proxied: usize,
    throttled: usize,
}

struct Bench {
    driver: Client,
    oob: aws_sdk_sqs::Client,
    log: RequestLog,
    ack: Option<Ack>,
    quota: Option<sqs_faults::FaultProxy>,
    failures: Mutex<Vec<String>>,
}

impl Bench {
    fn fail(&self, what: String) {
        println!("  BROKEN: {what}");
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).push(what);
    }

    async fn namespace(&self, arm: &str) -> anyhow::Result<String> {
        let name = format!("bench-{arm}-{:08x}", rand::random::<u32>());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"skyport.dev/bench": "true"}}}))?;
        Api::<Namespace>::all(self.driver.clone()).create(&PostParams::default(), &ns).await?;
        Ok(name)
    }

    /// SQS queue URLs whose name starts with `prefix`. Retried: after minutes of idling, the
    /// first request can meet a pooled connection LocalStack has already closed.
    async fn sqs_queues(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let mut last = None;
        for _ in 0..3 {
            let mut urls = vec![];
            let mut pages = self.oob.list_queues().queue_name_prefix(prefix).max_results(1000).into_paginator().send();
            let mut failed = None;
            while let Some(page) = pages.next().await {
                match page {
                    Ok(p) => urls.extend(p.queue_urls.unwrap_or_default()),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            match failed {
                None => return Ok(urls),
                Some(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(last.map(anyhow::Error::from).unwrap_or_else(|| anyhow!("ListQueues failed")))
    }

    async fn run_arm(&self, arm: &Arm, n: usize, o: &Opts) -> anyhow::Result<Figures> {
        let ns = self.namespace(arm.key).await?;
        let ar = resource(arm.kind);
        let api: Api<DynamicObject> = Api::namespaced_with(self.driver.clone(), &ns, &ar);
        let proxy = self.quota.as_ref().map(|p| p.url());
        let mut op = OperatorProcess::spawn(arm, &ns, self.ack.as_ref(), &o.skyport_args, proxy.as_deref())?;
        let result = self.measure(arm, n, o, &ns, &ar, &api, &mut op).await;
        op.stop().await;
        if let Err(e) = &result {
            let tail: String = std::fs::read_to_string(&op.log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join("\n    ");
            self.fail(format!("{} at N = {n}: {e:#}; operator log {} ends:\n    {tail}", arm.label, op.log.display()));
        }
        self.cleanup(&ns, &api).await;
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure(
        &self,
        arm: &Arm,
        n: usize,
        o: &Opts,
        ns: &str,
        ar: &ApiResource,
        api: &Api<DynamicObject>,
        op: &mut OperatorProcess,
    ) -> anyhow::Result<Figures> {
        let mut f = Figures::default();
        // Let the operator start (ACK asks STS who it is, both list their caches) before the clock.
        tokio::time::sleep(Duration::from_secs(if o.quick { 3 } else { 5 })).await;
        if !op.alive() {
            bail!("the operator exited at start");
        }
        let mut watch = ReadyWatch::start(api.clone(), arm.kind).await?;
        let off = self.log.offset();
        let proxied = || {
            self.quota.as_ref().map_or((0, 0), |p| {
                let calls = p.calls();
                (calls.len(), calls.iter().filter(|c| c.fault.is_some()).count())
            })
        };
        let proxied0 = proxied();
        let t0 = Instant::now();
        futures::stream::iter((0..n).map(|i| format!("q-{i:05}")))
            .map(|name| {
                let (api, obj) = (api.clone(), object(arm.kind, ar, ns, &name));
                async move { api.create(&PostParams::default(), &obj).await }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .map_err(anyhow::Error::from)
            .try_for_each(|_| futures::future::ready(Ok(())))
            .await?;
        let timeout = Duration::from_secs(120) + Duration::from_millis(500 * n as u64);
        let done = watch.all_ready(n, timeout).await?;
        f.ready_s = (done - t0).as_secs_f64();
        f.create_calls = self.log.sqs_calls_since(off);
        let proxied1 = proxied();
        (f.proxied, f.throttled) = (proxied1.0 - proxied0.0, proxied1.1 - proxied0.1);
        if total(&f.create_calls) == 0 {
            bail!("LocalStack's log ({}) shows no SQS request: cannot count calls", self.log.0.display());
        }
        progress(&format!("{}: {n} Ready after {:.1} s", arm.label, f.ready_s));

        tokio::time::sleep(Duration::from_secs(5)).await;
        f.rss = vm_mib(op.pid, "VmRSS");
        let off = self.log.offset();
        let cpu0 = cpu_seconds(op.pid).unwrap_or(f64::NAN);
        tokio::time::sleep(o.idle).await;
        let cpu1 = cpu_seconds(op.pid).unwrap_or(f64::NAN);
        f.idle_calls = self.log.sqs_calls_since(off);
        f.idle_cpu_per_min = (cpu1 - cpu0) * 60.0 / o.idle.as_secs_f64();
        f.peak = vm_mib(op.pid, "VmHWM");
        if !op.alive() {
            bail!("the operator exited while idle");
        }
        drop(watch);

        let off = self.log.offset();
        let t1 = Instant::now();
        api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        let deadline = t1 + Duration::from_secs(300) + Duration::from_millis(500 * n as u64);
        loop {
            let left = api.list_metadata(&ListParams::default()).await?.items.len();
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("{left} Queue objects still there {:?} after the delete", deadline - t1);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        f.delete_s = t1.elapsed().as_secs_f64();
        f.delete_calls = self.log.sqs_calls_since(off);
        f.left_behind = self.sqs_queues(&format!("{ns}_")).await?.len();
        if f.left_behind > 0 {
            self.fail(format!("{} left {} of {n} SQS queues behind", arm.label, f.left_behind));
        }
        Ok(f)
    }

    /// Whatever a failed arm left: finalizers dropped, SQS queues deleted, namespace deleted.
    async fn cleanup(&self, ns: &str, api: &Api<DynamicObject>) {
        if let Ok(list) = api.list_metadata(&ListParams::default()).await {
            for o in list.items {
                let _ = api
                    .patch(
                        &o.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
                let _ = api.delete(&o.name_any(), &DeleteParams::default()).await;
            }
        }
        if let Ok(urls) = self.sqs_queues(&format!("{ns}_")).await {
            for url in urls {
                let _ = self.oob.delete_queue().queue_url(url).send().await;
            }
        }
        let _ = Api::<Namespace>::all(self.driver.clone()).delete(ns, &DeleteParams::default()).await;
    }
}

fn progress(msg: &str) {
    eprintln!("[{}] {msg}", humantime::format_rfc3339_seconds(std::time::SystemTime::now()));
}

fn mark(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

fn report(n: usize, rows: &[(Arm, Figures)], idle: Duration, quota: bool) {
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
            "  no ACK checkout given (SKYPORT_ACK_SRC): skyport's arms only, no comparison (see BENCHMARKS.md)"
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
    entry::main("ack", parse_args, run)
}

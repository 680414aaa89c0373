//! One replica: a `skyport run --sharding` process of the built binary, its JSON log kept in
//! memory (its SQS writes are audited against the shard Leases), its peak RSS read from /proc.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::common::process::{Lines, capture_into};
use crate::common::shards;
use crate::entry;
use crate::world::GROUP;

pub(crate) struct Replica {
    child: Child,
    pub(crate) pid: u32,
    lines: Lines,
    pub(crate) identity: String,
    /// VmHWM when it was killed or stopped.
    pub(crate) peak_kib: u64,
    /// Killed by the benchmark (its exit is no failure).
    pub(crate) killed: bool,
}

impl Replica {
    /// Starts a replica watching `ns` (Leases there too); returns once it holds shard Leases.
    pub(crate) async fn start(ns: &str, extra: &[String]) -> anyhow::Result<Replica> {
        let mut child = Command::new(entry::skyport_exe())
            .args(["run", "--namespace", ns, "--log-format", "json", "--listen-address", "127.0.0.1:0"])
            .args(["--sharding", "--lease-namespace", ns, "--lease-name", GROUP, "--allow-http-account-endpoints"])
            .args(extra)
            // As the cluster admin, whom no admission policy covers.
            .env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true")
            .env("RUST_LOG", "info,kube_runtime=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting skyport run")?;
        let lines = Lines::default();
        capture_into(&mut child, &lines);
        let pid = child.id().context("no pid")?;
        let mut r = Replica { child, pid, lines, identity: String::new(), peak_kib: 0, killed: false };
        for _ in 0..600 {
            if let Some(id) = shards::identity(&r.logs()) {
                r.identity = id;
                return Ok(r);
            }
            if !r.alive() {
                bail!("skyport run exited at start: {}", r.tail(10));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("skyport run did not take part in sharding within 60 s: {}", r.tail(10))
    }

    pub(crate) fn logs(&self) -> Vec<Value> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// The last `n` lines it wrote, for an error message.
    pub(crate) fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().rev().take(n).rev().cloned().collect::<Vec<_>>().join("\n    ")
    }

    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(crate) fn panics(&self) -> usize {
        crate::common::process::panics(&self.lines)
    }

    fn record_peak(&mut self) {
        self.peak_kib = crate::stats::vm_kib(self.pid, "VmHWM").unwrap_or(self.peak_kib);
    }

    /// SIGKILL, as a node failure or OOM kill ends it.
    pub(crate) async fn kill(&mut self) -> anyhow::Result<()> {
        self.record_peak();
        self.killed = true;
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, then up to 30 s for the graceful shutdown (it releases its shards).
    pub(crate) async fn stop(&mut self) -> anyhow::Result<()> {
        if !self.alive() {
            return Ok(());
        }
        self.record_peak();
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().await;
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            self.child.kill().await?;
            bail!("skyport run (pid {}) ignored SIGTERM for 30 s", self.pid);
        }
        Ok(())
    }
}

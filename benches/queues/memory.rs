//! Scenario 4, memory: RSS and peak RSS of the real `skyport run` binary, a separate process, as
//! Queues are added, and again after a restart with all of them there.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::api::Api;

use crate::entry;
use crate::harness::Bench;
use crate::options::Opts;
use crate::ready_watch::ReadyWatch;
use crate::stats::{mib, secs, vm_kib};
use crate::time_to_ready::ready_timeout;

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
            // As the cluster admin, whom no admission policy covers.
            .env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true")
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
    pub(crate) async fn memory(&self, o: &Opts) -> anyhow::Result<()> {
        println!("\n== 4. memory of the operator process: {}", entry::skyport_build());
        println!(
            "   skyport run --namespace <ns> --sqs-rate {0} --sqs-burst {0} --sqs-tag-rate {0} (resync and everything else default); Queues with spec.configMap {1}",
            o.memory_rate, o.memory_configmap
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
                let mut spec = crate::harness::spec();
                spec["configMap"] = o.memory_configmap.clone().into();
                self.create_queues_with(&ns, have..n.max(have), None, spec).await?;
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

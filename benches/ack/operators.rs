//! The operators: the arms (skyport at its defaults and with its budgets open, ACK at its defaults
//! and at skyport's settings, the floor), the ACK binary and CRDs from a checkout, and running any
//! of them as a process.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::options::Opts;
use crate::{SKYPORT_CONCURRENCY, SKYPORT_RESYNC_S, entry};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Skyport,
    Ack,
    /// The least a Queue controller can do ([`crate::floor`]).
    Floor,
}

#[derive(Debug, Clone)]
pub(crate) struct Arm {
    pub(crate) key: &'static str,
    pub(crate) label: String,
    pub(crate) kind: Kind,
    /// ACK's `--reconcile-default-max-concurrent-syncs` and `--reconcile-default-resync-seconds`.
    pub(crate) ack_workers: Option<u32>,
    pub(crate) ack_resync_s: Option<u32>,
    /// Arguments for `skyport run` beyond `--skyport-arg`'s.
    pub(crate) skyport_args: &'static [&'static str],
}

/// skyport's budgets opened: LocalStack enforces no quota, so this is its pace without one.
const OPEN_BUDGETS: &[&str] = &["--sqs-rate=100000", "--sqs-burst=100000", "--sqs-tag-rate=100000"];

pub(crate) fn arms(o: &Opts, ack: Option<&Ack>) -> Vec<Arm> {
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
                skyport_args: &[],
            }),
            "ack" if ack.is_some() => v.push(Arm {
                key: "ack",
                label: "ACK (defaults: 1 worker, resync 10 h)".into(),
                kind: Kind::Ack,
                ack_workers: None,
                ack_resync_s: None,
                skyport_args: &[],
            }),
            "ack-c" if ack.is_some() => v.push(Arm {
                key: "ack-c",
                label: format!("ACK ({SKYPORT_CONCURRENCY} workers, resync {SKYPORT_RESYNC_S} s: skyport's settings)"),
                kind: Kind::Ack,
                ack_workers: Some(SKYPORT_CONCURRENCY),
                ack_resync_s: Some(SKYPORT_RESYNC_S),
                skyport_args: &[],
            }),
            "skyport-open" => v.push(Arm {
                key: "skyport-open",
                label: "skyport (budgets open)".into(),
                kind: Kind::Skyport,
                ack_workers: None,
                ack_resync_s: None,
                skyport_args: OPEN_BUDGETS,
            }),
            "floor" => v.push(Arm {
                key: "floor",
                label: format!("floor ({SKYPORT_CONCURRENCY} workers, 3 calls per Queue, no budget)"),
                kind: Kind::Floor,
                ack_workers: None,
                ack_resync_s: None,
                skyport_args: &[],
            }),
            _ => {}
        }
    }
    v
}

/// The ACK controller binary and the checkout its CRDs come from.
pub(crate) struct Ack {
    pub(crate) bin: PathBuf,
    pub(crate) src: PathBuf,
    pub(crate) commit: String,
}

impl Ack {
    pub(crate) fn from_env() -> anyhow::Result<Option<Ack>> {
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
    pub(crate) async fn install_crds(&self, client: &Client) -> anyhow::Result<()> {
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

pub(crate) struct OperatorProcess {
    child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) log: PathBuf,
}

impl OperatorProcess {
    /// `sqs`: where SQS is, when not at LocalStack directly (the quota proxy).
    pub(crate) fn spawn(
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
                c.args(arm.skyport_args).args(skyport_args);
                // It runs as the test cluster's admin, whom no admission policy covers.
                c.env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true");
                if let Some(url) = sqs {
                    c.env("AWS_ENDPOINT_URL_SQS", url);
                }
                c
            }
            Kind::Floor => {
                let mut c = tokio::process::Command::new(std::env::current_exe()?);
                c.args([crate::floor::FLAG, ns]);
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

    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then up to 30 s for a graceful shutdown.
    pub(crate) async fn stop(&mut self) {
        let _ = tokio::process::Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().await;
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
    }
}

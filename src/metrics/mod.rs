//! Prometheus metrics, served as OpenMetrics text on `/metrics` (prometheus-client).
//!
//! Nothing is counted twice: each controller records its reconciles in its own
//! [`ReconcileMetrics`]; cloud calls and rate-limiter waits are read at scrape time from the
//! providers' [`providers::CallCounters`]; objects by Ready state are counted from the
//! controller's cache at scrape time.
//!
//! | metric | labels |
//! |---|---|
//! | `skyport_reconciles_total` | `controller` |
//! | `skyport_reconcile_errors_total` | `controller`, `reason` |
//! | `skyport_reconcile_duration_seconds` (histogram) | `controller` |
//! | `skyport_objects` (gauge) | `controller`, `ready` (`True`, `False`, `Unknown`) |
//! | `skyport_kube_api_writes_total` | `controller` |
//! | `skyport_orphan_hosts_deleted_total` (while the Tunnel controllers run) | |
//! | `skyport_orphan_addresses_released_total` (while the Tunnel controllers run) | |
//! | `skyport_tunnel_failovers_total` (while the Tunnel controllers run) | `namespace`, `name` |
//! | `skyport_tunnel_unserved_seconds_total` (while the Tunnel controllers run) | `namespace`, `name` |
//! | `skyport_exit_servers` (gauge, while the Tunnel controllers run) | `provider` |
//! | `skyport_tunnel_status_failovers_total` (while the Tunnel controllers run) | `namespace`, `name` |
//! | `skyport_sqs_account_calls_total` (while the Queue controller runs) | `aws_account`, `region`, `operation`, `outcome` |
//! | `skyport_sqs_account_throttles_total` (while the Queue controller runs) | `aws_account`, `region` |
//! | `skyport_sqs_account_rate_limiter_waits_total` (while the Queue controller runs) | `aws_account`, `region` |
//! | `skyport_queue_drift_period_seconds` (gauge, while the Queue controller runs) | `aws_account`, `region`, `check` (`attributes`, `tags`) |
//! | `skyport_sqs_account_queues` (gauge, while the Queue controller runs) | `aws_account`, `region` |
//! | `skyport_cloud_api_calls_total` | `provider`, `operation`, `outcome` (`success` or an error label) |
//! | `skyport_rate_limiter_waits_total` | `provider` |
//! | `skyport_rate_limiter_wait_seconds_total` | `provider` |
//! | `skyport_leader` (gauge) | |
//! | `skyport_shards_held` (gauge, with `--sharding`) | |
//! | `skyport_shard_takeovers_total` (with `--sharding`) | |
//! | `skyport_caches_synced` (gauge) | |
//! | `skyport_build_info` | `version` |

mod cached;

pub use cached::{AccountSnapshot, DriftPace, TunnelSnapshot};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Reconcile counts, failures by reason and durations of one controller.
#[derive(Debug)]
pub struct ReconcileMetrics {
    reconciles: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    duration: Histogram,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        ReconcileMetrics {
            reconciles: AtomicU64::new(0),
            errors: Mutex::default(),
            // 5 ms .. ~82 s: a converged object takes one cloud read, a slow create tens of seconds.
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
        }
    }
}

impl ReconcileMetrics {
    /// Records one reconcile that took `elapsed` and failed with `error` (a stable reason), if
    /// it failed.
    pub fn record(&self, elapsed: Duration, error: Option<&'static str>) {
        self.reconciles.fetch_add(1, Ordering::Relaxed);
        self.duration.observe(elapsed.as_secs_f64());
        if let Some(reason) = error {
            *self.errors.lock().unwrap_or_else(|p| p.into_inner()).entry(reason).or_default() += 1;
        }
    }

    pub fn reconciles(&self) -> u64 {
        self.reconciles.load(Ordering::Relaxed)
    }

    /// Failed reconciles per reason.
    pub fn errors(&self) -> BTreeMap<&'static str, u64> {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Objects in a controller's cache by the status of their Ready condition.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadyCounts {
    pub ready: u64,
    pub not_ready: u64,
    /// No Ready condition yet.
    pub unknown: u64,
}

impl ReadyCounts {
    /// Counts objects by the status of their Ready condition (`None`: no condition yet).
    pub fn count(statuses: impl IntoIterator<Item = Option<crate::crd::ConditionStatus>>) -> Self {
        use crate::crd::ConditionStatus;
        let mut counts = ReadyCounts::default();
        for status in statuses {
            match status {
                Some(ConditionStatus::True) => counts.ready += 1,
                Some(ConditionStatus::False) => counts.not_ready += 1,
                Some(ConditionStatus::Unknown) | None => counts.unknown += 1,
            }
        }
        counts
    }
}

/// What one cloud provider adapter has done so far (from its limiter's counters).
#[derive(Debug, Default, Clone)]
pub struct CloudSnapshot {
    /// Finished calls per (operation, outcome).
    pub calls: BTreeMap<(&'static str, &'static str), u64>,
    /// Calls that had to wait for the rate limiter, and the total wait.
    pub waits: (u64, Duration),
}

impl CloudSnapshot {
    pub fn of(counters: &providers::CallCounters) -> Self {
        CloudSnapshot { calls: counters.outcomes(), waits: counters.waits() }
    }
}

type ObjectsFn = Box<dyn Fn() -> ReadyCounts + Send + Sync>;
type CounterFn = Box<dyn Fn() -> u64 + Send + Sync>;
type CloudFn = Box<dyn Fn() -> CloudSnapshot + Send + Sync>;

struct ControllerSource {
    name: &'static str,
    reconciles: Arc<ReconcileMetrics>,
    objects: ObjectsFn,
    api_writes: CounterFn,
}

struct CloudSource {
    provider: &'static str,
    snapshot: CloudFn,
}

/// A counter's value per Tunnel, by (namespace, name).
pub type PerTunnelCounts = std::collections::BTreeMap<(String, String), f64>;
type PerTunnelFn = Box<dyn Fn() -> PerTunnelCounts + Send + Sync>;

#[derive(Default)]
struct Sources {
    controllers: Vec<ControllerSource>,
    clouds: Vec<CloudSource>,
    orphans: Option<CounterFn>,
    orphan_addresses: Option<CounterFn>,
    failovers: Option<PerTunnelFn>,
    unserved: Option<PerTunnelFn>,
    tunnels: Option<Box<dyn Fn() -> TunnelSnapshot + Send + Sync>>,
    sqs_accounts: Option<Box<dyn Fn() -> AccountSnapshot + Send + Sync>>,
    drift: Option<Box<dyn Fn() -> Vec<DriftPace> + Send + Sync>>,
}

/// Reads the registered controllers and providers on each scrape.
#[derive(Clone, Default)]
struct SourcesCollector(Arc<Mutex<Sources>>);

impl std::fmt::Debug for SourcesCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourcesCollector")
    }
}

impl Collector for SourcesCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sources = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let controllers = &sources.controllers;
        {
            let mut m = enc.encode_descriptor("reconciles", "Reconciles run", None, MetricType::Counter)?;
            for c in controllers {
                ConstCounter::new(c.reconciles.reconciles()).encode(m.encode_family(&[("controller", c.name)])?)?;
            }
        }
        {
            let help = "Reconciles that failed and were retried with backoff, by reason (permanent problems are reported in status and count in skyport_objects{ready=\"False\"})";
            let mut m = enc.encode_descriptor("reconcile_errors", help, None, MetricType::Counter)?;
            for c in controllers {
                for (reason, n) in c.reconciles.errors() {
                    ConstCounter::new(n).encode(m.encode_family(&[("controller", c.name), ("reason", reason)])?)?;
                }
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "reconcile_duration",
                "Time one reconcile took",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for c in controllers {
                c.reconciles.duration.encode(m.encode_family(&[("controller", c.name)])?)?;
            }
        }
        {
            let help = "Objects in the controller's cache by the status of their Ready condition";
            let mut m = enc.encode_descriptor("objects", help, None, MetricType::Gauge)?;
            for c in controllers {
                let counts = (c.objects)();
                for (ready, n) in [("True", counts.ready), ("False", counts.not_ready), ("Unknown", counts.unknown)] {
                    let n = i64::try_from(n).unwrap_or(i64::MAX);
                    ConstGauge::new(n).encode(m.encode_family(&[("controller", c.name), ("ready", ready)])?)?;
                }
            }
        }
        {
            let help = "Writes to the Kubernetes API (finalizers, status, owned objects, Events)";
            let mut m = enc.encode_descriptor("kube_api_writes", help, None, MetricType::Counter)?;
            for c in controllers {
                ConstCounter::new((c.api_writes)()).encode(m.encode_family(&[("controller", c.name)])?)?;
            }
        }
        if let Some(orphans) = &sources.orphans {
            let help = "Exit servers the orphan sweep deleted (tagged by this cluster, no Tunnel left)";
            let m = enc.encode_descriptor("orphan_hosts_deleted", help, None, MetricType::Counter)?;
            ConstCounter::new(orphans()).encode(m)?;
        }
        if let Some(released) = &sources.orphan_addresses {
            let help =
                "Reserved addresses the orphan sweep released (tagged by this cluster, no Tunnel left, not Retain)";
            let m = enc.encode_descriptor("orphan_addresses_released", help, None, MetricType::Counter)?;
            ConstCounter::new(released()).encode(m)?;
        }
        if let Some(failovers) = &sources.failovers {
            let help = "Reserved addresses of highly available Tunnels moved to the standby exit server, by Tunnel (this process's count)";
            let mut m = enc.encode_descriptor("tunnel_failovers", help, None, MetricType::Counter)?;
            for ((namespace, name), n) in failovers() {
                let labels = [("namespace", namespace.as_str()), ("name", name.as_str())];
                ConstCounter::new(n as u64).encode(m.encode_family(&labels)?)?;
            }
        }
        if let Some(unserved) = &sources.unserved {
            let help = "Seconds each highly available Tunnel that was Active once spent with no exit server passing behind its address";
            let mut m = enc.encode_descriptor("tunnel_unserved_seconds", help, None, MetricType::Counter)?;
            for ((namespace, name), seconds) in unserved() {
                let labels = [("namespace", namespace.as_str()), ("name", name.as_str())];
                ConstCounter::new(seconds).encode(m.encode_family(&labels)?)?;
            }
        }
        if let Some(tunnels) = &sources.tunnels {
            tunnels().encode(&mut enc)?;
        }
        if let Some(accounts) = &sources.sqs_accounts {
            cached::encode_accounts(&accounts(), &mut enc)?;
        }
        if let Some(drift) = &sources.drift {
            cached::encode_drift(&drift(), &mut enc)?;
        }
        let clouds: Vec<(&'static str, CloudSnapshot)> =
            sources.clouds.iter().map(|c| (c.provider, (c.snapshot)())).collect();
        {
            let help = "Cloud API calls made, by outcome (success or the error's label)";
            let mut m = enc.encode_descriptor("cloud_api_calls", help, None, MetricType::Counter)?;
            for (provider, snap) in &clouds {
                for ((operation, outcome), n) in &snap.calls {
                    let labels = [("provider", *provider), ("operation", *operation), ("outcome", *outcome)];
                    ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        {
            let help = "Cloud API calls that had to wait for the rate limiter";
            let mut m = enc.encode_descriptor("rate_limiter_waits", help, None, MetricType::Counter)?;
            for (provider, snap) in &clouds {
                ConstCounter::new(snap.waits.0).encode(m.encode_family(&[("provider", *provider)])?)?;
            }
        }
        {
            let help = "Time spent waiting for the rate limiter";
            let mut m = enc.encode_descriptor("rate_limiter_wait", help, Some(&Unit::Seconds), MetricType::Counter)?;
            for (provider, snap) in &clouds {
                ConstCounter::new(snap.waits.1.as_secs_f64()).encode(m.encode_family(&[("provider", *provider)])?)?;
            }
        }
        Ok(())
    }
}

/// The metrics a sharded replica keeps ([`crate::shards`]).
#[derive(Clone, Debug, Default)]
pub struct ShardMetrics {
    /// Shards this replica acts on now.
    pub held: Gauge,
    /// Shard Leases this replica took.
    pub takeovers: Counter,
}

/// The operator's metrics registry. Controllers and providers are added when they start (a
/// standby replica starts them too, and keeps their caches, but acts only once it is leader).
pub struct Metrics {
    registry: Registry,
    sources: SourcesCollector,
    /// 1 while this replica runs the controllers (holds the Lease, or runs without election).
    pub leader: Gauge,
    /// 1 once the controllers' caches have listed everything, a standby's included.
    pub caches_synced: Gauge,
    /// With sharding: the shards this replica acts on, and the shard Leases it took.
    pub shards: ShardMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("skyport");
        let sources = SourcesCollector::default();
        registry.register_collector(Box::new(sources.clone()));
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica runs the controllers (holds the leader Lease or runs without leader election)",
            leader.clone(),
        );
        let caches_synced = Gauge::default();
        registry.register(
            "caches_synced",
            "1 once the controllers' caches have listed everything (a standby keeps them too, so it acts at once when it becomes leader)",
            caches_synced.clone(),
        );
        let shards = ShardMetrics::default();
        registry.register(
            "shards_held",
            "Shards whose Lease this replica holds and whose objects it acts on (with --sharding)",
            shards.held.clone(),
        );
        registry.register(
            "shard_takeovers",
            "Shard Leases this replica took, free or expired (with --sharding)",
            shards.takeovers.clone(),
        );
        registry.register(
            "build",
            "Version of the running binary",
            Info::new(vec![("version".to_string(), env!("CARGO_PKG_VERSION").to_string())]),
        );
        Metrics { registry, sources, leader, caches_synced, shards }
    }
}

impl Metrics {
    /// Adds a controller: its reconcile metrics, a count of its cached objects by Ready
    /// state, and its Kubernetes API write counter.
    pub fn add_controller(
        &self,
        name: &'static str,
        reconciles: Arc<ReconcileMetrics>,
        objects: impl Fn() -> ReadyCounts + Send + Sync + 'static,
        api_writes: impl Fn() -> u64 + Send + Sync + 'static,
    ) {
        let source =
            ControllerSource { name, reconciles, objects: Box::new(objects), api_writes: Box::new(api_writes) };
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).controllers.push(source);
    }

    /// Adds a cloud provider adapter, read through its limiter's counters.
    pub fn add_cloud(&self, provider: &'static str, snapshot: impl Fn() -> CloudSnapshot + Send + Sync + 'static) {
        let source = CloudSource { provider, snapshot: Box::new(snapshot) };
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).clouds.push(source);
    }

    /// Adds the orphan sweep's count of deleted exit servers.
    pub fn add_orphans(&self, deleted: impl Fn() -> u64 + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).orphans = Some(Box::new(deleted));
    }

    /// Adds the orphan sweep's count of released reserved addresses.
    pub fn add_orphan_addresses(&self, released: impl Fn() -> u64 + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).orphan_addresses = Some(Box::new(released));
    }

    /// Adds the Tunnel controller's failovers, by Tunnel.
    pub fn add_failovers(&self, failovers: impl Fn() -> PerTunnelCounts + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).failovers = Some(Box::new(failovers));
    }

    /// Adds the Tunnel controller's time without a healthy path, by Tunnel.
    pub fn add_unserved(&self, seconds: impl Fn() -> PerTunnelCounts + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).unserved = Some(Box::new(seconds));
    }

    /// Adds the Tunnel cache's exit servers and failovers, read at scrape time.
    pub fn add_tunnels(&self, snapshot: impl Fn() -> TunnelSnapshot + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).tunnels = Some(Box::new(snapshot));
    }

    /// Adds the SQS calls made through AwsAccounts, per AWS account and region.
    pub fn add_sqs_accounts(&self, snapshot: impl Fn() -> AccountSnapshot + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).sqs_accounts = Some(Box::new(snapshot));
    }

    /// Adds the drift check periods per SQS budget (AWS account and region).
    pub fn add_drift_paces(&self, paces: impl Fn() -> Vec<DriftPace> + Send + Sync + 'static) {
        self.sources.0.lock().unwrap_or_else(|p| p.into_inner()).drift = Some(Box::new(paces));
    }

    /// The current values as OpenMetrics text ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests;

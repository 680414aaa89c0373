//! Families read at scrape time from what the controllers hold: exit servers by provider and
//! each highly available Tunnel's failovers (from the Tunnel cache's status), and SQS calls per
//! AWS account and region (from the budgets the AwsAccounts' clients share), and the drift check
//! periods each budget's Queues get.

use std::collections::BTreeMap;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::CloudSnapshot;
use crate::crd::tunnel::Tunnel;

/// What the Tunnel cache says now.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct TunnelSnapshot {
    /// Exit servers recorded in status (created and not yet deleted: billed), by provider.
    pub exit_servers: BTreeMap<String, u64>,
    /// Failovers each highly available Tunnel's status records since it was created, by
    /// (namespace, name).
    pub failovers: BTreeMap<(String, String), u64>,
}

impl TunnelSnapshot {
    pub fn of<'a>(tunnels: impl IntoIterator<Item = &'a Tunnel>) -> Self {
        let mut snapshot = TunnelSnapshot::default();
        for tunnel in tunnels {
            let Some(status) = &tunnel.status else { continue };
            let servers = match &status.high_availability {
                Some(ha) => ha.servers.iter().filter(|s| s.host_id.is_some()).count() as u64,
                None => u64::from(status.host_id.is_some()),
            };
            if servers > 0 {
                let provider = status.provider.clone().unwrap_or_else(|| "unknown".into());
                *snapshot.exit_servers.entry(provider).or_default() += servers;
            }
            if let Some(ha) = &status.high_availability {
                let key = (tunnel.metadata.namespace.clone().unwrap_or_default(), tunnel.metadata.name.clone());
                let key = (key.0, key.1.unwrap_or_default());
                snapshot.failovers.insert(key, u64::from(ha.failovers.unwrap_or(0)));
            }
        }
        snapshot
    }

    pub(super) fn encode(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        {
            let help = "Exit servers skyport created and has not deleted (what the provider bills), by provider";
            let mut m = enc.encode_descriptor("exit_servers", help, None, MetricType::Gauge)?;
            for (provider, n) in &self.exit_servers {
                let n = i64::try_from(*n).unwrap_or(i64::MAX);
                ConstGauge::new(n).encode(m.encode_family(&[("provider", provider.as_str())])?)?;
            }
        }
        let help = "Failovers of each highly available Tunnel since it was created (from its status)";
        let mut m = enc.encode_descriptor("tunnel_status_failovers", help, None, MetricType::Counter)?;
        for ((namespace, name), n) in &self.failovers {
            let labels = [("namespace", namespace.as_str()), ("name", name.as_str())];
            ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// SQS calls through the AwsAccounts' clients, by (AWS account id, region): each pair has one
/// budget, shared by every AwsAccount naming a role of that account.
pub type AccountSnapshot = Vec<((String, String), CloudSnapshot)>;

/// The outcome label of a call SQS throttled.
const THROTTLED: &str = "throttled";

pub(super) fn encode_accounts(accounts: &AccountSnapshot, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    {
        let help = "SQS calls made through AwsAccounts, by AWS account, region, operation and outcome";
        let mut m = enc.encode_descriptor("sqs_account_calls", help, None, MetricType::Counter)?;
        for ((account, region), snap) in accounts {
            for ((operation, outcome), n) in &snap.calls {
                let labels = [
                    ("aws_account", account.as_str()),
                    ("region", region),
                    ("operation", operation),
                    ("outcome", outcome),
                ];
                ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    {
        let help = "SQS calls through AwsAccounts that SQS throttled, by AWS account and region";
        let mut m = enc.encode_descriptor("sqs_account_throttles", help, None, MetricType::Counter)?;
        for ((account, region), snap) in accounts {
            let n: u64 = snap.calls.iter().filter(|((_, outcome), _)| *outcome == THROTTLED).map(|(_, n)| n).sum();
            ConstCounter::new(n).encode(m.encode_family(&[("aws_account", account.as_str()), ("region", region)])?)?;
        }
    }
    let help = "SQS calls through AwsAccounts that waited for the account and region's rate limiter";
    let mut m = enc.encode_descriptor("sqs_account_rate_limiter_waits", help, None, MetricType::Counter)?;
    for ((account, region), snap) in accounts {
        ConstCounter::new(snap.waits.0)
            .encode(m.encode_family(&[("aws_account", account.as_str()), ("region", region)])?)?;
    }
    Ok(())
}

/// The drift checks of the Queues spending one SQS budget (AWS account and region; `default` for
/// the operator's own identity).
#[derive(Debug, Clone, PartialEq)]
pub struct DriftPace {
    pub aws_account: String,
    pub region: String,
    /// Queues spending the budget.
    pub queues: u64,
    /// How often each reads its attributes.
    pub attributes: std::time::Duration,
    /// How often, at most, each reads its tags.
    pub tags: std::time::Duration,
}

pub(super) fn encode_drift(paces: &[DriftPace], enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    {
        let help = "How often each Queue spending an SQS budget is compared with SQS (check=attributes) and re-reads its tags (check=tags), by AWS account and region: the resync flags, stretched so the checks take at most half the budget";
        let mut m = enc.encode_descriptor("queue_drift_period", help, Some(&Unit::Seconds), MetricType::Gauge)?;
        for p in paces {
            for (check, period) in [("attributes", p.attributes), ("tags", p.tags)] {
                let labels = [("aws_account", p.aws_account.as_str()), ("region", &p.region), ("check", check)];
                ConstGauge::new(period.as_secs_f64()).encode(m.encode_family(&labels)?)?;
            }
        }
    }
    let help = "Queues spending each SQS budget, by AWS account and region";
    let mut m = enc.encode_descriptor("sqs_account_queues", help, None, MetricType::Gauge)?;
    for p in paces {
        let n = i64::try_from(p.queues).unwrap_or(i64::MAX);
        ConstGauge::new(n)
            .encode(m.encode_family(&[("aws_account", p.aws_account.as_str()), ("region", &p.region)])?)?;
    }
    Ok(())
}

//! A warm standby beside a test's operator, for the failover benchmarks: the operator holds the
//! leader Lease (`skyport::leader::Lease`, as `skyport run --leader-elect` does) and a second
//! instance of the controllers waits for it with its watches running and its acting gated, as a
//! standby replica does. Killing the operator ([`TunnelOperator::kill`] with
//! [`Standby::lose_leader`]) leaves the Lease to expire; the standby then takes it and acts.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use skyport::leader::Lease;
use tokio::task::JoinHandle;

use super::TestNs;
use super::tunnels::TunnelOperator;

/// `skyport run`'s default `--lease-duration`: how long a killed leader's Lease keeps a standby out.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

pub struct Standby {
    pub op: TunnelOperator,
    /// The active operator renewing its Lease: aborted when it is killed.
    leader: JoinHandle<()>,
    /// The standby waiting for the Lease, then holding it.
    taking: JoinHandle<()>,
}

impl Standby {
    /// `active` takes the Lease; a standby with its settings and `extra` providers waits for it.
    pub async fn start(
        ns: &TestNs,
        active: &TunnelOperator,
        extra: Vec<Arc<dyn providers::HostProvider>>,
    ) -> anyhow::Result<Standby> {
        let lease = async |identity: &str| {
            Lease::new(ns.client.clone(), &ns.name, "skyport", LEASE_DURATION, identity.into()).await
        };
        let holder = lease("active").await?;
        holder.acquire().await;
        let leader = tokio::spawn(async move {
            holder.hold().await;
        });
        let (gate, op) = TunnelOperator::start_standby(ns, active.ctx.settings.clone(), extra).await;
        let waiting = lease("standby").await?;
        let taking = tokio::spawn(async move {
            waiting.acquire().await;
            gate.open();
            waiting.hold().await;
        });
        Ok(Standby { op, leader, taking })
    }

    /// The active operator's renewals end with it: its Lease expires.
    pub fn lose_leader(&self) {
        self.leader.abort();
    }

    /// The standby's operator, its Lease let go.
    pub fn into_operator(self) -> TunnelOperator {
        self.taking.abort();
        self.op
    }
}

//! Leader election through a `coordination.k8s.io/v1` Lease (kube-lease-manager).
//!
//! With several replicas, only the Lease holder runs the controllers. The holder renews the
//! Lease a third of its duration before it expires; a standby takes it over once it has expired,
//! so a dead leader is replaced within one lease duration. A leader that can no longer renew
//! gives up before the Lease expires (the process then exits and is restarted), so two replicas
//! never reconcile at the same time for longer than the API server's clock skew allows.

use std::time::{Duration, Instant};

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tracing::{info, warn};

/// Who we are in the Lease's `holderIdentity`: the Pod name (or host name) plus a random
/// suffix, so a restarted container never mistakes the previous one's lock for its own.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "skyport".to_string());
    format!("{host}_{:08x}", rand::random::<u32>())
}

/// Seconds before expiry at which the holder renews: a third of the duration, at least 1 s.
pub fn renew_margin(duration: Duration) -> Duration {
    Duration::from_secs((duration.as_secs() / 3).max(1))
}

/// A Lease we may hold.
pub struct Lease {
    manager: LeaseManager,
    pub identity: String,
    pub namespace: String,
    pub name: String,
    margin: Duration,
}

impl Lease {
    /// Prepares the Lease `namespace/name` (created if missing). `client` should have short
    /// timeouts: a renewal that hangs must fail before the Lease expires.
    pub async fn new(
        client: Client,
        namespace: &str,
        name: &str,
        duration: Duration,
        identity: String,
    ) -> Result<Self, kube_lease_manager::LeaseManagerError> {
        let margin = renew_margin(duration);
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity.clone())
            .with_duration(duration.as_secs())
            .with_grace(margin.as_secs())
            .build()
            .await?;
        Ok(Lease { manager, identity, namespace: namespace.to_string(), name: name.to_string(), margin })
    }

    /// Waits until this replica holds the Lease. Errors (API server unreachable) are retried.
    pub async fn acquire(&self) {
        info!(lease = %self.name, namespace = %self.namespace, identity = %self.identity, "waiting for the leader lease");
        loop {
            match self.manager.changed().await {
                Ok(true) => {
                    info!(lease = %self.name, identity = %self.identity, "acquired the leader lease");
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    warn!(error = %e, "leader election failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Keeps renewing the Lease; returns why it was lost: taken by another replica, or not
    /// renewable for long enough that it is about to expire.
    pub async fn hold(&self) -> String {
        let mut failing_since: Option<Instant> = None;
        loop {
            let started = Instant::now();
            match self.manager.changed().await {
                Ok(true) => failing_since = None,
                Ok(false) => return "another replica holds the lease".to_string(),
                Err(e) => {
                    // A call that failed only after a long sleep is the first failure since a
                    // successful renewal; quick repeated failures extend the same streak.
                    if started.elapsed() > Duration::from_secs(1) {
                        failing_since = None;
                    }
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() + Duration::from_millis(500) >= self.margin {
                        return format!("could not renew the lease before it expires: {e}");
                    }
                    warn!(error = %e, "lease renewal failed; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }

    /// Gives the Lease up so a standby takes over at once instead of after expiry.
    pub async fn release(&self) {
        match self.manager.release().await {
            Ok(()) => info!(lease = %self.name, identity = %self.identity, "released the leader lease"),
            Err(e) => warn!(error = %e, "could not release the leader lease; it expires on its own"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_margin_is_a_third_of_the_duration_and_at_least_a_second() {
        assert_eq!(renew_margin(Duration::from_secs(15)), Duration::from_secs(5));
        assert_eq!(renew_margin(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(renew_margin(Duration::from_secs(4)), Duration::from_secs(1));
    }

    #[test]
    fn identities_differ_per_process_start() {
        let (a, b) = (identity(), identity());
        assert_ne!(a, b);
        assert!(a.rsplit_once('_').is_some_and(|(host, suffix)| !host.is_empty() && suffix.len() == 8), "{a}");
    }
}

//! Leader election through a `coordination.k8s.io/v1` Lease (kube-lease-manager).
//!
//! With several replicas, only the Lease holder acts; the others run their controllers' watches
//! with the gate of [`crate::controllers::acting`] shut (warm standbys). The holder renews the
//! Lease half its duration before it expires; a standby takes it over once it has expired,
//! so a dead leader is replaced within one lease duration. A leader that can no longer renew
//! gives up while the Lease is still valid (the process then exits and is restarted), so two
//! replicas do not reconcile at the same time, clock skew between nodes aside.

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

/// How long before expiry the holder renews: half the duration (whole seconds, at least 1 s).
pub fn renew_margin(duration: Duration) -> Duration {
    Duration::from_secs((duration.as_secs() / 2).max(1))
}

/// Timeout for each Lease request: a third of the renewal margin, so a renewal that fails
/// leaves time for retries that end before the Lease may expire.
pub fn request_timeout(duration: Duration) -> Duration {
    renew_margin(duration) / 3
}

/// Pause between retries of a failed renewal.
const RETRY: Duration = Duration::from_millis(200);

/// While renewals fail: the earliest moment the Lease may expire, from what the holder knows.
///
/// The lease manager renews `margin` before expiry and reports only failures, so a failed call
/// says: the last successful renewal was at most `duration - margin + timeout` ago, i.e. the Lease
/// expires no sooner than `margin - timeout` from now. Quick failures that follow (retries,
/// no sleep in between) keep that deadline; a call that lasted longer than one request must
/// have slept after a successful renewal, which starts a new estimate.
#[derive(Debug)]
struct RenewalDeadline {
    margin: Duration,
    timeout: Duration,
    deadline: Option<Instant>,
}

impl RenewalDeadline {
    fn new(margin: Duration, timeout: Duration) -> Self {
        RenewalDeadline { margin, timeout, deadline: None }
    }

    /// A renewal call that began at `started` failed at `now`: time left to retry, or `None`
    /// when the Lease may expire before another attempt completes.
    fn failed(&mut self, started: Instant, now: Instant) -> Option<Duration> {
        let slept = now.duration_since(started) > self.timeout + RETRY;
        let deadline = match self.deadline {
            Some(d) if !slept => d,
            _ => now + self.margin.saturating_sub(self.timeout),
        };
        self.deadline = Some(deadline);
        let left = deadline.saturating_duration_since(now);
        // Retry only if the attempt ends before the Lease may expire.
        (left > self.timeout + RETRY).then_some(left)
    }
}

/// A Lease we may hold.
pub struct Lease {
    manager: LeaseManager,
    pub identity: String,
    pub namespace: String,
    pub name: String,
    margin: Duration,
    timeout: Duration,
}

impl Lease {
    /// Prepares the Lease `namespace/name` (created if missing). `client` must time requests out
    /// after [`request_timeout`]: a renewal that hangs must fail while there is time to retry.
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
        let timeout = request_timeout(duration);
        Ok(Lease { manager, identity, namespace: namespace.to_string(), name: name.to_string(), margin, timeout })
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
    /// renewed while there was still time to (the caller must then stop reconciling at once).
    pub async fn hold(&self) -> String {
        let mut deadline = RenewalDeadline::new(self.margin, self.timeout);
        loop {
            let started = Instant::now();
            match self.manager.changed().await {
                Ok(true) => {}
                Ok(false) => return "another replica holds the lease".to_string(),
                Err(e) => match deadline.failed(started, Instant::now()) {
                    Some(left) => {
                        warn!(error = %e, ?left, "lease renewal failed; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                    None => return format!("could not renew the lease before it may expire: {e}"),
                },
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
    fn renewal_margin_is_half_the_duration_and_at_least_a_second() {
        assert_eq!(renew_margin(Duration::from_secs(15)), Duration::from_secs(7));
        assert_eq!(renew_margin(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(renew_margin(Duration::from_secs(6)), Duration::from_secs(3));
        assert_eq!(request_timeout(Duration::from_secs(6)), Duration::from_secs(1));
    }

    #[test]
    fn failed_renewals_are_retried_until_the_lease_may_expire() {
        let duration = Duration::from_secs(15);
        let (margin, timeout) = (renew_margin(duration), request_timeout(duration));
        let mut d = RenewalDeadline::new(margin, timeout);
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        // The call slept 8 s (it had renewed before), then its renewal failed.
        let first = t0 + Duration::from_secs(8);
        let window = margin - timeout;
        assert_eq!(d.failed(t0, first), Some(window));
        // A quick retry fails: same deadline.
        let retry = first + ms(300);
        assert_eq!(d.failed(first + ms(200), retry), Some(window - ms(300)));
        // A retry that timed out: not enough left for one more request.
        let late = retry + ms(200) + timeout;
        assert_eq!(d.failed(retry + ms(200), late), None, "{window:?} {timeout:?}");
        // A call that slept again (it renewed in between) starts a fresh estimate.
        let much_later = late + Duration::from_secs(12);
        assert_eq!(d.failed(late, much_later), Some(window));
    }

    #[test]
    fn with_the_smallest_lease_a_quick_failure_is_retried_once() {
        let duration = Duration::from_secs(3);
        let mut d = RenewalDeadline::new(renew_margin(duration), request_timeout(duration));
        let t0 = Instant::now();
        let first = t0 + Duration::from_secs(2);
        assert!(d.failed(t0, first).is_some());
        assert_eq!(d.failed(first, first + Duration::from_millis(400)), None);
    }

    #[test]
    fn identities_differ_per_process_start() {
        let (a, b) = (identity(), identity());
        assert_ne!(a, b);
        assert!(a.rsplit_once('_').is_some_and(|(host, suffix)| !host.is_empty() && suffix.len() == 8), "{a}");
    }
}

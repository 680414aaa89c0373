//! The step after the check of [`Policy::Single`](super::policy::Policy::Single)'s one slot
//! (pure): whether its tunnel is Ready, still coming up, late, or to be replaced, and when the
//! Service's address is taken off. Beside [`super::failover::failover_step`] and
//! [`super::both::steps`], the steps of the pair's policies.

use std::time::Duration;

use super::failover::Health;

/// What the end-to-end health check of a running exit server means for the Tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrafficStep {
    /// The probe passed: Active, Ready=True, the address on the Service.
    Ready,
    /// Not through yet, within the boot timeout: Provisioning, `WaitingForTunnel`.
    Waiting { message: String },
    /// Past the boot timeout: `TunnelNotEstablished` with a Warning Event.
    NotEstablished { message: String },
    /// Past the replace time: delete the host (after clearing the Service's address) and create
    /// another, whose clock starts anew.
    Replace { why: String },
}

/// How soon a host whose tunnel is not through yet is probed again: the client usually connects
/// within a second of its Deployment, so the first probes come every 500 ms, then less often the
/// longer it fails (a quarter of the time so far), up to `longest`. A probe is one TCP round trip
/// to the exit server; what a reconcile reads from the provider goes through its rate limiter.
pub fn health_poll(failing_for: Duration, longest: Duration) -> Duration {
    (failing_for / 4).clamp(Duration::from_millis(500), longest.max(Duration::from_millis(500)))
}

/// Decides from the slot's check: its streak, failing since its server was first seen running
/// or last passed, and the last failed check's message (never holding a secret).
pub fn traffic_step((health, error): (Health, &str), boot_timeout: Duration, replace_after: Duration) -> TrafficStep {
    if health.passing() {
        return TrafficStep::Ready;
    }
    let failing_for = health.failing_for;
    let waited = humantime::format_duration(Duration::from_secs(failing_for.as_secs()));
    if failing_for >= replace_after {
        TrafficStep::Replace { why: format!("the tunnel has not been established for {waited}: {error}") }
    } else if failing_for >= boot_timeout {
        TrafficStep::NotEstablished {
            message: format!(
                "the tunnel has not been established for {waited} (boot timeout {}): {error}; the exit server is replaced after {}",
                humantime::format_duration(boot_timeout),
                humantime::format_duration(replace_after)
            ),
        }
    } else {
        TrafficStep::Waiting { message: format!("waiting for the tunnel to carry traffic: {error}") }
    }
}

/// Whether the Service's address is taken off: when the host is replaced, or once it has failed
/// the health check for `window`; a shorter failure is a blip that must not flap it.
pub fn withdraws(step: &TrafficStep, failing_for: Duration, window: Duration) -> bool {
    match step {
        TrafficStep::Ready => false,
        TrafficStep::Replace { .. } => true,
        TrafficStep::Waiting { .. } | TrafficStep::NotEstablished { .. } => failing_for >= window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_not_through_yet_is_probed_soon_then_less_often() {
        let longest = Duration::from_secs(5);
        assert_eq!(health_poll(Duration::ZERO, longest), Duration::from_millis(500));
        assert_eq!(health_poll(Duration::from_secs(1), longest), Duration::from_millis(500));
        assert_eq!(health_poll(Duration::from_secs(8), longest), Duration::from_secs(2));
        assert_eq!(health_poll(Duration::from_secs(600), longest), longest);
    }

    #[test]
    fn the_probe_decides_ready_waiting_not_established_and_replace() {
        let (boot, replace) = (Duration::from_secs(600), Duration::from_secs(900));
        let error = "cannot connect to 203.0.113.9:2334: refused";
        let fail = |secs| (Health { failures: 1, failing_for: Duration::from_secs(secs) }, error);
        assert_eq!(traffic_step((Health::default(), ""), boot, replace), TrafficStep::Ready);
        let waiting = traffic_step(fail(5), boot, replace);
        assert!(
            matches!(&waiting, TrafficStep::Waiting { message } if message.contains("203.0.113.9:2334: refused")),
            "{waiting:?}"
        );
        assert!(matches!(traffic_step(fail(599), boot, replace), TrafficStep::Waiting { .. }));
        let late = traffic_step(fail(600), boot, replace);
        assert!(
            matches!(&late, TrafficStep::NotEstablished { message } if message.contains("10m") && message.contains("15m")),
            "{late:?}"
        );
        assert!(matches!(traffic_step(fail(899), boot, replace), TrafficStep::NotEstablished { .. }));
        assert!(matches!(traffic_step(fail(900), boot, replace), TrafficStep::Replace { .. }));
        // A replace time shorter than the boot timeout still replaces (never waits forever).
        assert!(matches!(
            traffic_step(fail(60), Duration::from_secs(120), Duration::from_secs(30)),
            TrafficStep::Replace { .. }
        ));
    }

    #[test]
    fn the_address_is_withdrawn_only_after_the_window_or_with_the_host() {
        let (window, blip) = (Duration::from_secs(30), Duration::from_secs(1));
        let waiting = TrafficStep::Waiting { message: String::new() };
        assert!(!withdraws(&waiting, blip, window));
        assert!(withdraws(&waiting, window, window));
        assert!(withdraws(&waiting, Duration::ZERO, Duration::ZERO), "0 withdraws at the first failure");
        assert!(withdraws(&TrafficStep::Replace { why: String::new() }, blip, window));
        assert!(!withdraws(&TrafficStep::Ready, window, window));
    }
}

//! What to do about the exit server, from what was observed: pure, so every branch is unit tested.

use providers::{Host, HostState};

use crate::crd::tunnel::TunnelPort;

/// The next step for the exit server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostStep {
    /// No host exists (never created, or deleted outside skyport): create one.
    Create,
    /// The host exists but cannot carry traffic again (stopped, archived): delete it and create
    /// another. `why` goes into an Event.
    Replace { id: String, why: String },
    /// The host is booting or being deleted: look again soon, without blocking a worker.
    Wait { why: String },
    /// The host runs, but with other ports than the Service has now.
    Reconfigure { id: String, ip: String },
    /// The host runs with the right ports.
    Ready { ip: String },
}

/// Decides the step from the host found (by recorded id, else by owner tag) and the ports it was
/// last configured with (`status.ports`) against the Service's ports now.
pub fn host_step(host: Option<&Host>, configured: &[TunnelPort], desired: &[TunnelPort]) -> HostStep {
    let Some(host) = host else { return HostStep::Create };
    match (host.state, host.public_ipv4.as_deref()) {
        (HostState::Stopped, _) => {
            HostStep::Replace { id: host.id.clone(), why: format!("exit server {} is no longer running", host.id) }
        }
        (HostState::Deleting, _) => HostStep::Wait { why: format!("exit server {} is being deleted", host.id) },
        (HostState::Provisioning, _) | (HostState::Running, None) => {
            HostStep::Wait { why: format!("waiting for exit server {} to boot", host.id) }
        }
        (HostState::Running, Some(ip)) if configured != desired => {
            HostStep::Reconfigure { id: host.id.clone(), ip: ip.to_string() }
        }
        (HostState::Running, Some(ip)) => HostStep::Ready { ip: ip.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn host(state: HostState, ip: Option<&str>) -> Host {
        Host {
            id: "h-1".into(),
            name: "skyport-ns-web".into(),
            public_ipv4: ip.map(String::from),
            state,
            tags: BTreeMap::new(),
        }
    }

    fn tcp(port: i32) -> TunnelPort {
        TunnelPort { port, protocol: "TCP".into() }
    }

    #[test]
    fn no_host_means_create() {
        assert_eq!(host_step(None, &[], &[tcp(80)]), HostStep::Create);
    }

    #[test]
    fn a_stopped_host_is_replaced_a_booting_one_waited_for() {
        assert!(matches!(
            host_step(Some(&host(HostState::Stopped, Some("203.0.113.9"))), &[tcp(80)], &[tcp(80)]),
            HostStep::Replace { id, .. } if id == "h-1"
        ));
        for h in [
            host(HostState::Provisioning, None),
            host(HostState::Running, None),
            host(HostState::Deleting, Some("203.0.113.9")),
        ] {
            assert!(matches!(host_step(Some(&h), &[tcp(80)], &[tcp(80)]), HostStep::Wait { .. }), "{h:?}");
        }
    }

    #[test]
    fn a_running_host_is_ready_or_reconfigured_when_ports_changed() {
        let h = host(HostState::Running, Some("203.0.113.9"));
        assert_eq!(host_step(Some(&h), &[tcp(80)], &[tcp(80)]), HostStep::Ready { ip: "203.0.113.9".into() });
        assert_eq!(
            host_step(Some(&h), &[tcp(80)], &[tcp(80), tcp(443)]),
            HostStep::Reconfigure { id: "h-1".into(), ip: "203.0.113.9".into() }
        );
        assert!(matches!(host_step(Some(&h), &[], &[tcp(80)]), HostStep::Reconfigure { .. }));
    }
}

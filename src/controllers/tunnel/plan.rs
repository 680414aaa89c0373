//! What to do, from what was observed: pure, so every branch is unit tested.

pub mod address;
pub mod both;
pub mod budget;
pub mod failover;
pub mod fill;
pub mod policy;
pub mod replace;
pub mod single;

use std::sync::Arc;
use std::time::Duration;

use providers::{Host, HostProvider, HostState};
use sha2::{Digest, Sha256};

use super::desired::Credentials;

use crate::clouds::Providers;
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelPort, TunnelStatus};
use crate::reasons::Reason;

/// Why a Tunnel cannot progress without something changing, as (phase, reason, message).
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked(pub TunnelPhase, pub Reason, pub String);

/// The provider of the Tunnel's host: where it was created, else spec.provider, else the
/// operator's default.
pub fn provider_for(
    tunnel: &Tunnel,
    status: &TunnelStatus,
    providers: &Providers,
) -> Result<Arc<dyn HostProvider>, Blocked> {
    let recorded = status.provider.clone().filter(|_| status.host_id.is_some() || status.address_id.is_some());
    provider_named(recorded.or_else(|| tunnel.spec.provider.clone()), providers)
}

/// The configured provider `name`, or the default one when `name` is unset.
pub fn provider_named(name: Option<String>, providers: &Providers) -> Result<Arc<dyn HostProvider>, Blocked> {
    let Some(name) = name.or_else(|| providers.default.clone()) else {
        return Err(Blocked(
            TunnelPhase::Failed,
            Reason::ProviderNotConfigured,
            "the Tunnel names no provider and skyport runs without --provider".into(),
        ));
    };
    providers.get(&name).ok_or_else(|| {
        Blocked(
            TunnelPhase::Failed,
            Reason::ProviderNotConfigured,
            format!(
                "provider {name:?} is not configured in skyport (configured: {}); set its credentials or pick another",
                providers.names().join(", ")
            ),
        )
    })
}

/// Whether the Tunnel's size and region are on the operator's allow-lists. An empty list allows
/// only the provider's default (the field unset); `*` allows any value. Tenants who may create
/// LoadBalancer Services choose these by annotation, so the cost of what they order is the
/// platform's decision, not theirs.
pub fn allowed(tunnel: &Tunnel, sizes: &[String], regions: &[String]) -> Result<(), Blocked> {
    let refused: Vec<String> = [
        ("size", tunnel.spec.size.as_deref(), sizes, "--tunnel-allowed-sizes", "tunnel.allowedSizes"),
        ("region", tunnel.spec.region.as_deref(), regions, "--tunnel-allowed-regions", "tunnel.allowedRegions"),
    ]
    .into_iter()
    .filter_map(|(what, asked, list, flag, value)| {
        let asked = asked.filter(|a| !a.is_empty())?;
        let list: Vec<&str> = list.iter().map(|v| v.trim()).filter(|v| !v.is_empty()).collect();
        if list.iter().any(|v| *v == "*" || *v == asked) {
            return None;
        }
        let allowed = if list.is_empty() {
            format!("only the provider's default {what} (leave {what} unset)")
        } else {
            format!("{}, or the provider's default (unset)", list.join(", "))
        };
        Some(format!(
            "{what} {asked:?} is not allowed (allowed: {allowed}); the operator's {flag} flag (Helm value {value}) sets the list"
        ))
    })
    .collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(Blocked(TunnelPhase::Failed, Reason::NotAllowed, format!("{}; no exit server was created", refused.join("; "))))
}

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

/// What identifies the credentials an exit server runs with, for status: a domain-separated
/// SHA-256 prefix of its key and token. 64 bits tell two random credentials apart; they reveal
/// nothing of a 256-bit token.
pub fn credentials_digest(credentials: &Credentials) -> String {
    let digest = Sha256::new()
        .chain_update(b"skyport-tunnel-credentials-v1\0")
        .chain_update(credentials.keypair.private_key.as_bytes())
        .chain_update(b"\0")
        .chain_update(credentials.token.as_bytes())
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The ports the running exit server may be trusted to have: those in status, unless its
/// credentials are not the Secret's (the Secret was re-created, in this reconcile or an earlier
/// one that then failed): then none, which makes [`host_step`] reconfigure or replace it. No
/// recorded digest (a Tunnel whose status predates `credentialsDigest`) trusts status.
pub fn configured_ports(current: &TunnelStatus, fresh: bool, digest: &str) -> Vec<TunnelPort> {
    let other_keys = current.credentials_digest.as_deref().is_some_and(|d| d != digest);
    if fresh || other_keys { Vec::new() } else { current.ports.clone() }
}

/// The shortest `--tunnel-replace-after`: a cloud VM takes about a minute to boot, and replacing
/// hosts faster than they can come up would only churn VMs (create, delete, create, ...).
pub const MIN_REPLACE_AFTER: Duration = Duration::from_secs(60);

/// Checks the health-check flags at start: the health port must differ from the control port
/// (the exit server could not bind both), and a host gets its boot timeout and at least
/// [`MIN_REPLACE_AFTER`] before it is replaced.
pub fn check_health_settings(
    control_port: u16,
    health_port: u16,
    boot_timeout: Duration,
    replace_after: Duration,
) -> Result<(), String> {
    if control_port == health_port {
        return Err(format!("--tunnel-health-port {health_port} must differ from --tunnel-control-port"));
    }
    let push = providers::exit::push::PUSH_PORT;
    if control_port == push || health_port == push {
        return Err(format!(
            "--tunnel-control-port and --tunnel-health-port must differ from {push}, the exit server's push port"
        ));
    }
    let show = humantime::format_duration;
    if replace_after < boot_timeout.max(MIN_REPLACE_AFTER) {
        return Err(format!(
            "--tunnel-replace-after {} must be at least --tunnel-boot-timeout ({}) and at least {}",
            show(replace_after),
            show(boot_timeout),
            show(MIN_REPLACE_AFTER)
        ));
    }
    Ok(())
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
            placement: None,
        }
    }

    fn tcp(port: i32) -> TunnelPort {
        TunnelPort { port, protocol: "TCP".into(), proxy_protocol: None }
    }

    fn tunnel(size: Option<&str>, region: Option<&str>) -> Tunnel {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "skyport.dev/v1alpha1",
            "kind": "Tunnel",
            "metadata": {"name": "web-tunnel", "namespace": "ns"},
            "spec": {"serviceRef": {"name": "web"}, "size": size, "region": region},
        }))
        .unwrap()
    }

    fn list(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn by_default_only_the_providers_default_size_and_region_are_allowed() {
        assert_eq!(allowed(&tunnel(None, None), &[], &[]), Ok(()));
        assert_eq!(allowed(&tunnel(Some(""), Some("")), &[], &[]), Ok(()), "empty is unset");
        let Err(Blocked(phase, reason, message)) = allowed(&tunnel(Some("c5.24xlarge"), None), &[], &[]) else {
            panic!("a size was allowed by an empty list")
        };
        assert_eq!((phase, reason), (TunnelPhase::Failed, Reason::NotAllowed));
        assert!(message.contains("\"c5.24xlarge\"") && message.contains("--tunnel-allowed-sizes"), "{message}");
        assert!(message.contains("tunnel.allowedSizes") && message.contains("leave size unset"), "{message}");
        let Err(Blocked(_, _, message)) = allowed(&tunnel(None, Some("ap-south-1")), &[], &[]) else {
            panic!("a region was allowed by an empty list")
        };
        assert!(message.contains("--tunnel-allowed-regions") && !message.contains("sizes"), "{message}");
    }

    #[test]
    fn listed_values_and_the_wildcard_open_more_and_both_refusals_are_named() {
        let sizes = list(&["t3.nano", " t3.micro"]);
        let regions = list(&["fra1"]);
        assert_eq!(allowed(&tunnel(Some("t3.micro"), Some("fra1")), &sizes, &regions), Ok(()));
        assert_eq!(allowed(&tunnel(None, None), &sizes, &regions), Ok(()));
        assert_eq!(allowed(&tunnel(Some("x"), Some("y")), &list(&["*"]), &list(&["*"])), Ok(()));
        let Err(Blocked(_, _, message)) = allowed(&tunnel(Some("t3.large"), Some("nyc1")), &sizes, &regions) else {
            panic!("unlisted values were allowed")
        };
        assert!(message.contains("t3.nano, t3.micro, or the provider's default"), "{message}");
        assert!(message.contains("\"nyc1\"") && message.contains("allowed: fra1"), "{message}");
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

    #[test]
    fn health_settings_that_would_churn_hosts_or_clash_are_refused() {
        let m = Duration::from_secs(60);
        assert_eq!(check_health_settings(2333, 2334, 10 * m, 15 * m), Ok(()));
        assert_eq!(check_health_settings(2333, 2334, m, m), Ok(()));
        let clash = check_health_settings(2333, 2333, 10 * m, 15 * m).unwrap_err();
        assert!(clash.contains("--tunnel-health-port 2333"), "{clash}");
        let early = check_health_settings(2333, 2334, 10 * m, 5 * m).unwrap_err();
        assert!(early.contains("--tunnel-replace-after 5m") && early.contains("(10m)"), "{early}");
        assert!(check_health_settings(2333, 2334, Duration::from_secs(5), Duration::from_secs(30)).is_err());
        assert!(check_health_settings(2335, 2334, 10 * m, 15 * m).unwrap_err().contains("push port"));
        assert!(check_health_settings(2333, 2335, 10 * m, 15 * m).is_err());
    }

    #[test]
    fn new_credentials_are_not_trusted_to_be_on_the_host() {
        let (old, new) = (Credentials::generate(), Credentials::generate());
        let (d_old, d_new) = (credentials_digest(&old), credentials_digest(&new));
        assert_eq!(d_old, credentials_digest(&old));
        assert_ne!(d_old, d_new);
        assert_eq!(d_old.len(), 16);
        assert!(!old.token.contains(&d_old) && !old.keypair.private_key.contains(&d_old));
        let status =
            TunnelStatus { ports: vec![tcp(80)], credentials_digest: Some(d_old.clone()), ..Default::default() };
        assert_eq!(configured_ports(&status, false, &d_old), [tcp(80)]);
        assert!(configured_ports(&status, false, &d_new).is_empty(), "the Secret's keys are not the host's");
        assert!(configured_ports(&status, true, &d_old).is_empty(), "a fresh Secret");
        let legacy = TunnelStatus { ports: vec![tcp(80)], ..Default::default() };
        assert_eq!(configured_ports(&legacy, false, &d_new), [tcp(80)]);
    }
}

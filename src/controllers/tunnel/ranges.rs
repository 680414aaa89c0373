//! Who may reach the Service's ports on the exit server: `spec.sourceRanges` (the Service's
//! `loadBalancerSourceRanges`), enforced by the exit server's own firewall on VM providers (or,
//! on EC2, by the host's security group), and said to be unenforced where the provider has
//! neither ([`Capabilities::host_enforces_source_ranges`]: the local provider).
//!
//! The ranges travel in the exit server's description ([`providers::TunnelService`]) and so in
//! its config, so a new host gets its firewall with them; a change reaches a running host through
//! [`providers::HostProvider::sync_source_ranges`] (a config push, or EC2's group).
//! `status.sourceRanges` records what the host enforces, so a host is only touched when the
//! ranges differ from it.
//!
//! [`Capabilities::host_enforces_source_ranges`]: providers::Capabilities::host_enforces_source_ranges

use std::sync::Arc;

use providers::{ExitServer, HostProvider};

use super::Context;
use super::plan::Blocked;
use crate::crd::tunnel::{Tunnel, TunnelPhase};
use crate::error::Result;
use crate::reasons::Reason;

/// `server` with `ranges` (canonical) on every Service port; the health port stays open to the
/// operator. Also returns the canonical ranges.
pub fn restrict(mut server: ExitServer, ranges: &[String]) -> Result<(ExitServer, Vec<String>), Blocked> {
    let mut canonical = Vec::new();
    for r in ranges {
        let c = providers::cidr::canonical(r).map_err(|e| {
            Blocked(TunnelPhase::Failed, Reason::InvalidSourceRanges, format!("spec.sourceRanges: {e}"))
        })?;
        if !canonical.contains(&c) {
            canonical.push(c);
        }
    }
    canonical.sort();
    for s in server.services.iter_mut().filter(|s| !crate::tunnel::is_health_service(&s.name)) {
        s.source_ranges = canonical.clone();
    }
    Ok((server, canonical))
}

/// Whether the host's firewall must be brought to `desired`: ranges never applied to this host
/// (`status.sourceRanges` unset) or different ones. A host without recorded ranges that should
/// admit anyone is left alone: it was created so, and nothing narrowed it since.
pub fn needs_sync(recorded: Option<&[String]>, desired: &[String]) -> bool {
    match recorded {
        None => !desired.is_empty(),
        Some(recorded) => recorded != desired,
    }
}

/// What the `Ready` message adds: nothing when the ranges are enforced or there are none.
pub fn note(enforced: bool, ranges: &[String], provider: &dyn HostProvider) -> String {
    if enforced || ranges.is_empty() {
        return String::new();
    }
    let why = if provider.capabilities().host_enforces_source_ranges {
        "the exit server took no configuration push with them".to_string()
    } else {
        format!("provider {} runs its exit servers without a firewall", provider.name())
    };
    format!("; spec.sourceRanges ({}) is not enforced: {why}", ranges.join(", "))
}

/// Brings the running host's firewall to `ranges` when `recorded` (its `status.sourceRanges`)
/// says it differs. Returns whether the provider enforces them, and what `status.sourceRanges`
/// must become when that changed.
pub async fn converge(
    tunnel: &Tunnel,
    provider: &Arc<dyn HostProvider>,
    host_id: Option<&str>,
    (server, ranges): (&ExitServer, &[String]),
    recorded: Option<&[String]>,
    ctx: &Context,
) -> Result<(bool, Option<Option<Vec<String>>>)> {
    let Some(id) = host_id else { return Ok((false, None)) };
    if !needs_sync(recorded, ranges) {
        return Ok((true, None));
    }
    let enforced = provider.sync_source_ranges(id, server).await?;
    let now = enforced.then(|| ranges.to_vec());
    if now.as_deref() == recorded {
        return Ok((enforced, None));
    }
    if enforced && recorded.is_some() {
        let from = crate::controllers::service::act::describe_ranges(ranges);
        let note = format!("exit server {id} admits the Service's ports from {from}");
        ctx.publish(tunnel, Reason::SourceRangesChanged, note).await;
    }
    Ok((enforced, Some(now)))
}

#[cfg(test)]
mod tests {
    use providers::{Protocol, TunnelService};

    use super::*;

    fn server() -> ExitServer {
        let service = |name: &str, port| TunnelService {
            name: name.into(),
            protocol: Protocol::Tcp,
            port,
            token: "t".into(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
            bind: None,
        };
        ExitServer {
            control_port: 2333,
            noise_private_key: "k".into(),
            services: vec![service("tcp-80", 80), service(crate::tunnel::HEALTH_SERVICE, 2334)],
        }
    }

    #[test]
    fn ranges_restrict_the_service_ports_but_never_the_health_port() {
        let ranges = ["203.0.113.9/24".to_string(), "10.0.0.0/8".into(), "203.0.113.0/24".into()];
        let (restricted, canonical) = restrict(server(), &ranges).unwrap();
        assert_eq!(canonical, ["10.0.0.0/8", "203.0.113.0/24"], "canonical, sorted, once each");
        assert_eq!(restricted.services[0].source_ranges, canonical);
        assert!(restricted.services[1].source_ranges.is_empty(), "the operator probes the health port");
        let (open, none) = restrict(server(), &[]).unwrap();
        assert!(none.is_empty() && open.services.iter().all(|s| s.source_ranges.is_empty()));
        let Err(Blocked(phase, reason, message)) = restrict(server(), &["10.0.0.0/33".into()]) else {
            panic!("accepted a bad range")
        };
        assert_eq!((phase, reason), (TunnelPhase::Failed, Reason::InvalidSourceRanges));
        assert!(message.contains("\"10.0.0.0/33\" is not a CIDR"), "{message}");
    }

    #[tokio::test]
    async fn the_ranges_reach_an_enforcing_host_once_and_a_change_again() {
        use crate::controllers::tunnel::tests::{harness, ready};
        let mut h = harness();
        h.provider.enforce_ranges();
        h.add_service();
        let mut tunnel = (*h.new_tunnel()).clone();
        tunnel.spec.source_ranges = vec!["198.51.100.7/24".into()];
        let tunnel = h.put_tunnel(&tunnel);
        h.reconcile(tunnel.clone()).await.unwrap();
        let stored = h.current();
        assert_eq!(ready(&stored).1, "Active");
        let host = stored.status.as_ref().unwrap().host_id.clone().unwrap();
        assert_eq!(h.provider.ranges_of(&host), Some(vec!["198.51.100.0/24".to_string()]));
        assert_eq!(stored.status.as_ref().unwrap().source_ranges, Some(vec!["198.51.100.0/24".to_string()]));
        let nft = h.provider.user_data_of(&host).unwrap();
        assert!(nft.contains("ip saddr 198.51.100.0/24 tcp dport 80 accept"), "its own firewall has them: {nft}");
        let message = crate::controllers::status::ready_condition(&stored).unwrap().message.clone();
        assert!(!message.contains("not enforced"), "{message}");
        h.reconcile(Arc::new(stored.clone())).await.unwrap();
        assert_eq!(h.provider.count("sync_source_ranges"), 0, "made with them: nothing to bring over");

        let mut changed = stored.clone();
        changed.spec.source_ranges = vec!["203.0.113.0/24".into()];
        h.reconcile(h.put_tunnel(&changed)).await.unwrap();
        assert_eq!(h.provider.ranges_of(&host), Some(vec!["203.0.113.0/24".to_string()]), "same host");
        assert_eq!(h.provider.count("sync_source_ranges"), 1, "applied once");
        assert_eq!(h.provider.count("create"), 1);
        assert!(h.api.event_reasons().contains(&"SourceRangesChanged".to_string()));
    }

    #[tokio::test]
    async fn a_provider_without_a_firewall_says_the_ranges_are_not_enforced() {
        use crate::controllers::tunnel::tests::harness;
        let mut h = harness();
        h.add_service();
        let mut tunnel = (*h.new_tunnel()).clone();
        tunnel.spec.source_ranges = vec!["198.51.100.0/24".into()];
        h.reconcile(h.put_tunnel(&tunnel)).await.unwrap();
        let stored = h.current();
        let ready = crate::controllers::status::ready_condition(&stored).unwrap();
        assert!(
            ready.message.contains("is not enforced: provider fake runs its exit servers without a firewall"),
            "{}",
            ready.message
        );
        assert_eq!(stored.status.as_ref().unwrap().source_ranges, None);
        let host = stored.status.as_ref().unwrap().host_id.clone().unwrap();
        assert!(!h.provider.user_data_of(&host).unwrap().contains("saddr"), "no host firewall holds them");
    }

    #[test]
    fn a_host_is_synced_when_its_ranges_were_never_applied_or_differ() {
        let want = ["10.0.0.0/8".to_string()];
        assert!(needs_sync(None, &want));
        assert!(!needs_sync(None, &[]), "a host created open to anyone, never narrowed");
        assert!(needs_sync(Some(&[]), &want));
        assert!(!needs_sync(Some(&want), &want));
        let provider = crate::controllers::testing::provider::FakeProvider::default();
        assert_eq!(note(true, &want, &provider), "");
        assert_eq!(note(false, &[], &provider), "");
        assert!(note(false, &want, &provider).contains("not enforced: provider fake runs its exit servers without"));
        provider.enforce_ranges();
        assert!(note(false, &want, &provider).contains("not enforced: the exit server took no configuration push"));
    }
}

//! One slot of a Tunnel as a pass found it: its exit server, the address its client dials, its
//! end-to-end check and its replacements in a row. One shape for the one unnamed slot of
//! [`Policy::Single`](super::super::plan::policy::Policy::Single) and the two named slots of a
//! pair; [`checks`](super::checks) checks every policy's slots alike.

use providers::{Host, HostState};

use super::super::placement::Placement;
use super::super::plan::both::Checked;
use super::super::plan::failover::Health;
use super::super::plan::fill::Standing;
use super::super::plan::replace::replace_wait;
use super::console::Failing;
use crate::crd::tunnel::ServerStatus;

/// One slot's exit server as this pass found it.
pub(super) struct Slot {
    /// Its name, `a` or `b` in a pair; `None` for the one slot of a single server.
    pub(super) slot: Option<&'static str>,
    pub(super) host: Option<Host>,
    /// Its own address, which its client dials: as recorded for this host, else as first seen.
    pub(super) own_ip: Option<String>,
    /// Its end-to-end check ([`Slot::check_ip`]), when it runs: the streak and the error.
    pub(super) check: Option<(Health, String)>,
    /// Servers of this slot replaced in a row for failing ([`ServerStatus::replacements`]).
    pub(super) replaced: u32,
    /// Why its failing server is kept ([`ServerStatus::kept_because`]).
    pub(super) kept: Option<String>,
}

impl Slot {
    /// Slot `slot` filled by `host` (or waiting for one), with its replacements as recorded.
    pub(super) fn new(
        slot: &'static str,
        host: Option<Host>,
        own_ip: Option<String>,
        recorded: &[ServerStatus],
    ) -> Self {
        let replaced = recorded.iter().find(|s| s.slot == slot).and_then(|s| s.replacements).unwrap_or(0);
        Slot { slot: Some(slot), host, own_ip, check: None, replaced, kept: None }
    }

    /// The one slot of a single server: `host`, whose client dials `ip` (the reserved address,
    /// or the host's own), after `replaced` replacements in a row (`status.replacements`).
    pub(super) fn single(host: Host, ip: String, replaced: Option<u32>) -> Self {
        let replaced = replaced.unwrap_or(0);
        Slot { slot: None, host: Some(host), own_ip: Some(ip), check: None, replaced, kept: None }
    }

    /// Its client's Deployment and config key.
    pub(super) fn client_at(&self, at: &Placement) -> Placement {
        match self.slot {
            Some(slot) => at.for_slot(slot),
            None => at.clone(),
        }
    }

    /// Its server, named for messages: "exit server ID", with " (slot a)" in a pair.
    pub(super) fn server(&self) -> String {
        let id = self.id().unwrap_or_default();
        match self.slot {
            Some(slot) => format!("exit server {id} (slot {slot})"),
            None => format!("exit server {id}"),
        }
    }

    /// Its failing server as [`judge`] reads it, probed at `ip`; `None` while it passes or is not
    /// checked.
    ///
    /// [`judge`]: super::console::judge
    pub(super) fn failing<'a>(&'a self, ip: &'a str) -> Option<Failing<'a>> {
        let (health, error) = self.check.as_ref().filter(|(h, _)| !h.passing())?;
        Some(Failing { host: (self.id(), ip), error, failing_for: health.failing_for, replaced: self.replaced })
    }

    /// Its replacements in a row as status records them: cleared once its server passes.
    pub(super) fn replacements(&self) -> Option<u32> {
        Some(self.replaced).filter(|n| *n > 0 && !self.passing())
    }

    /// As `status.highAvailability.servers` shows it; a passing server clears the count.
    pub(super) fn status(&self) -> ServerStatus {
        let passing = self.passing();
        ServerStatus {
            slot: self.slot.unwrap_or_default().to_string(),
            host_id: self.id().map(str::to_string),
            host_ip: self.own_ip.clone().filter(|_| self.host.is_some()),
            healthy: passing,
            replacements: self.replacements(),
            kept_because: self.kept.clone().filter(|_| !passing && self.host.is_some()),
            placement: self.placement().map(str::to_string),
        }
    }

    /// The failure domain its server runs in, as the provider reports it.
    pub(super) fn placement(&self) -> Option<&str> {
        self.host.as_ref().and_then(|h| h.placement.as_deref())
    }

    /// How long its server may fail while the other holds the address before it is replaced:
    /// `None` once its slot's replacements are spent.
    pub(super) fn replace_after(&self, replace_after: std::time::Duration, max: u32) -> Option<std::time::Duration> {
        (self.replaced < max).then(|| replace_wait(replace_after, self.replaced))
    }

    /// The slot as [`both`](super::super::plan::both) plans from it.
    pub(super) fn checked(&self, replace_after: std::time::Duration, max: u32) -> Checked<'_> {
        Checked {
            id: self.id(),
            stopped: self.stopped(),
            check: self.check.as_ref().map(|(h, e)| (*h, e.as_str())),
            replace_after: self.replace_after(replace_after, max),
        }
    }

    /// The slot as [`FillPlan::after_failover_steps`] plans from it.
    ///
    /// [`FillPlan::after_failover_steps`]: super::super::plan::fill::FillPlan::after_failover_steps
    pub(super) fn standing(&self) -> Standing<'_> {
        Standing {
            id: self.id(),
            stopped: self.stopped(),
            failing: self.host.is_some() && self.check.as_ref().is_some_and(|(h, _)| !h.passing()),
            replaced: self.replaced,
        }
    }

    /// Whether the provider reports its server stopped.
    fn stopped(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.state == HostState::Stopped)
    }

    /// Whether a server fills the slot and its last check passed.
    pub(super) fn passing(&self) -> bool {
        self.host.is_some() && self.check.as_ref().is_some_and(|(h, _)| h.passing())
    }

    pub(super) fn running_ip(&self) -> Option<&str> {
        self.host.as_ref().filter(|h| h.state == HostState::Running).and_then(|h| h.public_ipv4.as_deref())
    }

    /// Where its end-to-end check goes while it runs: where the provider reports it (local: the
    /// holder answers only at the reserved address, its ports bound there), except where the
    /// address goes onto a secondary private IPv4 beside the host's own public one (`beside`,
    /// EC2): there its own address, which its client dials, whatever the API reports as its
    /// public IPv4 (LocalStack reports the Elastic IP, and still after it moved on).
    pub(super) fn check_ip(&self, beside: bool) -> Option<&str> {
        let reported = self.running_ip()?;
        Some(self.own_ip.as_deref().filter(|_| beside).unwrap_or(reported))
    }

    pub(super) fn id(&self) -> Option<&str> {
        self.host.as_ref().map(|h| h.id.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::crd::tunnel::Tunnel;

    fn host(id: &str) -> Host {
        let (name, tags) = (id.to_string(), BTreeMap::new());
        let public_ipv4 = Some("198.51.100.7".to_string());
        Host { id: id.into(), name, public_ipv4, state: HostState::Running, tags, placement: None }
    }

    fn placement() -> Placement {
        let tunnel: Tunnel = serde_json::from_value(serde_json::json!({
            "apiVersion": "skyport.dev/v1alpha1",
            "kind": "Tunnel",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"serviceRef": {"name": "web"}}
        }))
        .unwrap();
        Placement::of(&tunnel, None).unwrap()
    }

    fn failed(secs: u64) -> Option<(Health, String)> {
        Some((Health { failures: 2, failing_for: Duration::from_secs(secs) }, "refused".into()))
    }

    #[test]
    fn a_single_servers_slot_is_unnamed_and_uses_the_tunnels_own_client() {
        let slot = Slot::single(host("i-1"), "203.0.113.9".into(), Some(2));
        assert_eq!((slot.slot, slot.replaced, slot.own_ip.as_deref()), (None, 2, Some("203.0.113.9")));
        assert_eq!(slot.server(), "exit server i-1");
        let at = placement();
        assert_eq!(slot.client_at(&at), at, "the single client's Deployment and config key");
        let pair = Slot::new("b", Some(host("i-2")), None, &[]);
        assert_eq!(pair.server(), "exit server i-2 (slot b)");
        assert_eq!(pair.client_at(&at), at.for_slot("b"));
    }

    #[test]
    fn only_a_failing_check_is_judged_and_replacements_clear_once_it_passes() {
        let mut slot = Slot::single(host("i-1"), "203.0.113.9".into(), Some(2));
        assert!(slot.failing("203.0.113.9").is_none(), "not checked yet");
        assert_eq!(slot.replacements(), Some(2), "kept until a check passes");
        slot.check = failed(90);
        let failing = slot.failing("203.0.113.9").expect("failing");
        assert_eq!(failing.host, (Some("i-1"), "203.0.113.9"));
        assert_eq!((failing.error, failing.failing_for, failing.replaced), ("refused", Duration::from_secs(90), 2));
        slot.check = Some((Health::default(), String::new()));
        assert!(slot.failing("203.0.113.9").is_none());
        assert_eq!(slot.replacements(), None, "a passing server clears the run");
        slot.host = None;
        assert_eq!(slot.replacements(), Some(2), "an empty slot keeps its run for its next server");
    }
}

//! One slot of a highly available Tunnel's pair as a pass found it, and how the Ready message
//! describes the pair.

use providers::{Address, Host, HostState};

use super::super::super::plan::both::Checked;
use super::super::super::plan::failover::Health;
use super::super::super::plan::fill::Standing;
use super::super::super::plan::replace::replace_wait;
use super::super::super::status::describe;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{ServerStatus, TunnelPort};
use crate::reasons::Reason;

/// One slot's exit server as this pass found it.
pub(super) struct Slot {
    pub(super) slot: &'static str,
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
        Slot { slot, host, own_ip, check: None, replaced, kept: None }
    }

    /// As `status.highAvailability.servers` shows it; a passing server clears the count.
    pub(super) fn status(&self) -> ServerStatus {
        let passing = self.passing();
        ServerStatus {
            slot: self.slot.to_string(),
            host_id: self.id().map(str::to_string),
            host_ip: self.own_ip.clone().filter(|_| self.host.is_some()),
            healthy: passing,
            replacements: Some(self.replaced).filter(|n| *n > 0 && !passing),
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

    /// The slot as [`both`](super::super::super::plan::both) plans from it.
    pub(super) fn checked(&self, replace_after: std::time::Duration, max: u32) -> Checked<'_> {
        Checked {
            id: self.id(),
            stopped: self.host.as_ref().is_some_and(|h| h.state == HostState::Stopped),
            check: self.check.as_ref().map(|(h, e)| (*h, e.as_str())),
            replace_after: self.replace_after(replace_after, max),
        }
    }

    /// The slot as [`FillPlan::after_failover_steps`](super::super::super::plan::fill::FillPlan::after_failover_steps)
    /// plans from it.
    pub(super) fn standing(&self) -> Standing<'_> {
        Standing {
            id: self.id(),
            stopped: self.host.as_ref().is_some_and(|h| h.state == HostState::Stopped),
            failing: self.host.is_some() && self.check.as_ref().is_some_and(|(h, _)| !h.passing()),
            replaced: self.replaced,
        }
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

/// Where the pair's servers run, for `status.highAvailability.spread`: as the provider's
/// capabilities and the zones it reports say ([`providers::Spread::describe`]).
pub(super) fn spread(spread: providers::Spread, slots: &[Slot]) -> String {
    spread.describe([0, 1].map(|i| slots.get(i).and_then(Slot::placement)))
}

/// Where the holder's check went, for the Ready message: through the reserved address where it
/// was checked there (local), else the holder's own address (the cloud's routing of the reserved
/// address to it is not what was checked, and the message must not claim it).
pub(super) fn checked_at(holder_checked_at: Option<&str>, reserved: &str) -> String {
    match holder_checked_at {
        Some(ip) if ip == reserved => format!("the reserved address {ip}"),
        Some(ip) => format!("its own address {ip} (not through the reserved address)"),
        None => "no address".into(),
    }
}

/// The Ready condition of a pair whose holder `active` passes, with the reserved address `a` on
/// it, forwarding `ports` to Service `service`; `checked` says where ([`checked_at`]), `waiting`
/// what a client roll waits for, if anything.
pub(super) fn ready_condition(
    (service, ports): (&str, &[TunnelPort]),
    (a, active): (&Address, Option<&str>),
    slots: &[Slot],
    (checked, waiting): (String, String),
) -> Condition {
    let message = format!(
        "reserved address {} on exit server {} forwards {} to Service {service}; its tunnel passed its health check at {checked}; standby: {}{waiting}",
        a.ip,
        active.unwrap_or_default(),
        describe(ports),
        standby_note(slots, active),
    );
    Condition::new("Ready", ConditionStatus::True, Reason::Active.as_str(), message)
}

/// How the server without the address stands, for the Ready message.
pub(super) fn standby_note(slots: &[Slot], active: Option<&str>) -> String {
    let standby = slots.iter().find(|s| s.id() != active);
    match standby.and_then(|s| Some((s.id()?, s.check.as_ref()))) {
        Some((id, Some((h, _)))) if h.passing() => format!("exit server {id}, passing its health check"),
        Some((id, Some((_, error)))) => match standby.and_then(|s| s.kept.as_deref()) {
            Some(kept) => format!("exit server {id}, failing its health check and kept: {kept}"),
            None => format!("exit server {id}, failing its health check: {error}"),
        },
        Some((id, None)) => format!("exit server {id}, not running yet"),
        None => "none running".into(),
    }
}

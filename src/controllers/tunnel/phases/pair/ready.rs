//! How a highly available Tunnel's pair is described: where its servers run, and the Ready
//! message of a pair and of its standby.

use providers::Address;

use super::super::super::status::describe;
use super::Slot;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::TunnelPort;
use crate::reasons::Reason;

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

//! The daily budget of exit servers per slot (pure): every creation draws from it, whatever the
//! cause, so no failure (a host that stops at once, checks that fail after the Tunnel was
//! Active, a create that fails halfway, an address that never lands) buys VMs without bound.
//! The creations are recorded in status before each call, so a restart keeps the count.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::crd::tunnel::HostCreated;

/// The budget's window: a rolling day.
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The creations still inside the window ending `now` (unreadable times count as now: a
/// corrupted record must not free the budget).
pub fn recent(created: &[HostCreated], now: Timestamp) -> Vec<HostCreated> {
    let since = now.checked_sub(SignedDuration::try_from(WINDOW).unwrap_or(SignedDuration::MAX)).unwrap_or(now);
    created.iter().filter(|c| c.at.parse::<Timestamp>().map_or(true, |at| at > since)).cloned().collect()
}

/// Whether slot `slot` may create one more exit server at `now` with at most `per_day` a day:
/// `Err` carries when the oldest of its creations leaves the window.
pub fn allows(created: &[HostCreated], slot: Option<&str>, now: Timestamp, per_day: u32) -> Result<(), Timestamp> {
    let mine: Vec<Timestamp> = recent(created, now)
        .iter()
        .filter(|c| c.slot.as_deref() == slot)
        .map(|c| c.at.parse().unwrap_or(now))
        .collect();
    if mine.len() < per_day as usize {
        return Ok(());
    }
    let oldest = mine.into_iter().min().unwrap_or(now);
    Err(oldest.checked_add(SignedDuration::try_from(WINDOW).unwrap_or(SignedDuration::MAX)).unwrap_or(Timestamp::MAX))
}

/// `created` with slot `slot`'s creation at `now` added, and what left the window dropped.
pub fn with_creation(created: &[HostCreated], slot: Option<&str>, now: Timestamp) -> Vec<HostCreated> {
    let mut kept = recent(created, now);
    kept.push(HostCreated { slot: slot.map(str::to_string), at: now.to_string() });
    kept
}

/// The message of a spent budget.
pub fn spent_message(slot: Option<&str>, per_day: u32, next: Timestamp) -> String {
    let which = slot.map_or("this Tunnel".to_string(), |s| format!("slot {s} of this Tunnel"));
    format!(
        "{which} created {per_day} exit server(s) in the last 24 hours (--tunnel-max-hosts-per-day {per_day}); \
         skyport creates none until {next}: find why its servers do not last (Events, the exit server's console)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn each_slot_gets_its_own_budget_of_a_rolling_day() {
        let now = at("2030-01-02T12:00:00Z");
        let mut created = Vec::new();
        for hour in 0..3 {
            created = with_creation(&created, Some("a"), now - SignedDuration::from_hours(3 - hour));
        }
        assert_eq!(allows(&created, Some("a"), now, 3), Err(at("2030-01-03T09:00:00Z")), "the oldest leaves at +24h");
        assert_eq!(allows(&created, Some("b"), now, 3), Ok(()), "the other slot is not charged");
        assert_eq!(allows(&created, None, now, 3), Ok(()));
        assert_eq!(allows(&created, Some("a"), at("2030-01-03T09:00:01Z"), 3), Ok(()), "a day later it refills");
        assert_eq!(allows(&created, Some("a"), now, 4), Ok(()));
    }

    #[test]
    fn creations_older_than_a_day_are_dropped_and_unreadable_ones_still_count() {
        let now = at("2030-01-02T12:00:00Z");
        let old = HostCreated { slot: None, at: "2030-01-01T11:00:00Z".into() };
        let garbled = HostCreated { slot: None, at: "yesterday".into() };
        let kept = with_creation(&[old, garbled.clone()], None, now);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(kept[0], garbled);
        assert_eq!(allows(&kept, None, now, 2), Err(at("2030-01-03T12:00:00Z")));
    }

    #[test]
    fn the_message_names_the_flag_and_the_time() {
        let m = spent_message(Some("b"), 10, at("2030-01-03T09:00:00Z"));
        assert!(
            m.contains("slot b") && m.contains("--tunnel-max-hosts-per-day 10") && m.contains("2030-01-03T09:00:00Z")
        );
    }
}

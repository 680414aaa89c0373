//! A highly available Tunnel's slots before their checks: which server stays, which slot gets a
//! server now, and which waits. Pure, from what the pass found, so every branch is unit tested.

use providers::{Host, MovedAddress};

use super::super::placement::SLOTS;

/// What a pass does with one slot before the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fill {
    /// Its server stays.
    Keep,
    /// Empty: a server is created now.
    Create,
    /// Its server was made with an earlier reserved address on its interface (this one was
    /// reserved again after a release outside skyport), so it cannot answer on this one: it is
    /// replaced now, for the reason given.
    Replace(String),
    /// Empty, and its server is made once the reserved address exists, in the region of the
    /// first slot's (the address exists only once it is on a first host, and cannot move between
    /// regions; a provider left to pick may pick two).
    WaitForAddress,
    /// Empty because it lost the holder: filled once the address moved on. Creating a server
    /// takes seconds and may fail; the move is one call.
    AfterFailover,
}

/// What the pass found, as much as the plan reads.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    /// Each slot's server, in [`SLOTS`] order.
    pub hosts: [Option<&'a Host>; 2],
    /// The reserved address, if one exists.
    pub reserved_ip: Option<&'a str>,
    /// The host the provider says holds the reserved address.
    pub reserved_on: Option<&'a str>,
    /// `status.highAvailability.active`.
    pub recorded_active: Option<&'a str>,
    /// Whether a host must carry the moved address on its interface ([`MovedAddress`]).
    pub moved_address: MovedAddress,
    /// Whether the provider makes a reserved address only onto a first host (DigitalOcean).
    pub reserves_with_host: bool,
}

/// The pass's plan for the slots, before the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FillPlan {
    /// The host holding the address: as the provider says, else the one recorded active if it is
    /// gone (a cloud unassigns a deleted host's address: EC2, DigitalOcean), whose loss is a
    /// failover like any other.
    pub holder: Option<String>,
    /// Each slot's step, in [`SLOTS`] order.
    pub slots: [Fill; 2],
}

/// One slot after the failover step, as much as [`FillPlan::after_failover_steps`] reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Standing<'a> {
    /// Its server, if one fills the slot (a standby replaced in the failover step left it empty).
    pub id: Option<&'a str>,
    /// Whether the provider reports that server stopped.
    pub stopped: bool,
    /// Whether its server's last check failed.
    pub failing: bool,
    /// Servers of this slot replaced in a row for failing.
    pub replaced: u32,
}

/// What a pass does with one slot after the failover step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    Keep,
    /// Failing without the address, its replacements spent (`--tunnel-max-replacements`): kept,
    /// and status says why.
    Spent,
    /// Its server stopped (the address is off it now): deleted, for the reason given; the slot is
    /// filled next pass, drawing on its budget like any creation.
    Gone(String),
    /// It lost the holder ([`Fill::AfterFailover`]): a server is created now.
    Create,
}

impl FillPlan {
    /// Each slot's step after the failover step, in [`SLOTS`] order, where `max` is
    /// `--tunnel-max-replacements`.
    pub fn after_failover_steps(&self, slots: [Standing; 2], max: u32) -> [After; 2] {
        [0, 1].map(|i| {
            let s = slots[i];
            match s.id {
                Some(id) if s.stopped => {
                    After::Gone(format!("exit server {id} (slot {}) is no longer running", SLOTS[i]))
                }
                Some(id) if Some(id) != self.holder.as_deref() && s.failing && s.replaced >= max => After::Spent,
                None if self.slots[i] == Fill::AfterFailover => After::Create,
                _ => After::Keep,
            }
        })
    }
}

pub fn fill(found: &Found) -> FillPlan {
    let ids: Vec<&str> = found.hosts.iter().flatten().map(|h| h.id.as_str()).collect();
    let holder = found.reserved_on.or(found.recorded_active.filter(|id| !ids.contains(id))).map(str::to_string);
    let holder_gone = holder.as_deref().is_some_and(|id| !ids.contains(&id));
    let wait_for_address = found.reserved_ip.is_none() && found.reserves_with_host;
    let slots = [0, 1].map(|i| match found.hosts[i] {
        Some(host) if !found.moved_address.carried_by(host, found.reserved_ip) => Fill::Replace(format!(
            "exit server {} (slot {}) does not carry the reserved address {} on its interface",
            host.id,
            SLOTS[i],
            found.reserved_ip.unwrap_or_default()
        )),
        Some(_) => Fill::Keep,
        None if wait_for_address && i > 0 => Fill::WaitForAddress,
        None if holder_gone => Fill::AfterFailover,
        None => Fill::Create,
    });
    FillPlan { holder, slots }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use providers::HostState;
    use providers::hosts::TAG_BOUND_ADDRESS;

    use super::*;

    fn host(id: &str, bound: Option<&str>) -> Host {
        let tags: BTreeMap<String, String> =
            bound.map(|ip| (TAG_BOUND_ADDRESS.to_string(), ip.to_string())).into_iter().collect();
        Host { id: id.into(), name: id.into(), public_ipv4: None, state: HostState::Running, tags, placement: None }
    }

    fn found<'a>(hosts: [Option<&'a Host>; 2]) -> Found<'a> {
        Found {
            hosts,
            reserved_ip: Some("203.0.113.9"),
            reserved_on: None,
            recorded_active: None,
            moved_address: MovedAddress::Translated,
            reserves_with_host: false,
        }
    }

    #[test]
    fn found_servers_stay_and_empty_slots_get_one_now() {
        let a = host("i-a", None);
        let plan = fill(&found([Some(&a), None]));
        assert_eq!(plan.slots, [Fill::Keep, Fill::Create]);
        assert_eq!(plan.holder, None);
        assert_eq!(fill(&found([None, None])).slots, [Fill::Create, Fill::Create]);
    }

    #[test]
    fn the_holder_is_whom_the_provider_names_else_the_recorded_active_that_is_gone() {
        let (a, b) = (host("i-a", None), host("i-b", None));
        let said = Found { reserved_on: Some("i-b"), recorded_active: Some("i-a"), ..found([Some(&a), Some(&b)]) };
        assert_eq!(fill(&said).holder.as_deref(), Some("i-b"), "the provider's word first");
        let found_both = Found { recorded_active: Some("i-a"), ..found([Some(&a), Some(&b)]) };
        assert_eq!(fill(&found_both).holder, None, "a recorded active still found is not assumed to hold it");
        let lost = Found { recorded_active: Some("i-gone"), ..found([Some(&a), None]) };
        assert_eq!(fill(&lost).holder.as_deref(), Some("i-gone"), "a deleted holder's address was unassigned");
    }

    #[test]
    fn a_slot_that_lost_the_holder_is_filled_after_the_address_moved_on() {
        let b = host("i-b", None);
        let plan = fill(&Found { reserved_on: Some("i-a"), ..found([None, Some(&b)]) });
        assert_eq!(plan.slots, [Fill::AfterFailover, Fill::Keep]);
        let standing = [Standing::default(), Standing { id: Some("i-b"), ..Standing::default() }];
        assert_eq!(plan.after_failover_steps(standing, 3), [After::Create, After::Keep]);
        // A holder still found: an empty slot is an ordinary one.
        let a = host("i-a", None);
        let plan = fill(&Found { reserved_on: Some("i-a"), ..found([Some(&a), None]) });
        assert_eq!(plan.slots, [Fill::Keep, Fill::Create]);
        let standing = [Standing { id: Some("i-a"), ..Standing::default() }, Standing::default()];
        assert_eq!(plan.after_failover_steps(standing, 3), [After::Keep, After::Keep]);
    }

    #[test]
    fn where_the_address_comes_with_the_first_host_the_second_waits_for_it() {
        let waiting = Found { reserved_ip: None, reserves_with_host: true, ..found([None, None]) };
        assert_eq!(fill(&waiting).slots, [Fill::Create, Fill::WaitForAddress]);
        let reserved = Found { reserves_with_host: true, ..found([None, None]) };
        assert_eq!(fill(&reserved).slots, [Fill::Create, Fill::Create], "once reserved, both are made");
    }

    #[test]
    fn a_server_made_with_another_reserved_address_on_its_interface_is_replaced_now() {
        let (a, b) = (host("i-a", Some("203.0.113.9")), host("i-b", Some("198.51.100.4")));
        let plan = fill(&Found { moved_address: MovedAddress::OnInterface, ..found([Some(&a), Some(&b)]) });
        assert_eq!(plan.slots[0], Fill::Keep);
        let Fill::Replace(why) = &plan.slots[1] else { panic!("{:?}", plan.slots[1]) };
        assert!(why.contains("i-b") && why.contains("slot b") && why.contains("203.0.113.9"), "{why}");
        // Where the provider translates the address, any host answers on it.
        assert_eq!(fill(&found([Some(&a), Some(&b)])).slots, [Fill::Keep, Fill::Keep]);
    }

    #[test]
    fn after_the_failover_stopped_servers_go_and_a_spent_standby_is_kept() {
        let (a, b) = (host("i-a", None), host("i-b", None));
        let plan = fill(&Found { reserved_on: Some("i-a"), ..found([Some(&a), Some(&b)]) });
        let standing = |id, stopped, failing, replaced| Standing { id: Some(id), stopped, failing, replaced };
        let steps = plan.after_failover_steps([standing("i-a", true, true, 0), standing("i-b", false, false, 0)], 3);
        let After::Gone(why) = &steps[0] else { panic!("{steps:?}") };
        assert!(why.contains("i-a") && why.contains("slot a"), "{why}");
        assert_eq!(steps[1], After::Keep);
        // Failing without the address and spent: kept; the holder's fate is the failover step's.
        let spent = [standing("i-a", false, true, 3), standing("i-b", false, true, 3)];
        assert_eq!(plan.after_failover_steps(spent, 3), [After::Keep, After::Spent]);
        let left = [standing("i-a", false, true, 3), standing("i-b", false, true, 2)];
        assert_eq!(plan.after_failover_steps(left, 3), [After::Keep, After::Keep], "one replacement left");
        // Stopped goes even when spent: it serves nothing, and its successor draws on the budget.
        let stopped_spent = [standing("i-a", false, false, 0), standing("i-b", true, true, 3)];
        assert!(matches!(plan.after_failover_steps(stopped_spent, 3)[1], After::Gone(_)));
    }
}

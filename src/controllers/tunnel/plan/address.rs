//! The reserved address's steps (`spec.address.mode: Reserved`), decided like the host's: pure.
//!
//! How an address reaches a host differs per provider ([`AddressBinding`]), which decides when
//! it is reserved: before the first host where a host can be given it later (`Assign`) or only
//! at creation (`AtCreate`), together with the first running host where an address can only be
//! found through its host's tags (`WithHost`). Either way the Tunnel's address is the reserved
//! one only once it is on the running host; until then nothing is published.

use std::collections::HashSet;

use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, TAG_TUNNEL_NAME, TAG_TUNNEL_NAMESPACE, TAG_TUNNEL_UID};
use providers::{Address, AddressBinding};

/// Whether to reserve the address before the exit server is created or stepped: where a new
/// host can take it at creation (`AtCreate`), it must exist first; with `Assign` reserving first
/// costs nothing and lets the first host get it at once.
pub fn reserve_first(binding: AddressBinding, address: Option<&Address>) -> bool {
    address.is_none() && binding != AddressBinding::WithHost
}

/// Whether the address recorded in status (`recorded`) is gone: released outside skyport. Its IP
/// may be someone else's now, so it must come off the Service before anything else.
pub fn lost(recorded: Option<&str>, found: Option<&Address>) -> bool {
    recorded.is_some_and(|id| found.is_none_or(|a| a.id != id))
}

/// Whether a new exit server may be created now: where it takes the address only at creation
/// (`AtCreate`), not while the address is still on another host (one being deleted: Hetzner
/// frees a primary IP only once its server is gone). A host created meanwhile would come up
/// without it and have to be replaced again. `Err` says what is waited for.
pub fn may_create(binding: AddressBinding, address: Option<&Address>) -> Result<(), String> {
    match address {
        Some(a) if binding == AddressBinding::AtCreate => match &a.host_id {
            Some(host) => Err(format!("waiting for exit server {host} to free the reserved address {}", a.ip)),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The next step for the address, once the exit server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressStep {
    /// There is none: reserve one, assigned to host `onto` right away when set.
    Reserve { onto: Option<String> },
    /// Point address `id` at the running host `host_id`.
    Assign { id: String, host_id: String },
    /// The running host lacks the address and can only get it when created: replace it.
    ReplaceHost { id: String, why: String },
    /// The address is on the running host: `ip` is the Tunnel's address.
    Ready { ip: String },
}

/// Decides the step for the running host `host_id` and the Tunnel's address (found by tag or
/// by the id in status).
pub fn address_step(binding: AddressBinding, address: Option<&Address>, host_id: &str) -> AddressStep {
    let Some(address) = address else {
        let onto = (binding != AddressBinding::AtCreate).then(|| host_id.to_string());
        return AddressStep::Reserve { onto };
    };
    if address.host_id.as_deref() == Some(host_id) {
        return AddressStep::Ready { ip: address.ip.clone() };
    }
    match binding {
        AddressBinding::AtCreate => AddressStep::ReplaceHost {
            id: host_id.to_string(),
            why: format!(
                "exit server {host_id} does not hold the Tunnel's reserved address {} and can only get it when created",
                address.ip
            ),
        },
        AddressBinding::Assign | AddressBinding::WithHost => {
            AddressStep::Assign { id: address.id.clone(), host_id: host_id.to_string() }
        }
    }
}

/// Whether deleting a Tunnel keeps its reserved address for the next Tunnel of its Service
/// rather than releasing it: the Service that controls the Tunnel still exists, is served and is
/// not being deleted (`service_asks`), so the Service controller makes a new Tunnel at once, and
/// a released address (the Service's published IP, which DNS may name) could be reserved by anyone
/// on that cloud. Only where an address carries its own tags ([`kept_for`] finds it again by
/// them): a DigitalOcean reserved IP is found only through its droplet's.
pub fn keep_for_successor(service_asks: bool, binding: AddressBinding) -> bool {
    service_asks && binding != AddressBinding::WithHost
}

/// Whether `address` is one an earlier Tunnel of `namespace` (of the name it was listed by) kept
/// for its Service's next Tunnel ([`keep_for_successor`]): this cluster's, released on deletion
/// (`Delete`: a `Retain` address was kept on purpose and is left alone), of a Tunnel UID that no
/// live Tunnel has.
pub fn kept_for(address: &Address, namespace: &str, cluster_id: &str, live: &HashSet<String>) -> bool {
    let tag = |k: &str| address.tags.get(k).map(String::as_str);
    tag(TAG_CLUSTER) == Some(cluster_id)
        && tag(TAG_TUNNEL_NAMESPACE) == Some(namespace)
        && tag(TAG_DELETION_POLICY) != Some("Retain")
        // A pool member's address is its shared server's to release, never a successor's.
        && tag(providers::hosts::TAG_POOL_MEMBER).is_none()
        && tag(TAG_TUNNEL_UID).is_some_and(|uid| !live.contains(uid))
}

/// Whether `address` was kept on purpose (`Retain`) by a Tunnel of this namespace (`at.0`) and
/// cluster (`at.1`): what its tags alone prove of a handover ([`handed_over`]), and all that an
/// address id already recorded in status must still show to be taken as handed over.
pub fn retained_here(address: &Address, at: (&str, &str)) -> Result<(), String> {
    let tag = |k: &str| address.tags.get(k).map(String::as_str);
    let (ip, id) = (&address.ip, &address.id);
    if tag(TAG_CLUSTER) != Some(at.1) || tag(TAG_TUNNEL_NAMESPACE) != Some(at.0) {
        return Err(format!(
            "reserved address {ip} ({id}) was not reserved by a Tunnel of this namespace in this cluster"
        ));
    }
    if tag(TAG_DELETION_POLICY) != Some("Retain") {
        return Err(format!(
            "reserved address {ip} ({id}) was not kept with deletionPolicy Retain; only a retained address is handed over"
        ));
    }
    Ok(())
}

/// Whether `address`, named by a Service's `skyport.dev/reserved-address`, may become Tunnel
/// `mine`'s: kept on purpose (`Retain`) by a Tunnel of this namespace (`at.0`) and cluster
/// (`at.1`) that no live Tunnel is (`live`), and recorded by no other live Tunnel (`others`).
/// `Err` says why not; the caller lists only addresses tagged with this namespace, so nothing
/// of another namespace is ever seen, let alone named.
pub fn handed_over(
    address: &Address,
    at: (&str, &str),
    mine: &str,
    live: &HashSet<String>,
    others: &HashSet<String>,
) -> Result<(), String> {
    retained_here(address, at)?;
    let tag = |k: &str| address.tags.get(k).map(String::as_str);
    let (ip, id) = (&address.ip, &address.id);
    let holder = tag(TAG_TUNNEL_UID).unwrap_or_default();
    if (holder != mine && live.contains(holder)) || others.contains(id) {
        let name = tag(TAG_TUNNEL_NAME).unwrap_or("another Tunnel");
        return Err(format!("reserved address {ip} ({id}) is still held by a live Tunnel of this namespace ({name})"));
    }
    Ok(())
}

/// Whether the orphan sweep must leave `address` alone although its Tunnel UID is gone: a live
/// Tunnel took it over (its id in `recorded`), or a live Tunnel of the name it carries has none
/// yet and will take it (`awaiting`, namespace and name).
pub fn taken_over(address: &Address, recorded: &HashSet<String>, awaiting: &HashSet<(String, String)>) -> bool {
    let tag = |k: &str| address.tags.get(k).cloned().unwrap_or_default();
    recorded.contains(&address.id) || awaiting.contains(&(tag(TAG_TUNNEL_NAMESPACE), tag(TAG_TUNNEL_NAME)))
}

/// How long after a reservation was started an address it made is still adopted: the longer
/// the operator was away, the likelier someone else made an unassigned address meanwhile.
pub const ADOPT_WITHIN: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// What a reservation of an untagged address whose answer was lost left behind.
#[derive(Debug, PartialEq)]
pub enum Meanwhile {
    /// No address appeared: nothing was made (or it is on the Tunnel's host, found by its tags).
    Nothing,
    /// Exactly one, provably this reservation's: it is the Tunnel's.
    Adopt(Address),
    /// Addresses appeared that cannot be told apart from someone else's: named, never touched.
    Unproven(Vec<Address>),
}

/// The address a reservation started `elapsed` ago made, given the addresses the account had
/// before it (`before`) and has now (`listed`): new, unassigned (one on a host of this Tunnel
/// is found by its host's tags; one on any other host is not this reservation's), and
/// recorded by no other Tunnel (`others`). It is adopted only when it is the only one, no
/// other Tunnel was reserving too (`others_reserving`), and within [`ADOPT_WITHIN`].
pub fn reserved_meanwhile(
    before: &[String],
    listed: Vec<Address>,
    others: &HashSet<String>,
    others_reserving: bool,
    elapsed: std::time::Duration,
) -> Meanwhile {
    let mut new: Vec<Address> = listed
        .into_iter()
        .filter(|a| a.host_id.is_none() && !before.contains(&a.id) && !others.contains(&a.id))
        .collect();
    match new.len() {
        0 => Meanwhile::Nothing,
        1 if !others_reserving && elapsed <= ADOPT_WITHIN => Meanwhile::Adopt(new.remove(0)),
        _ => Meanwhile::Unproven(new),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_one_new_unassigned_unrecorded_address_is_adopted() {
        use std::time::Duration;
        let address = |id: &str, host: Option<&str>| Address {
            private_ip: None,
            id: id.into(),
            ip: format!("192.0.2.{}", id.len()),
            host_id: host.map(str::to_string),
            tags: Default::default(),
        };
        let before = vec!["old".to_string()];
        let none = HashSet::new();
        let soon = Duration::from_secs(30);
        let listed = vec![address("old", None), address("used", Some("h-9")), address("new", None)];
        let adopted = reserved_meanwhile(&before, listed.clone(), &none, false, soon);
        assert_eq!(adopted, Meanwhile::Adopt(address("new", None)));
        let recorded = HashSet::from(["new".to_string()]);
        assert_eq!(reserved_meanwhile(&before, listed.clone(), &recorded, false, soon), Meanwhile::Nothing);
        let two = [listed.clone(), vec![address("other", None)]].concat();
        let Meanwhile::Unproven(named) = reserved_meanwhile(&before, two, &none, false, soon) else {
            panic!("two new addresses: neither is provably this reservation's")
        };
        assert_eq!(named.len(), 2);
        assert!(matches!(reserved_meanwhile(&before, listed.clone(), &none, true, soon), Meanwhile::Unproven(_)));
        let late = ADOPT_WITHIN + Duration::from_secs(1);
        assert!(matches!(reserved_meanwhile(&before, listed, &none, false, late), Meanwhile::Unproven(_)));
        let only_old = vec![address("old", None)];
        assert_eq!(reserved_meanwhile(&before, only_old, &none, false, soon), Meanwhile::Nothing);
    }

    const BINDINGS: [AddressBinding; 3] = [AddressBinding::Assign, AddressBinding::AtCreate, AddressBinding::WithHost];

    fn address(host: Option<&str>) -> Address {
        Address {
            private_ip: None,
            id: "a-1".into(),
            ip: "198.51.100.7".into(),
            host_id: host.map(String::from),
            tags: Default::default(),
        }
    }

    #[test]
    fn only_withhost_waits_for_a_host_before_reserving() {
        assert!(reserve_first(AddressBinding::Assign, None));
        assert!(reserve_first(AddressBinding::AtCreate, None));
        assert!(!reserve_first(AddressBinding::WithHost, None), "a DigitalOcean reserved IP needs its droplet");
        for binding in BINDINGS {
            assert!(!reserve_first(binding, Some(&address(None))), "{binding:?}: one exists");
        }
    }

    #[test]
    fn without_an_address_one_is_reserved_onto_the_host_where_the_provider_can() {
        assert_eq!(
            address_step(AddressBinding::Assign, None, "h-1"),
            AddressStep::Reserve { onto: Some("h-1".into()) }
        );
        assert_eq!(
            address_step(AddressBinding::WithHost, None, "h-1"),
            AddressStep::Reserve { onto: Some("h-1".into()) }
        );
        assert_eq!(address_step(AddressBinding::AtCreate, None, "h-1"), AddressStep::Reserve { onto: None });
    }

    #[test]
    fn an_address_on_the_running_host_is_the_tunnels_address() {
        for binding in BINDINGS {
            assert_eq!(
                address_step(binding, Some(&address(Some("h-1"))), "h-1"),
                AddressStep::Ready { ip: "198.51.100.7".into() },
                "{binding:?}"
            );
        }
    }

    #[test]
    fn an_address_elsewhere_is_assigned_or_the_host_replaced_where_it_comes_only_at_creation() {
        for on in [None, Some("h-0")] {
            for binding in [AddressBinding::Assign, AddressBinding::WithHost] {
                assert_eq!(
                    address_step(binding, Some(&address(on)), "h-1"),
                    AddressStep::Assign { id: "a-1".into(), host_id: "h-1".into() },
                    "{binding:?} {on:?}"
                );
            }
            let step = address_step(AddressBinding::AtCreate, Some(&address(on)), "h-1");
            assert!(
                matches!(&step, AddressStep::ReplaceHost { id, why } if id == "h-1" && why.contains("198.51.100.7")),
                "{step:?}"
            );
        }
    }

    #[test]
    fn an_at_create_host_waits_until_the_address_is_free() {
        assert_eq!(may_create(AddressBinding::AtCreate, Some(&address(None))), Ok(()));
        assert_eq!(may_create(AddressBinding::AtCreate, None), Ok(()), "an unreserved address is not waited for");
        let held = may_create(AddressBinding::AtCreate, Some(&address(Some("h-0")))).unwrap_err();
        assert!(held.contains("h-0") && held.contains("198.51.100.7"), "{held}");
        for binding in [AddressBinding::Assign, AddressBinding::WithHost] {
            assert_eq!(may_create(binding, Some(&address(Some("h-0")))), Ok(()), "{binding:?}: assigned later");
        }
    }

    #[test]
    fn a_recorded_address_that_is_not_found_is_lost() {
        assert!(!lost(None, None));
        assert!(!lost(None, Some(&address(None))), "a new one, not yet recorded");
        assert!(!lost(Some("a-1"), Some(&address(None))));
        assert!(lost(Some("a-1"), None), "released outside skyport");
        assert!(lost(Some("a-0"), Some(&address(None))), "another one took its place");
    }

    fn tagged(uid: &str, ns: &str, policy: &str) -> Address {
        let mut a = address(None);
        a.tags = [
            (TAG_CLUSTER, "c1"),
            (TAG_TUNNEL_UID, uid),
            (TAG_TUNNEL_NAMESPACE, ns),
            (TAG_TUNNEL_NAME, "web-tunnel"),
            (TAG_DELETION_POLICY, policy),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        a
    }

    #[test]
    fn an_address_is_kept_for_the_services_next_tunnel_only_while_the_service_asks_and_tags_find_it() {
        assert!(keep_for_successor(true, AddressBinding::Assign));
        assert!(keep_for_successor(true, AddressBinding::AtCreate));
        assert!(!keep_for_successor(true, AddressBinding::WithHost), "found only through its droplet: released");
        assert!(!keep_for_successor(false, AddressBinding::Assign), "the Service is gone or opted out: released");
    }

    #[test]
    fn a_kept_address_is_taken_over_only_in_its_namespace_cluster_and_once_its_tunnel_is_gone() {
        let live: HashSet<String> = ["live-uid".to_string()].into();
        assert!(kept_for(&tagged("gone-uid", "a", "Delete"), "a", "c1", &live));
        assert!(!kept_for(&tagged("live-uid", "a", "Delete"), "a", "c1", &live), "its Tunnel still holds it");
        assert!(!kept_for(&tagged("gone-uid", "b", "Delete"), "a", "c1", &live), "another namespace's");
        assert!(!kept_for(&tagged("gone-uid", "a", "Delete"), "a", "c2", &live), "another cluster's");
        assert!(!kept_for(&tagged("gone-uid", "a", "Retain"), "a", "c1", &live), "kept on purpose");
        let mut member = tagged("gone-uid", "a", "Delete");
        member.tags.insert(providers::hosts::TAG_POOL_MEMBER.into(), "member-uid".into());
        assert!(!kept_for(&member, "a", "c1", &live), "a pool member's: its shared server releases it");
        let recorded: HashSet<String> = ["a-1".to_string()].into();
        let awaiting: HashSet<(String, String)> = [("a".to_string(), "web-tunnel".to_string())].into();
        assert!(taken_over(&tagged("gone-uid", "b", "Delete"), &recorded, &HashSet::new()), "by its id");
        assert!(taken_over(&tagged("gone-uid", "a", "Delete"), &HashSet::new(), &awaiting), "by its name");
        let mut other = tagged("gone-uid", "b", "Delete");
        other.id = "addr-2".into();
        assert!(!taken_over(&other, &recorded, &awaiting));
    }

    #[test]
    fn a_named_address_is_handed_over_only_if_retained_here_and_held_by_no_live_tunnel() {
        let (live, none): (HashSet<String>, HashSet<String>) = (["live-uid".to_string()].into(), HashSet::new());
        let at = ("a", "c1");
        assert_eq!(handed_over(&tagged("gone-uid", "a", "Retain"), at, "new-uid", &live, &none), Ok(()));
        assert_eq!(
            handed_over(&tagged("new-uid", "a", "Retain"), at, "new-uid", &live, &none),
            Ok(()),
            "taken already"
        );
        let refused = |a: &Address, others: &HashSet<String>| handed_over(a, at, "new-uid", &live, others).unwrap_err();
        assert!(
            refused(&tagged("gone-uid", "b", "Retain"), &none).contains("not reserved by a Tunnel of this namespace")
        );
        let other_cluster = handed_over(&tagged("gone-uid", "a", "Retain"), ("a", "c2"), "new-uid", &live, &none);
        assert!(other_cluster.unwrap_err().contains("in this cluster"));
        assert!(refused(&tagged("gone-uid", "a", "Delete"), &none).contains("deletionPolicy Retain"));
        assert!(refused(&tagged("live-uid", "a", "Retain"), &none).contains("still held by a live Tunnel"));
        let recorded: HashSet<String> = ["a-1".to_string()].into();
        assert!(refused(&tagged("gone-uid", "a", "Retain"), &recorded).contains("web-tunnel"), "another took it");
    }
}

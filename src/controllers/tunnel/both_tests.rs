//! A highly available Tunnel in mode `BothAddresses` through whole reconciles, at a provider that
//! cannot move addresses: both servers' own addresses on the Service, a failing one dropped at
//! once and replaced while the other carries.

use std::sync::Arc;
use std::time::Duration;

use providers::AddressBinding;
use providers::hosts::{TAG_MOVED_ADDRESS, TAG_TUNNEL_SLOT};
use serde_json::json;

use super::pair_tests::roll_out;
use super::tests::{Harness, SERVICE, harness_settings, ready};
use super::*;
use crate::config::TunnelArgs;
use crate::crd::condition::ConditionStatus;
use crate::crd::tunnel::{HighAvailability, HighAvailabilityMode, HighAvailabilityStatus};

const REPLACE_AFTER: Duration = Duration::from_millis(300);

fn both() -> (Harness, Arc<Tunnel>) {
    let settings = TunnelArgs { replace_after: REPLACE_AFTER, withdraw_after: REPLACE_AFTER, ..Default::default() };
    let mut h = harness_settings(settings);
    // A provider whose addresses are bound when a host is made, never moved.
    h.provider.bind_addresses(AddressBinding::AtCreate);
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    t.spec.high_availability = Some(HighAvailability { mode: HighAvailabilityMode::BothAddresses });
    let t = h.put_tunnel(&t);
    (h, t)
}

fn ha(h: &Harness) -> HighAvailabilityStatus {
    h.current().status.unwrap().high_availability.expect("highAvailability status")
}

fn ingress_ips(h: &Harness) -> Vec<String> {
    let service = h.api.get(SERVICE).unwrap();
    let ingress = service["status"]["loadBalancer"]["ingress"].as_array().cloned().unwrap_or_default();
    ingress.iter().map(|i| i["ip"].as_str().unwrap().to_string()).collect()
}

/// A pass with the Service's cache as the watch has it by then.
async fn pass(h: &mut Harness) {
    h.sync_service();
    h.reconcile(Arc::new(h.current())).await.unwrap();
}

#[tokio::test]
async fn both_servers_own_addresses_are_the_services_addresses_and_nothing_is_reserved() {
    let (h, t) = both();
    h.reconcile(t).await.unwrap();
    let slots: Vec<_> = h.provider.hosts().iter().map(|h| h.tags[TAG_TUNNEL_SLOT].clone()).collect();
    assert_eq!(slots, ["a", "b"]);
    assert!(h.provider.addresses().is_empty(), "nothing reserved");
    assert_eq!(ingress_ips(&h), ["203.0.113.1", "203.0.113.2"]);
    let service = h.api.get(SERVICE).unwrap();
    assert_eq!(service["status"]["loadBalancer"]["ingress"][1]["ports"][0]["port"], json!(80));
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    let status = ha(&h);
    assert_eq!((status.active, status.limitation), (None, None));
    let own: Vec<_> = status.servers.iter().map(|s| (s.slot.as_str(), s.host_ip.as_deref(), s.healthy)).collect();
    assert_eq!(own, [("a", Some("203.0.113.1"), true), ("b", Some("203.0.113.2"), true)]);
    for slot in ["a", "b"] {
        assert!(h.api.get(&format!("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client-{slot}")).is_some());
    }
    assert_eq!(ha(&h).spread.as_deref(), Some("all fake hosts share one machine"), "said in this mode too");
}

#[tokio::test]
async fn a_failing_server_leaves_the_addresses_at_once_and_is_replaced_while_the_other_carries() {
    let (mut h, t) = both();
    h.reconcile(t).await.unwrap();
    h.probe.refuse("203.0.113.1", true);
    pass(&mut h).await;
    assert_eq!(ingress_ips(&h), ["203.0.113.2"], "at the first failed check, no hysteresis");
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert!(h.api.event_reasons().contains(&"AddressWithdrawn".to_string()));
    assert!(h.provider.hosts().iter().any(|host| host.id == "h-1"), "kept within the replace time");

    // Its client runs: the failure is the server's, which a new one can cure.
    roll_out(&h, "a");
    tokio::time::sleep(REPLACE_AFTER).await;
    pass(&mut h).await;
    assert!(!h.provider.hosts().iter().any(|host| host.id == "h-1"), "replaced past the replace time");
    assert_eq!(ha(&h).servers[0].replacements, Some(1));
    pass(&mut h).await;
    pass(&mut h).await;
    let slots: Vec<_> = h.provider.hosts().iter().map(|h| (h.id.clone(), h.tags[TAG_TUNNEL_SLOT].clone())).collect();
    assert_eq!(slots, [("h-2".to_string(), "b".to_string()), ("h-3".to_string(), "a".to_string())]);
    assert_eq!(ingress_ips(&h), ["203.0.113.3", "203.0.113.2"], "the replacement on its new address");
    assert_eq!(ha(&h).servers[0].replacements, None, "its server passes: the count starts over");
}

#[tokio::test]
async fn a_failing_server_whose_client_cannot_run_is_kept_and_replaced_servers_wait_longer_each_time() {
    let (mut h, t) = both();
    h.reconcile(t).await.unwrap();
    // Slot a's client Pod never becomes available (an image that cannot be pulled): a new exit
    // server cannot help, so none is bought however long it fails.
    h.probe.refuse("203.0.113.1", true);
    pass(&mut h).await;
    h.ctx.health.backdate("h-1", 100 * REPLACE_AFTER);
    pass(&mut h).await;
    pass(&mut h).await;
    assert_eq!(h.provider.hosts().len(), 2, "nothing bought");
    let a = ha(&h).servers[0].clone();
    assert!(
        a.kept_because.as_deref().is_some_and(|k| k.contains("web-tunnel-client-a has no available replica")),
        "{a:?}"
    );
    assert_eq!(h.api.event_reasons().iter().filter(|r| *r == "ClientNotAvailable").count(), 1, "once per resync");

    // Its client runs now: replaced, and the next server of the slot must fail twice as long.
    roll_out(&h, "a");
    h.ctx.health.forget("h-1");
    pass(&mut h).await;
    h.ctx.health.backdate("h-1", REPLACE_AFTER);
    pass(&mut h).await;
    assert_eq!(h.provider.hosts().iter().filter(|host| host.id == "h-1").count(), 0, "replaced");
    // Its successor fails from the start (one that passes starts the count over).
    h.probe.refuse("203.0.113.3", true);
    pass(&mut h).await;
    roll_out(&h, "a");
    pass(&mut h).await;
    h.ctx.health.backdate("h-3", REPLACE_AFTER);
    pass(&mut h).await;
    assert!(h.provider.hosts().iter().any(|host| host.id == "h-3"), "the second waits twice as long");
    h.ctx.health.backdate("h-3", REPLACE_AFTER);
    pass(&mut h).await;
    assert!(!h.provider.hosts().iter().any(|host| host.id == "h-3"), "and then goes");
    assert_eq!(ha(&h).servers[0].replacements, Some(2));
}

#[tokio::test]
async fn when_both_fail_the_addresses_go_after_the_withdraw_time_and_one_server_is_replaced_at_a_time() {
    let (mut h, t) = both();
    h.reconcile(t).await.unwrap();
    roll_out(&h, "a");
    roll_out(&h, "b");
    h.probe.refuse("203.0.113.1", true);
    h.probe.refuse("203.0.113.2", true);
    pass(&mut h).await;
    assert_eq!(ingress_ips(&h).len(), 2, "kept within the withdraw time");
    assert_eq!(ready(&h.current()).0, ConditionStatus::False);
    tokio::time::sleep(REPLACE_AFTER).await;
    pass(&mut h).await;
    assert!(ingress_ips(&h).is_empty(), "withdrawn");
    // The one failing longer (by the order of their checks) went; the other waits for its successor.
    let provider = h.provider.clone();
    let ids = || provider.hosts().iter().map(|host| host.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids().len(), 1, "one replaced, not both: {:?}", ids());
    // Its slot is filled again; once the successor serves, the other is replaced as one failing
    // while the other serves.
    pass(&mut h).await;
    pass(&mut h).await;
    let mut ids = ids();
    ids.sort();
    assert_eq!(ids, ["h-3", "h-4"]);
    // Their clients rolled to the new addresses, one at a time: both carry.
    for _ in 0..2 {
        roll_out(&h, "a");
        roll_out(&h, "b");
        pass(&mut h).await;
    }
    let mut ips = ingress_ips(&h);
    ips.sort();
    assert_eq!(ips, ["203.0.113.3", "203.0.113.4"]);
}

#[tokio::test]
async fn active_standby_at_such_a_provider_names_the_alternative() {
    let (h, _) = both();
    let mut t = h.current();
    t.spec.high_availability = Some(HighAvailability::default());
    t.spec.address = Some(crate::crd::tunnel::TunnelAddress {
        mode: crate::crd::tunnel::AddressMode::Reserved,
        ..Default::default()
    });
    let t = h.put_tunnel(&t);
    h.reconcile(t).await.unwrap();
    let message = crate::controllers::status::ready_condition(&h.current()).unwrap().message.clone();
    assert!(message.contains("BothAddresses"), "{message}");
}

#[tokio::test]
async fn at_a_provider_moving_addresses_onto_secondary_ones_the_servers_get_none() {
    // As on EC2: only a pair that moves a reserved address needs a secondary address per server.
    let (h, t) = both();
    h.provider.bind_addresses(AddressBinding::Assign);
    h.provider.move_to_secondary_addresses();
    h.reconcile(t).await.unwrap();
    assert_eq!(ingress_ips(&h), ["203.0.113.1", "203.0.113.2"]);
    for host in h.provider.hosts() {
        assert!(!host.tags.contains_key(TAG_MOVED_ADDRESS), "{}: {:?}", host.id, host.tags);
        assert!(!h.provider.user_data_of(&host.id).unwrap().contains("local-ipv4s"), "{}", host.id);
    }
}

/// A stopped server goes at once; its own address leaves the Service before its VM does (a
/// released address may be someone else's next), even when deleting the VM then fails.
#[tokio::test]
async fn a_stopped_servers_address_leaves_the_service_before_its_vm_goes() {
    let (mut h, t) = both();
    h.reconcile(t).await.unwrap();
    assert_eq!(ingress_ips(&h), ["203.0.113.1", "203.0.113.2"]);
    // The cache shows the Service as published.
    h.sync_service();
    let mut stopped = h.provider.hosts().into_iter().find(|host| host.id == "h-1").unwrap();
    stopped.state = providers::HostState::Stopped;
    h.provider.insert(stopped);
    h.provider.fail_next("delete", providers::HostError::Unavailable { provider: "fake", message: "timeout".into() });
    h.reconcile(Arc::new(h.current())).await.unwrap_err();
    assert_eq!(ingress_ips(&h), ["203.0.113.2"], "off the Service though the VM is still there");
    pass(&mut h).await;
    assert!(!h.provider.hosts().iter().any(|host| host.id == "h-1"), "deleted at the next pass");
}

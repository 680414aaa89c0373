//! A highly available Tunnel through whole reconciles: two exit servers with a client each, the
//! reserved address on the one that works, moved with hysteresis, never onto a failing one.

use std::sync::Arc;
use std::time::Duration;

use providers::hosts::{MOVED_ADDRESS_SECONDARY, TAG_BOUND_ADDRESS, TAG_MOVED_ADDRESS, TAG_TUNNEL_SLOT};
use providers::{AddressBinding, HostState};
use serde_json::json;

use super::tests::{Harness, SERVICE, harness_settings, ready};
use super::*;
use crate::config::TunnelArgs;
use crate::crd::condition::ConditionStatus;
use crate::crd::tunnel::{AddressMode, HighAvailability, TunnelAddress};

const SECRET: &str = "/api/v1/namespaces/ns/secrets/web-tunnel-credentials";

/// An HA Tunnel whose failover needs 3 failed checks in a row (and no minimum time).
pub(super) fn pair() -> (Harness, Arc<Tunnel>) {
    let settings = TunnelArgs { failover_failures: 3, failover_after: Duration::ZERO, ..Default::default() };
    let mut h = harness_settings(settings);
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    t.spec.address = Some(TunnelAddress { mode: AddressMode::Reserved, ..Default::default() });
    t.spec.high_availability = Some(HighAvailability::default());
    let t = h.put_tunnel(&t);
    (h, t)
}

/// The Tunnel marked deleted, and its Service too (a Tunnel deleted while its Service asks for
/// one keeps the address for the next).
pub(super) fn deleted_with_service(h: &mut Harness) -> Arc<Tunnel> {
    let mut t = h.current();
    t.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let mut svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
    svc.metadata.deletion_timestamp = t.metadata.deletion_timestamp.clone();
    h.services.apply_watcher_event(&kube::runtime::watcher::Event::Apply(svc));
    h.put_tunnel(&t)
}

pub(super) fn ha(h: &Harness) -> HighAvailabilityStatus {
    h.current().status.unwrap().high_availability.expect("highAvailability status")
}

fn ingress_ip(h: &Harness) -> serde_json::Value {
    h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"][0]["ip"].clone()
}

/// `n` passes with the checks at `ip` refused, then the refusal lifted.
pub(super) async fn fail_checks(h: &Harness, ip: &str, n: usize) {
    h.probe.refuse(ip, true);
    for _ in 0..n {
        pass(h).await;
    }
    h.probe.refuse(ip, false);
}

/// Slot `slot`'s client Deployment as the Deployment controller reports it once its only Pod
/// runs the current template.
pub(super) fn roll_out(h: &Harness, slot: &str) {
    let path = format!("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client-{slot}");
    let mut d = h.api.get(&path).unwrap();
    d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1});
    h.api.put(&path, d);
}

pub(super) async fn pass(h: &Harness) {
    let action = h.reconcile(Arc::new(h.current())).await.unwrap();
    assert!(crate::controllers::testing::requeue_secs(&action) <= 1.0, "{action:?}");
}

use crate::crd::tunnel::HighAvailabilityStatus;

#[tokio::test]
async fn two_servers_two_clients_and_the_reserved_address_on_the_first_that_works() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let hosts = h.provider.hosts();
    let slots: Vec<_> = hosts.iter().map(|h| h.tags[TAG_TUNNEL_SLOT].as_str()).collect();
    assert_eq!(slots, ["a", "b"]);
    let [address] = h.provider.addresses().try_into().expect("one reserved address");
    assert_eq!(address.host_id.as_deref(), Some("h-1"));
    let status = h.current().status.unwrap();
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert_eq!((status.host_id.as_deref(), status.host_ip.as_deref()), (Some("h-1"), Some(address.ip.as_str())));
    let ha = status.high_availability.unwrap();
    assert_eq!(ha.active.as_deref(), Some("h-1"));
    let own: Vec<_> = ha.servers.iter().map(|s| (s.slot.as_str(), s.host_ip.as_deref(), s.healthy)).collect();
    assert_eq!(own, [("a", Some("203.0.113.1"), true), ("b", Some("203.0.113.2"), true)]);
    assert_eq!(ingress_ip(&h), json!(address.ip));
    // The message says where the holder was checked: at its own address, as on DigitalOcean and
    // Hetzner, never claiming the reserved address's routing was.
    let message = crate::controllers::status::ready_condition(&h.current()).unwrap().message.clone();
    assert!(message.contains("health check at its own address 203.0.113.1 (not through the reserved"), "{message}");
    // Each client dials its own server's own address, from its own key of the one Secret.
    let secret = h.api.get(SECRET).unwrap();
    assert!(secret["stringData"]["client-a.toml"].as_str().unwrap().contains("203.0.113.1:2333"));
    assert!(secret["stringData"]["client-b.toml"].as_str().unwrap().contains("203.0.113.2:2333"));
    for slot in ["a", "b"] {
        let d = h.api.get(&format!("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client-{slot}")).unwrap();
        let items = &d["spec"]["template"]["spec"]["volumes"][0]["secret"]["items"][0];
        assert_eq!(items["key"], json!(format!("client-{slot}.toml")));
        let instance = &d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"];
        assert_eq!(instance, &json!(format!("web-tunnel-client-{slot}")), "the two never select each other's pods");
    }
    assert!(h.api.get("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client").is_none());
}

#[tokio::test]
async fn a_blip_moves_nothing_a_failing_holder_loses_the_address_to_the_standby() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let reserved = h.provider.addresses()[0].ip.clone();
    // Two failures, then a pass: a blip.
    h.probe.refuse(&reserved, true);
    pass(&h).await;
    pass(&h).await;
    h.probe.refuse(&reserved, false);
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"));
    assert!(!h.api.event_reasons().contains(&"Failover".to_string()));

    // Three in a row: the address goes to h-2, whose own check passes.
    h.probe.refuse(&reserved, true);
    pass(&h).await;
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"), "two failures are within the hysteresis");
    assert!(!ha(&h).servers[0].healthy);
    pass(&h).await;
    h.probe.refuse(&reserved, false);
    let status = ha(&h);
    assert_eq!(status.active.as_deref(), Some("h-2"));
    assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some("h-2"));
    assert_eq!(status.failovers, Some(1));
    let last = status.last_failover.unwrap();
    assert_eq!((last.from.as_str(), last.to.as_str()), ("h-1", "h-2"));
    assert!(last.reason.contains("failed 3 health checks in a row") && last.reason.contains("refused"), "{last:?}");
    assert_eq!(h.api.event_reasons().iter().filter(|r| *r == "Failover").count(), 2, "on the Tunnel and the Service");
    assert_eq!(h.ctx.failovers.total(), 1.0);
    assert_eq!(ingress_ip(&h), json!(reserved), "the Service keeps its address");
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));

    // h-1 passes again: nothing moves back.
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    assert_eq!(h.ctx.failovers.total(), 1.0);
}

#[tokio::test]
async fn never_onto_a_standby_whose_own_check_fails() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let reserved = h.provider.addresses()[0].ip.clone();
    h.probe.refuse(&reserved, true);
    h.probe.refuse("203.0.113.2", true);
    for _ in 0..5 {
        pass(&h).await;
    }
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"));
    let (status, reason) = ready(&h.current());
    assert_eq!((status, reason.as_str()), (ConditionStatus::False, "WaitingForTunnel"));
    let message = crate::controllers::status::ready_condition(&h.current()).unwrap().message.clone();
    assert!(message.contains("address stays"), "{message}");
    assert_eq!(h.ctx.failovers.total(), 0.0);
}

#[tokio::test]
async fn a_stopped_holder_loses_the_address_at_once_and_its_slot_is_filled_again() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let mut dead = h.provider.hosts().remove(0);
    dead.state = HostState::Stopped;
    h.provider.insert(dead);
    pass(&h).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"), "in one pass, without the hysteresis");
    let last = ha(&h).last_failover.unwrap();
    assert!(last.reason.contains("not running"), "{last:?}");
    assert!(!h.provider.hosts().iter().any(|host| host.id == "h-1"), "the stopped host was deleted");
    pass(&h).await;
    let slots: Vec<_> = h.provider.hosts().iter().map(|h| (h.id.clone(), h.tags[TAG_TUNNEL_SLOT].clone())).collect();
    assert_eq!(slots, [("h-2".to_string(), "b".to_string()), ("h-3".to_string(), "a".to_string())]);
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    let secret = h.api.get(SECRET).unwrap();
    assert!(secret["stringData"]["client-a.toml"].as_str().unwrap().contains("203.0.113.3:2333"));
}

#[tokio::test]
async fn a_provider_that_cannot_move_addresses_is_refused_before_any_host() {
    let (h, t) = pair();
    h.provider.bind_addresses(AddressBinding::AtCreate);
    h.reconcile(t).await.unwrap();
    assert!(h.provider.hosts().is_empty());
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "HighAvailabilityUnavailable".into()));
    let limitation = t.status.unwrap().high_availability.unwrap().limitation.unwrap();
    assert!(limitation.contains("only when the host is created"), "{limitation}");
}

#[tokio::test]
async fn in_the_operators_namespace_both_clients_go_with_the_tunnel_and_so_do_both_servers() {
    let settings = TunnelArgs { client_namespace: Some("skyport-system".into()), ..Default::default() };
    let mut h = harness_settings(settings);
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    t.spec.address = Some(TunnelAddress { mode: AddressMode::Reserved, ..Default::default() });
    t.spec.high_availability = Some(HighAvailability::default());
    let t = h.put_tunnel(&t);
    h.reconcile(t.clone()).await.unwrap();
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    let at = placement::Placement::of(&t, Some("skyport-system")).unwrap();
    let paths = ["a", "b"]
        .map(|slot| format!("/apis/apps/v1/namespaces/skyport-system/deployments/{}", at.for_slot(slot).deployment));
    for path in &paths {
        let d = h.api.get(path).expect("a client per server in the clients' namespace");
        assert_eq!(d["metadata"]["labels"][placement::LABEL_TUNNEL_UID], json!("tunnel-uid"), "{path}");
    }

    let t = deleted_with_service(&mut h);
    h.reconcile(t).await.unwrap();
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
    for path in &paths {
        assert!(h.api.get(path).is_none(), "{path} deleted with its Tunnel");
    }
    assert!(h.provider.hosts().is_empty(), "both exit servers deleted");
    assert!(h.provider.addresses().is_empty(), "the address released");
}

#[tokio::test]
async fn time_without_a_passing_server_is_counted_once_the_tunnel_was_active() {
    let (h, t) = pair();
    h.probe.answer(false);
    h.reconcile(t).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    pass(&h).await;
    assert_eq!(h.ctx.unserved.seconds.total(), 0.0, "booting is not unserved");
    h.probe.answer(true);
    pass(&h).await;
    h.probe.answer(false);
    tokio::time::sleep(Duration::from_millis(50)).await;
    pass(&h).await;
    let unserved = h.ctx.unserved.seconds.total();
    assert!(unserved >= 0.05, "{unserved}");
    let by_tunnel = h.ctx.unserved.seconds.by_tunnel();
    assert_eq!(
        by_tunnel.keys().collect::<Vec<_>>(),
        [&("ns".to_string(), "web-tunnel".to_string())],
        "the Tunnel's own series"
    );
}

#[tokio::test]
async fn where_the_address_comes_with_a_first_host_the_second_waits_for_it() {
    let (h, t) = pair();
    h.provider.bind_addresses(AddressBinding::WithHost);
    h.reconcile(t).await.unwrap();
    assert_eq!(h.provider.hosts().len(), 1, "slot b waits for the address's region");
    let [address] = h.provider.addresses().try_into().expect("reserved onto the first host");
    assert_eq!(address.host_id.as_deref(), Some("h-1"));
    pass(&h).await;
    let slots: Vec<_> = h.provider.hosts().iter().map(|h| h.tags[TAG_TUNNEL_SLOT].clone()).collect();
    assert_eq!(slots, ["a", "b"]);
    // And a failover moves it with an assign, as on DigitalOcean.
    let reserved = address.ip.clone();
    fail_checks(&h, &reserved, 3).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some("h-2"));
}

#[tokio::test]
async fn where_only_a_second_kind_of_address_moves_the_pair_reserves_that_and_its_servers_carry_it() {
    // As on Hetzner: a primary IP only at creation, so the pair reserves a floating IP, which
    // each server must carry on its interface and keeps its own address beside.
    let (h, t) = pair();
    h.provider.float_moved_addresses();
    h.reconcile(t).await.unwrap();
    let [address] = h.provider.addresses().try_into().expect("one reserved address");
    assert!(h.provider.is_movable(&address.id), "reserved as movable");
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert_eq!(ha(&h).limitation, None);
    let carried = |h: &Harness, ip: &str| {
        h.provider.hosts().iter().all(|host| {
            let user_data = h.provider.user_data_of(&host.id).unwrap();
            user_data.contains(&format!("ip addr replace {ip}/32 ")) && host.tags[TAG_BOUND_ADDRESS] == ip
        })
    };
    assert!(carried(&h, &address.ip), "both servers put the address on their interface at boot");
    let own: Vec<_> = ha(&h).servers.iter().map(|s| s.host_ip.clone().unwrap()).collect();
    assert_eq!(own, ["203.0.113.1", "203.0.113.2"]);

    // The holder fails its checks (at its own address): the address moves with an assign.
    fail_checks(&h, "203.0.113.1", 3).await;
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some("h-2"));
    assert_eq!(ingress_ip(&h), json!(address.ip));

    // Released outside skyport: a new one is reserved, and servers carrying the old one on their
    // interface are replaced by servers carrying the new one.
    h.provider.remove_address(&address.id);
    pass(&h).await;
    pass(&h).await;
    let [renewed] = h.provider.addresses().try_into().expect("a new reserved address");
    assert_ne!(renewed.ip, address.ip);
    let ids: Vec<_> = h.provider.hosts().into_iter().map(|host| host.id).collect();
    assert!(!ids.contains(&"h-1".to_string()) && !ids.contains(&"h-2".to_string()), "{ids:?}");
    assert!(carried(&h, &renewed.ip));
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert_eq!(ingress_ip(&h), json!(renewed.ip));
}

#[tokio::test]
async fn where_the_address_moves_onto_secondary_addresses_each_server_keeps_its_own_and_reads_it_at_boot() {
    // As on EC2: the Elastic IP goes onto a secondary private address of each server, which the
    // server's user data puts on its interface; each keeps the public address its client dials.
    let (h, t) = pair();
    h.provider.move_to_secondary_addresses();
    h.reconcile(t).await.unwrap();
    let [address] = h.provider.addresses().try_into().expect("one reserved address");
    assert_eq!(address.host_id.as_deref(), Some("h-1"));
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    let own = |h: &Harness| h.provider.hosts().into_iter().map(|host| host.public_ipv4.unwrap()).collect::<Vec<_>>();
    assert_eq!(own(&h), ["203.0.113.1", "203.0.113.2"]);
    for host in h.provider.hosts() {
        let user_data = h.provider.user_data_of(&host.id).unwrap();
        assert!(
            user_data.contains("network/interfaces/macs/$mac/local-ipv4s"),
            "{}: reads its secondary address",
            host.id
        );
        assert!(!user_data.contains(&format!("ip addr replace {}/32", address.ip)), "not the Elastic IP itself");
        assert!(!host.tags.contains_key(TAG_BOUND_ADDRESS), "any Elastic IP can go onto it");
        assert_eq!(host.tags[TAG_MOVED_ADDRESS], MOVED_ADDRESS_SECONDARY, "the adapter makes its secondary address");
    }

    // The holder fails its checks at its own address: the address moves, the own ones stay.
    h.probe.refuse("203.0.113.1", true);
    for _ in 0..3 {
        pass(&h).await;
    }
    assert_eq!(ha(&h).active.as_deref(), Some("h-2"));
    assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some("h-2"));
    assert_eq!(own(&h), ["203.0.113.1", "203.0.113.2"]);
    let recorded: Vec<_> = ha(&h).servers.iter().map(|s| s.host_ip.clone().unwrap()).collect();
    assert_eq!(recorded, ["203.0.113.1", "203.0.113.2"]);
    assert_eq!(ingress_ip(&h), json!(address.ip));
    let secret = h.api.get(SECRET).unwrap();
    assert!(secret["stringData"]["client-a.toml"].as_str().unwrap().contains("203.0.113.1:2333"));
    assert!(secret["stringData"]["client-b.toml"].as_str().unwrap().contains("203.0.113.2:2333"));
}

#[tokio::test]
async fn deleting_a_pair_deletes_a_standby_made_but_never_recorded() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let hosts = h.provider.hosts();
    assert_eq!(hosts.len(), 2, "{hosts:?}");
    // The operator stopped between creating slot b's server and recording it: status names a only.
    let mut t = h.current();
    let status = t.status.as_mut().unwrap();
    let ha = status.high_availability.as_mut().unwrap();
    ha.servers.retain(|s| s.slot == "a");
    let recorded = ha.servers[0].host_id.clone();
    status.host_id = recorded.clone();
    ha.active = recorded;
    t.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let t = h.put_tunnel(&t);
    h.reconcile(t).await.unwrap();
    assert!(h.provider.hosts().is_empty(), "left: {:?}", h.provider.hosts());
}

#[tokio::test]
async fn when_both_servers_fail_the_one_without_the_address_is_replaced() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    roll_out(&h, "a");
    roll_out(&h, "b");
    h.probe.answer(false);
    for _ in 0..3 {
        pass(&h).await;
    }
    assert_eq!(ha(&h).active.as_deref(), Some("h-1"), "never moved onto a failing server");
    for host in ["h-1", "h-2"] {
        h.ctx.health.backdate(host, h.ctx.settings.replace_after);
    }
    pass(&h).await;
    pass(&h).await;
    let ids: Vec<_> = h.provider.hosts().into_iter().map(|host| host.id).collect();
    assert!(ids.contains(&"h-1".to_string()) && !ids.contains(&"h-2".to_string()), "{ids:?}");
    assert_eq!(ids.len(), 2, "slot b filled again: {ids:?}");
    assert_eq!(h.current().status.unwrap().hosts_created.len(), 3, "the new server is counted");
}

#[tokio::test]
async fn a_pairs_checks_may_take_the_probe_interval_not_the_single_servers_timeout() {
    let (h, t) = pair();
    h.reconcile(t).await.unwrap();
    let timeouts = h.probe.timeouts();
    // The default interval, 1 s: a hung server fails its check at the next pass.
    assert!(!timeouts.is_empty() && timeouts.iter().all(|t| *t == Duration::from_secs(1)), "{timeouts:?}");
}

//! The reserved address through whole reconciles, for each way a provider binds addresses:
//! reserved once, kept across exit server replacements, released on deletion (or retained),
//! swept when orphaned.

use std::sync::Arc;

use kube::runtime::watcher;
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, TAG_TUNNEL_UID};
use providers::{Address, AddressBinding, HostError, HostProvider};
use serde_json::json;

use super::tests::{Harness, SERVICE, harness, ready};
use super::*;
use crate::controllers::testing::provider::NAME;
use crate::crd::condition::ConditionStatus;
use crate::crd::tunnel::{AddressDeletionPolicy, AddressMode, TunnelAddress};

/// A Tunnel with a reserved address on a provider binding addresses by `binding`.
fn reserved(binding: AddressBinding, policy: AddressDeletionPolicy) -> (Harness, Arc<Tunnel>) {
    let mut h = harness();
    h.provider.bind_addresses(binding);
    h.add_service();
    let mut t = (*h.new_tunnel()).clone();
    t.spec.address = Some(TunnelAddress { mode: AddressMode::Reserved, deletion_policy: policy });
    let t = h.put_tunnel(&t);
    (h, t)
}

fn ingress_ip(h: &Harness) -> serde_json::Value {
    h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"][0]["ip"].clone()
}

async fn delete_tunnel(h: &mut Harness) {
    delete_tunnel_with(h, true).await;
}

/// Deletes the Tunnel, with its Service being deleted too (`service_going`: the garbage collector's
/// cascade) or still asking for a Tunnel (a Tunnel deleted by hand).
async fn delete_tunnel_with(h: &mut Harness, service_going: bool) {
    let now = || Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let mut t = h.current();
    t.metadata.deletion_timestamp = now();
    let t = h.put_tunnel(&t);
    let mut svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
    if service_going {
        svc.metadata.deletion_timestamp = now();
    }
    h.services.apply_watcher_event(&watcher::Event::Apply(svc));
    assert_eq!(h.reconcile(t).await.unwrap(), Action::await_change());
}

/// Active with the reserved address, a host deleted out of band comes back with the same address,
/// deleting the Tunnel releases it. Returns the calls made.
async fn keeps_its_address_and_releases_it(binding: AddressBinding) -> Vec<&'static str> {
    let (mut h, t) = reserved(binding, AddressDeletionPolicy::Delete);
    h.reconcile(t).await.unwrap();
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::True, "Active".into()), "{binding:?}");
    let [address] = h.provider.addresses().try_into().expect("one address reserved");
    let host = h.provider.hosts().pop().unwrap();
    assert_eq!(address.host_id.as_deref(), Some(host.id.as_str()), "{binding:?}: on the host");
    let status = t.status.clone().unwrap();
    assert_eq!(status.address_id.as_deref(), Some(address.id.as_str()));
    assert_eq!(status.address_ip.as_deref(), Some(address.ip.as_str()));
    assert_eq!(status.host_ip.as_deref(), Some(address.ip.as_str()));
    assert_eq!(ingress_ip(&h), json!(address.ip));
    assert_eq!(address.tags.get(TAG_TUNNEL_UID).map(String::as_str), Some("tunnel-uid"));
    assert_eq!(address.tags.get(TAG_CLUSTER).map(String::as_str), Some("cluster-1"));
    assert_eq!(address.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Delete"));

    // Lost out of band: the replacement gets the same address, nothing new is reserved.
    h.provider.delete(&host.id).await.unwrap();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let replacement = h.provider.hosts().pop().expect("a replacement host");
    assert_ne!(replacement.id, host.id);
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert_eq!(ingress_ip(&h), json!(address.ip), "{binding:?}: the same address after replacement");
    assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some(replacement.id.as_str()));
    assert_eq!(h.provider.count("reserve_address"), 1, "{binding:?}: reserved once");

    delete_tunnel(&mut h).await;
    assert!(h.provider.addresses().is_empty(), "{binding:?}: released with the Tunnel");
    assert!(h.provider.hosts().is_empty());
    assert!(h.api.event_reasons().contains(&"AddressReleased".to_string()));
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
    h.provider.calls()
}

fn position(calls: &[&str], op: &str) -> usize {
    calls.iter().position(|c| *c == op).unwrap_or_else(|| panic!("no {op} in {calls:?}"))
}

#[tokio::test]
async fn assign_reserves_before_the_host_and_assigns_it_to_each_host() {
    let calls = keeps_its_address_and_releases_it(AddressBinding::Assign).await;
    assert!(position(&calls, "reserve_address") < position(&calls, "create"));
    assert_eq!(calls.iter().filter(|c| **c == "assign_address").count(), 2, "first host and replacement");
}

#[tokio::test]
async fn at_create_reserves_before_the_host_which_takes_it_when_created() {
    let calls = keeps_its_address_and_releases_it(AddressBinding::AtCreate).await;
    assert!(position(&calls, "reserve_address") < position(&calls, "create"));
    assert!(!calls.contains(&"assign_address"), "{calls:?}");
}

#[tokio::test]
async fn with_host_reserves_onto_the_first_running_host_and_assigns_it_to_later_ones() {
    let calls = keeps_its_address_and_releases_it(AddressBinding::WithHost).await;
    assert!(position(&calls, "create") < position(&calls, "reserve_address"));
    assert_eq!(calls.iter().filter(|c| **c == "assign_address").count(), 1, "the replacement only");
    // Between droplets the address carries no tags: it was found by the id in status.
    assert!(calls.contains(&"get_address"), "{calls:?}");
}

#[tokio::test]
async fn an_at_create_host_without_the_address_is_replaced() {
    let (h, t) = reserved(AddressBinding::AtCreate, AddressDeletionPolicy::Delete);
    h.reconcile(t).await.unwrap();
    let first = h.provider.hosts().pop().unwrap();
    // The address was released and another reserved for the Tunnel while the host ran.
    let old = h.provider.addresses().pop().unwrap();
    h.provider.release_address(&old.id).await.unwrap();
    assert_eq!(h.reconcile(Arc::new(h.current())).await.unwrap(), Action::requeue(BOOT_POLL));
    assert!(h.provider.hosts().is_empty(), "the host without the new address is deleted");
    assert_eq!(h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"], json!([]));
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let [address] = h.provider.addresses().try_into().unwrap();
    let host = h.provider.hosts().pop().unwrap();
    assert_ne!(host.id, first.id);
    assert_ne!(address.ip, old.ip);
    assert_eq!(ingress_ip(&h), json!(address.ip));
    let reasons = h.api.event_reasons();
    assert!(reasons.contains(&"AddressLost".to_string()) && reasons.contains(&"Replacing".to_string()), "{reasons:?}");
}

#[tokio::test]
async fn a_released_address_comes_off_the_service_before_another_is_reserved() {
    let (h, t) = reserved(AddressBinding::Assign, AddressDeletionPolicy::Delete);
    h.reconcile(t).await.unwrap();
    let old = h.provider.addresses().pop().unwrap();
    h.provider.release_address(&old.id).await.unwrap();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let [new] = h.provider.addresses().try_into().unwrap();
    assert_ne!(new.ip, old.ip);
    assert_eq!(ingress_ip(&h), json!(new.ip));
    assert_eq!(h.current().status.unwrap().address_id, Some(new.id));
    // The old address was taken off the Service before the new one was published.
    let ingress_writes: Vec<_> = h
        .api
        .writes()
        .into_iter()
        .filter(|w| w.path.starts_with(SERVICE))
        .map(|w| w.body["status"]["loadBalancer"]["ingress"].clone())
        .collect();
    assert_eq!(
        ingress_writes,
        [
            json!([{"ip": old.ip, "ipMode": "Proxy", "ports": [{"port": 80, "protocol": "TCP"}]}]),
            json!([]),
            json!([{"ip": new.ip, "ipMode": "Proxy", "ports": [{"port": 80, "protocol": "TCP"}]}])
        ]
    );
    assert!(h.api.event_reasons().contains(&"AddressLost".to_string()));
}

#[tokio::test]
async fn a_retained_address_outlives_its_tunnel_and_the_sweep() {
    let (mut h, t) = reserved(AddressBinding::Assign, AddressDeletionPolicy::Retain);
    h.reconcile(t).await.unwrap();
    delete_tunnel(&mut h).await;
    assert!(h.provider.hosts().is_empty());
    let [kept] = h.provider.addresses().try_into().expect("the address is kept");
    assert_eq!(kept.tags.get(TAG_DELETION_POLICY).map(String::as_str), Some("Retain"));
    assert!(h.api.event_reasons().contains(&"AddressRetained".to_string()));
    assert!(!h.provider.calls().contains(&"release_address"));
    // An orphan of a Delete Tunnel (its finalizer was removed by hand) goes; the kept one stays.
    let mut orphan = Address { id: "a-orphan".into(), ..kept.clone() };
    orphan.tags.insert(TAG_DELETION_POLICY.into(), "Delete".into());
    h.provider.insert_address(orphan);
    h.provider.fail_next("list_addresses_by_tag", HostError::Unavailable { provider: NAME, message: "503".into() });
    sweep::sweep_once(&h.ctx).await;
    assert_eq!(h.provider.addresses().len(), 2, "nothing released when the list failed");
    sweep::sweep_once(&h.ctx).await;
    let left: Vec<_> = h.provider.addresses().into_iter().map(|a| a.id).collect();
    assert_eq!(left, [kept.id]);
    assert_eq!(h.ctx.orphan_addresses_released.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn the_sweep_keeps_a_live_tunnels_address() {
    let (mut h, t) = reserved(AddressBinding::Assign, AddressDeletionPolicy::Delete);
    h.reconcile(t).await.unwrap();
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(h.current()));
    sweep::sweep_once(&h.ctx).await;
    assert_eq!(h.provider.addresses().len(), 1);
}

#[tokio::test]
async fn an_address_quota_error_fails_before_any_host_is_made() {
    let (h, t) = reserved(AddressBinding::Assign, AddressDeletionPolicy::Delete);
    let quota = HostError::Quota { provider: NAME, message: "AddressLimitExceeded".into() };
    h.provider.fail_next("reserve_address", quota);
    assert_eq!(h.reconcile(t).await.unwrap_err().reason(), "ProviderQuotaExceeded");
    assert_eq!(ready(&h.current()), (ConditionStatus::False, "ProviderQuotaExceeded".into()));
    assert!(h.provider.hosts().is_empty());
    assert!(h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"][0].is_null());
}

#[tokio::test]
async fn an_ephemeral_tunnel_never_touches_addresses() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    delete_tunnel(&mut h).await;
    assert!(h.provider.calls().iter().all(|c| !c.contains("address")), "{:?}", h.provider.calls());
}

/// A port change and new credentials on a provider that cannot change a running host replace it
/// (like a cloud VM): the address stays, for every binding.
#[tokio::test]
async fn replacements_for_new_ports_and_new_credentials_keep_the_address() {
    for binding in [AddressBinding::Assign, AddressBinding::AtCreate, AddressBinding::WithHost] {
        let (mut h, t) = reserved(binding, AddressDeletionPolicy::Delete);
        h.provider.fix_config();
        h.reconcile(t).await.unwrap();
        let ip = h.provider.addresses()[0].ip.clone();
        let first = h.provider.hosts().pop().unwrap();

        let mut svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
        let svc = serde_json::from_value(h.api.put(SERVICE, serde_json::to_value(svc).unwrap())).unwrap();
        h.services.apply_watcher_event(&watcher::Event::Apply(svc));
        h.reconcile(Arc::new(h.current())).await.unwrap();
        let second = h.provider.hosts().pop().unwrap();
        assert_ne!(second.id, first.id, "{binding:?}: replaced for the new port");
        assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()), "{binding:?}");
        assert_eq!(ingress_ip(&h), json!(ip), "{binding:?}: same address after a port change");
        assert_eq!(
            h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"][0]["ports"][0]["port"],
            json!(8080)
        );

        h.api.remove("/api/v1/namespaces/ns/secrets/web-tunnel-credentials");
        h.reconcile(Arc::new(h.current())).await.unwrap();
        let third = h.provider.hosts().pop().unwrap();
        assert_ne!(third.id, second.id, "{binding:?}: replaced for new credentials");
        assert_eq!(ingress_ip(&h), json!(ip), "{binding:?}: same address with new credentials");
        assert_eq!(h.provider.addresses().len(), 1);
        assert_eq!(h.provider.count("reserve_address"), 1, "{binding:?}");
    }
}

#[tokio::test]
async fn a_provider_without_reserved_addresses_rejects_the_tunnel_but_never_keeps_it() {
    let (mut h, t) = reserved(AddressBinding::Assign, AddressDeletionPolicy::Delete);
    let unsupported =
        || HostError::Invalid { provider: NAME, message: "fake does not support reserved addresses".into() };
    h.provider.fail_next("list_addresses_by_tag", unsupported());
    assert_eq!(h.reconcile(t).await.unwrap(), Action::await_change(), "permanent: not retried");
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ProviderRejected".into()));
    assert!(h.provider.hosts().is_empty(), "no host without its address");
    h.provider.fail_next("list_addresses_by_tag", unsupported());
    delete_tunnel(&mut h).await;
    assert_eq!(h.current().metadata.finalizers, Some(vec![]), "deleting it is not blocked");
}

#[tokio::test]
async fn an_at_create_replacement_waits_until_the_old_host_frees_the_address() {
    let (h, t) = reserved(AddressBinding::AtCreate, AddressDeletionPolicy::Delete);
    h.reconcile(t).await.unwrap();
    let ip = h.provider.addresses()[0].ip.clone();
    let mut old = h.provider.hosts().pop().unwrap();
    // Deleted outside skyport, but still shutting down and holding the address.
    old.state = providers::HostState::Deleting;
    h.provider.insert(old.clone());
    assert_eq!(h.reconcile(Arc::new(h.current())).await.unwrap(), Action::requeue(BOOT_POLL));
    assert_eq!(h.provider.hosts().len(), 1, "no host created that could not get the address");
    let message = crate::controllers::status::ready_condition(&h.current()).unwrap().message.clone();
    assert!(message.contains(&old.id) && message.contains(&ip), "{message}");
    h.provider.delete(&old.id).await.unwrap();
    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    assert_eq!(ingress_ip(&h), json!(ip));
}

#[tokio::test]
async fn the_steady_state_costs_one_address_list_per_reconcile() {
    for binding in [AddressBinding::Assign, AddressBinding::AtCreate, AddressBinding::WithHost] {
        let (h, t) = reserved(binding, AddressDeletionPolicy::Delete);
        h.reconcile(t).await.unwrap();
        let before = h.provider.calls().len();
        h.reconcile(Arc::new(h.current())).await.unwrap();
        assert_eq!(h.provider.calls()[before..], ["list_by_tag", "list_addresses_by_tag"], "{binding:?}");
    }
}

/// Deleted by hand (or with a stolen token) while its Service still asks for a Tunnel: the
/// address is kept for the Service's next Tunnel, except where only its host's tags find it.
#[tokio::test]
async fn a_tunnel_deleted_while_its_service_asks_for_one_keeps_the_address_for_the_next() {
    for (binding, kept) in
        [(AddressBinding::Assign, true), (AddressBinding::AtCreate, true), (AddressBinding::WithHost, false)]
    {
        let (mut h, t) = reserved(binding, AddressDeletionPolicy::Delete);
        h.reconcile(t).await.unwrap();
        assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()), "{binding:?}");
        delete_tunnel_with(&mut h, false).await;
        assert!(h.provider.hosts().is_empty(), "{binding:?}: the exit server goes");
        assert_eq!(h.provider.addresses().len(), usize::from(kept), "{binding:?}");
        let reason = if kept { "AddressKept" } else { "AddressReleased" };
        assert!(h.api.event_reasons().contains(&reason.to_string()), "{binding:?}: {:?}", h.api.event_reasons());
        assert_eq!(h.current().metadata.finalizers, Some(vec![]), "{binding:?}");
    }
}

/// The Service's next Tunnel (a new UID) takes the kept address over and comes up on it with one
/// exit server, also where an address goes onto a host only at creation: the host is created
/// with the address named, not one found by the previous Tunnel's UID tag (a host without it
/// would be replaced to get it, again and again).
#[tokio::test]
async fn the_next_tunnel_of_the_service_comes_up_on_the_kept_address_with_one_exit_server() {
    for binding in [AddressBinding::Assign, AddressBinding::AtCreate] {
        let (mut h, t) = reserved(binding, AddressDeletionPolicy::Delete);
        h.reconcile(t).await.unwrap();
        let [kept] = h.provider.addresses().try_into().expect("one address");
        delete_tunnel_with(&mut h, false).await;

        let mut next = h.current();
        next.metadata.uid = Some("next-tunnel-uid".into());
        next.metadata.deletion_timestamp = None;
        next.metadata.finalizers = None;
        next.status = None;
        let next = h.put_tunnel(&next);
        // The watch cache sees the Service as the cleanup left it (its ingress taken off).
        let svc = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
        h.services.apply_watcher_event(&watcher::Event::Apply(svc));
        let created = h.provider.count("create");
        h.reconcile(next).await.unwrap();
        for _ in 0..2 {
            h.reconcile(Arc::new(h.current())).await.unwrap();
        }
        assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()), "{binding:?}");
        assert_eq!(h.provider.count("create") - created, 1, "{binding:?}: one exit server, never replaced");
        let [host] = h.provider.hosts().try_into().expect("one host");
        let [address] = h.provider.addresses().try_into().expect("still one address");
        assert_eq!(address.id, kept.id, "{binding:?}: the kept address, nothing new reserved");
        assert_eq!(address.host_id.as_deref(), Some(host.id.as_str()), "{binding:?}: on the new host");
        assert_eq!(ingress_ip(&h), json!(kept.ip), "{binding:?}");
        assert!(h.api.event_reasons().contains(&"AddressTakenOver".to_string()), "{binding:?}");
    }
}

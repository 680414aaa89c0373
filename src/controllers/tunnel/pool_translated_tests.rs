//! A pool with an address per Service where the provider translates each address to a private
//! IPv4 of the server (EC2's Elastic IPs), against the in-memory provider made to behave so.

use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;
use serde_json::json;

use super::phases::BOOT_POLL;
use super::pool_tests::{
    CARRIER, carrier_now, ha_per_service, member_ingress, pool_with_a_member_by, pool_with_a_member_of,
    reconcile_member,
};
use super::tests::{Harness, TUNNEL, service};
use crate::config::TunnelArgs;
use crate::controllers::service::desired::ANNOTATION_POOL;
use crate::crd::pool::PoolAddressing;
use crate::crd::tunnel::Tunnel;

/// Dates the member Tunnel at `path` `created`, in the API and the cache.
fn created_at(h: &mut Harness, path: &str, created: &str) {
    let mut tunnel = h.api.get(path).expect("the member's Tunnel");
    tunnel["metadata"]["creationTimestamp"] = json!(created);
    let tunnel: Tunnel = serde_json::from_value(h.api.put(path, tunnel)).unwrap();
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(tunnel));
}

/// A second member: the Service `api` in `ns` on port 8443 and its Tunnel (UID `api-uid`), made
/// `created`.
fn second_member(h: &mut Harness, created: &str) {
    let mut svc = service();
    svc.metadata.name = Some("api".into());
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8443;
    svc.metadata.uid = Some("api-svc-uid".into());
    svc.metadata.annotations = Some([(ANNOTATION_POOL.to_string(), "shared".to_string())].into());
    let path = "/api/v1/namespaces/ns/services/api";
    let svc: Service = serde_json::from_value(h.api.put(path, serde_json::to_value(&svc).unwrap())).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc.clone()));
    let mut member = crate::controllers::service::tunnel_for(&svc).unwrap();
    member.metadata.namespace = Some("ns".into());
    member.metadata.uid = Some("api-uid".into());
    let path = format!("/apis/skyport.dev/v1alpha1/namespaces/ns/tunnels/{}", member.metadata.name.clone().unwrap());
    h.api.put(&path, serde_json::to_value(&member).unwrap());
    created_at(h, &path, created);
}

/// As on EC2: the member's Elastic IP goes onto a private IPv4 of its own on the shared server,
/// which keeps its own public address; the member's services bind that private IPv4 (where the
/// server sees the traffic) once it is there, and the member is published at its Elastic IP. A
/// member past the server's limit is refused with it, before any address is reserved for it.
#[tokio::test]
async fn each_member_binds_the_private_ip_its_address_reaches_and_one_past_the_limit_is_refused() {
    let (mut h, carrier) = pool_with_a_member_by(PoolAddressing::PerService);
    h.provider.translate_member_addresses(1);
    created_at(&mut h, TUNNEL, "2026-01-01T00:00:00Z");
    second_member(&mut h, "2026-01-02T00:00:00Z");

    let first = h.reconcile(carrier).await.unwrap();
    assert_eq!(first, kube::runtime::controller::Action::requeue(BOOT_POLL), "bound at the next pass");
    let [address] = h.provider.addresses().try_into().expect("one address: the newer member is refused");
    let host = h.provider.hosts().pop().unwrap();
    assert_eq!(address.tags.get(providers::hosts::TAG_POOL_MEMBER).map(String::as_str), Some("tunnel-uid"));
    assert_eq!(
        (address.host_id.as_deref(), address.private_ip.as_deref()),
        (Some(host.id.as_str()), Some("10.0.1.10"))
    );
    assert_ne!(host.public_ipv4.as_deref(), Some(address.ip.as_str()), "the server keeps its own address");
    let binds = |h: &Harness| -> Vec<(Option<String>, u16)> {
        let server = h.provider.server_of(&host.id).unwrap();
        let members = server.services.into_iter().filter(|s| s.name.contains('.'));
        members.map(|s| (s.bind.map(|ip| ip.to_string()), s.port)).collect()
    };
    assert_eq!(binds(&h), [], "not served before its address is on the server");

    h.reconcile(carrier_now(&h)).await.unwrap();
    let own = |port| (Some("10.0.1.10".to_string()), port);
    assert_eq!(binds(&h), [own(80), own(40000)], "its port and health port on the private IPv4, not {}", address.ip);
    let status = carrier_now(&h).status.clone().unwrap();
    let refused = status.pool_members.iter().find(|m| m.uid == "api-uid").and_then(|m| m.refused.clone());
    assert!(refused.as_deref().is_some_and(|r| r.contains("at most 1")), "{refused:?}");
    let ports: Vec<i32> = status.ports.iter().map(|p| p.port).collect();
    assert_eq!(ports, [80], "the server exposes nothing for the refused member");

    h.tunnels.apply_watcher_event(&watcher::Event::Apply((*carrier_now(&h)).clone()));
    reconcile_member(&mut h).await;
    assert_eq!(member_ingress(&h)[0]["ip"], json!(address.ip), "published at its Elastic IP");
    assert_eq!(h.api.get(CARRIER).unwrap()["status"]["memberAddresses"][0]["ip"], json!(address.ip));
}

/// A pair cannot bind each server's own private IPv4 in one configuration: refused before
/// anything is bought.
#[tokio::test]
async fn a_pair_is_refused_where_member_addresses_are_translated() {
    let spec = ha_per_service();
    let (h, carrier) = pool_with_a_member_of(spec, TunnelArgs::default());
    h.provider.translate_member_addresses(8);
    let _ = h.reconcile(carrier).await;
    let status = carrier_now(&h).status.clone().unwrap();
    let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "PoolAddressingUnavailable", "{}", ready.message);
    assert!(ready.message.contains("private IPv4"), "{}", ready.message);
    assert!(h.provider.hosts().is_empty() && h.provider.addresses().is_empty(), "nothing bought");
}

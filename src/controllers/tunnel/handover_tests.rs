//! A retained reserved address handed to a Service's Tunnel by the Service's annotation
//! `skyport.dev/reserved-address` (its id or IP): taken, never released by skyport, and refused
//! (nothing reserved, no exit server made) for an address of another namespace or cluster, one
//! not retained, one a live Tunnel holds, and where addresses carry no tags to prove it by.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, TAG_TUNNEL_NAME, TAG_TUNNEL_NAMESPACE, TAG_TUNNEL_UID};
use providers::{Address, AddressBinding};
use serde_json::json;

use super::tests::{Harness, SERVICE, harness, ready};
use super::*;
use crate::controllers::service::desired::ANNOTATION_RESERVED_ADDRESS;
use crate::crd::condition::ConditionStatus;

/// An address a deleted Tunnel (`uid`) of namespace `ns` in cluster `cluster` kept with `policy`.
fn kept(id: &str, ip: &str, (ns, cluster): (&str, &str), uid: &str, policy: &str) -> Address {
    let tags = [
        (TAG_CLUSTER, cluster),
        (TAG_TUNNEL_UID, uid),
        (TAG_TUNNEL_NAMESPACE, ns),
        (TAG_TUNNEL_NAME, "old-tunnel"),
        (TAG_DELETION_POLICY, policy),
    ];
    let tags = tags.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Address { private_ip: None, id: id.into(), ip: ip.into(), host_id: None, tags }
}

/// The Service annotated to take `named`, and the Tunnel skyport makes for it.
fn named(binding: AddressBinding, named: &str) -> (Harness, Arc<Tunnel>) {
    let mut h = harness();
    h.provider.bind_addresses(binding);
    let mut svc = h.add_service();
    svc.metadata.annotations.get_or_insert_default().insert(ANNOTATION_RESERVED_ADDRESS.into(), named.into());
    let svc: Service = serde_json::from_value(h.api.put(SERVICE, serde_json::to_value(&svc).unwrap())).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc.clone()));
    let mut t = crate::controllers::service::tunnel_for(&svc).unwrap();
    t.metadata.namespace = Some("ns".into());
    t.metadata.uid = Some("tunnel-uid".into());
    t.metadata.generation = Some(1);
    assert!(t.spec.reserves_address(), "the annotation implies a reserved address");
    let t = h.put_tunnel(&t);
    (h, t)
}

fn ingress_ip(h: &Harness) -> serde_json::Value {
    h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"][0]["ip"].clone()
}

#[tokio::test]
async fn a_retained_address_the_service_names_becomes_its_tunnels_and_is_never_released() {
    for by in ["a-kept", "198.51.100.9"] {
        let (mut h, t) = named(AddressBinding::Assign, by);
        h.provider.insert_address(kept("a-kept", "198.51.100.9", ("ns", "cluster-1"), "gone-uid", "Retain"));
        h.reconcile(t).await.unwrap();
        for _ in 0..2 {
            h.reconcile(Arc::new(h.current())).await.unwrap();
        }
        let t = h.current();
        assert_eq!(ready(&t), (ConditionStatus::True, "Active".into()), "named by {by}");
        assert_eq!(t.status.unwrap().address_id.as_deref(), Some("a-kept"));
        assert_eq!(ingress_ip(&h), json!("198.51.100.9"));
        let [host] = h.provider.hosts().try_into().expect("one host");
        assert_eq!(h.provider.addresses()[0].host_id.as_deref(), Some(host.id.as_str()), "on the new host");
        assert_eq!(h.provider.count("reserve_address"), 0, "nothing new reserved");
        assert!(h.api.event_reasons().contains(&"AddressTakenOver".to_string()));

        // Deleted with its Service (deletionPolicy Delete): the address stays, as its tags say.
        let now = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
        let mut t = h.current();
        t.metadata.deletion_timestamp = now.clone();
        let t = h.put_tunnel(&t);
        let mut svc: Service = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
        svc.metadata.deletion_timestamp = now;
        h.services.apply_watcher_event(&watcher::Event::Apply(svc));
        h.reconcile(t).await.unwrap();
        assert!(h.provider.hosts().is_empty());
        assert_eq!(h.provider.addresses().len(), 1, "a handed-over address is never released by skyport");
        assert!(!h.provider.calls().contains(&"release_address"));
        assert!(h.api.event_reasons().contains(&"AddressRetained".to_string()));
    }
}

/// Each refusal: the Tunnel reports `AddressNotHandedOver`, reserves nothing and makes no exit
/// server; what it says never names another namespace.
#[tokio::test]
async fn a_named_address_is_refused_unless_retained_here_and_free_and_nothing_else_is_bought() {
    let ours = ("ns", "cluster-1");
    let cases = [
        (
            "another namespace's",
            kept("a-x", "198.51.100.20", ("victim-ns", "cluster-1"), "gone", "Retain"),
            "no reserved address",
        ),
        (
            "another cluster's",
            kept("a-x", "198.51.100.20", ("ns", "cluster-2"), "gone", "Retain"),
            "no reserved address",
        ),
        ("not retained", kept("a-x", "198.51.100.20", ours, "gone", "Delete"), "deletionPolicy Retain"),
        ("held by a live Tunnel", kept("a-x", "198.51.100.20", ours, "live-uid", "Retain"), "still held"),
    ];
    for (what, address, says) in cases {
        let (mut h, t) = named(AddressBinding::Assign, "198.51.100.20");
        h.provider.insert_address(address);
        let mut live = (*t).clone();
        live.metadata.name = Some("old-tunnel".into());
        live.metadata.uid = Some("live-uid".into());
        h.tunnels.apply_watcher_event(&watcher::Event::Apply(live));
        let e = h.reconcile(t).await.unwrap_err();
        assert_eq!(e.reason(), "AddressNotHandedOver", "{what}");
        assert!(e.to_string().contains(says) && !e.to_string().contains("victim-ns"), "{what}: {e}");
        assert_eq!((h.provider.count("reserve_address"), h.provider.count("create")), (0, 0), "{what}");
    }
    // Where reserved addresses carry no tags (DigitalOcean), none can be proven this namespace's.
    let (h, t) = named(AddressBinding::WithHost, "198.51.100.20");
    h.provider.insert_address(kept("a-x", "198.51.100.20", ours, "gone", "Retain"));
    let e = h.reconcile(t).await.unwrap_err();
    assert!(e.to_string().contains("carry no tags"), "{e}");
    assert_eq!(h.provider.count("create"), 0);
}

#[tokio::test]
async fn an_id_written_into_status_hands_over_nothing_the_first_take_would_refuse() {
    // A token that may write tunnels/status records another cluster's retained address (of a
    // namespace with the same name), which this namespace's Service names: the address's tags
    // refuse it as they refuse the first take, so it is never put on an exit server.
    let (h, t) = named(AddressBinding::Assign, "b-kept");
    h.provider.insert_address(kept("b-kept", "198.51.100.10", ("ns", "cluster-2"), "gone-uid", "Retain"));
    let mut t = (*t).clone();
    let recorded = crate::crd::tunnel::TunnelStatus {
        provider: Some("fake".into()),
        address_id: Some("b-kept".into()),
        address_ip: Some("198.51.100.10".into()),
        ..Default::default()
    };
    t.status = Some(recorded);
    h.put_tunnel(&t);
    for _ in 0..3 {
        let _ = h.reconcile(Arc::new(h.current())).await;
    }
    let address = h.provider.addresses().into_iter().find(|a| a.id == "b-kept").unwrap();
    assert_eq!(address.host_id, None, "another cluster's address went onto an exit server");
    assert!(h.provider.hosts().is_empty(), "{:?}", h.provider.hosts());
    assert_ne!(ingress_ip(&h), json!("198.51.100.10"));
}

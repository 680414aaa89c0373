//! The Service reconcile against an in-process fake of the Kubernetes API: the Tunnel created,
//! left alone, or deleted, with Events, and the failure branches.

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::json;

use super::*;
use crate::controllers::testing::{FakeApi, ready_store};

const TUNNEL: &str = "/apis/skyport.dev/v1alpha1/namespaces/ns/tunnels/web-tunnel";

struct Harness {
    ctx: Arc<Context>,
    api: FakeApi,
    tunnels: Writer<Tunnel>,
}

fn harness() -> Harness {
    let (client, api) = FakeApi::start();
    let (reader, tunnels) = ready_store();
    let settings = TunnelArgs { default_load_balancer: true, ..Default::default() };
    let backoff = Backoff::new(settings.service_backoff_min, settings.service_backoff_max);
    let ctx = Arc::new(Context::new(client, backoff, State { settings, tunnels: reader, services: ready_store().0 }));
    Harness { ctx, api, tunnels }
}

fn service(type_: &str) -> Arc<Service> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid", "annotations": {ANNOTATION_REGION: "fra1"}},
            "spec": {"type": type_, "ports": [{"port": 80}]},
        }))
        .unwrap(),
    )
}

#[tokio::test]
async fn a_served_service_gets_its_tunnel_and_an_event() {
    let h = harness();
    assert_eq!(reconcile(service("LoadBalancer"), h.ctx.clone()).await.unwrap(), Action::await_change());
    let tunnel = h.api.get(TUNNEL).expect("Tunnel created");
    assert_eq!(tunnel["spec"]["region"], json!("fra1"));
    assert_eq!(tunnel["metadata"]["ownerReferences"][0]["uid"], json!("svc-uid"));
    assert_eq!(h.api.event_reasons(), ["TunnelCreated"]);
    assert_eq!(h.ctx.api_writes.get(), 2);
}

#[tokio::test]
async fn a_tunnel_created_meanwhile_is_fine_and_makes_no_event() {
    let h = harness();
    h.api.put(TUNNEL, json!({"metadata": {"name": "web-tunnel"}}));
    reconcile(service("LoadBalancer"), h.ctx.clone()).await.unwrap();
    assert!(h.api.event_reasons().is_empty());
}

#[tokio::test]
async fn a_failed_create_is_an_error_to_retry_with_the_fixed_delay() {
    let h = harness();
    h.api.fail(Method::POST, "/tunnels", 500, 1);
    let svc = service("LoadBalancer");
    let err = reconcile(svc.clone(), h.ctx.clone()).await.unwrap_err();
    assert_eq!(err.reason(), "KubernetesApiError");
    assert!(h.api.event_reasons().is_empty());
    for _ in 0..3 {
        assert_eq!(error_policy(svc.clone(), &err, h.ctx.clone()), Action::requeue(Duration::from_secs(5)));
    }
}

/// The Tunnel skyport made for the Service, in the cache.
fn owned_tunnel(h: &mut Harness) {
    let mut tunnel = tunnel_for(&service("LoadBalancer")).unwrap();
    tunnel.metadata.namespace = Some("ns".into());
    h.api.put(TUNNEL, serde_json::to_value(&tunnel).unwrap());
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(tunnel));
}

#[tokio::test]
async fn a_service_no_longer_served_loses_its_tunnel_with_an_event() {
    let mut h = harness();
    owned_tunnel(&mut h);
    assert_eq!(reconcile(service("ClusterIP"), h.ctx.clone()).await.unwrap(), Action::await_change());
    assert!(h.api.get(TUNNEL).is_none());
    assert_eq!(h.api.event_reasons(), ["TunnelDeleted"]);
}

#[tokio::test]
async fn a_tunnel_already_gone_counts_as_deleted_and_a_failed_delete_is_retried() {
    let mut h = harness();
    owned_tunnel(&mut h);
    h.api.fail(Method::DELETE, "/tunnels/web-tunnel", 404, 1);
    reconcile(service("ClusterIP"), h.ctx.clone()).await.unwrap();
    h.api.fail(Method::DELETE, "/tunnels/web-tunnel", 500, 1);
    let err = reconcile(service("ClusterIP"), h.ctx.clone()).await.unwrap_err();
    assert_eq!(err.reason(), "KubernetesApiError");
    assert_eq!(h.api.event_reasons(), ["TunnelDeleted"], "no Event for the failed delete");
}

#[tokio::test]
async fn a_tunnel_still_being_deleted_in_the_cache_is_looked_at_again_for_its_successor() {
    // `kubectl delete tunnel`: the Service's own watch saw the Tunnel go, but the Tunnel
    // controller's cache, which the reconcile reads, still shows it with its deletion stamp.
    // Nothing else wakes the Service afterwards, so it must come back by itself.
    let mut h = harness();
    let mut tunnel = tunnel_for(&service("LoadBalancer")).unwrap();
    tunnel.metadata.namespace = Some("ns".into());
    tunnel.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(tunnel));
    let action = reconcile(service("LoadBalancer"), h.ctx.clone()).await.unwrap();
    assert_ne!(action, Action::await_change(), "a fresh Tunnel would never follow");
    assert!(h.api.writes().is_empty());
}

#[tokio::test]
async fn a_served_service_with_its_tunnel_costs_nothing() {
    let mut h = harness();
    owned_tunnel(&mut h);
    reconcile(service("LoadBalancer"), h.ctx.clone()).await.unwrap();
    assert!(h.api.writes().is_empty());
}

#[tokio::test]
async fn an_unreadable_address_annotation_is_a_warning_on_the_service_not_a_retry() {
    let h = harness();
    let mut svc = (*service("LoadBalancer")).clone();
    svc.metadata.annotations.get_or_insert_default().insert(ANNOTATION_ADDRESS.into(), "static".into());
    assert_eq!(reconcile(Arc::new(svc), h.ctx.clone()).await.unwrap(), Action::await_change());
    assert!(h.api.get(TUNNEL).is_none());
    assert_eq!(h.api.event_reasons(), ["InvalidAnnotation"]);
}

#[tokio::test]
async fn changed_source_ranges_are_patched_onto_the_tunnel_once() {
    let mut h = harness();
    owned_tunnel(&mut h);
    let mut svc = (*service("LoadBalancer")).clone();
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    assert_eq!(reconcile(Arc::new(svc.clone()), h.ctx.clone()).await.unwrap(), Action::await_change());
    let tunnel = h.api.get(TUNNEL).unwrap();
    assert_eq!(tunnel["spec"]["sourceRanges"], json!(["198.51.100.0/24"]));
    assert_eq!(tunnel["spec"]["region"], json!("fra1"), "only the ranges are patched");
    assert_eq!(h.api.event_reasons(), ["SourceRangesChanged"]);
    // Once the cache shows them, nothing more is written.
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(tunnel).unwrap()));
    let writes = h.api.writes().len();
    reconcile(Arc::new(svc), h.ctx.clone()).await.unwrap();
    assert_eq!(h.api.writes().len(), writes);
}

#[tokio::test]
async fn the_proxy_protocol_annotation_follows_onto_the_tunnel_and_a_bad_value_changes_nothing() {
    let mut h = harness();
    owned_tunnel(&mut h);
    let annotated = |value: &str| {
        let mut svc = (*service("LoadBalancer")).clone();
        svc.metadata
            .annotations
            .get_or_insert_default()
            .insert(desired::ANNOTATION_PROXY_PROTOCOL.into(), value.into());
        Arc::new(svc)
    };
    assert_eq!(reconcile(annotated("v2"), h.ctx.clone()).await.unwrap(), Action::await_change());
    let tunnel = h.api.get(TUNNEL).unwrap();
    assert_eq!(tunnel["spec"]["proxyProtocol"], json!("v2"));
    assert_eq!(tunnel["spec"]["region"], json!("fra1"), "only the field is patched");
    assert_eq!(h.api.event_reasons(), ["ProxyProtocolChanged"]);
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(tunnel).unwrap()));
    let writes = h.api.writes().len();
    reconcile(annotated("v2"), h.ctx.clone()).await.unwrap();
    assert_eq!(h.api.writes().len(), writes, "once the cache shows it, nothing more is written");
    // An unknown value is said on the Service; the Tunnel keeps the header it has.
    reconcile(annotated("v3"), h.ctx.clone()).await.unwrap();
    assert_eq!(h.api.get(TUNNEL).unwrap()["spec"]["proxyProtocol"], json!("v2"));
    assert_eq!(h.api.event_reasons(), ["ProxyProtocolChanged", "InvalidAnnotation"]);
    // The annotation removed: the field is removed.
    reconcile(service("LoadBalancer"), h.ctx.clone()).await.unwrap();
    assert_eq!(h.api.get(TUNNEL).unwrap()["spec"].get("proxyProtocol"), None);
}

#[tokio::test(start_paused = true)]
async fn a_standby_acts_on_nothing_until_it_holds_the_lease_then_not_on_what_it_parked_with() {
    let (client, api) = FakeApi::start();
    let settings = TunnelArgs { default_load_balancer: true, ..Default::default() };
    let backoff = Backoff::new(settings.service_backoff_min, settings.service_backoff_max);
    let state = State { settings, tunnels: ready_store().0, services: ready_store().0 };
    let (gate, acting) = crate::controllers::Gate::shut();
    let ctx = Arc::new(Context::new(client, backoff, state).with_acting(acting));
    let parked = tokio::spawn(reconcile(service("LoadBalancer"), ctx.clone()));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!parked.is_finished(), "a standby's reconcile went past the gate");
    assert!(api.calls().is_empty(), "a standby called the API: {:?}", api.calls());
    gate.open();
    // The snapshot it parked with may be stale: it is run again from the cache, not acted on.
    assert_eq!(parked.await.unwrap().unwrap(), crate::controllers::Gate::parked());
    assert!(api.calls().is_empty(), "acted on the parked snapshot: {:?}", api.calls());
    assert_eq!((ctx.api_writes.get(), ctx.metrics.reconciles()), (0, 0));
    // Run again, now holding the Lease: it acts.
    assert_eq!(reconcile(service("LoadBalancer"), ctx.clone()).await.unwrap(), Action::await_change());
    assert!(api.get(TUNNEL).is_some(), "the leader made the Tunnel");
}

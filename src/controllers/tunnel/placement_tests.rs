//! Reconciles with `--tunnel-client-namespace`: the client Deployment and the credentials Secret
//! live in the clients' namespace, are this Tunnel's by their labels, and go with the Tunnel.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher;
use serde_json::json;

use super::placement::{LABEL_TUNNEL_UID, Placement};
use super::tests::{Harness, SERVICE, harness_settings, ready};
use super::*;
use crate::crd::condition::ConditionStatus;

const OPERATOR_NS: &str = "skyport-system";

fn harness() -> Harness {
    harness_settings(TunnelArgs { client_namespace: Some(OPERATOR_NS.into()), ..TunnelArgs::default() })
}

/// The Tunnel's placement, and the fake API's paths of its client Deployment and Secret.
fn paths(tunnel: &Tunnel) -> (Placement, String, String) {
    let at = Placement::of(tunnel, Some(OPERATOR_NS)).unwrap();
    let deployment = format!("/apis/apps/v1/namespaces/{OPERATOR_NS}/deployments/{}", at.deployment);
    let secret = format!("/api/v1/namespaces/{OPERATOR_NS}/secrets/{}", at.secret);
    (at, deployment, secret)
}

/// Nothing skyport wrote went to a Deployment or Secret of the Tunnel's namespace.
fn nothing_in_the_tenant_namespace(h: &Harness) {
    let tenant: Vec<_> = h
        .api
        .calls()
        .into_iter()
        .filter(|c| c.path.contains("/namespaces/ns/deployments") || c.path.contains("/namespaces/ns/secrets"))
        .collect();
    assert!(tenant.is_empty(), "calls to the tenant's Deployments or Secrets: {tenant:?}");
}

#[tokio::test]
async fn the_client_and_its_keys_live_in_the_operators_namespace_and_go_with_the_tunnel() {
    let mut h = harness();
    h.add_service();
    let tunnel = h.new_tunnel();
    h.reconcile(tunnel.clone()).await.unwrap();
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
    let (at, deployment_path, secret_path) = paths(&tunnel);
    let deployment: Deployment = serde_json::from_value(h.api.get(&deployment_path).expect("client")).unwrap();
    assert!(deployment.metadata.owner_references.is_none(), "no owner reference across namespaces");
    let labels = deployment.metadata.labels.clone().unwrap();
    assert_eq!(labels.get(LABEL_TUNNEL_UID).map(String::as_str), Some("tunnel-uid"));
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let mounted = pod.volumes.unwrap()[0].secret.clone().unwrap().secret_name;
    assert_eq!(mounted.as_deref(), Some(at.secret.as_str()));
    let secret: Secret = serde_json::from_value(h.api.get(&secret_path).expect("credentials")).unwrap();
    assert!(secret.data.unwrap().contains_key(desired::KEY_PRIVATE));
    nothing_in_the_tenant_namespace(&h);

    let mut t = h.current();
    t.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    let svc = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc));
    h.reconcile(h.put_tunnel(&t)).await.unwrap();
    assert_eq!(h.current().metadata.finalizers, Some(vec![]));
    assert!(h.api.get(&deployment_path).is_none(), "the client is deleted with its Tunnel");
    assert!(h.api.get(&secret_path).is_none(), "and so are its keys");
}

/// An earlier Tunnel of the same namespace and name left its Secret (its cleanup never ran):
/// the new Tunnel gets fresh keys, never the old ones.
#[tokio::test]
async fn an_earlier_tunnels_keys_in_the_operators_namespace_are_replaced() {
    let mut h = harness();
    h.add_service();
    let tunnel = h.new_tunnel();
    let (_, _, secret_path) = paths(&tunnel);
    let mut earlier = tunnel.as_ref().clone();
    earlier.metadata.uid = Some("deleted-tunnel-uid".into());
    let old = desired::Credentials::generate();
    let at = Placement::of(&earlier, Some(OPERATOR_NS)).unwrap();
    h.api.put(&secret_path, serde_json::to_value(desired::secret(&earlier, &at, &old).unwrap()).unwrap());

    h.reconcile(tunnel).await.unwrap();
    let secret: Secret = serde_json::from_value(h.api.get(&secret_path).unwrap()).unwrap();
    let uid = secret.metadata.labels.as_ref().unwrap().get(LABEL_TUNNEL_UID).cloned();
    assert_eq!(uid.as_deref(), Some("tunnel-uid"));
    let private = String::from_utf8(secret.data.unwrap()[desired::KEY_PRIVATE].0.clone()).unwrap();
    assert_ne!(private, old.keypair.private_key, "fresh keys");
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
}

/// A Secret of that name skyport did not label is neither read nor replaced.
#[tokio::test]
async fn a_secret_of_that_name_skyport_did_not_make_is_left_alone() {
    let mut h = harness();
    h.add_service();
    let tunnel = h.new_tunnel();
    let (at, _, secret_path) = paths(&tunnel);
    let stored = h.api.put(&secret_path, json!({"metadata": {"name": at.secret}, "data": {"token": "c2VjcmV0"}}));
    h.reconcile(tunnel).await.unwrap();
    let current = h.current();
    let ready = crate::controllers::status::ready_condition(&current).expect("Ready condition");
    assert!(ready.message.contains("is not this Tunnel's"), "{ready:?}");
    assert_eq!(h.api.get(&secret_path), Some(stored), "left as it was");
}

//! The RBAC in `deploy/` is sufficient and minimal: the Queue controller runs in-process with
//! the identity of the deploy ServiceAccount `skyport-system/skyport` (a token from the
//! TokenRequest API) and passes a Queue scenario, while requests outside the granted rules are
//! refused with 403.
//!
//! This applies `deploy/` to the test API server for real (`kubectl apply -k deploy/`): the
//! ServiceAccount and its bindings must exist. The Deployment it creates stays inert (the test
//! environment runs no Deployment controller, scheduler or kubelet).

use crate::common;
mod accounts;
mod escalations;
mod install;
mod namespaced;
mod startup;
mod tenants;
mod users_objects;
use crate::common::tunnels;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use install::{
    CLIENT_NS, INSTALL_NS, helm_render, install_deploy_once, kubectl_apply, service_account_client, token_client,
};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease as LeaseObject;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use skyport::controllers::tunnel::placement::Placement;
use skyport::crd::{ConditionStatus, Queue};
use tokio::sync::oneshot;

const TIMEOUT: Duration = Duration::from_secs(30);
/// A Tunnel's first Active waits on a new exit server and client process, as in the Tunnel tests.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(60);

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

async fn allowed(
    client: &Client,
    namespace: &str,
    verb: &str,
    resource: &str,
    group: &str,
    name: Option<&str>,
) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_string()),
                verb: Some(verb.to_string()),
                resource: Some(resource.to_string()),
                group: Some(group.to_string()),
                name: name.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    api.create(&PostParams::default(), &review).await.expect("SelfSubjectAccessReview").status.expect("status").allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn queue_controller_works_with_the_deploy_service_account_and_nothing_else_is_allowed() {
    let admin = client().await;
    install_deploy_once().await;
    let sa = service_account_client(&admin).await;
    let ns = TestNs::new("rbac").await;

    // The controller, with the ServiceAccount's identity only.
    let (ctx, stop, task) = queue_controller_as(sa.clone(), &ns).await;

    // create → Ready, ConfigMap, Event
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("orders", json!({"tags": {"team": "shop"}}))).await.unwrap();
    let q = wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    let sqs_name = q.status.as_ref().and_then(|s| s.queue_name.clone()).expect("status.queueName");
    let configmaps: Api<ConfigMap> = ns.api();
    eventually("ConfigMap orders-sqs", TIMEOUT, || async { configmaps.get("orders-sqs").await.ok() }).await;
    let events: Api<Event> = ns.api();
    eventually("a Created Event", TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.iter().any(|e| e.reason.as_deref() == Some("Created")).then_some(())
    })
    .await;
    exports_work_as_the_service_account(&queues, &ns).await;
    // delete → SQS queue and finalizer gone
    queues.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "orders", TIMEOUT).await;
    assert!(!queue_exists(&sqs().await, &sqs_name).await, "SQS queue {sqs_name} still exists");
    assert_no_failures(&ctx.metrics, "reconciles failed under the ServiceAccount's identity");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;

    // What the ClusterRole grants works cluster-wide, as the Deployment (all namespaces) needs.
    Api::<Queue>::all(sa.clone()).list(&ListParams::default().limit(1)).await.expect("list Queues in all namespaces");
    Api::<ConfigMap>::all(sa.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=skyport").limit(1))
        .await
        .expect("list managed ConfigMaps in all namespaces");

    // Everything else is refused.
    forbidden(Api::<Secret>::all(sa.clone()).list(&ListParams::default()).await, "list Secrets cluster-wide");
    forbidden(Api::<Namespace>::all(sa.clone()).delete(&ns.name, &DeleteParams::default()).await, "delete a Namespace");
    forbidden(Api::<Pod>::namespaced(sa.clone(), &ns.name).list(&ListParams::default()).await, "list Pods");
    // `get` on Queues is granted: adopting checks whether the Queue an SQS owner tag names (in
    // any namespace, so not from a namespaced cache) still exists, and a create checks that its
    // Queue is still live (the cache may be behind).
    forbidden(
        Api::<Queue>::namespaced(sa.clone(), &ns.name).delete("orders", &DeleteParams::default()).await,
        "delete a Queue",
    );

    forbidden(Api::<LeaseObject>::namespaced(sa.clone(), "default").list(&ListParams::default()).await, "list Leases");

    // Leases: create in the install namespace, read and renew only the operator's own.
    let lease = |verb, name| allowed(&sa, INSTALL_NS, verb, "leases", "coordination.k8s.io", name);
    assert!(lease("create", None).await);
    assert!(lease("get", Some("skyport")).await);
    assert!(lease("patch", Some("skyport")).await);
    assert!(!lease("patch", Some("someone-else")).await);
    assert!(!lease("delete", Some("skyport")).await);
    assert!(!lease("update", Some("skyport")).await);
    assert!(!allowed(&sa, "default", "create", "leases", "coordination.k8s.io", None).await);

    // And the real leader election calls succeed under that identity.
    let lease =
        skyport::leader::Lease::new(sa.clone(), INSTALL_NS, "skyport", Duration::from_secs(3), "rbac-test".into())
            .await
            .expect("prepare the Lease as the ServiceAccount");
    tokio::time::timeout(Duration::from_secs(30), lease.acquire()).await.expect("acquire the Lease");
    let held = Api::<LeaseObject>::namespaced(admin.clone(), INSTALL_NS).get("skyport").await.unwrap();
    assert_eq!(held.spec.and_then(|s| s.holder_identity).as_deref(), Some("rbac-test"));
    lease.release().await;
    let released = Api::<LeaseObject>::namespaced(admin.clone(), INSTALL_NS).get("skyport").await.unwrap();
    assert_eq!(released.spec.and_then(|s| s.holder_identity), None, "the Lease is free again");

    ns.cleanup().await;
}

/// Export Secrets are written, compared and deleted without ever reading one that is not the
/// Queue's: a Secret someone else holds under an export's name is a conflict, left alone.
async fn exports_work_as_the_service_account(queues: &Api<Queue>, ns: &TestNs) {
    use kube::api::{Patch, PatchParams};
    let exports = |names: &[(&str, &str)]| {
        let list: Vec<_> =
            names.iter().map(|(kind, name)| json!({"kind": kind, "name": name, "keys": {"url": "URL"}})).collect();
        json!({"spec": {"exports": list}})
    };
    let patch = exports(&[("Secret", "orders-env"), ("ConfigMap", "orders-cm")]);
    queues.patch("orders", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let secrets: Api<Secret> = ns.api();
    let secret = eventually("Secret export", TIMEOUT, || async { secrets.get("orders-env").await.ok() }).await;
    assert!(secret.data.unwrap()["URL"].0.starts_with(b"http"), "the export holds the queue's URL");
    let taken: Secret =
        serde_json::from_value(json!({"metadata": {"name": "taken"}, "stringData": {"URL": "mine"}})).unwrap();
    secrets.create(&PostParams::default(), &taken).await.unwrap();
    queues.patch("orders", &PatchParams::default(), &Patch::Merge(exports(&[("Secret", "taken")]))).await.unwrap();
    wait_ready(queues, "orders", ConditionStatus::False, "ExportConflict", TIMEOUT).await;
    eventually("dropped exports deleted", TIMEOUT, || async {
        let gone = secrets.get_opt("orders-env").await.ok()?.is_none()
            && ns.api::<ConfigMap>().get_opt("orders-cm").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    assert_eq!(
        secrets.get("taken").await.unwrap().data.unwrap()["URL"].0,
        b"mine",
        "someone else's Secret is left alone"
    );
    queues.patch("orders", &PatchParams::default(), &Patch::Merge(exports(&[]))).await.unwrap();
    wait_ready(queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
}

/// Each way a stolen token could reach beyond skyport's own objects is refused by the shipped
/// RBAC and admission policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_stolen_service_account_token_reaches_nothing_beyond_skyports_objects() {
    let admin = client().await;
    install_deploy_once().await;
    let sa = service_account_client(&admin).await;
    let ns = TestNs::new("rbac-esc").await;
    escalations::escalations_are_refused(&admin, &sa, &ns.name, (INSTALL_NS, "skyport"), CLIENT_NS).await;
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn tunnel_controllers_work_with_the_deploy_service_account() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Service;
    use skyport::crd::{Tunnel, TunnelPhase};

    let admin = client().await;
    install_deploy_once().await;
    let sa = service_account_client(&admin).await;
    let ns = TestNs::new("rbac-tun").await;
    // The cluster id as the binary reads it: the kube-system namespace's UID.
    let mut settings = tunnels::fast_tunnel_settings();
    settings.cluster_id = Some(skyport::hosts::cluster_id(&sa, &settings).await.expect("read kube-system as the SA"));
    // As installed: the client and its credentials in the tunnel clients' namespace.
    settings.client_namespace = Some(CLIENT_NS.into());
    let op = tunnels::TunnelOperator::start_as(sa.clone(), &ns, settings).await;
    let (_, client, _) = Placement::names(&ns.name, "web-tunnel", Some(CLIENT_NS));

    let services: Api<Service> = ns.api();
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": [{"port": 8080}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    // Active needs the tunnel client running (the kubelet's part here).
    let _client =
        common::kubelet::ClientRunner::start(admin.clone(), CLIENT_NS, &client, common::kubelet::Backends::default());
    let tunnels_api: Api<Tunnel> = ns.api();
    let tunnel = eventually("Tunnel Active", ACTIVE_TIMEOUT, || async {
        let t = tunnels_api.get("web-tunnel").await.ok()?;
        (t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;
    let ip = tunnel.status.and_then(|s| s.host_ip).unwrap();
    eventually("Service ingress", TIMEOUT, || async {
        let s = services.get("web").await.ok()?;
        (s.status?.load_balancer?.ingress?.first()?.ip.as_deref()? == ip).then_some(())
    })
    .await;
    let clients: Api<Deployment> = Api::namespaced(admin.clone(), CLIENT_NS);
    clients.get(&client).await.expect("the client Deployment in the tunnel clients' namespace");
    let beside = ns.api::<Deployment>().list(&ListParams::default()).await.unwrap().items;
    assert!(beside.is_empty(), "no Deployment in the tenant's namespace: {beside:?}");
    // Deleting the Tunnel (finalizer, ingress cleared, a new Tunnel made) works as the SA too.
    tunnels_api.delete("web-tunnel", &DeleteParams::default()).await.unwrap();
    eventually("a new Tunnel Active", Duration::from_secs(60), || async {
        let t = tunnels_api.get("web-tunnel").await.ok()?;
        (t.metadata.uid != tunnel.metadata.uid && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(())
    })
    .await;
    assert_no_failures(&op.ctx.metrics, "Tunnel reconciles failed as the SA");
    assert_no_failures(&op.services.metrics, "Service reconciles failed");

    // Secrets: read by name only, never listed; other kube-system namespaces' data stays closed.
    forbidden(Api::<Secret>::namespaced(sa.clone(), &ns.name).list(&ListParams::default()).await, "list Secrets");
    forbidden(Api::<Namespace>::all(sa.clone()).get("default").await, "get a Namespace other than kube-system");
    forbidden(
        Api::<Service>::namespaced(sa.clone(), &ns.name).delete("web", &DeleteParams::default()).await,
        "delete a Service",
    );
    unrelated_writes_are_refused(&admin, &sa, &ns.name).await;
    tunnels::finish_tunnels(op, ns).await;
    // No owner reference crosses namespaces: the Tunnel's cleanup deleted its client.
    assert!(clients.get_opt(&client).await.unwrap().is_none(), "the client outlived its Tunnel");
}

/// What RBAC cannot express, the admission policy does: the ServiceAccount may create and patch
/// only Secrets, ConfigMaps and Deployments labelled as skyport's. (Refusals by the policy come
/// back as 403 Forbidden, the reason it sets.)
async fn unrelated_writes_are_refused(admin: &Client, sa: &Client, ns: &str) {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Patch, PatchParams};
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "unrelated"}, "stringData": {"k": "v"}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
    let as_sa: Api<Secret> = Api::namespaced(sa.clone(), ns);
    let steal =
        json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "skyport"}}, "stringData": {"k": "stolen"}});
    forbidden(
        as_sa.patch("unrelated", &PatchParams::default(), &Patch::Merge(&steal)).await,
        "patch an unrelated Secret",
    );
    let mut own = secret.clone();
    own.metadata.name = Some("made-by-sa".into());
    forbidden(as_sa.create(&PostParams::default(), &own).await, "create a Secret without skyport's label");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "unrelated-cm"}})).unwrap();
    forbidden(
        Api::<ConfigMap>::namespaced(sa.clone(), ns).create(&PostParams::default(), &cm).await,
        "create a ConfigMap without skyport's label",
    );
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "unrelated"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
    }))
    .unwrap();
    forbidden(
        Api::<Deployment>::namespaced(sa.clone(), ns).create(&PostParams::default(), &deployment).await,
        "create a Deployment without skyport's label",
    );
    // Deleting is granted for dropped Queue exports, and only skyport's own objects may go.
    forbidden(as_sa.delete("unrelated", &DeleteParams::default()).await, "delete an unrelated Secret");
    let user_cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "users-cm"}})).unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), ns).create(&PostParams::default(), &user_cm).await.unwrap();
    forbidden(
        Api::<ConfigMap>::namespaced(sa.clone(), ns).delete("users-cm", &DeleteParams::default()).await,
        "delete an unrelated ConfigMap",
    );
    let kept = Api::<Secret>::namespaced(admin.clone(), ns).get("unrelated").await.unwrap();
    assert_eq!(kept.data.unwrap()["k"].0, b"v", "the unrelated Secret is untouched");
    planted_in_the_operators_namespace_is_refused(admin, sa).await;
}

/// The operator's own namespace holds what configures it (the ownership key that seals Queue
/// status): even an object that looks like a Queue export (skyport's label, a Queue of that
/// namespace as its controller) is refused there, so a stolen token cannot plant the key.
async fn planted_in_the_operators_namespace_is_refused(admin: &Client, sa: &Client) {
    let queues: Api<Queue> = Api::namespaced(admin.clone(), "skyport-system");
    let decoy = queues.create(&PostParams::default(), &queue("rbac-decoy", json!({}))).await.unwrap();
    let owner = json!([{"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "name": "rbac-decoy",
                        "uid": decoy.metadata.uid, "controller": true}]);
    let key: Secret = serde_json::from_value(json!({
        "metadata": {"name": "skyport-ownership-key", "labels": {"app.kubernetes.io/managed-by": "skyport"},
                     "ownerReferences": owner},
        "stringData": {"key": "k".repeat(64)},
    }))
    .unwrap();
    let planted = Api::<Secret>::namespaced(sa.clone(), "skyport-system").create(&PostParams::default(), &key).await;
    let _ = queues.delete("rbac-decoy", &DeleteParams::default()).await;
    forbidden(planted, "plant the ownership key in the operator's namespace");
}

/// The Queue controller for `ns` with `client`'s identity: its context, its stop switch, its task.
async fn queue_controller_as(
    client: kube::Client,
    ns: &TestNs,
) -> (Arc<skyport::controllers::queue::Context>, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let aws = providers::SqsSettings { operation_timeout: Duration::from_secs(5), ..Default::default() };
    let sqs_provider = providers::SqsProvider::from_env(&aws).await;
    let (stop, stopped) = oneshot::channel::<()>();
    let (ctx, run) = skyport::controllers::queue::controller(
        client,
        Arc::new(sqs_provider),
        aws,
        fast_settings(),
        Some(ns.name.clone()),
        skyport::controllers::Acting::always(),
        async {
            let _ = stopped.await;
        },
    );
    (ctx, stop, tokio::spawn(run))
}

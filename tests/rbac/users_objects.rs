//! What a stolen token of skyport's ServiceAccount can do to the users' own requests (Queues,
//! Tunnels, AwsAccounts) and to the tunnel clients it may run: only what skyport itself does.
//! Each write is tried for real against the installed RBAC and admission policy; what skyport
//! does is tried too (a dry run where it would change something), so each refusal is for the one
//! thing an attacker changed.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use skyport::config::OWN_IMAGE;
use skyport::controllers::tunnel::desired;
use skyport::controllers::tunnel::placement::Placement;
use skyport::crd::{AwsAccount, Queue, Tunnel};

use super::escalations::{create_refused, set};
use super::forbidden;
use crate::common::queue;

type Namespaced = kube::core::NamespaceResourceScope;

/// Patches `name` as the ServiceAccount and expects 403, then checks the object is unchanged.
async fn patch_refused<K>(sa: &Client, admin: &Client, ns: &str, name: &str, patch: Patch<Value>, what: &str)
where
    K: Resource<DynamicType = (), Scope = Namespaced> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let before = serde_json::to_value(Api::<K>::namespaced(admin.clone(), ns).get(name).await.unwrap()).unwrap();
    let result = Api::<K>::namespaced(sa.clone(), ns).patch(name, &PatchParams::default(), &patch).await;
    forbidden(result, what);
    let after = serde_json::to_value(Api::<K>::namespaced(admin.clone(), ns).get(name).await.unwrap()).unwrap();
    assert_eq!(before["metadata"], after["metadata"], "{what}: the metadata changed");
    assert_eq!(before["spec"], after["spec"], "{what}: the spec changed");
}

/// A dry-run patch as the ServiceAccount that the policy must admit.
async fn patch_admitted<K>(sa: &Client, ns: &str, name: &str, patch: Patch<Value>, what: &str)
where
    K: Resource<DynamicType = (), Scope = Namespaced> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let dry_run = PatchParams { dry_run: true, ..Default::default() };
    if let Err(e) = Api::<K>::namespaced(sa.clone(), ns).patch(name, &dry_run, &patch).await {
        panic!("{what}: skyport's own write refused: {e}");
    }
}

fn merge(v: Value) -> Patch<Value> {
    Patch::Merge(v)
}

fn json_patch(ops: Value) -> Patch<Value> {
    Patch::Json(serde_json::from_value(ops).unwrap())
}

const QUEUE_FINALIZER: &str = "queues.skyport.dev/cleanup";
const TUNNEL_FINALIZER: &str = "tunnels.skyport.dev/cleanup";
const ACCOUNT_FINALIZER: &str = "awsaccounts.skyport.dev/in-use";

/// Every way the token might rewrite a user's object, refused; the finalizer skyport adds and
/// removes, admitted.
async fn metadata_is_limited_to_skyports_finalizer<K>(admin: &Client, sa: &Client, ns: &str, name: &str, own: &str)
where
    K: Resource<DynamicType = (), Scope = Namespaced> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let kind = K::kind(&());
    let api = Api::<K>::namespaced(admin.clone(), ns);
    let owner =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-00000000dead"});
    let attacks = [
        ("an injected ownerReference", merge(json!({"metadata": {"ownerReferences": [owner]}}))),
        (
            "an ownerReference added by JSON patch",
            json_patch(json!([{"op": "add", "path": "/metadata/ownerReferences", "value": [owner]}])),
        ),
        ("a label", merge(json!({"metadata": {"labels": {"example.com/team": "attacker"}}}))),
        ("an annotation", merge(json!({"metadata": {"annotations": {"example.com/x": "y"}}}))),
        ("a finalizer of someone else", merge(json!({"metadata": {"finalizers": [own, "example.com/hold"]}}))),
    ];
    for (what, patch) in attacks {
        let what = format!("{kind} {name}: {what}");
        patch_refused::<K>(sa, admin, ns, name, patch, &what).await;
    }
    // A tenant's own finalizer stays: skyport removes only its own.
    api.patch(name, &PatchParams::default(), &merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})))
        .await
        .unwrap();
    let what = format!("{kind} {name}: a tenant's finalizer removed");
    patch_refused::<K>(sa, admin, ns, name, merge(json!({"metadata": {"finalizers": null}})), &what).await;
    let what = format!("{kind} {name}: skyport's finalizer added");
    let add = merge(json!({"metadata": {"finalizers": ["example.com/keep", own]}}));
    patch_admitted::<K>(sa, ns, name, add, &what).await;
    api.patch(name, &PatchParams::default(), &merge(json!({"metadata": {"finalizers": [own]}}))).await.unwrap();
    patch_admitted::<K>(sa, ns, name, merge(json!({"metadata": {"finalizers": null}})), "skyport's finalizer removed")
        .await;
    api.patch(name, &PatchParams::default(), &merge(json!({"metadata": {"finalizers": null}}))).await.unwrap();
}

/// The checks of this module, in `ns`, with the client Deployment's namespace `client_ns`.
pub async fn users_objects_are_skyports_only_by_its_finalizer(admin: &Client, sa: &Client, ns: &str, client_ns: &str) {
    let account: AwsAccount = serde_json::from_value(json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount", "metadata": {"name": "victim"},
        "spec": {"roleArn": "arn:aws:iam::000000000002:role/victim", "region": "eu-west-1"},
    }))
    .unwrap();
    Api::<AwsAccount>::namespaced(admin.clone(), ns).create(&PostParams::default(), &account).await.unwrap();
    Api::<Queue>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &queue("tenant", json!({})))
        .await
        .unwrap();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/other", "ports": [{"port": 80}]},
    }))
    .unwrap();
    let service = Api::<Service>::namespaced(admin.clone(), ns).create(&PostParams::default(), &service).await.unwrap();
    let tunnels: Api<Tunnel> = Api::namespaced(admin.clone(), ns);
    let tunnel = |name: &str, owners: Value, labels: Value| -> Tunnel {
        serde_json::from_value(json!({
            "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
            "metadata": {"name": name, "ownerReferences": owners, "labels": labels},
            "spec": {"serviceRef": {"name": "web"}},
        }))
        .unwrap()
    };
    let uid = service.uid().unwrap();
    let by_service = || json!([{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": uid, "controller": true}]);
    let ours = tunnels
        .create(
            &PostParams::default(),
            &tunnel("web-tunnel", by_service(), json!({"app.kubernetes.io/managed-by": "skyport"})),
        )
        .await
        .unwrap();
    tunnels.create(&PostParams::default(), &tunnel("by-hand", json!([]), json!({}))).await.unwrap();
    let unlabelled = serde_json::to_value(tunnel("unlabelled", by_service(), json!({}))).unwrap();
    create_refused::<Tunnel>(sa, admin, ns, unlabelled, "a Service's Tunnel without skyport's label").await;
    // A pool's shared server (no serviceRef): only in skyport's own namespace, and only one its
    // pool controls. A thief cannot buy shared servers in a tenant's namespace or for no pool.
    let shared = |owners: Value| {
        json!({
            "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
            "metadata": {"name": "pool-shared", "ownerReferences": owners,
                "labels": {"app.kubernetes.io/managed-by": "skyport"}},
            "spec": {"pool": {"name": "shared"}},
        })
    };
    let by_pool = json!([{"apiVersion": "skyport.dev/v1alpha1", "kind": "ExitServerPool", "name": "shared",
        "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]);
    create_refused::<Tunnel>(sa, admin, ns, shared(by_pool.clone()), "a shared server in a tenant's namespace").await;
    let other_pool = json!([{"apiVersion": "skyport.dev/v1alpha1", "kind": "ExitServerPool", "name": "other",
        "uid": "00000000-0000-0000-0000-000000000002", "controller": true}]);
    create_refused::<Tunnel>(sa, admin, "skyport-system", shared(other_pool), "a shared server another pool controls")
        .await;
    create_refused::<Tunnel>(sa, admin, "skyport-system", shared(json!([])), "a shared server no pool controls").await;

    // AwsAccounts: the spec is the tenant's trust decision (allowedNamespaces), never skyport's.
    let widen = merge(json!({"spec": {"allowedNamespaces": ["attacker"]}}));
    patch_refused::<AwsAccount>(sa, admin, ns, "victim", widen, "AwsAccount: allowedNamespaces widened").await;
    let role = merge(json!({"spec": {"roleArn": "arn:aws:iam::000000000009:role/other"}}));
    patch_refused::<AwsAccount>(sa, admin, ns, "victim", role, "AwsAccount: another role").await;
    metadata_is_limited_to_skyports_finalizer::<AwsAccount>(admin, sa, ns, "victim", ACCOUNT_FINALIZER).await;
    metadata_is_limited_to_skyports_finalizer::<Queue>(admin, sa, ns, "tenant", QUEUE_FINALIZER).await;
    metadata_is_limited_to_skyports_finalizer::<Tunnel>(admin, sa, ns, "by-hand", TUNNEL_FINALIZER).await;
    metadata_is_limited_to_skyports_finalizer::<Tunnel>(admin, sa, ns, "web-tunnel", TUNNEL_FINALIZER).await;

    // A Tunnel's spec: only the fields of one its Service controls that follow the Service
    // (its loadBalancerSourceRanges, its proxy-protocol annotation), nothing of a hand-made one.
    let ranges = || merge(json!({"spec": {"sourceRanges": ["198.51.100.0/24"]}}));
    patch_admitted::<Tunnel>(sa, ns, "web-tunnel", ranges(), "the sourceRanges of a Service's Tunnel").await;
    patch_refused::<Tunnel>(sa, admin, ns, "by-hand", ranges(), "Tunnel by hand: sourceRanges").await;
    let proxy = || merge(json!({"spec": {"proxyProtocol": "v2"}}));
    patch_admitted::<Tunnel>(sa, ns, "web-tunnel", proxy(), "the proxyProtocol of a Service's Tunnel").await;
    patch_refused::<Tunnel>(sa, admin, ns, "by-hand", proxy(), "Tunnel by hand: proxyProtocol").await;
    // (Every other field of a Tunnel's spec is immutable for everyone, refused by the CRD
    // before admission; the policy compares them too, see the test below.)

    // Deleting: only a Tunnel a Service controls and skyport made.
    let dry_run = DeleteParams { dry_run: true, ..Default::default() };
    let as_sa: Api<Tunnel> = Api::namespaced(sa.clone(), ns);
    forbidden(as_sa.delete("by-hand", &dry_run).await, "delete a hand-made Tunnel");
    as_sa.delete("web-tunnel", &dry_run).await.expect("skyport deletes the Tunnel of a Service it no longer serves");
    assert!(tunnels.get_opt("by-hand").await.unwrap().is_some());

    tunnel_clients_run_only_the_client(admin, sa, client_ns, &ours).await;

    let gone = DeleteParams::default();
    for name in ["web-tunnel", "by-hand"] {
        tunnels.delete(name, &gone).await.unwrap();
    }
    Api::<Service>::namespaced(admin.clone(), ns).delete("web", &gone).await.unwrap();
    Api::<Queue>::namespaced(admin.clone(), ns).delete("tenant", &gone).await.unwrap();
    Api::<AwsAccount>::namespaced(admin.clone(), ns).delete("victim", &gone).await.unwrap();
}

/// The client Deployment runs `/skyport tunnel client` with its config, and nothing else.
async fn tunnel_clients_run_only_the_client(admin: &Client, sa: &Client, client_ns: &str, t: &Tunnel) {
    let at = Placement::of(t, Some(client_ns)).unwrap();
    let exact = serde_json::to_value(desired::deployment(t, &at, OWN_IMAGE, "0").unwrap()).unwrap();
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let client: Deployment = serde_json::from_value(exact.clone()).unwrap();
    crate::common::eventually(
        "the tunnel client skyport writes admitted",
        std::time::Duration::from_secs(30),
        || async {
            Api::<Deployment>::namespaced(sa.clone(), client_ns).create(&dry_run, &client).await.ok().map(|_| ())
        },
    )
    .await;
    let c = "/spec/template/spec/containers/0";
    let exec = json!({"exec": {"command": ["/skyport", "tunnel", "server", "--config", "/etc/skyport/client.toml"]}});
    let variants: [(&str, &str, Value); 9] = [
        ("another subcommand", "/args", json!(["tunnel", "server", "--config", "/etc/skyport/client.toml"])),
        ("another config file", "/args/3", json!("/proc/self/environ")),
        ("an extra argument", "/args/4", json!("--verbose")),
        ("another command", "/command", json!(["/bin/sh", "-c", "cat /etc/skyport/client.toml"])),
        ("a postStart hook", "/lifecycle", json!({"postStart": exec})),
        ("a liveness probe running a command", "/livenessProbe", exec.clone()),
        ("a startup probe running a command", "/startupProbe", exec),
        (
            "the Secret mounted over the binary",
            "/volumeMounts/0",
            json!({"name": "config", "mountPath": "/skyport", "subPath": "client.toml", "readOnly": true}),
        ),
        ("the Secret mounted writable", "/volumeMounts/0/readOnly", json!(false)),
    ];
    for (what, path, value) in variants {
        let mut d = exact.clone();
        set(&mut d, &format!("{c}{path}"), value);
        let what = format!("a tunnel client with {what}");
        create_refused::<Deployment>(sa, admin, client_ns, d, &what).await;
    }
    let mut no_command = exact.clone();
    no_command["spec"]["template"]["spec"]["containers"][0].as_object_mut().unwrap().remove("command");
    let what = "a tunnel client without its command (the image's entrypoint: `skyport run`)";
    create_refused::<Deployment>(sa, admin, client_ns, no_command, what).await;
}

/// The users' Queues, Tunnels and AwsAccounts change under the token only as skyport changes
/// them (its finalizers, a Service's Tunnel's source ranges), only a Service's Tunnel is deleted,
/// and tunnel clients run only the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_stolen_token_changes_users_objects_only_as_skyport_does() {
    use super::install::{CLIENT_NS, install_deploy_once, service_account_client};
    let admin = crate::common::client().await;
    install_deploy_once().await;
    let sa = service_account_client(&admin).await;
    let ns = crate::common::TestNs::new("rbac-users").await;
    users_objects_are_skyports_only_by_its_finalizer(&admin, &sa, &ns.name, CLIENT_NS).await;
    ns.cleanup().await;
}

/// The Tunnel spec fields that follow a Service: the Service controller writes them on the
/// Tunnel it owns, so the policy lets skyport change them there (and names them in its comment).
const FOLLOW_THE_SERVICE: [&str; 2] = ["sourceRanges", "proxyProtocol"];

/// The policy lets a Service's Tunnel change only the fields that follow the Service, by comparing
/// every other field by name: a field added to the Tunnel's spec must be compared there too, or
/// named as following the Service (kustomize and Helm).
#[test]
fn the_policy_compares_every_tunnel_spec_field_but_those_that_follow_the_service() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(Tunnel::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let fields: Vec<&String> = spec.as_object().unwrap().keys().collect();
    assert!(fields.len() >= 8, "the Tunnel's spec fields: {fields:?}");
    for path in ["deploy/admission.yaml", "deploy/helm/skyport/templates/admission.yaml"] {
        let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
        let policy = &text[text.find("-never-writes-specs").expect("the policy")..];
        let rule = &policy[policy.find("# The spec, whole").expect("the spec rule")..];
        let (comment, validation) = rule.split_at(rule.find("- expression:").expect("its expression"));
        for field in &fields {
            let compared = format!("object.spec.{field} == oldObject.spec.{field}");
            if FOLLOW_THE_SERVICE.contains(&field.as_str()) {
                assert!(!validation.contains(&compared), "{path}: spec.{field} follows the Service yet is compared");
                assert!(
                    comment.contains(&format!("spec.{field}")),
                    "{path}: spec.{field} is not named as following the Service"
                );
            } else {
                assert!(
                    validation.contains(&compared),
                    "{path}: the Tunnel's spec.{field} is not compared ({compared})"
                );
            }
        }
    }
}

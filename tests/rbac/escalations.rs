//! What a stolen token of skyport's ServiceAccount must not reach, each tried for real against
//! the installed RBAC and admission policy: a ServiceAccount token minted through a Secret,
//! privileged or token-carrying pods, reading Secrets skyport did not make, publishing an
//! address on another load balancer's Service, rewriting a Queue's spec, making a Tunnel for no Service.
//!
//! Every refusal must come back as 403 (RBAC, or the admission policy's reason Forbidden). An
//! object the server wrongly admits is deleted with the admin client before the test fails, so a
//! failing run leaves nothing behind in kube-system.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use skyport::config::OWN_IMAGE;
use skyport::controllers::tunnel::desired;
use skyport::controllers::tunnel::placement::{LABEL_TUNNEL_UID, Placement};
use skyport::crd::{Queue, Tunnel};

use super::forbidden;
use crate::common::queue;

const MANAGED: (&str, &str) = ("app.kubernetes.io/managed-by", "skyport");

/// Creates `obj` as the ServiceAccount and expects 403; anything admitted is removed first.
pub(super) async fn create_refused<K>(sa: &Client, admin: &Client, ns: &str, obj: Value, what: &str)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).unwrap_or_else(|e| panic!("{what}: {e}"));
    let result = Api::<K>::namespaced(sa.clone(), ns).create(&PostParams::default(), &obj).await;
    if let Ok(made) = &result {
        let name = made.meta().name.clone().unwrap_or_default();
        let _ = Api::<K>::namespaced(admin.clone(), ns).delete(&name, &DeleteParams::background()).await;
    }
    forbidden(result, what);
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true})
}

/// Checks every escalation of a stolen token in `ns` (a namespace the ServiceAccount works in),
/// in `operator`'s namespace (where its Deployment of that name and its own Secrets live) and in
/// `client_ns`, the tunnel clients' namespace.
pub async fn escalations_are_refused(admin: &Client, sa: &Client, ns: &str, operator: (&str, &str), client_ns: &str) {
    let queues: Api<Queue> = Api::namespaced(admin.clone(), ns);
    let q = queues.create(&PostParams::default(), &queue("escalation", json!({}))).await.unwrap();
    let queue_owner = owner("skyport.dev/v1alpha1", "Queue", "escalation", q.meta().uid.as_deref().unwrap());
    let tunnel: Tunnel = serde_json::from_value(json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": "escalation"}, "spec": {"serviceRef": {"name": "nothing"}},
    }))
    .unwrap();
    let tunnel = Api::<Tunnel>::namespaced(admin.clone(), ns).create(&PostParams::default(), &tunnel).await.unwrap();

    let tunnel_owner = owner("skyport.dev/v1alpha1", "Tunnel", "escalation", tunnel.meta().uid.as_deref().unwrap());
    secrets_are_limited_to_opaque_owned_ones(admin, sa, ns, (&queue_owner, &tunnel_owner)).await;
    deployments_are_limited_to_unprivileged_tunnel_clients(admin, sa, (ns, client_ns), &tunnel).await;
    the_operators_namespace_is_out_of_reach(admin, sa, ns, operator).await;
    service_status_is_limited_to_skyports_class(admin, sa, ns).await;
    specs_are_never_written(admin, sa, ns).await;

    // Nothing of this is left for controllers that run in `ns` next.
    let gone = DeleteParams::default();
    for service in ["other-class", "no-class", "ours"] {
        Api::<Service>::namespaced(admin.clone(), ns).delete(service, &gone).await.unwrap();
    }
    Api::<Tunnel>::namespaced(admin.clone(), ns).delete("escalation", &gone).await.unwrap();
    queues.delete("escalation", &gone).await.unwrap();
}

async fn secrets_are_limited_to_opaque_owned_ones(
    admin: &Client,
    sa: &Client,
    ns: &str,
    (queue_owner, tunnel_owner): (&Value, &Value),
) {
    // The token controller fills such a Secret with a token of whichever ServiceAccount its
    // annotation names.
    let token_secret = |owners: Value| {
        json!({
            "metadata": {
                "name": "stolen-token",
                "labels": {MANAGED.0: MANAGED.1},
                "annotations": {"kubernetes.io/service-account.name": "default"},
                "ownerReferences": owners,
            },
            "type": "kubernetes.io/service-account-token",
        })
    };
    let what = "a labelled service-account-token Secret";
    create_refused::<Secret>(sa, admin, ns, token_secret(json!([])), what).await;
    let what = "a service-account-token Secret owned by a Queue";
    create_refused::<Secret>(sa, admin, ns, token_secret(json!([queue_owner])), what).await;
    let opaque = |name: &str, owners: Value| {
        json!({"metadata": {"name": name, "labels": {MANAGED.0: MANAGED.1}, "ownerReferences": owners},
               "type": "Opaque", "stringData": {"k": "v"}})
    };
    let what = "a labelled Secret without an owner";
    create_refused::<Secret>(sa, admin, ns, opaque("no-owner", json!([])), what).await;
    let foreign = owner("v1", "ConfigMap", "x", "00000000-0000-0000-0000-000000000000");
    let what = "a Secret owned by something other than a Queue";
    create_refused::<Secret>(sa, admin, ns, opaque("foreign-owner", json!([foreign])), what).await;
    // A Tunnel's keys live in the clients' namespace only, never beside the Tunnel.
    let what = "a Secret owned by a Tunnel in a tenant's namespace";
    create_refused::<Secret>(sa, admin, ns, opaque("tunnel-owned", json!([tunnel_owner])), what).await;
    let what = "a labelled ConfigMap without an owner";
    let cm = json!({"metadata": {"name": "no-owner", "labels": {MANAGED.0: MANAGED.1}}, "data": {"k": "v"}});
    create_refused::<ConfigMap>(sa, admin, ns, cm, what).await;

    // Secrets skyport did not make cannot be read: not by name, not as the answer to a write.
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "someone-elses"}, "stringData": {"k": "v"}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), ns).create(&PostParams::default(), &secret).await.unwrap();
    let as_sa: Api<Secret> = Api::namespaced(sa.clone(), ns);
    forbidden(as_sa.get("someone-elses").await, "get an unrelated Secret");
    forbidden(
        as_sa.patch("someone-elses", &PatchParams::default(), &Patch::Merge(json!({}))).await,
        "read an unrelated Secret back from a no-op patch",
    );
    forbidden(as_sa.get("no-such-secret").await, "probe Secret names (403 before 404)");
    no_patch_reads_a_secret(admin, sa, ns, queue_owner).await;
}

/// `patch` is a read where it is granted: the API server checks a patched object's name (and
/// validates its labels) before any admission policy runs, and its refusal quotes the value a
/// JSON patch copied there; a `test` operation that holds fails later than one that does not.
/// None of it may answer anything of a Secret skyport did not make.
async fn no_patch_reads_a_secret(admin: &Client, sa: &Client, ns: &str, queue_owner: &Value) {
    let value = format!("s3cr3t-{ns}");
    let encoded = serde_json::to_value(k8s_openapi::ByteString(value.clone().into_bytes())).unwrap();
    let encoded = encoded.as_str().unwrap().to_string();
    let victim: Secret = serde_json::from_value(json!({
        "metadata": {"name": "victim", "labels": {"team": "a"}, "annotations": {"note": "b"}},
        "stringData": {"password": value},
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), ns).create(&PostParams::default(), &victim).await.unwrap();
    let as_sa: Api<Secret> = Api::namespaced(sa.clone(), ns);
    let dry_run = PatchParams { dry_run: true, ..Default::default() };
    let copy = |to: &str| json!([{"op": "copy", "from": "/data/password", "path": to}]);
    let test = |guess: &str| json!([{"op": "test", "path": "/data/password", "value": guess}]);
    let mut answers = Vec::new();
    for (what, ops) in [
        ("copy into the name", copy("/metadata/name")),
        ("copy into a label", copy("/metadata/labels/leak")),
        ("copy into an annotation", copy("/metadata/annotations/leak")),
        ("test the right value", test(&encoded)),
        ("test a wrong value", test("d3Jvbmc=")),
    ] {
        let patch: json_patch::Patch = serde_json::from_value(ops).unwrap();
        let answer = as_sa.patch("victim", &dry_run, &Patch::<()>::Json(patch)).await;
        let text = format!("{answer:?}");
        assert!(!text.contains(&encoded) && !text.contains(&value), "{what}: the Secret's value came back: {text}");
        answers.push((what, text));
    }
    // Refused by RBAC, which runs before all of the above; an admission policy would be too late.
    for (what, answer) in &answers {
        assert!(
            answer.contains("403") && answer.contains("cannot patch resource"),
            "{what}: a JSON patch of someone else's Secret must be refused by RBAC, got {answer}"
        );
    }
    // `update` is granted (Secret exports are rewritten whole): it answers only what was sent, and
    // the policy refuses taking over a Secret no Queue controls.
    let take_over: Secret = serde_json::from_value(json!({
        "metadata": {"name": "victim", "labels": {MANAGED.0: MANAGED.1}, "ownerReferences": [queue_owner]},
        "stringData": {"password": "overwritten"},
    }))
    .unwrap();
    let answer = format!("{:?}", as_sa.replace("victim", &PostParams::default(), &take_over).await);
    assert!(answer.contains("403") && !answer.contains(&encoded), "update of someone else's Secret: {answer}");
    let kept = Api::<Secret>::namespaced(admin.clone(), ns).get("victim").await.unwrap();
    assert_eq!(kept.data.unwrap()["password"].0, value.as_bytes(), "the Secret is untouched");
    Api::<Secret>::namespaced(admin.clone(), ns).delete("victim", &DeleteParams::default()).await.unwrap();
}

async fn deployments_are_limited_to_unprivileged_tunnel_clients(
    admin: &Client,
    sa: &Client,
    (ns, client_ns): (&str, &str),
    t: &Tunnel,
) {
    let at = Placement::of(t, Some(client_ns)).unwrap();
    let exact = serde_json::to_value(desired::deployment(t, &at, OWN_IMAGE, "0").unwrap()).unwrap();
    // The client as skyport writes it is admitted in the clients' namespace (a dry run), so
    // each refusal below is for the one thing changed.
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let pod = "/spec/template/spec";
    let client: Deployment = serde_json::from_value(exact.clone()).unwrap();
    let deployments: Api<Deployment> = Api::namespaced(sa.clone(), client_ns);
    deployments.create(&dry_run, &client).await.expect("the tunnel client skyport writes is admitted");
    // A highly available Tunnel's two clients too, each mounting only its Tunnel's Secret.
    let slot = serde_json::to_value(desired::deployment(t, &at.for_slot("b"), OWN_IMAGE, "0").unwrap()).unwrap();
    let slot_client: Deployment = serde_json::from_value(slot.clone()).unwrap();
    // Waited for: an API server that had an older policy picks the applied one up a moment later.
    crate::common::eventually("a highly available Tunnel's client admitted", Duration::from_secs(30), || async {
        deployments.create(&dry_run, &slot_client).await.ok().map(|_| ())
    })
    .await;
    let mut foreign = slot.clone();
    set(&mut foreign, &format!("{pod}/volumes/0/secret/secretName"), json!("skyport-aws"));
    create_refused::<Deployment>(sa, admin, client_ns, foreign, "a pair's client mounting another Secret").await;
    let variants: [(&str, &str, Value); 14] = [
        ("a privileged container", "/containers/0/securityContext", json!({"privileged": true})),
        ("a container allowed to escalate", "/containers/0/securityContext/allowPrivilegeEscalation", json!(true)),
        ("an added capability", "/containers/0/securityContext/capabilities/add", json!(["NET_ADMIN"])),
        ("the host network", "/hostNetwork", json!(true)),
        ("the host PID namespace", "/hostPID", json!(true)),
        ("the host IPC namespace", "/hostIPC", json!(true)),
        ("another ServiceAccount", "/serviceAccountName", json!("admin")),
        ("a ServiceAccount token", "/automountServiceAccountToken", json!(true)),
        ("a root user", "/securityContext/runAsNonRoot", json!(false)),
        ("a hostPath volume", "/volumes/0", json!({"name": "config", "hostPath": {"path": "/etc/kubernetes"}})),
        ("another Secret mounted", "/volumes/0/secret/secretName", json!("skyport-aws")),
        ("a second container", "/containers/1", json!({"name": "extra", "image": OWN_IMAGE})),
        ("another image", "/containers/0/image", json!("example.com/anything:latest")),
        ("an environment", "/containers/0/env", json!([{"name": "X", "value": "y"}])),
    ];
    for (what, path, value) in variants {
        let mut d = exact.clone();
        set(&mut d, &format!("{pod}{path}"), value);
        let what = format!("a Tunnel's client Deployment with {what}");
        create_refused::<Deployment>(sa, admin, client_ns, d, &what).await;
    }
    let mut unlabelled = exact.clone();
    unlabelled["metadata"]["labels"].as_object_mut().unwrap().remove(LABEL_TUNNEL_UID);
    create_refused::<Deployment>(sa, admin, client_ns, unlabelled, "a client without its Tunnel's UID label").await;
    // No Deployment at all outside the tunnel clients' namespace, not even the exact client.
    let mut elsewhere = exact.clone();
    elsewhere["metadata"]["namespace"] = json!(ns);
    create_refused::<Deployment>(sa, admin, ns, elsewhere, "a tunnel client in a tenant's namespace").await;
    // A Secret there that is no Tunnel's is not changed by a patch (its read through a JSON
    // patch is the named residue of the tunnel clients' namespace, tests/attacks/residues.rs).
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": format!("other-{ns}")}, "stringData": {"k": "v"}})).unwrap();
    let name = secret.metadata.name.clone().unwrap();
    Api::<Secret>::namespaced(admin.clone(), client_ns).create(&PostParams::default(), &secret).await.unwrap();
    let write = Api::<Secret>::namespaced(sa.clone(), client_ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"stringData": {"k": "changed"}})))
        .await;
    Api::<Secret>::namespaced(admin.clone(), client_ns).delete(&name, &DeleteParams::default()).await.unwrap();
    forbidden(write, "change a Secret of the tunnel clients' namespace that is no Tunnel's");

    // The classic: a labelled privileged pod on the host network in kube-system.
    let mut privileged = exact.clone();
    privileged["metadata"]["name"] = json!(format!("skyport-escalation-{ns}"));
    privileged["metadata"]["namespace"] = json!("kube-system");
    set(&mut privileged, &format!("{pod}/hostNetwork"), json!(true));
    set(&mut privileged, &format!("{pod}/containers/0/securityContext"), json!({"privileged": true}));
    let what = "a labelled privileged Deployment in kube-system";
    create_refused::<Deployment>(sa, admin, "kube-system", privileged, what).await;
}

/// The operator's own namespace holds its Deployment, its cloud credentials and Helm's release
/// records: the token can neither read (by any patch) nor change anything there but its Lease.
async fn the_operators_namespace_is_out_of_reach(admin: &Client, sa: &Client, ns: &str, operator: (&str, &str)) {
    let (operator_ns, deployment) = operator;
    let deployments: Api<Deployment> = Api::namespaced(sa.clone(), operator_ns);
    let change = deployments.patch(deployment, &PatchParams::default(), &Patch::Merge(json!({}))).await;
    forbidden(change, "change the operator's own Deployment");
    forbidden(deployments.get(deployment).await, "read the operator's own Deployment");
    let value = format!("cloud-key-of-{ns}");
    let encoded = serde_json::to_value(k8s_openapi::ByteString(value.clone().into_bytes())).unwrap();
    let encoded = encoded.as_str().unwrap().to_string();
    let name = format!("operators-{ns}");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": value}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), operator_ns).create(&PostParams::default(), &secret).await.unwrap();
    let as_sa: Api<Secret> = Api::namespaced(sa.clone(), operator_ns);
    // The read a granted patch is: the value copied into the name comes back in a 400.
    let copy = json!([{"op": "copy", "from": "/data/k", "path": "/metadata/name"}]);
    let copy: json_patch::Patch = serde_json::from_value(copy).unwrap();
    let dry_run = PatchParams { dry_run: true, ..Default::default() };
    let read = as_sa.patch(&name, &dry_run, &Patch::<()>::Json(copy)).await;
    let no_op = as_sa.patch(&name, &PatchParams::default(), &Patch::Merge(json!({}))).await;
    Api::<Secret>::namespaced(admin.clone(), operator_ns).delete(&name, &DeleteParams::default()).await.unwrap();
    let answer = format!("{read:?}");
    assert!(!answer.contains(&value) && !answer.contains(&encoded), "the operator's Secret came back: {answer}");
    forbidden(read, "read a Secret of the operator's namespace through a JSON patch");
    forbidden(no_op, "read a Secret of the operator's namespace back from a no-op patch");
}

/// Sets the JSON pointer `path` in `doc`, creating objects on the way and appending to arrays.
pub(super) fn set(doc: &mut Value, path: &str, value: Value) {
    let (parent, last) = path.rsplit_once('/').unwrap();
    let mut at = doc;
    for part in parent.split('/').skip(1) {
        at = match at {
            Value::Array(items) => &mut items[part.parse::<usize>().unwrap()],
            other => other.as_object_mut().unwrap().entry(part).or_insert_with(|| json!({})),
        };
    }
    match at {
        Value::Array(items) => match last.parse::<usize>().unwrap() {
            i if i < items.len() => items[i] = value,
            _ => items.push(value),
        },
        other => {
            other.as_object_mut().unwrap().insert(last.to_string(), value);
        }
    }
}

async fn service_status_is_limited_to_skyports_class(admin: &Client, sa: &Client, ns: &str) {
    let services: Api<Service> = Api::namespaced(admin.clone(), ns);
    let ingress = json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.66"}]}}});
    for (name, class) in [("other-class", Some("example.com/other")), ("no-class", None)] {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": class, "ports": [{"port": 80}]},
        }))
        .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();
        let result = Api::<Service>::namespaced(sa.clone(), ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&ingress))
            .await;
        forbidden(result, &format!("publish an address on a Service of class {class:?}"));
    }
    // On skyport's own Services only the load balancer's part of status is skyport's.
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "ours"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": [{"port": 80}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let conditions = json!({"status": {"conditions": [{"type": "Owned", "status": "True", "reason": "Stolen",
        "message": "", "lastTransitionTime": "2020-01-01T00:00:00Z"}]}});
    forbidden(
        Api::<Service>::namespaced(sa.clone(), ns)
            .patch_status("ours", &PatchParams::default(), &Patch::Merge(&conditions))
            .await,
        "write a Service's status conditions",
    );
}

async fn specs_are_never_written(admin: &Client, sa: &Client, ns: &str) {
    let spec = json!({"spec": {"deletionPolicy": "Delete", "policy": {"Statement": [{"Effect": "Allow"}]}}});
    forbidden(
        Api::<Queue>::namespaced(sa.clone(), ns)
            .patch("escalation", &PatchParams::default(), &Patch::Merge(&spec))
            .await,
        "patch a Queue's spec",
    );
    // (A Tunnel's spec is immutable for everyone: the CRD's validation refuses before admission.)
    // Tunnels are made only for a Service, owned by it.
    let loose = json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": "loose", "labels": {MANAGED.0: MANAGED.1}}, "spec": {"serviceRef": {"name": "ours"}},
    });
    create_refused::<Tunnel>(sa, admin, ns, loose, "a Tunnel no Service owns").await;
}

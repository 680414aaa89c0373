//! A stolen token of skyport's ServiceAccount reaches nothing beyond skyport's own objects: for
//! the kustomize install (`deploy/`) and for the Helm chart at its default values (cluster-wide),
//! every rule the manifests grant the ServiceAccount is read from the rendered manifests, and
//! the known ways to read, overwrite, delete or redirect an object skyport does not own are
//! tried with a token of that ServiceAccount against the real API server, on objects of every
//! attacked kind planted in a tenant's namespace, in the operator's own and in the tunnel
//! clients' (and on the operator's own Deployment and kube-system):
//!
//! - reads: get, list and watch, in the namespace and in all;
//! - JSON patch `copy` and `move` of the value into the name, a label or an annotation (the
//!   server quotes them in its errors, before any admission policy runs), each also as a dry
//!   run; `test` as an equality oracle (a right and a wrong guess must be answered alike);
//! - merge, strategic merge and apply patches, update (PUT), of the object and its status;
//! - owner reference and finalizer injection; deletes and collection deletes, also dry runs;
//! - creates over the victim's name, and of objects that would read or redirect it (a token
//!   Secret, a tunnel client mounting another Secret or running the attacker's command).
//!
//! Judged for each: no planted marker (nor its base64) in any answer, body or error; no write
//! admitted; the victim unchanged (resourceVersion and content) and not deleted. The only
//! exceptions are in `attacks/residues.rs`, each with its reason. A granted rule no attack
//! covers (a resource without a victim kind, a verb without attacks) fails the test, so a new
//! grant comes with its attacks.

mod attempts;
mod grants;
mod install;
mod judge;
mod leases;
mod patches;
mod residues;
mod victims;
mod wire;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use skyport::controllers::tunnel::desired;
use skyport::controllers::tunnel::placement::Placement;
use skyport::crd::Tunnel;

use crate::common::{self, TestNs};
use install::Install;
use judge::Judge;
use victims::{KINDS, Victim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_stolen_token_of_the_kustomize_install_reaches_nothing_beyond_skyports_objects() {
    common::client().await;
    let install = tokio::task::spawn_blocking(install::kustomize).await.unwrap();
    attack(install).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment and helm: tests/env.sh up, SKYPORT_HELM"]
async fn a_stolen_token_of_the_helm_chart_at_its_defaults_reaches_nothing_beyond_skyports_objects() {
    common::client().await;
    let install = tokio::task::spawn_blocking(install::helm_chart).await.unwrap();
    attack(install).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment and helm: tests/env.sh up, SKYPORT_HELM"]
async fn a_stolen_token_of_the_sharded_helm_chart_reaches_nothing_beyond_skyports_objects() {
    common::client().await;
    let install = tokio::task::spawn_blocking(install::helm_chart_sharded).await.unwrap();
    attack(install).await;
}

async fn attack(install: Install) {
    let admin = common::client().await;
    let client_ns = install.client_namespace();
    let grants = grants::of(&install.docs, (&install.sa.0, &install.sa.1));
    assert!(!grants.is_empty(), "{}: no rule is bound to {:?}", install.name, install.sa);
    let mut problems = grants::uncovered(&grants, &[install.namespace(), &client_ns]);
    problems.extend(residues::stale(&grants));
    let sa = install::service_account(&admin, &install).await;
    let tenant = TestNs::new("attacks").await;
    let (victims, planted) = plant(&admin, &install, &tenant.name).await;
    let judge = Judge::new(install.name, admin.clone(), sa, grants, &victims);
    let client = tunnel_client(&judge, &install, &victims, &tenant.name).await;
    leases::controls(&judge, &install).await;

    futures::stream::iter(&victims)
        .for_each_concurrent(4, |v| {
            let (judge, client, all, client_ns) = (&judge, &client, &victims, &client_ns);
            async move {
                let owners = owners(&judge.admin, v, all).await;
                let mut attempts = attempts::reads(v);
                attempts.extend(attempts::writes(v));
                // The creates are per kind and namespace: tried beside the first victim of each.
                let first = all.iter().find(|w| w.kind.resource == v.kind.resource && w.namespace == v.namespace);
                if first.is_some_and(|f| std::ptr::eq(f, v)) {
                    let client = client.as_ref().filter(|_| v.namespace.as_ref() == Some(client_ns));
                    attempts.extend(attempts::hostile_creates(v, &owners[1].1, client));
                }
                let (patches, mut oracles) = patches::patches(v, None, &owners);
                attempts.extend(patches);
                if v.kind.status {
                    let (patches, more) = patches::patches(v, Some("status"), &owners);
                    attempts.extend(patches);
                    oracles.extend(more);
                }
                judge.attack(v, attempts, oracles).await;
            }
        })
        .await;

    for v in planted.iter().filter(|v| v.namespace.as_deref() != Some(&tenant.name)) {
        let _ = wire::Call::new(hyper::Method::DELETE, v.path(None)).send(&admin).await;
    }
    tenant.cleanup().await;
    problems.extend(judge.failures());
    problems.sort();
    assert!(
        problems.is_empty(),
        "{} attacks or grants failed against the {} install:\n{}",
        problems.len(),
        install.name,
        problems.join("\n")
    );
}

/// Every victim (and those of them planted by the test, to delete): one object of each kind in
/// the tenant's namespace, in the operator's and in the tunnel clients', a Namespace, the
/// operator's credentials Secret (when not there already), its own Deployment, and kube-system.
async fn plant(admin: &Client, install: &Install, tenant: &str) -> (Vec<Victim>, Vec<Victim>) {
    let op_ns = install.namespace();
    let client_ns = install.client_namespace();
    let mut planted = Vec::new();
    for kind in KINDS {
        if kind.namespaced {
            planted.push(victims::plant(admin, kind, Some(tenant), None).await);
            planted.push(victims::plant(admin, kind, Some(op_ns), None).await);
            planted.push(victims::plant(admin, kind, Some(&client_ns), None).await);
        } else {
            planted.push(victims::plant(admin, kind, None, None).await);
        }
    }
    // Leases under the names skyport's shard and replica Leases take, made by someone else: an
    // attack that labels them as skyport's group must not make them skyport's.
    let leases = victims::find("coordination.k8s.io", "leases").unwrap();
    for role in ["shard", "replica"] {
        let name = format!("{}-{role}-victim-{:06x}", leases::group(install), rand::random::<u32>() & 0xff_ffff);
        planted.push(victims::plant(admin, leases, Some(op_ns), Some(&name)).await);
    }
    let secrets = victims::find("", "secrets").unwrap();
    let deployments = victims::find("apps", "deployments").unwrap();
    let namespaces = victims::find("", "namespaces").unwrap();
    let credentials = install.credentials_secret();
    let mut all = planted.clone();
    let existing =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), op_ns).get_opt(&credentials).await;
    if existing.expect("read the credentials Secret").is_some() {
        all.push(victims::existing(admin, secrets, Some(op_ns), &credentials, "/metadata/name").await);
    } else {
        planted.push(victims::plant(admin, secrets, Some(op_ns), Some(&credentials)).await);
        all.push(planted.last().unwrap().clone());
    }
    let operator = install.operator["metadata"]["name"].as_str().unwrap();
    let image = "/spec/template/spec/containers/0/image";
    all.push(victims::existing(admin, deployments, Some(op_ns), operator, image).await);
    all.push(victims::existing(admin, namespaces, None, "kube-system", "/metadata/uid").await);
    (all, planted)
}

/// The owners an attacker injects into `v`: one the garbage collector finds missing (it deletes
/// `v`), and the Queue planted beside `v` (it claims `v` as a Queue's, which skyport may write).
async fn owners(admin: &Client, v: &Victim, all: &[Victim]) -> Vec<(String, Value)> {
    let missing = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "attacks-no-such-owner",
        "uid": format!("00000000-0000-4000-8000-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff), "controller": true});
    let queue = all
        .iter()
        .find(|q| q.kind.resource == "queues" && q.namespace == v.namespace && v.namespace.is_some())
        .or_else(|| all.iter().find(|q| q.kind.resource == "queues"))
        .expect("a Queue victim");
    let uid = victims::get(admin, queue).await.and_then(|q| q["metadata"]["uid"].as_str().map(str::to_string));
    let queue_owner = json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "name": queue.name,
        "uid": uid.unwrap_or_default(), "controller": true, "blockOwnerDeletion": true});
    vec![("an owner that does not exist".into(), missing), (format!("the Queue {}", queue.name), queue_owner)]
}

/// The tunnel client skyport writes for the tenant's Tunnel, in the tunnel clients' namespace:
/// the base the tunnel client attacks change one thing of. It must be admitted as it is (a dry
/// run), or those attacks would prove nothing.
async fn tunnel_client(judge: &Judge, install: &Install, all: &[Victim], tenant: &str) -> Option<Value> {
    let client_ns = install.client_namespace();
    let tunnel = all.iter().find(|v| v.kind.resource == "tunnels" && v.namespace.as_deref() == Some(tenant))?;
    let found = victims::get(&judge.admin, tunnel).await.expect("the tenant's Tunnel");
    let t: Tunnel = serde_json::from_value(found).expect("a Tunnel");
    let at = Placement::of(&t, Some(&client_ns)).expect("placement");
    let client = serde_json::to_value(desired::deployment(&t, &at, &install.client_image(), "0").unwrap()).unwrap();
    let control = wire::Call::new(hyper::Method::POST, wire::collection("apps", "v1", "deployments", Some(&client_ns)))
        .with(wire::JSON, client.clone())
        .query(attempts::DRY_RUN);
    let answer = control.send(&judge.sa).await;
    if !answer.admitted() {
        judge.fail(
            "control",
            "skyport's own tunnel client (dry run)",
            format!("refused, so the client attacks prove nothing: {}", answer.brief()),
        );
    }
    Some(client)
}

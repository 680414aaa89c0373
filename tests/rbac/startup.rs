//! The operator proves at start that the admission policies cover its identity: the real binary
//! runs with a ServiceAccount token, once as the installed `skyport-system/skyport` (covered by
//! deploy/admission.yaml) and once as a `skyport` ServiceAccount of another namespace with the
//! same RBAC, as a kustomize overlay that moved the namespace but not the policies would run it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Client;
use kube::api::PostParams;
use serde_json::json;
use tokio::process::Child;

use crate::common::process::{Lines, spawn_operator};
use crate::common::{TestNs, service_account_token};

/// A kubeconfig file like the test environment's, authenticating with `token`.
async fn kubeconfig_with(token: &str, path: &std::path::Path) {
    let mut config = kube::config::Kubeconfig::read().expect("the test environment's kubeconfig");
    for user in &mut config.auth_infos {
        user.auth_info = Some(serde_json::from_value(json!({"token": token})).unwrap());
    }
    std::fs::write(path, serde_json::to_string(&config).unwrap()).unwrap();
}

/// `skyport run` as `namespace/name`, watching `watch`, its clients in `namespace`.
async fn operator_as(admin: &Client, (namespace, name): (&str, &str), watch: &str, extra: &[&str]) -> (Child, Lines) {
    let token = service_account_token(admin, namespace, name).await;
    let path = std::env::temp_dir().join(format!("skyport-startup-{namespace}-{}.kubeconfig", rand::random::<u32>()));
    kubeconfig_with(&token, &path).await;
    let lines: Lines = Arc::new(Mutex::new(Vec::new()));
    let clients = format!("--tunnel-client-namespace={namespace}");
    // A RoleBinding of the ClusterRole does not reach kube-system's UID.
    let mut args = vec!["--leader-elect=false", "--listen-address", "127.0.0.1:0", "--namespace", watch];
    args.extend([clients.as_str(), "--cluster-id=startup-test"]);
    args.extend(extra);
    let kubeconfig = path.to_string_lossy();
    // The probe itself is under test: the admin's opt-out of spawn_operator is switched off.
    let env =
        [("KUBECONFIG", &*kubeconfig), ("RUST_LOG", "info"), ("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "false")];
    let child = spawn_operator(&args, &env, &lines);
    (child, lines)
}

/// Waits until `child` logs that it is ready; fails if it exits first.
async fn until_ready(child: &mut Child, lines: &Lines, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !said(lines, "caches synced; ready") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("exited ({status}) instead of starting {what}: {:#?}", lines.lock().unwrap());
        }
        assert!(tokio::time::Instant::now() < deadline, "not ready {what}: {:#?}", lines.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn said(lines: &Lines, text: &str) -> bool {
    lines.lock().unwrap().iter().any(|l| l.contains(text))
}

/// Running, and ready, as the installed ServiceAccount; refused, with the fix named, as one
/// the policies do not name; running again with the unsafe flag.
pub async fn the_operator_starts_only_under_the_policies(admin: &Client, installed: (&str, &str)) {
    let watched = TestNs::new("startup").await;
    let (mut covered, lines) = operator_as(admin, installed, &watched.name, &[]).await;
    until_ready(&mut covered, &lines, "under the policies").await;
    assert!(said(&lines, "the admission policies cover this operator's identity"));
    covered.kill().await.unwrap();

    // The same RBAC for a ServiceAccount of another namespace: what an overlay would install.
    let moved = TestNs::new("startup-moved").await;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "skyport"}})).unwrap();
    moved.api::<ServiceAccount>().create(&PostParams::default(), &sa).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "skyport"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "skyport"},
        "subjects": [{"kind": "ServiceAccount", "name": "skyport", "namespace": moved.name}],
    }))
    .unwrap();
    moved.api::<RoleBinding>().create(&PostParams::default(), &binding).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "skyport-watched"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "skyport"},
        "subjects": [{"kind": "ServiceAccount", "name": "skyport", "namespace": moved.name}],
    }))
    .unwrap();
    watched.api::<RoleBinding>().create(&PostParams::default(), &binding).await.unwrap();
    let (mut uncovered, lines) = operator_as(admin, (&moved.name, "skyport"), &watched.name, &[]).await;
    let status = tokio::time::timeout(Duration::from_secs(60), uncovered.wait())
        .await
        .unwrap_or_else(|_| panic!("still running without covering policies: {:#?}", lines.lock().unwrap()))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let output = lines.lock().unwrap().join("\n");
    assert!(!status.success(), "exited successfully:\n{output}");
    let identity = format!("system:serviceaccount:{}:skyport", moved.name);
    for text in ["no ValidatingAdmissionPolicy covers", identity.as_str(), "--allow-without-admission-policies"] {
        assert!(output.contains(text), "the refusal does not say {text:?}:\n{output}");
    }
    assert!(!said(&lines, "caches synced"), "it acted before refusing:\n{output}");

    let (mut allowed, lines) =
        operator_as(admin, (&moved.name, "skyport"), &watched.name, &["--allow-without-admission-policies"]).await;
    until_ready(&mut allowed, &lines, "with the unsafe flag").await;
    assert!(said(&lines, "starting without admission policies"));
    allowed.kill().await.unwrap();
    moved.cleanup().await;
    watched.cleanup().await;
}

/// The operator runs only when the admission policies cover its identity (or with the unsafe
/// flag), as the installed ServiceAccount and as one the policies do not name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_operator_refuses_to_start_when_no_admission_policy_covers_it() {
    use super::install::{INSTALL_NS, install_deploy_once, service_account_client};
    let admin = crate::common::client().await;
    install_deploy_once().await;
    service_account_client(&admin).await;
    the_operator_starts_only_under_the_policies(&admin, (INSTALL_NS, "skyport")).await;
}

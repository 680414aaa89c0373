//! Installing what is tested: `deploy/` with kustomize, the chart with `helm template`, and
//! clients holding a ServiceAccount's token.

use std::process::Command;

use kube::Client;
use serde_json::json;

use crate::common::service_account_token;

pub const INSTALL_NS: &str = "skyport-system";
/// The installed tunnel clients' namespace (deploy/namespace.yaml, `--tunnel-client-namespace`).
pub const CLIENT_NS: &str = "skyport-tunnels";

/// `kubectl apply -k deploy/` against the test API server.
fn install_deploy() {
    let out = Command::new("kubectl")
        .args(["apply", "-k", "deploy/"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kubectl (is the test environment's PATH set?)");
    assert!(out.status.success(), "kubectl apply -k deploy/ failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// [`install_deploy`] once per test process: the tests run in parallel, and two concurrent
/// `kubectl apply` of a fresh install race on creating the same objects.
pub async fn install_deploy_once() {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED.get_or_init(|| async { tokio::task::spawn_blocking(install_deploy).await.unwrap() }).await;
}

/// A client authenticated as the deploy ServiceAccount, with a short-lived bound token, once the
/// installed admission policy is in effect for it.
pub async fn service_account_client(admin: &Client) -> Client {
    let sa = token_client(admin, INSTALL_NS, "skyport").await;
    until_the_policy_applies(&sa, INSTALL_NS).await;
    sa
}

/// Waits until the API server enforces the admission policy just applied (it picks policies up
/// from a watch, a moment after the apply): a labelled ConfigMap no Queue owns is refused to
/// `sa` in `ns` (a dry run, nothing is stored).
pub async fn until_the_policy_applies(sa: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    let probe: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "policy-probe", "labels": {"app.kubernetes.io/managed-by": "skyport"}}}),
    )
    .unwrap();
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let api: Api<ConfigMap> = Api::namespaced(sa.clone(), ns);
    crate::common::eventually("the admission policy in effect", std::time::Duration::from_secs(30), || async {
        match api.create(&dry_run, &probe).await {
            Err(kube::Error::Api(e)) if e.code == 403 => Some(()),
            _ => None,
        }
    })
    .await;
}

/// A client authenticated as the ServiceAccount `namespace/name`, with a short-lived bound token.
pub async fn token_client(admin: &Client, namespace: &str, name: &str) -> Client {
    let token = service_account_token(admin, namespace, name).await;
    let mut config = kube::Config::infer().await.expect("kubeconfig");
    config.auth_info = serde_json::from_value(json!({ "token": token })).expect("auth info");
    Client::try_from(config).expect("client")
}

/// `helm template` of the chart (no CRDs: the tests install them from crds/).
pub fn helm_render(args: &[&str]) -> String {
    let helm = std::env::var("SKYPORT_HELM").unwrap_or_else(|_| {
        let out = Command::new("tests/env/build-helm.sh").current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    });
    let out = Command::new(helm)
        .args(["template", "skyport-ns", "deploy/helm/skyport"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run helm");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl apply` of rendered manifests (every namespaced object names its namespace).
pub fn kubectl_apply(manifests: &str) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child.stdin.take().unwrap().write_all(manifests.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
}

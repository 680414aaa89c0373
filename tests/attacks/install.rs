//! The installs attacked: `deploy/` with kustomize, and the Helm chart at its default values
//! (cluster-wide) as a release of its own name and namespace, both applied to the test API
//! server; what each renders is also where the attacked rules are read from.

use std::time::Duration;

use hyper::Method;
use kube::Client;
use serde_json::{Value, json};

use super::wire::{Call, JSON};
use crate::deploy::harness::{documents, helm, run};

/// One rendered and applied install: its objects, its ServiceAccount, its operator Deployment.
pub struct Install {
    pub name: &'static str,
    pub docs: Vec<Value>,
    /// The ServiceAccount the operator runs as: (namespace, name). Its namespace is the
    /// operator's.
    pub sa: (String, String),
    pub operator: Value,
}

impl Install {
    fn from(name: &'static str, rendered: &str) -> Install {
        let docs = documents(rendered);
        let one = |kind: &str| {
            let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
            assert_eq!(found.len(), 1, "{name}: one {kind} in the manifests");
            found[0].clone()
        };
        let sa = one("ServiceAccount");
        let sa = (
            sa["metadata"]["namespace"].as_str().unwrap().to_string(),
            sa["metadata"]["name"].as_str().unwrap().to_string(),
        );
        let operator = one("Deployment");
        Install { name, docs, sa, operator }
    }

    pub fn namespace(&self) -> &str {
        &self.sa.0
    }

    /// Where the operator runs its tunnel clients (`--tunnel-client-namespace`).
    pub fn client_namespace(&self) -> String {
        let args = self.operator["spec"]["template"]["spec"]["containers"][0]["args"].as_array();
        let arg = args.into_iter().flatten().filter_map(Value::as_str);
        let found = arg.clone().find_map(|a| a.strip_prefix("--tunnel-client-namespace="));
        found.expect("the operator's --tunnel-client-namespace").to_string()
    }

    /// The image the operator runs its tunnel clients with.
    pub fn client_image(&self) -> String {
        let container = &self.operator["spec"]["template"]["spec"]["containers"][0];
        let env = container["env"].as_array().into_iter().flatten();
        env.clone()
            .find(|e| e["name"] == "SKYPORT_TUNNEL_CLIENT_IMAGE")
            .and_then(|e| e["value"].as_str())
            .or(container["image"].as_str())
            .expect("the operator's image")
            .to_string()
    }

    /// The Secret whose keys the operator reads as its cloud credentials (envFrom).
    pub fn credentials_secret(&self) -> String {
        let container = &self.operator["spec"]["template"]["spec"]["containers"][0];
        container["envFrom"][0]["secretRef"]["name"].as_str().expect("the operator's credentials Secret").to_string()
    }
}

/// `kubectl kustomize deploy/`, applied.
pub fn kustomize() -> Install {
    let rendered = run("kubectl", &["kustomize", "deploy/"], None);
    apply(&rendered);
    Install::from("kustomize deploy/", &rendered)
}

pub const HELM_RELEASE: &str = "skyport-attacks";
pub const HELM_RELEASE_SHARDED: &str = "skyport-attacks-sharded";

/// `helm template` of the chart with its default values, in a namespace of its own, applied;
/// its tunnel clients' namespace too, named after the release (the default is the kustomize
/// install's, attacked at the same time).
pub fn helm_chart() -> Install {
    helm_release(HELM_RELEASE, &[], "helm chart (default values)")
}

/// The same with several active replicas (`sharding.enabled`): its Role writes and lists the
/// Leases of its namespace.
pub fn helm_chart_sharded() -> Install {
    helm_release(HELM_RELEASE_SHARDED, &["sharding.enabled=true"], "helm chart (sharding.enabled)")
}

fn helm_release(release: &str, sets: &[&str], name: &'static str) -> Install {
    let clients = format!("tunnel.clientNamespace={release}-tunnels");
    let mut args = vec!["template", release, "deploy/helm/skyport", "--namespace", release, "--set", &clients];
    sets.iter().for_each(|s| args.extend(["--set", s]));
    let rendered = run(&helm(), &args, None);
    let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {release}\n---\n");
    apply(&format!("{namespace}{rendered}"));
    Install::from(name, &rendered)
}

/// `kubectl apply`, retried: another test applying the same install at the same moment makes one
/// of two creates fail with AlreadyExists.
fn apply(manifests: &str) {
    for attempt in 1.. {
        let out = std::process::Command::new("kubectl")
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(manifests.as_bytes())?;
                child.wait_with_output()
            })
            .expect("kubectl");
        if out.status.success() {
            return;
        }
        assert!(attempt < 3, "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// A client with a fresh token of the install's ServiceAccount, once the install's admission
/// policy is in effect for it: a labelled ConfigMap no Queue owns is refused (a dry run).
pub async fn service_account(admin: &Client, install: &Install) -> Client {
    let (ns, name) = &install.sa;
    let token = crate::common::service_account_token(admin, ns, name).await;
    let mut config = kube::Config::infer().await.expect("kubeconfig");
    config.auth_info = serde_json::from_value(json!({ "token": token })).expect("auth info");
    let sa = Client::try_from(config).expect("client");
    let probe = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "policy-probe", "labels": {"app.kubernetes.io/managed-by": "skyport"}}});
    let call = Call::new(Method::POST, format!("/api/v1/namespaces/{ns}/configmaps?dryRun=All")).with(JSON, probe);
    crate::common::eventually("the admission policy in effect", Duration::from_secs(30), || async {
        (call.send(&sa).await.status == 403).then_some(())
    })
    .await;
    sa
}

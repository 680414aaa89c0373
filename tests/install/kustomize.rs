//! `kubectl apply -k` on the test node, as deploy/README.md tells users to install: an overlay
//! that sets the image with kustomize's `images:` and generates the `skyport-aws` Secret (region,
//! LocalStack's endpoint, credentials), deploy/ itself unchanged. The operator Pod becomes Ready and runs
//! hardened, a Queue goes Ready, and after the README's uninstall (Queues first, then
//! `kubectl delete -k`) nothing of the install is left: not the namespace, the CRDs, the
//! cluster-wide RBAC and admission policies, nor the SQS queue.

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use skyport::crd::Queue;

use super::{NS, ONE_INSTALL_AT_A_TIME, TIMEOUT, node};
use crate::common::{self, eventually};
use crate::deploy::harness::root;

pub const APP_NS: &str = "kustomize-app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment's node: tests/env.sh up"]
async fn kubectl_apply_k_runs_the_operator_from_an_overlay_and_delete_k_leaves_nothing() {
    let Some(node) = node::node().await else { return };
    let _turn = ONE_INSTALL_AT_A_TIME.lock().await;
    let (repository, tag) = node.import_skyport_image();
    super::remove_earlier_installs(&node);

    let overlay = overlay(&repository, &tag, &node.aws_endpoint);
    let overlay = overlay.to_string_lossy();
    node.kubectl(&["apply", "-k", &overlay], None);
    node.kubectl(&["-n", NS, "rollout", "status", "deployment/skyport", "--timeout=4m"], None);

    let pods: Api<Pod> = Api::namespaced(node.client.clone(), NS);
    let operator = super::ready_pods(&pods, 1).await.remove(0);
    let image = operator.spec.as_ref().map(|s| s.containers[0].image.clone().unwrap_or_default());
    assert_eq!(image, Some(format!("{repository}:{tag}")), "the overlay's image runs");
    super::hardened(&node, &operator, "skyport", super::MEMORY_LIMIT);
    assert_eq!(
        tunnel_client_image(&operator),
        format!("{repository}:{tag}"),
        "the overlay's image also runs the tunnel clients, so they are the operator's version"
    );

    node.kubectl(&["create", "namespace", APP_NS], None);
    let queues: Api<Queue> = Api::namespaced(node.client.clone(), APP_NS);
    let sqs = common::sqs().await;
    super::create_ready_queue(&queues, &sqs, APP_NS, "orders").await;

    // deploy/README.md's uninstall: Queues while the operator runs, then everything else.
    queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await.expect("delete Queues");
    common::wait_gone(&queues, "orders", TIMEOUT).await;
    let gone = super::sqs_name(APP_NS, "orders");
    eventually(&format!("SQS queue {gone} deleted"), TIMEOUT, || async {
        (!common::queue_exists(&sqs, &gone).await).then_some(())
    })
    .await;
    node.kubectl(&["delete", "-k", &overlay, "--wait=true", "--timeout=3m"], None);

    let namespaces = node.kubectl(&["get", "namespaces", "-o", "name"], None);
    assert!(!namespaces.lines().any(|n| n == format!("namespace/{NS}")), "namespace {NS} left: {namespaces}");
    let cluster = node.kubectl(
        &[
            "get",
            "customresourcedefinitions,clusterroles,clusterrolebindings,\
             validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-o",
            "name",
        ],
        None,
    );
    let left: Vec<&str> = cluster.lines().filter(|l| l.contains("skyport")).collect();
    assert!(left.is_empty(), "cluster-scoped objects left behind after kubectl delete -k: {left:?}");
    node.kubectl(&["delete", "namespace", APP_NS, "--wait=false"], None);
}

/// The image the operator gives tunnel clients, by clap's rule: the flag, else its environment
/// variable, else the built-in default.
fn tunnel_client_image(pod: &Pod) -> String {
    let container = &pod.spec.as_ref().expect("Pod spec").containers[0];
    let flag = container.args.iter().flatten().find_map(|a| a.strip_prefix("--tunnel-client-image="));
    let env = container.env.iter().flatten().find(|e| e.name == "SKYPORT_TUNNEL_CLIENT_IMAGE");
    let env = env.and_then(|e| e.value.as_deref());
    flag.or(env).unwrap_or(skyport::config::OWN_IMAGE).to_string()
}

/// A kustomization over deploy/ in a fresh directory: the image and the AWS Secret only.
fn overlay(repository: &str, tag: &str, aws_endpoint: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("skyport-install-overlay");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("overlay directory");
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} of tests/env.sh"));
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
images:
  - name: ghcr.io/skyport-dev/skyport
    newName: {repository}
    newTag: {tag}
secretGenerator:
  - name: skyport-aws
    namespace: {NS}
    literals:
      - AWS_REGION=us-east-1
      - AWS_ENDPOINT_URL_SQS={aws_endpoint}
      - AWS_ACCESS_KEY_ID={key}
      - AWS_SECRET_ACCESS_KEY={secret}
generatorOptions:
  disableNameSuffixHash: true
",
        base = relative(&dir, &root().join("deploy")),
        key = var("AWS_ACCESS_KEY_ID"),
        secret = var("AWS_SECRET_ACCESS_KEY"),
    );
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("write the overlay");
    dir
}

/// `to` as seen from `from` (both absolute): kustomize refuses absolute paths to a base.
fn relative(from: &Path, to: &Path) -> String {
    let up = from.components().filter(|c| matches!(c, Component::Normal(_))).count();
    let down = to.strip_prefix("/").expect("an absolute path");
    format!("{}{}", "../".repeat(up), down.display())
}

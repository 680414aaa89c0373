//! `kubectl apply -k` on the test node, as docs/install.md tells users to install: an overlay
//! that sets the image with kustomize's `images:` (and, by its `replacements:`, in the admission
//! policy), generates the `skyport-aws` Secret (region, LocalStack's endpoint, credentials) and
//! selects the local exit-server provider, deploy/ itself unchanged. The operator Pod becomes Ready and runs hardened, a Queue goes Ready, a
//! LoadBalancer Service carries HTTP through a tunnel client Pod of the overlay's image, an
//! ExitServerPool serves two namespaces from one exit server and refuses a third (tests/install/pool.rs), and
//! after the README's uninstall (Services and Queues first, then `kubectl delete -k`) nothing of
//! the install is left: not the namespace, the CRDs, the cluster-wide RBAC and admission
//! policies, nor the SQS queue.

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use skyport::crd::Queue;

use super::{CLIENT_NS, NS, TIMEOUT, node, tunnel};
use crate::common::{self, eventually};
use crate::deploy::harness::root;

pub const APP_NS: &str = "kustomize-app";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment's node: tests/env.sh up"]
async fn kubectl_apply_k_runs_the_operator_from_an_overlay_and_delete_k_leaves_nothing() {
    let Some(node) = node::node().await else { return };
    let _turn = node::NODE_CLUSTER.write().await;
    let (repository, tag) = node.import_skyport_image();
    super::remove_earlier_installs(&node);

    let overlay = overlay(&repository, &tag, &node.aws_endpoint, &node.exit_addresses);
    let overlay = overlay.to_string_lossy();
    node.kubectl(&["apply", "-k", &overlay], None);
    node.kubectl(&["-n", NS, "rollout", "status", "deployment/skyport", "--timeout=4m"], None);

    let pods: Api<Pod> = Api::namespaced(node.client.clone(), NS);
    let operator = super::ready_pods(&pods, 1).await.remove(0);
    let image = operator.spec.as_ref().map(|s| s.containers[0].image.clone().unwrap_or_default());
    assert_eq!(image, Some(format!("{repository}:{tag}")), "the overlay's image runs");
    super::hardened(&node, &operator, "skyport", super::MEMORY_LIMIT);

    node.kubectl(&["create", "namespace", APP_NS], None);
    let queues: Api<Queue> = Api::namespaced(node.client.clone(), APP_NS);
    let sqs = common::sqs().await;
    super::create_ready_queue(&queues, &sqs, APP_NS, "orders").await;

    // A LoadBalancer Service: the client Pod runs the overlay's image too (the admission policy
    // admits exactly the image the operator hands its clients), so bytes flow.
    let address = tunnel::web_through_a_tunnel(&node, APP_NS, CLIENT_NS).await;
    let client_pods: Api<Pod> = Api::namespaced(node.client.clone(), CLIENT_NS);
    let client = client_pods.get(&tunnel::client_pod(&node, CLIENT_NS).await).await.expect("client Pod");
    let image = client.spec.as_ref().map(|s| s.containers[0].image.clone().unwrap_or_default());
    assert_eq!(image, Some(format!("{repository}:{tag}")), "the tunnel client runs the overlay's image");
    super::hardened(&node, &client, "tunnel-client", super::CLIENT_MEMORY_LIMIT);
    node.kubectl(&["-n", APP_NS, "delete", "service", "web"], None);
    eventually("the exit server gone", TIMEOUT, || async { tunnel::get(&address).await.is_none().then_some(()) }).await;
    eventually("the tunnel client Pod gone", TIMEOUT, || async {
        let clients = ListParams::default().labels("app.kubernetes.io/name=skyport-tunnel-client");
        client_pods.list(&clients).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    super::pool::shared_across_namespaces(&node).await;

    // docs/uninstall.md: Services and Queues while the operator runs, then the rest.
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
    super::client_namespace_gone(&node, "kubectl delete -k");
    node.kubectl(&["delete", "namespace", APP_NS, "--wait=false"], None);
}

/// A kustomization over deploy/ in a fresh directory: the image, the AWS Secret, and the local
/// exit-server provider as the chart's `tunnel.provider: local` renders it (on the node's
/// network, for tunnel client Pods to reach its servers, which the namespace's Pod Security
/// level must then allow; state in an emptyDir, the root is read-only).
fn overlay(repository: &str, tag: &str, aws_endpoint: &str, exit_addresses: &str) -> PathBuf {
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
# docs/install.md's overlay: the admission policy admits tunnel clients of this image only.
replacements:
  - source: {{kind: Deployment, name: skyport, fieldPath: 'spec.template.spec.containers.[name=skyport].image'}}
    targets:
      - select: {{kind: ValidatingAdmissionPolicy, name: skyport-writes-only-its-own-objects}}
        fieldPaths: ['spec.variables.[name=clientImage].expression']
        options: {{delimiter: \"'\", index: 1}}
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
patches:
  # The base's namespace enforces the restricted Pod Security Standard, which forbids the
  # node's network.
  - target: {{kind: Namespace, name: {NS}}}
    patch: |
      - {{op: replace, path: /metadata/labels/pod-security.kubernetes.io~1enforce, value: privileged}}
  - target: {{kind: Deployment, name: skyport}}
    patch: |
      # The local provider's exit servers live on the operator's node and network: one replica
      # (two would share the node's ports).
      - {{op: replace, path: /spec/replicas, value: 1}}
      - {{op: add, path: /spec/template/spec/hostNetwork, value: true}}
      - {{op: add, path: /spec/template/spec/dnsPolicy, value: ClusterFirstWithHostNet}}
      # On the node's network 8080 is a port the tunnel tests' exit servers publish.
      - {{op: test, path: /spec/template/spec/containers/0/args/2, value: --listen-address=0.0.0.0:8080}}
      - {{op: replace, path: /spec/template/spec/containers/0/args/2, value: --listen-address=0.0.0.0:{http_port}}}
      - {{op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: {http_port}}}
      - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --provider=local}}
      - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --local-state-dir=/var/run/skyport-local-hosts}}
      - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --local-addresses={exit_addresses}}}
      - {{op: add, path: /spec/template/spec/volumes, value: [{{name: local-hosts, emptyDir: {{}}}}]}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts
        value: [{{name: local-hosts, mountPath: /var/run/skyport-local-hosts}}]
",
        base = relative(&dir, &root().join("deploy")),
        http_port = super::HOST_NETWORK_HTTP_PORT,
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

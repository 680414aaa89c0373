//! Installing skyport as users do: `helm install` of deploy/helm/skyport, unchanged but for the
//! image values, on the real node of `tests/env.sh up` (kubelet, containerd, kube-proxy; see
//! tests/env/node.sh), from skyport's own image (tests/env/build-image.sh). What a user would
//! check: the operator Pods become Ready through their probes, run hardened (as the kernel sees
//! the process: user, capabilities, read-only root, memory limit), elect one leader that a
//! standby replaces when it is killed, serve metrics on the Pod and through the Service, make a
//! Queue Ready, and `helm uninstall` leaves nothing of the release behind.
//!
//! tests/install/kustomize.rs does the same with `kubectl apply -k`.
//!
//! Without the node the test fails with the reason `tests/env.sh up` recorded; `SKYPORT_NODE=0`
//! skips it and says so.

use crate::common;
use crate::node;

mod kustomize;
mod pool;
mod tunnel;

use std::time::Duration;

use crate::deploy::harness::helm;
use common::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue};

const NS: &str = "skyport-system";
/// The tunnel clients' namespace of both installs (chart value tunnel.clientNamespace).
const CLIENT_NS: &str = "skyport-tunnels";
const APP_NS: &str = "install-app";
const SELECTOR: &str = "app.kubernetes.io/name=skyport,app.kubernetes.io/instance=skyport";
/// Pod start on a busy 2-core machine, and the chart's lease duration (15 s) plus a second.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The chart's memory limit for the operator, and the one skyport gives its tunnel clients.
const MEMORY_LIMIT: u64 = 256 * 1024 * 1024;
const CLIENT_MEMORY_LIMIT: u64 = 128 * 1024 * 1024;
/// The operator's health and metrics port when it runs on the node's network (the local
/// provider): not 8080, which Services of the tunnel tests publish on the same host.
pub const HOST_NETWORK_HTTP_PORT: u16 = 18381;
/// The Tunnel install's `tunnel.maxHostsPerHour`: one exit server before the operator's container
/// restarts, one after, none for a third Service.
const PER_HOUR: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment's node: tests/env.sh up"]
async fn helm_install_on_the_node_runs_the_operator_as_users_get_it_and_uninstalls_cleanly() {
    let Some(node) = node::node().await else { return };
    let _turn = node::NODE_CLUSTER.write().await;
    let (repository, tag) = node.import_skyport_image();
    remove_earlier_installs(&node);

    // The credentials Secret the chart's default values name (aws.credentialsSecret).
    node.kubectl(&["create", "namespace", NS], None);
    let key = std::env::var("AWS_ACCESS_KEY_ID").expect("AWS_ACCESS_KEY_ID of tests/env.sh");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").expect("AWS_SECRET_ACCESS_KEY of tests/env.sh");
    node.kubectl(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "skyport-aws",
            &format!("--from-literal=AWS_ACCESS_KEY_ID={key}"),
            &format!("--from-literal=AWS_SECRET_ACCESS_KEY={secret}"),
        ],
        None,
    );
    node.helm(&[
        "install",
        "skyport",
        "deploy/helm/skyport",
        "--namespace",
        NS,
        "--set",
        &format!("image.repository={repository}"),
        "--set",
        &format!("image.tag={tag}"),
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "replicaCount=2",
        "--set",
        "aws.region=us-east-1",
        "--set",
        &format!("aws.sqsEndpointUrl={}", node.aws_endpoint),
        "--wait",
        "--timeout",
        "4m",
    ]);

    let pods: Api<Pod> = Api::namespaced(node.client.clone(), NS);
    let operators = ready_pods(&pods, 2).await;
    for pod in &operators {
        hardened(&node, pod, "skyport", MEMORY_LIMIT);
    }

    // One leader: its Lease names it, and its /metrics says so; the other stands by.
    let leases: Api<Lease> = Api::namespaced(node.client.clone(), NS);
    let leader = eventually("a Lease holder among the Pods", TIMEOUT, || async {
        let holder = holder(&leases).await?;
        operators.iter().find(|p| holder.starts_with(&format!("{}_", name(p)))).map(name)
    })
    .await;
    for pod in &operators {
        let metrics = scrape(&format!("{}:8080", pod_ip(pod))).await;
        let expected = if name(pod) == leader { "skyport_leader 1" } else { "skyport_leader 0" };
        assert!(metrics.contains(expected), "{} /metrics lacks `{expected}`:\n{metrics}", name(pod));
    }
    // And through the metrics Service's cluster IP, which only kube-proxy's rules lead to a Pod.
    let service =
        node.kubectl(&["-n", NS, "get", "service", "skyport-metrics", "-o", "jsonpath={.spec.clusterIP}"], None);
    // kube-proxy programs a new Service's rules shortly after its endpoints appear (its sync
    // period), and until then refuses connections; after a Service of the same name was just
    // removed (the kustomize install) that moment is visible.
    let service = format!("{service}:8080");
    eventually("kube-proxy forwarding to skyport-metrics", TIMEOUT, || async {
        tokio::net::TcpStream::connect(&service).await.ok().map(drop)
    })
    .await;
    assert!(scrape(&service).await.contains("skyport_build_info"));

    // A Queue goes Ready: the leader reached SQS (LocalStack) from its Pod.
    node.kubectl(&["create", "namespace", APP_NS], None);
    let queues: Api<Queue> = Api::namespaced(node.client.clone(), APP_NS);
    let sqs = common::sqs().await;
    create_ready_queue(&queues, &sqs, APP_NS, "orders").await;

    // Kill the leader's process, as a crash would: once the Lease expires a live replica holds it
    // (the standby, or the killed container the kubelet restarted, whichever locks it first).
    let old = holder(&leases).await.expect("a holder");
    let pid = node.container_pid(&leader, "skyport");
    let killed = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill");
    assert!(killed.success());
    let new = eventually("another identity holds the Lease", TIMEOUT, || async {
        holder(&leases).await.filter(|h| *h != old)
    })
    .await;
    eventually("the killed container restarted and Ready", TIMEOUT, || async {
        let pod = pods.get(&leader).await.ok()?;
        (is_ready(&pod) && restarts(&pod) == 1).then_some(())
    })
    .await;
    hardened(&node, &pods.get(&leader).await.expect("Pod"), "skyport", MEMORY_LIMIT);

    // Delete the leader's Pod, as a drain or rollout would: it releases the Lease on SIGTERM and
    // another Pod takes over (the standby when it next looks, up to a lease duration later, or the
    // Deployment's replacement Pod if that starts first); no Pod of the deleted one holds it.
    let leader = operators.iter().map(name).find(|n| new.starts_with(&format!("{n}_"))).expect("holder is a Pod");
    pods.delete(&leader, &DeleteParams::default()).await.expect("delete the leader's Pod");
    eventually("another Pod holds the Lease", TIMEOUT, || async {
        holder(&leases).await.filter(|h| !h.starts_with(&format!("{leader}_")))
    })
    .await;
    ready_pods(&pods, 2).await;
    create_ready_queue(&queues, &sqs, APP_NS, "after-failover").await;

    // Tunnels with the local provider: its exit servers run in the operator's container, which
    // then takes the node's network (tunnel.local), so one replica; and a port of its own for
    // health and metrics, since on the node's network 8080 is one the other tests' exit servers
    // publish.
    node.helm(&[
        "upgrade",
        "skyport",
        "deploy/helm/skyport",
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        &format!("httpPort={HOST_NETWORK_HTTP_PORT}"),
        "--set",
        "replicaCount=1",
        "--set",
        "tunnel.provider=local",
        "--set",
        &format!("tunnel.maxHostsPerHour={PER_HOUR}"),
        "--set",
        &format!("tunnel.local.addresses={}", node.exit_addresses),
        "--wait",
        "--timeout",
        "4m",
    ]);
    let operator = ready_pods(&pods, 1).await.remove(0);
    hardened(&node, &operator, "skyport", MEMORY_LIMIT);
    // One of the hour's PER_HOUR exit servers bought before a thief ends the process.
    tunnel::one_server_bought(&node, APP_NS, "first").await;
    lease_stolen_and_container_restarted(&leases, &pods, &name(&operator)).await;
    let address = tunnel::web_through_a_tunnel(&node, APP_NS, CLIENT_NS).await;
    // The restarted container resumed the hour from its record (--tunnel-creations-file on the
    // chart's emptyDir), so `web` took the last of it: a third Service's Tunnel waits.
    tunnel::budget_spent(&node, APP_NS, "third", &format!("--tunnel-max-hosts-per-hour {PER_HOUR}")).await;
    // The client runs in the tunnel clients' namespace; the tenant's holds only its own Pods.
    let client_pods: Api<Pod> = Api::namespaced(node.client.clone(), CLIENT_NS);
    let client = client_pods.get(&tunnel::client_pod(&node, CLIENT_NS).await).await.expect("client Pod");
    hardened(&node, &client, "tunnel-client", CLIENT_MEMORY_LIMIT);
    let app_pods: Api<Pod> = Api::namespaced(node.client.clone(), APP_NS);
    let clients = ListParams::default().labels("app.kubernetes.io/name=skyport-tunnel-client");
    assert!(app_pods.list(&clients).await.unwrap().items.is_empty(), "a tunnel client in {APP_NS}");

    // Uninstall as docs/uninstall.md says: LoadBalancer Services and Queues first, while the
    // operator runs; the exit server goes with the Service.
    node.kubectl(&["-n", APP_NS, "delete", "service", "web", "third"], None);
    eventually("the exit server gone", TIMEOUT, || async { tunnel::get(&address).await.is_none().then_some(()) }).await;
    eventually("the tunnel client Pod gone", TIMEOUT, || async {
        client_pods.list(&clients).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    queues.delete_collection(&DeleteParams::default(), &ListParams::default()).await.expect("delete Queues");
    for name in ["orders", "after-failover"] {
        common::wait_gone(&queues, name, TIMEOUT).await;
        let gone = sqs_name(APP_NS, name);
        eventually(&format!("SQS queue {gone} deleted"), TIMEOUT, || async {
            (!common::queue_exists(&sqs, &gone).await).then_some(())
        })
        .await;
    }
    node.helm(&["uninstall", "skyport", "--namespace", NS, "--wait", "--timeout", "2m"]);
    eventually("no operator Pods", TIMEOUT, || async {
        pods.list(&ListParams::default().labels(SELECTOR)).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    nothing_of_the_release_left(&node);
    node.kubectl(&["delete", "-f", "deploy/helm/skyport/crds/"], None);
    node.kubectl(&["delete", "namespace", APP_NS, NS, "--wait=false"], None);
}

/// Takes the leader Lease, as anyone holding skyport's token can (it may patch that Lease): the
/// holder finds it lost at its next renewal and exits, and the kubelet restarts its container in
/// the same Pod.
async fn lease_stolen_and_container_restarted(leases: &Api<Lease>, pods: &Api<Pod>, pod: &str) {
    let before = restarts(&pods.get(pod).await.expect("the operator Pod"));
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let stolen = json!({"spec": {"holderIdentity": "thief", "renewTime": now, "leaseDurationSeconds": 15}});
    leases.patch("skyport", &PatchParams::default(), &Patch::Merge(&stolen)).await.expect("take the Lease");
    eventually("the operator's container restarted after losing its Lease, and Ready", TIMEOUT, || async {
        let pod = pods.get(pod).await.ok()?;
        (is_ready(&pod) && restarts(&pod) > before).then_some(())
    })
    .await;
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get("skyport").await.ok()?.spec?.holder_identity
}

/// The name SQS gets for a Queue without spec.queueName: `<namespace>_<name>`.
fn sqs_name(ns: &str, queue: &str) -> String {
    format!("{ns}_{queue}")
}

async fn create_ready_queue(queues: &Api<Queue>, sqs: &aws_sdk_sqs::Client, ns: &str, name: &str) {
    queues.create(&PostParams::default(), &common::queue(name, json!({}))).await.expect("create Queue");
    common::wait_ready(queues, name, ConditionStatus::True, "Available", TIMEOUT).await;
    assert!(common::queue_exists(sqs, &sqs_name(ns, name)).await, "SQS has the queue of {name}");
}

/// What a failed earlier run of either test may have left: its Services and Queues (deleted
/// while its operator may still run, else their finalizers are released by hand), the Helm
/// release or the kustomize install, the namespaces.
fn remove_earlier_installs(node: &node::Node) {
    let app_namespaces = [APP_NS, kustomize::APP_NS, pool::NAMESPACES[0], pool::NAMESPACES[1], pool::NAMESPACES[2]];
    for ns in app_namespaces {
        node.attempt("kubectl", &["-n", ns, "delete", "services,queues", "--all", "--timeout=60s"]);
    }
    // A Service of skyport's class that a failed test left in its namespace: the operator
    // installed next watches every namespace, would serve it, and its client Pod would share the
    // clients' namespace these tests watch.
    let columns = "custom-columns=NS:.metadata.namespace,NAME:.metadata.name,CLASS:.spec.loadBalancerClass";
    let services = node.kubectl(&["get", "services", "-A", "-o", columns, "--no-headers"], None);
    for line in services.lines() {
        if let [ns, name, "skyport.dev/tunnel"] = line.split_whitespace().collect::<Vec<_>>()[..] {
            node.attempt("kubectl", &["-n", ns, "delete", "service", name, "--wait=false"]);
        }
    }
    node.attempt(&helm(), &["uninstall", "skyport", "--namespace", NS, "--wait"]);
    // On a fresh cluster the CRDs are not there yet (the install brings them), so nothing is left;
    // after a run cut short one CRD may be gone while another waits for its objects' finalizers.
    for kind in ["queues", "tunnels"] {
        if !node.attempt("kubectl", &["get", "crd", &format!("{kind}.skyport.dev")]) {
            continue;
        }
        // In every namespace, not only these tests' own: the install tests have the node to
        // themselves (NODE_CLUSTER's write lock), so no test's operator runs now, and an object
        // still holding skyport's finalizer is one whose operator is gone. Left alone it keeps the
        // CRD Terminating after `delete -k`, and the install then meets it so. Its exit servers,
        // if any, are tests/env/leaked-servers.sh's to name.
        let columns = "custom-columns=NS:.metadata.namespace,NAME:.metadata.name";
        let left = node.kubectl(&["get", kind, "-A", "-o", columns, "--no-headers", "--ignore-not-found"], None);
        for (ns, name) in left.lines().filter_map(|l| l.split_once(char::is_whitespace)) {
            let object = format!("{kind}/{}", name.trim());
            node.attempt(
                "kubectl",
                &["-n", ns, "patch", &object, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#],
            );
        }
    }
    // The kustomize base names every object a kustomize install made (its overlay adds only the
    // Secret, which goes with the namespace).
    let base = crate::deploy::harness::root().join("deploy");
    node.attempt("kubectl", &["delete", "-k", &base.to_string_lossy(), "--ignore-not-found", "--timeout=120s"]);
    let mut namespaces = vec!["delete", "namespace", NS, CLIENT_NS, "--ignore-not-found", "--timeout=120s"];
    namespaces.extend(app_namespaces);
    node.attempt("kubectl", &namespaces);
}

/// Every object of the release, namespaced or not, is gone. The Secret and namespace the test
/// made itself stay, and so do the CRDs (Helm never deletes them; docs/install.md says so).
fn nothing_of_the_release_left(node: &node::Node) {
    let kinds = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,configmaps,secrets,leases";
    let namespaced = node.kubectl(&["-n", NS, "get", kinds, "-o", "name"], None);
    let allowed = ["secret/skyport-aws", "serviceaccount/default", "configmap/kube-root-ca.crt"];
    let left: Vec<&str> = namespaced.lines().filter(|l| !allowed.contains(l)).collect();
    assert!(left.is_empty(), "left behind in {NS} after helm uninstall: {left:?}");
    let cluster = node.kubectl(
        &[
            "get",
            "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings",
            "-o",
            "name",
        ],
        None,
    );
    let left: Vec<&str> = cluster.lines().filter(|l| l.contains("skyport")).collect();
    assert!(left.is_empty(), "cluster-scoped objects left behind after helm uninstall: {left:?}");
    client_namespace_gone(node, "helm uninstall");
}

/// The tunnel clients' namespace, made by the install, goes with it (or is on its way).
fn client_namespace_gone(node: &node::Node, how: &str) {
    let args = ["get", "namespace", CLIENT_NS, "--ignore-not-found", "-o", "jsonpath={.metadata.deletionTimestamp}."];
    let left = node.kubectl(&args, None);
    assert!(left.is_empty() || left.trim() != ".", "namespace {CLIENT_NS} left behind after {how}: {left:?}");
}

/// The operator container as the kernel runs it: the chart's securityContext and limits hold.
fn hardened(node: &node::Node, pod: &Pod, container: &str, memory_limit: u64) {
    let pid = node.container_pid(&name(pod), container);
    let who = format!("Pod {} (pid {pid})", name(pod));
    assert_eq!(node::proc_status(pid, "Uid"), "65532\t65532\t65532\t65532", "{who}: non-root user");
    assert_eq!(node::proc_status(pid, "Gid"), "65532\t65532\t65532\t65532", "{who}: group");
    assert_eq!(node::proc_status(pid, "CapEff"), "0000000000000000", "{who}: capabilities dropped");
    assert_eq!(node::proc_status(pid, "CapPrm"), "0000000000000000", "{who}: capabilities dropped");
    assert_eq!(node::proc_status(pid, "NoNewPrivs"), "1", "{who}: allowPrivilegeEscalation: false");
    assert_eq!(node::proc_status(pid, "Seccomp"), "2", "{who}: seccomp RuntimeDefault (filter mode)");
    let root = node::root_mount_options(pid);
    assert!(root.split(',').any(|o| o == "ro"), "{who}: read-only root file system, mounted {root}");
    assert_eq!(node::memory_limit(pid), memory_limit, "{who}: memory limit");
}

async fn ready_pods(pods: &Api<Pod>, count: usize) -> Vec<Pod> {
    eventually(&format!("{count} Ready operator Pods"), TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels(SELECTOR)).await.ok()?;
        let ready: Vec<Pod> =
            list.items.into_iter().filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none()).collect();
        (ready.len() == count).then_some(ready)
    })
    .await
}

/// Ready as the kubelet reports it: the readiness probe (/readyz) passed.
fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn restarts(pod: &Pod) -> i32 {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    statuses.map_or(0, |s| s.iter().map(|c| c.restart_count).sum())
}

fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().expect("Pod name")
}

fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("Pod IP")
}

async fn scrape(address: &str) -> String {
    let (status, _, body) = crate::operate::http_get(address, "/metrics").await;
    assert_eq!(status, 200, "GET http://{address}/metrics");
    body
}

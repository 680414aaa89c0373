//! Tunnel tests on the test node: the in-process Tunnel and Service controllers talk to the
//! node's cluster, so the tunnel client Deployment runs as a real Pod from skyport's image, and
//! the Service's endpoints are a real backend Pod that only kube-proxy's rules lead to. The exit
//! servers are the local provider's processes on addresses the node routes to the host, which
//! both this test process (the public side) and the client Pod reach.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skyport::crd::Tunnel;
use tokio::sync::RwLockReadGuard;

use super::{NODE_CLUSTER, Node, node};
use crate::common::tunnels::{TunnelOperator, web};
use crate::common::{TestNs, eventually};

/// Pod start on a busy 2-core node.
const POD_TIMEOUT: Duration = Duration::from_secs(120);
/// What the backend Pod answers on: Service `web`'s two ports and the one a test adds.
pub const BACKEND_PORTS: &[&str] = &["8080/tcp", "5353/udp", "9090/tcp"];
/// Until a Tunnel on the node is Active: its client Pod starts from the image first.
pub const ACTIVE: Duration = Duration::from_secs(120);
/// A ReplicaSet whose Pod creation was refused retries with a growing backoff (up to minutes), so
/// a client Pod comes a while after its quota is lifted.
pub const AFTER_QUOTA: Duration = Duration::from_secs(240);

/// The node's [`crate::common::tunnels::WebTunnel`]: Service `web` (TCP 8080, UDP 5353) with a backend
/// Pod answering on `backend_ports`, an in-process operator whose clients are real Pods.
pub struct NodeTunnel {
    pub ns: TestNs,
    pub op: TunnelOperator,
    pub services: Api<Service>,
    pub tunnels: Api<Tunnel>,
    pub node: Node,
    /// Held until the test ends: no install runs on the node meanwhile.
    pub turn: RwLockReadGuard<'static, ()>,
}

impl NodeTunnel {
    /// `None` only when the environment was started without its node on purpose (`SKYPORT_NODE=0`,
    /// said by [`node`]); a node that failed to start fails the test.
    pub async fn start(prefix: &str, settings: skyport::config::TunnelArgs, backend_ports: &[&str]) -> Option<Self> {
        Self::start_with(prefix, settings, backend_ports, None, web("web")).await
    }

    /// [`NodeTunnel::start`] with `service` (selecting `app: web`) in place of `web`, and at most
    /// `pods` Pods allowed in the namespace (a ResourceQuota made before the Service): with 1, the
    /// backend runs and the tunnel client's Pod is refused.
    pub async fn start_with(
        prefix: &str,
        settings: skyport::config::TunnelArgs,
        backend_ports: &[&str],
        pods: Option<u32>,
        service: Service,
    ) -> Option<Self> {
        Self::start_in(prefix, |_| settings, backend_ports, pods, vec![service]).await
    }

    /// [`NodeTunnel::start_with`] with the settings made for the test's namespace (its name), and
    /// `services` made in that order.
    pub async fn start_in(
        prefix: &str,
        settings: impl FnOnce(&str) -> skyport::config::TunnelArgs,
        backend_ports: &[&str],
        pods: Option<u32>,
        services_made: Vec<Service>,
    ) -> Option<Self> {
        let node = node().await?;
        let turn = NODE_CLUSTER.read().await;
        // An install's `kubectl delete -k` may have taken the CRDs with it.
        let crds = crate::deploy::harness::root().join("crds");
        node.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crds.to_string_lossy()], None);
        established(&node, "tunnels.skyport.dev").await;
        let (repository, tag) = node.import_skyport_image();
        let echo = node.import_echo_image();

        let ns = TestNs::in_cluster(node.client.clone(), format!("{prefix}-{:08x}", rand::random::<u32>())).await;
        backend(&ns, &echo, backend_ports).await;
        if let Some(pods) = pods {
            set_pod_quota(&ns, Some(pods)).await;
        }
        let settings = skyport::config::TunnelArgs {
            client_image: format!("{repository}:{tag}"),
            local_addresses: exit_addresses(&node.exit_addresses),
            ..settings(&ns.name)
        };
        let op = TunnelOperator::start(&ns, settings).await;
        let services: Api<Service> = ns.api();
        for service in &services_made {
            services.create(&PostParams::default(), service).await.expect("create the Service");
        }
        let tunnels = ns.api();
        Some(NodeTunnel { ns, op, services, tunnels, node, turn })
    }
}

/// Waits until the CRD `name` serves its resource (`kubectl wait` fails on a CRD whose status
/// has no conditions yet).
async fn established(node: &Node, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(node.client.clone());
    eventually(&format!("CRD {name} Established"), POD_TIMEOUT, || async {
        let crd = crds.get(name).await.ok()?;
        let conditions = crd.status?.conditions?;
        conditions.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
}

/// Addresses each test's local provider hands out.
const SLICE: u32 = 8;

/// A slice of `SKYPORT_NODE_EXIT_ADDRESSES` (`FIRST-LAST`) of its own for each test. Independent
/// local providers on one range can hand out the same address: a provider skips addresses whose
/// control port is taken, but another provider's reserved address listens only on service ports
/// (an HA test's health check then reached another Tunnel's server there).
fn exit_addresses(range: &str) -> (Ipv4Addr, Ipv4Addr) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (first, last) = range.split_once('-').expect("FIRST-LAST");
    let first = u32::from(first.parse::<Ipv4Addr>().expect("first address"));
    let last = u32::from(last.parse::<Ipv4Addr>().expect("last address"));
    let slices = (last - first + 1) / SLICE;
    let start = first + NEXT.fetch_add(1, Ordering::Relaxed) % slices * SLICE;
    (Ipv4Addr::from(start), Ipv4Addr::from(start + SLICE - 1))
}

/// The echo Pod behind Service `web` (selector `app: web`), answering on `ports` (`8080/tcp`).
async fn backend(ns: &TestNs, image: &str, ports: &[&str]) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-backend", "labels": {"app": "web"}},
        "spec": {"containers": [{
            "name": "echo",
            "image": image,
            "imagePullPolicy": "Never",
            "args": ports,
            "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
        }]},
    }))
    .unwrap();
    let pods: Api<Pod> = ns.api();
    // A new namespace's `default` ServiceAccount, which admission requires, comes a moment later.
    eventually("the backend Pod created", POD_TIMEOUT, || async {
        pods.create(&PostParams::default(), &pod).await.ok().map(drop)
    })
    .await;
}

/// Allows at most `pods` Pods in the namespace (`None`: no limit), as a platform team's quota does.
pub async fn set_pod_quota(ns: &TestNs, pods: Option<u32>) {
    let quotas: Api<ResourceQuota> = ns.api();
    match pods {
        Some(n) => {
            let quota: ResourceQuota = serde_json::from_value(
                json!({"metadata": {"name": "pods"}, "spec": {"hard": {"pods": n.to_string()}}}),
            )
            .unwrap();
            quotas
                .patch("pods", &PatchParams::apply("skyport-test").force(), &Patch::Apply(&quota))
                .await
                .expect("apply the ResourceQuota");
        }
        None => {
            quotas.delete("pods", &DeleteParams::default()).await.expect("delete the ResourceQuota");
        }
    }
}

/// The running tunnel client Pod of the Tunnel `web-tunnel`, once it is Running.
pub async fn running_client(ns: &TestNs) -> Pod {
    let pods: Api<Pod> = ns.api();
    eventually("a Running tunnel client Pod", POD_TIMEOUT, || async {
        let clients = ListParams::default().labels("app.kubernetes.io/name=skyport-tunnel-client");
        let list = pods.list(&clients).await.ok()?;
        list.items.into_iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await
}

/// How many times the kubelet restarted the Pod's first container.
pub fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

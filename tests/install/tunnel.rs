//! A LoadBalancer Service of the installed operator, end to end on the node: a public client on
//! the host → the exit server (the local provider's `skyport tunnel server`, a process in the
//! operator's container on the node's network) → the tunnel client Pod skyport deploys from its
//! image in its own namespace → the Service's cluster IP, which only kube-proxy's rules resolve → the backend Pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use skyport::controllers::status::ObjectStatus;
use skyport::crd::Tunnel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::eventually;
use crate::node::Node;

const BODY: &str = "hello from the backend Pod";
const TIMEOUT: Duration = Duration::from_secs(180);

/// Serves `BODY` over HTTP on port 8080 from a busybox Pod, behind Service `web` (LoadBalancer,
/// class skyport.dev/tunnel, port 9080 → 8080) in `ns`; returns the exit server's address:port
/// once bytes flow through it. The tunnel client runs in `client_ns`. Port 9080: the local
/// provider's servers run as the operator's non-root user, which cannot bind ports below 1024
/// (a cloud exit server can).
pub async fn web_through_a_tunnel(node: &Node, ns: &str, client_ns: &str) -> String {
    let client_pods: Api<Pod> = Api::namespaced(node.client.clone(), client_ns);
    httpd(node, ns, BODY).await;
    let services: Api<Service> = Api::namespaced(node.client.clone(), ns);
    services.create(&PostParams::default(), &load_balancer("web", 9080)).await.expect("create the Service");

    let address = eventually("an address in the Service's status", TIMEOUT, || async {
        let s = services.get("web").await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    let client = eventually("a Running tunnel client Pod", TIMEOUT, || async {
        let clients = ListParams::default().labels("app.kubernetes.io/name=skyport-tunnel-client");
        let list = client_pods.list(&clients).await.ok()?;
        list.items.into_iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let pod_ip = client.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("Pod IP");
    assert!(pod_ip.starts_with("10.202."), "the tunnel client runs on the Pod network, at {pod_ip}");
    let reply = eventually("the backend's page through the exit server", TIMEOUT, || async {
        get(&format!("{address}:9080")).await.filter(|r| r.contains(BODY))
    })
    .await;
    assert!(reply.starts_with("HTTP/1.") && reply.contains(" 200 "), "{reply}");
    format!("{address}:9080")
}

/// A busybox httpd Pod `web` in `ns` (`app: web`, port 8080) whose page is `body`.
pub async fn httpd(node: &Node, ns: &str, body: &str) {
    let pods: Api<Pod> = Api::namespaced(node.client.clone(), ns);
    let script = format!(
        "/bin/busybox mkdir -p /tmp/www && echo '{body}' > /tmp/www/index.html && exec /bin/busybox httpd -f -p 8080 -h /tmp/www"
    );
    let backend: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{
            "name": "httpd",
            "image": "skyport.test/busybox:debian",
            "imagePullPolicy": "Never",
            "command": ["/bin/busybox", "sh", "-c", script],
            "ports": [{"containerPort": 8080}],
        }]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &backend).await.expect("create the backend Pod");
}

/// A LoadBalancer Service `name` in `ns` (no backend), whose Tunnel bought an exit server; the
/// Service is then deleted, and its Tunnel gone.
pub async fn one_server_bought(node: &Node, ns: &str, name: &str) {
    let services: Api<Service> = Api::namespaced(node.client.clone(), ns);
    services.create(&PostParams::default(), &load_balancer(name, 9081)).await.expect("create the Service");
    let tunnels: Api<Tunnel> = Api::namespaced(node.client.clone(), ns);
    let tunnel = format!("{name}-tunnel");
    eventually("the Tunnel's exit server created", TIMEOUT, || async {
        let status = tunnels.get(&tunnel).await.ok()?.status?;
        (!status.hosts_created.is_empty() && status.host_id.is_some()).then_some(())
    })
    .await;
    services.delete(name, &DeleteParams::default()).await.expect("delete the Service");
    eventually("the Tunnel gone with its Service", TIMEOUT, || async {
        matches!(tunnels.get(&tunnel).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
}

/// A LoadBalancer Service `name` in `ns` whose Tunnel reports `HostBudgetSpent`, naming `flag`,
/// and bought no exit server.
pub async fn budget_spent(node: &Node, ns: &str, name: &str, flag: &str) {
    let services: Api<Service> = Api::namespaced(node.client.clone(), ns);
    services.create(&PostParams::default(), &load_balancer(name, 9081)).await.expect("create the Service");
    let tunnels: Api<Tunnel> = Api::namespaced(node.client.clone(), ns);
    let tunnel = format!("{name}-tunnel");
    let status = eventually("the Tunnel reporting HostBudgetSpent", TIMEOUT, || async {
        let status = tunnels.get(&tunnel).await.ok()?.status?;
        (status.not_ready_reason() == Some("HostBudgetSpent")).then_some(status)
    })
    .await;
    let message = status.ready().map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.contains(flag), "{message}");
    assert!(status.host_id.is_none() && status.hosts_created.is_empty(), "{status:?}");
}

/// A LoadBalancer Service of skyport's class, port `port` → 8080 of the Pods labelled `app: name`.
fn load_balancer(name: &str, port: u16) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": "skyport.dev/tunnel",
            "selector": {"app": name},
            "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}],
        },
    }))
    .unwrap()
}

/// The tunnel client Pod's name.
pub async fn client_pod(node: &Node, ns: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(node.client.clone(), ns);
    let list = pods.list(&ListParams::default().labels("app.kubernetes.io/name=skyport-tunnel-client")).await.unwrap();
    list.items.first().and_then(|p| p.metadata.name.clone()).expect("a tunnel client Pod")
}

/// `GET /` over a fresh connection; `None` when the connection fails or is cut.
pub async fn get(address: &str) -> Option<String> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        stream.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n").await.ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.ok()?;
        Some(reply)
    };
    tokio::time::timeout(Duration::from_secs(5), attempt).await.ok().flatten()
}

//! An ExitServerPool under the installed operator, which watches every namespace: Services of two
//! namespaces the pool allows share one exit server, each on its own port and carried by its own
//! client Pod in the clients' namespace; a third namespace is refused, as is a port another
//! namespace serves (in words that name no other namespace). The shared server's Tunnel lives in
//! the operator's own namespace, where the admission policy lets it be made, and goes with the
//! last member.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skyport::crd::pool::{ExitServerPool, ExitServerPoolSpec};
use skyport::crd::tunnel::{Tunnel, TunnelPhase};

use super::{NS, TIMEOUT, tunnel};
use crate::common::eventually;
use crate::common::tunnels::ready;
use crate::node::Node;

/// The namespaces the pool allows, each with its Service's port, and one it does not allow.
const MEMBERS: [(&str, u16); 2] = [(NAMESPACES[0], 9084), (NAMESPACES[1], 9085)];
const STRANGER: &str = NAMESPACES[2];
/// Every namespace the test makes (an earlier run's are removed before an install).
pub const NAMESPACES: [&str; 3] = ["pool-app-a", "pool-app-b", "pool-app-c"];
const POOL: &str = "shared";

/// Runs the pool's whole life on an installed operator, and leaves no namespace, pool or Tunnel.
pub async fn shared_across_namespaces(node: &Node) {
    let pools: Api<ExitServerPool> = Api::all(node.client.clone());
    let spec = ExitServerPoolSpec {
        allowed_namespaces: MEMBERS.iter().map(|(ns, _)| ns.to_string()).collect(),
        ..Default::default()
    };
    pools.create(&PostParams::default(), &ExitServerPool::new(POOL, spec)).await.expect("create the pool");
    for (ns, port) in MEMBERS {
        namespace(node, ns).await;
        tunnel::httpd(node, ns, &format!("page of {ns}")).await;
        member(node, ns, "web", port).await;
    }
    namespace(node, STRANGER).await;
    member(node, STRANGER, "web", 9086).await;

    let mut addresses = Vec::new();
    for (ns, port) in MEMBERS {
        let services: Api<Service> = Api::namespaced(node.client.clone(), ns);
        let ip = eventually(&format!("{ns}/web's shared address"), TIMEOUT, || async {
            services.get("web").await.ok()?.status?.load_balancer?.ingress?.first()?.ip.clone()
        })
        .await;
        let page = eventually(&format!("{ns}'s page through the shared server"), TIMEOUT, || async {
            tunnel::get(&format!("{ip}:{port}")).await.filter(|r| r.contains(ns))
        })
        .await;
        assert!(page.contains(" 200 "), "{page}");
        addresses.push(ip);
    }
    assert_eq!(addresses[0], addresses[1], "one exit server for both namespaces");
    let shared = addresses.remove(0);
    let carriers: Api<Tunnel> = Api::namespaced(node.client.clone(), NS);
    let carrier =
        carriers.get(&format!("pool-{POOL}")).await.expect("the shared server's Tunnel in skyport's namespace");
    let members = carrier.status.map(|s| s.pool_members).unwrap_or_default();
    let carried = members.iter().filter(|m| m.health_port.is_some() && m.refused.is_none()).count();
    assert_eq!(carried, 2, "two members carried, the refused namespace's not among them: {members:?}");

    // A namespace the pool does not allow gets nothing, and is told why.
    let (reason, message) = failed(node, STRANGER, "web-tunnel").await;
    assert_eq!(reason, "PoolNotAllowed", "{message}");
    assert!(message.contains(STRANGER) && !message.contains(MEMBERS[0].0), "{message}");
    // A port of another namespace's Service: refused, naming the port and no namespace.
    member(node, MEMBERS[1].0, "taken", MEMBERS[0].1).await;
    let (reason, message) = failed(node, MEMBERS[1].0, "taken-tunnel").await;
    assert_eq!(reason, "PoolRefused", "{message}");
    assert!(message.contains(&format!("{}/TCP", MEMBERS[0].1)), "{message}");
    assert!(!message.contains(MEMBERS[0].0), "names another namespace: {message}");
    let a_page = tunnel::get(&format!("{shared}:{}", MEMBERS[0].1)).await.unwrap_or_default();
    assert!(a_page.contains(MEMBERS[0].0), "the taken port still leads to its own Service: {a_page}");

    // The members leave; the last one takes the shared server's Tunnel and the server with it.
    for ns in [MEMBERS[0].0, MEMBERS[1].0, STRANGER] {
        node.kubectl(&["delete", "namespace", ns, "--wait=true", "--timeout=3m"], None);
    }
    eventually("the shared server's Tunnel gone", TIMEOUT, || async {
        matches!(carriers.get(&format!("pool-{POOL}")).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    let port = MEMBERS[1].1;
    eventually("the shared server gone", TIMEOUT, || async {
        tunnel::get(&format!("{shared}:{port}")).await.is_none().then_some(())
    })
    .await;
    pools.delete(POOL, &DeleteParams::default()).await.expect("delete the pool");
}

/// Makes namespace `ns`.
async fn namespace(node: &Node, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(node.client.clone());
    let made = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    namespaces.create(&PostParams::default(), &made).await.expect("create the namespace");
}

/// A LoadBalancer Service `name` in `ns` on the pool, `port` → 8080 of the backend.
async fn member(node: &Node, ns: &str, name: &str, port: u16) {
    let services: Api<Service> = Api::namespaced(node.client.clone(), ns);
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"skyport.dev/exit-server-pool": POOL}},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": "skyport.dev/tunnel",
            "selector": {"app": "web"},
            "ports": [{"name": "http", "port": port, "targetPort": 8080, "protocol": "TCP"}],
        },
    }))
    .unwrap();
    services.create(&PostParams::default(), &service).await.expect("create the Service");
}

/// Tunnel `name` of `ns` once Failed: its Ready condition's reason and message.
async fn failed(node: &Node, ns: &str, name: &str) -> (String, String) {
    let tunnels: Api<Tunnel> = Api::namespaced(node.client.clone(), ns);
    let tunnel = eventually(&format!("{ns}/{name} refused"), Duration::from_secs(60), || async {
        let t = tunnels.get(name).await.ok()?;
        (t.status.as_ref()?.phase == Some(TunnelPhase::Failed)).then_some(t)
    })
    .await;
    let (_, reason, message) = ready(&tunnel).expect("a Ready condition");
    (reason, message)
}

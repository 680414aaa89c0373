//! Services of one namespace on one ExitServerPool's shared exit server, on the test node: the
//! clients are real Pods, the shared server the local provider's process. One VM carries both
//! Services on their own ports; a port another Service serves is refused without naming it, and an
//! edit asking for one waits while the Service keeps its ports; one Service's port change and its
//! leaving keep the other's open connections; a namespace the pool stops allowing loses the
//! address, and gets it back when allowed again; deleting the shared server's Tunnel gives a
//! fresh one, which the members move to; the last one leaving takes the VM. The pool's
//! status says where it serves and what, and only its own shared server writes it. A pool of two
//! exit servers serves its members as a pair serves its Service: each member gets a client per
//! server, the address moves to the standby when the active server dies, and `BothAddresses`
//! publishes both servers' own addresses.

use std::time::Duration;

use kube::api::{Api, DeleteParams, PostParams};
use providers::HostProvider;
use skyport::crd::condition::ConditionStatus;
use skyport::crd::pool::ExitServerPool;
use skyport::crd::tunnel::{Tunnel, TunnelPhase};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::eventually;
use crate::common::kubelet::tcp_echo;
use crate::common::tunnels::{
    active, carries, fast_tunnel_settings, finish_tunnels, host_ip, ingress_ip, ready, service,
};
use crate::node::tunnels::{ACTIVE, BACKEND_PORTS, NodeTunnel};

/// A Service on the pool, selecting the backend Pod (`app: web`).
pub(super) fn member(name: &str, pool: &str, port: u16) -> k8s_openapi::api::core::v1::Service {
    let mut svc = service(
        name,
        Some("skyport.dev/tunnel"),
        serde_json::json!({"skyport.dev/exit-server-pool": pool}),
        serde_json::json!([{"name": "tcp", "port": port, "protocol": "TCP"}]),
    );
    svc.spec.as_mut().unwrap().selector = Some([("app".to_string(), "web".to_string())].into());
    svc
}

/// Sends `what` on `conn` (if anything) and reads the answer.
async fn echo(conn: &mut tokio::net::TcpStream, what: &[u8]) -> Option<Vec<u8>> {
    if !what.is_empty() {
        conn.write_all(what).await.ok()?;
    }
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.ok()?.ok()?;
    Some(buf[..n].to_vec())
}

/// Deletes the cluster-scoped pool when the test ends, however it ends.
pub(super) struct PoolGuard(Api<ExitServerPool>, String);

impl Drop for PoolGuard {
    fn drop(&mut self) {
        let (api, name) = (self.0.clone(), self.1.clone());
        tokio::spawn(async move { api.delete(&name, &DeleteParams::default()).await });
    }
}

/// The test node with an operator whose pools' shared servers live in the test's namespace, and
/// a pool (`spec`, JSON, allowing that namespace) named after `prefix`; the guard deletes it.
pub(super) async fn on_pool(prefix: &str, spec: serde_json::Value) -> Option<(NodeTunnel, String, PoolGuard)> {
    let settings = |ns: &str| skyport::config::TunnelArgs { pool_namespace: Some(ns.into()), ..fast_tunnel_settings() };
    let node = NodeTunnel::start_in(prefix, settings, BACKEND_PORTS, None, Vec::new()).await?;
    let name = format!("{prefix}-{:08x}", rand::random::<u32>());
    let mut spec = spec;
    spec["allowedNamespaces"] = serde_json::json!([node.ns.name]);
    let pool: ExitServerPool =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    let pools: Api<ExitServerPool> = Api::all(node.ns.client.clone());
    pools.create(&PostParams::default(), &pool).await.unwrap();
    Some((node, name.clone(), PoolGuard(pools, name)))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn services_share_one_exit_server_on_their_own_ports_and_leave_it_one_by_one() {
    let Some((NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }, pool, _guard)) =
        on_pool("tun-pool", serde_json::json!({})).await
    else {
        return;
    };
    let pools: Api<ExitServerPool> = Api::all(ns.client.clone());
    for (name, port) in [("web-a", 8080), ("web-b", 9090)] {
        services.create(&PostParams::default(), &member(name, &pool, port)).await.unwrap();
    }

    let a = active(&tunnels, "web-a-tunnel", ACTIVE).await;
    let b = active(&tunnels, "web-b-tunnel", ACTIVE).await;
    assert_eq!(host_ip(&a), host_ip(&b), "one shared address");
    let ip = host_ip(&a);
    let hosts =
        op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.unwrap();
    assert_eq!(hosts.len(), 1, "one exit server for both Services: {hosts:?}");
    carries(&ip, 8080, None).await;
    carries(&ip, 9090, None).await;
    // The pool says where it serves and what, not for whom.
    let status = eventually("the pool's status", Duration::from_secs(30), || async {
        let status = pools.get(&pool).await.ok()?.status?;
        (status.members == Some(2) && status.address.as_deref() == Some(ip.as_str())).then_some(status)
    })
    .await;
    let ports: Vec<i32> = status.ports.iter().map(|p| p.port).collect();
    assert_eq!(ports, [8080, 9090]);
    assert!(status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True));

    // A Tunnel naming the pool without a Service, which the pool does not control, is refused:
    // it buys nothing and does not speak for the pool.
    let forged: Tunnel = serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": "forged"}, "spec": {"pool": {"name": pool}},
    }))
    .unwrap();
    tunnels.create(&PostParams::default(), &forged).await.unwrap();
    let forged = eventually("the forged shared server refused", ACTIVE, || async {
        let t = tunnels.get("forged").await.ok()?;
        (t.status.as_ref()?.phase == Some(TunnelPhase::Failed)).then_some(t)
    })
    .await;
    assert_eq!(ready(&forged).unwrap().1, "NotAPoolServer");
    tunnels.delete("forged", &DeleteParams::default()).await.unwrap();
    let hosts =
        op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.unwrap();
    assert_eq!(hosts.len(), 1, "still one exit server: {hosts:?}");
    let after = pools.get(&pool).await.unwrap().status.unwrap();
    assert_eq!((after.members, after.address), (Some(2), Some(ip.clone())), "the pool's status is its own");

    // A third Service asking for a port the pool already serves is refused, naming the port only.
    services.create(&PostParams::default(), &member("web-c", &pool, 8080)).await.unwrap();
    let refused = eventually("web-c refused", ACTIVE, || async {
        let t = tunnels.get("web-c-tunnel").await.ok()?;
        (t.status.as_ref()?.phase == Some(TunnelPhase::Failed)).then_some(t)
    })
    .await;
    let (_, reason, message) = ready(&refused).unwrap();
    assert_eq!(reason, "PoolRefused", "{message}");
    assert!(message.contains("8080/TCP") && !message.contains("web-a"), "{message}");
    services.delete("web-c", &DeleteParams::default()).await.unwrap();

    // web-b adds a UDP port: pushed to the running server while a connection to web-a stays up.
    let ports = |list: serde_json::Value| kube::api::Patch::Merge(serde_json::json!({"spec": {"ports": list}}));
    let mut held_a = tokio::net::TcpStream::connect((ip.as_str(), 8080)).await.unwrap();
    assert_eq!(echo(&mut held_a, b"").await.as_deref(), Some(&b"8080\n"[..]), "web-a's backend");
    let with_udp = serde_json::json!([
        {"name": "tcp", "port": 9090, "protocol": "TCP"},
        {"name": "dns", "port": 5353, "protocol": "UDP"},
    ]);
    services.patch("web-b", &Default::default(), &ports(with_udp)).await.unwrap();
    eventually("web-b carrying its new port", ACTIVE, || async {
        let t = tunnels.get("web-b-tunnel").await.ok()?;
        t.status?.ports.iter().any(|p| p.port == 5353).then_some(())
    })
    .await;
    carries(&ip, 9090, Some(5353)).await;
    let after = echo(&mut held_a, b"across").await;
    assert_eq!(after.as_deref(), Some(&b"across"[..]), "web-a's held connection across web-b's port change");

    // web-b edits its Service to add web-a's port: the edit waits, named in its Ready condition,
    // and web-b keeps what it had; web-a keeps its port.
    let both = serde_json::json!([
        {"name": "tcp", "port": 9090, "protocol": "TCP"},
        {"name": "extra", "port": 8080, "protocol": "TCP"},
    ]);
    services.patch("web-b", &Default::default(), &ports(both)).await.unwrap();
    let waiting = eventually("web-b's edit waiting", ACTIVE, || async {
        let (status, _, message) = ready(&tunnels.get("web-b-tunnel").await.ok()?)?;
        (status == ConditionStatus::True && message.contains("edit waits")).then_some(message)
    })
    .await;
    assert!(waiting.contains("8080/TCP") && !waiting.contains("web-a"), "{waiting}");
    carries(&ip, 8080, None).await;
    carries(&ip, 9090, None).await;
    let only = serde_json::json!([{"name": "tcp", "port": 9090, "protocol": "TCP"}]);
    services.patch("web-b", &Default::default(), &ports(only)).await.unwrap();
    eventually("web-b's edit withdrawn", ACTIVE, || async {
        let (_, _, message) = ready(&tunnels.get("web-b-tunnel").await.ok()?)?;
        (!message.contains("edit waits")).then_some(())
    })
    .await;
    // Its UDP port gone, web-b's own client rolls to the new config; its connections are held
    // from then on.
    rolled_out(&ns, "web-b-tunnel-client").await;

    // web-a leaves; a connection to web-b, open all along, keeps carrying bytes.
    let mut held = tokio::net::TcpStream::connect((ip.as_str(), 9090)).await.unwrap();
    // The backend names its port first, then echoes.
    assert_eq!(echo(&mut held, b"").await.as_deref(), Some(&b"9090\n"[..]), "web-b's backend");
    assert_eq!(echo(&mut held, b"before").await.as_deref(), Some(&b"before"[..]));
    services.delete("web-a", &DeleteParams::default()).await.unwrap();
    eventually("web-a's port closed on the shared address", Duration::from_secs(60), || async {
        tcp_echo(&ip, 8080, b"x").await.is_none().then_some(())
    })
    .await;
    let after = echo(&mut held, b"after").await;
    assert_eq!(after.as_deref(), Some(&b"after"[..]), "the held connection to web-b still carries bytes");
    // web-b's own check may fail for a moment while the server takes web-a's leaving.
    active(&tunnels, "web-b-tunnel", ACTIVE).await;

    // The pool stops allowing the namespace: web-b is refused, its Service loses the shared
    // address, and with no member left the shared server goes.
    let allow = |ns: &str| kube::api::Patch::Merge(serde_json::json!({"spec": {"allowedNamespaces": [ns]}}));
    pools.patch(&pool, &Default::default(), &allow("somebody-else")).await.unwrap();
    let refused = eventually("web-b refused", ACTIVE, || async {
        let t = tunnels.get("web-b-tunnel").await.ok()?;
        (t.status.as_ref()?.phase == Some(TunnelPhase::Failed)).then_some(t)
    })
    .await;
    assert_eq!(ready(&refused).unwrap().1, "PoolNotAllowed");
    eventually("web-b's Service without the shared address", Duration::from_secs(30), || async {
        let ingress = services.get("web-b").await.ok()?.status?.load_balancer?.ingress.unwrap_or_default();
        ingress.is_empty().then_some(())
    })
    .await;
    eventually("the shared server gone with its last allowed member", Duration::from_secs(90), || async {
        let left =
            op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.ok()?;
        left.is_empty().then_some(())
    })
    .await;
    // Allowed again, web-b is served again, on a new shared server: the pool's change wakes it.
    pools.patch(&pool, &Default::default(), &allow(&ns.name)).await.unwrap();
    let back = active(&tunnels, "web-b-tunnel", ACTIVE).await;
    carries(&host_ip(&back), 9090, None).await;

    // `kubectl delete tunnel pool-<pool>` gives the pool a fresh exit server, and web-b moves to it.
    let carrier = format!("pool-{pool}");
    let old = tunnels.get(&carrier).await.unwrap().status.and_then(|s| s.host_id).expect("the shared server");
    tunnels.delete(&carrier, &DeleteParams::default()).await.unwrap();
    let fresh = eventually("a fresh shared server", Duration::from_secs(90), || async {
        let id = tunnels.get(&carrier).await.ok()?.status?.host_id?;
        (id != old).then_some(id)
    })
    .await;
    let moved = eventually("web-b on the fresh server", ACTIVE, || async {
        let hosts =
            op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.ok()?;
        let ip = hosts.iter().find(|h| h.id == fresh)?.public_ipv4.clone()?;
        let t = tunnels.get("web-b-tunnel").await.ok()?;
        (t.status?.phase == Some(TunnelPhase::Active) && ingress_ip(&services.get("web-b").await.ok()?)? == ip)
            .then_some(ip)
    })
    .await;
    carries(&moved, 9090, None).await;

    // The last member leaves: the shared server's Tunnel goes, and with it the VM.
    services.delete("web-b", &DeleteParams::default()).await.unwrap();
    eventually("no Tunnel left, the shared server's included", Duration::from_secs(90), || async {
        tunnels.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    eventually("no exit server left", Duration::from_secs(60), || async {
        let left =
            op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.ok()?;
        left.is_empty().then_some(())
    })
    .await;
    op.stop().await;
    ns.cleanup().await;
}

/// Waits until Deployment `name` runs its current template alone: one Pod, updated and available,
/// none terminating.
async fn rolled_out(ns: &crate::common::TestNs, name: &str) {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = ns.api();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    eventually(&format!("{name} rolled out"), ACTIVE, || async {
        let d = deployments.get(name).await.ok()?;
        let labels = d.spec.as_ref()?.selector.match_labels.clone()?;
        let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let selector = selector.join(",");
        let status = d.status?;
        let current = status.observed_generation >= d.metadata.generation
            && status.updated_replicas == Some(1)
            && status.available_replicas == Some(1)
            && status.replicas == Some(1);
        let listed = pods.list(&kube::api::ListParams::default().labels(&selector)).await.ok()?;
        (current && listed.items.len() == 1).then_some(())
    })
    .await;
}

/// Deployment `name`'s Pod deleted and, by the namespace's Pod quota, not started again.
async fn stop_client(ns: &crate::common::TestNs, name: &str) {
    use kube::ResourceExt;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    let all = pods.list(&Default::default()).await.unwrap().items.len();
    let limit = (all - 1).to_string();
    crate::node::tunnels::set_pod_quota(ns, Some(all as u32 - 1)).await;
    // A quota holds only once its controller has counted what it limits: a Pod created before
    // that is admitted.
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = ns.api();
    eventually("the Pod quota in force", Duration::from_secs(30), || async {
        let status = quotas.get("pods").await.ok()?.status?;
        let hard = status.hard?.get("pods").map(|q| q.0.clone());
        (hard.as_deref() == Some(limit.as_str()) && status.used?.contains_key("pods")).then_some(())
    })
    .await;
    let selector = format!("app.kubernetes.io/instance={name}");
    let client = pods.list(&kube::api::ListParams::default().labels(&selector)).await.unwrap();
    let pod = client.items.first().unwrap_or_else(|| panic!("{name}'s Pod")).name_any();
    pods.delete(&pod, &DeleteParams::default().grace_period(0)).await.unwrap();
}

/// The shared server's pair status, once both servers passed their checks.
async fn pair_passing(tunnels: &Api<Tunnel>, pool: &str) -> skyport::crd::tunnel::HighAvailabilityStatus {
    let carrier = format!("pool-{pool}");
    eventually("both shared servers pass their checks", ACTIVE, || async {
        let ha = tunnels.get(&carrier).await.ok()?.status?.high_availability?;
        (ha.servers.iter().filter(|s| s.healthy).count() == 2).then_some(ha)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_active_standby_pool_moves_its_members_to_the_standby_when_the_active_server_dies() {
    let spec = serde_json::json!({"address": {"mode": "Reserved"}, "highAvailability": {"mode": "ActiveStandby"}});
    let Some((NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }, pool, _guard)) =
        on_pool("tun-pool-ha", spec).await
    else {
        return;
    };
    for (name, port) in [("web-a", 8080), ("web-b", 9090)] {
        services.create(&PostParams::default(), &member(name, &pool, port)).await.unwrap();
    }
    let a = active(&tunnels, "web-a-tunnel", ACTIVE).await;
    active(&tunnels, "web-b-tunnel", ACTIVE).await;
    let ha = pair_passing(&tunnels, &pool).await;
    let ip = host_ip(&a);
    let carrier = tunnels.get(&format!("pool-{pool}")).await.unwrap();
    assert_eq!(carrier.status.as_ref().and_then(|s| s.address_ip.clone()), Some(ip.clone()), "the reserved address");
    assert!(ha.servers.iter().all(|s| s.host_ip.as_deref() != Some(ip.as_str())), "{ha:?}");
    // A client per member and server, each dialing its own server.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = ns.api();
    for name in ["web-a-tunnel-client-a", "web-a-tunnel-client-b", "web-b-tunnel-client-a", "web-b-tunnel-client-b"] {
        deployments.get(name).await.unwrap_or_else(|e| panic!("client Deployment {name}: {e}"));
    }
    let hosts =
        op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.unwrap();
    assert_eq!(hosts.len(), 2, "one pair for both Services: {hosts:?}");
    carries(&ip, 8080, None).await;
    carries(&ip, 9090, None).await;

    let first = ha.active.clone().expect("an active server");
    crate::common::tunnels::kill_exit_server(&op, &first);
    eventually("the reserved address on the standby", ACTIVE, || async {
        let ha = tunnels.get(&format!("pool-{pool}")).await.ok()?.status?.high_availability?;
        ha.active.filter(|a| *a != first).map(drop)
    })
    .await;
    // Both members answer at the same address, through their clients of the other server.
    carries(&ip, 8080, None).await;
    carries(&ip, 9090, None).await;
    // A member's check at the address may fail while it moves, which takes the address off its
    // Service until the check passes through the other server.
    eventually("web-b Active at the shared address again", ACTIVE, || async {
        let t = tunnels.get("web-b-tunnel").await.ok()?;
        let status = t.status?;
        let back = status.phase == Some(TunnelPhase::Active) && status.host_ip.as_deref() == Some(ip.as_str());
        (back && ingress_ip(&services.get("web-b").await.ok()?)? == ip).then_some(())
    })
    .await;
    // The shared servers go with their Tunnels while the operator runs (stopping it keeps them).
    finish_tunnels(op, ns).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_both_addresses_pool_publishes_both_servers_for_every_member() {
    let spec = serde_json::json!({"highAvailability": {"mode": "BothAddresses"}});
    let Some((NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }, pool, _guard)) =
        on_pool("tun-pool-both", spec).await
    else {
        return;
    };
    services.create(&PostParams::default(), &member("web-a", &pool, 8080)).await.unwrap();
    active(&tunnels, "web-a-tunnel", ACTIVE).await;
    let ha = pair_passing(&tunnels, &pool).await;
    let mut own: Vec<String> = ha.servers.iter().filter_map(|s| s.host_ip.clone()).collect();
    own.sort();
    let published = eventually("both servers' addresses on the Service", ACTIVE, || async {
        let ingress = services.get("web-a").await.ok()?.status?.load_balancer?.ingress?;
        let mut ips: Vec<String> = ingress.into_iter().filter_map(|i| i.ip).collect();
        ips.sort();
        (ips.len() == 2).then_some(ips)
    })
    .await;
    assert_eq!(published, own);
    for ip in &published {
        carries(ip, 8080, None).await;
    }

    // The member's client of one server stops (its node gone): that server's address leaves the
    // Service, the other stays. With both stopped the Service has no address, and the member says
    // why; once its clients run again, both addresses are back.
    let ips = |left: usize| {
        let services = services.clone();
        async move {
            let ingress = services.get("web-a").await.ok()?.status?.load_balancer?.ingress.unwrap_or_default();
            (ingress.len() == left).then(|| ingress.into_iter().filter_map(|i| i.ip).collect::<Vec<_>>())
        }
    };
    stop_client(&ns, "web-a-tunnel-client-a").await;
    let slot_b = ha.servers.iter().find(|s| s.slot == "b").and_then(|s| s.host_ip.clone()).unwrap();
    let left = eventually("one address left on the Service", ACTIVE, || ips(1)).await;
    assert_eq!(left, [slot_b]);
    stop_client(&ns, "web-a-tunnel-client-b").await;
    eventually("no address left on the Service", ACTIVE, || ips(0)).await;
    let waiting = tunnels.get("web-a-tunnel").await.unwrap();
    assert_eq!(ready(&waiting).unwrap().1, "WaitingForTunnel");
    crate::node::tunnels::set_pod_quota(&ns, None).await;
    eventually("both addresses back", crate::node::tunnels::AFTER_QUOTA, || ips(2)).await;
    finish_tunnels(op, ns).await;
}

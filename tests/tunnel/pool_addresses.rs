//! An ExitServerPool with an address per Service (`addressing: PerService`) on the test node: two
//! Services on the same port, each at an address of its own on one exit server (the local
//! provider's process), each reaching its own backend through its own client Pod. The pool's
//! status, which every allowed namespace reads, names neither address; a Service that leaves has
//! its address released while the other keeps serving; nothing is left once both are gone.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, PostParams};
use providers::HostProvider;
use providers::hosts::{MANAGED_BY_VALUE, TAG_CLUSTER, TAG_MANAGED_BY};
use skyport::crd::condition::ConditionStatus;
use skyport::crd::pool::ExitServerPool;

use super::pool::{member, on_pool};
use crate::common::eventually;
use crate::common::tunnels::{active, finish_tunnels, host_ip, ingress_ip, reaches, test_cluster_id};
use crate::node::tunnels::{ACTIVE, NodeTunnel};

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn services_with_an_address_each_share_a_port_on_one_exit_server() {
    let spec = serde_json::json!({"addressing": "PerService"});
    let Some((NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }, pool, _guard)) =
        on_pool("tun-pool-own", spec).await
    else {
        return;
    };
    // Both on port 8080; each forwards to a backend port of its own, so a reply says whose it is.
    for (name, backend) in [("web-a", 8080), ("web-b", 9090)] {
        let mut svc = member(name, &pool, 8080);
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].target_port = Some(IntOrString::Int(backend));
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    let (a, b) = (active(&tunnels, "web-a-tunnel", ACTIVE).await, active(&tunnels, "web-b-tunnel", ACTIVE).await);
    let (ip_a, ip_b) = (host_ip(&a), host_ip(&b));
    assert_ne!(ip_a, ip_b, "an address each");
    let hosts = op.local.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert_eq!(hosts.len(), 1, "one exit server for both: {hosts:?}");
    let own = hosts[0].public_ipv4.clone().unwrap();
    assert!(own != ip_a && own != ip_b, "neither is published at the server's own address {own}");
    reaches(&ip_a, 8080, 8080).await;
    reaches(&ip_b, 8080, 9090).await;
    assert_eq!(ingress_ip(&services.get("web-a").await.unwrap()).as_deref(), Some(ip_a.as_str()));
    assert_eq!(ingress_ip(&services.get("web-b").await.unwrap()).as_deref(), Some(ip_b.as_str()));

    // The pool counts its members and names no member's address.
    let pools: Api<ExitServerPool> = Api::all(ns.client.clone());
    let status = eventually("the pool's status", Duration::from_secs(30), || async {
        let status = pools.get(&pool).await.ok()?.status?;
        let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True);
        (status.members == Some(2) && ready).then_some(status)
    })
    .await;
    assert!(status.address.is_none() && status.addresses.is_empty(), "{status:?}");

    // web-b leaves: its address is released; web-a keeps serving at its own.
    let local = op.local.clone();
    services.delete("web-b", &DeleteParams::default()).await.unwrap();
    eventually("web-b's address released", Duration::from_secs(60), || async {
        local.get_address(&ip_b).await.ok()?.is_none().then_some(())
    })
    .await;
    reaches(&ip_a, 8080, 8080).await;

    let cluster = test_cluster_id(&ns);
    finish_tunnels(op, ns).await;
    let left = local.list_addresses_by_tag(TAG_CLUSTER, &cluster).await.unwrap();
    assert!(left.is_empty(), "addresses left: {left:?}");
}

//! A Tunnel's life on the test node with the local provider: real bytes from the public side
//! through its exit server, the client Pod skyport deploys from its image and kube-proxy to the
//! backend Pod; port changes on the same server, a fresh server when the Tunnel is deleted, a lost
//! server replaced, cleanup when the Service goes.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use providers::HostProvider;
use providers::hosts::{MANAGED_BY_VALUE, TAG_MANAGED_BY};
use skyport::crd::{ConditionStatus, TunnelPhase};

use super::NEEDS_ENV;
use crate::common::eventually;
use crate::common::kubelet::udp_echo;
use crate::common::node_tunnels::{ACTIVE, BACKEND_PORTS as BACKEND, NodeTunnel, restarts, running_client};
use crate::common::tunnels::{
    self, active, carries, events, fast_tunnel_settings, finish_tunnels, host_id, host_ip, ingress_ip,
};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_load_balancer_service_gets_an_exit_server_and_real_bytes_flow_through_it() {
    let _ = NEEDS_ENV;
    let Some(NodeTunnel { ns, op, services, tunnels, node, turn: _turn }) =
        NodeTunnel::start("tun-bytes", fast_tunnel_settings(), BACKEND).await
    else {
        return;
    };

    let tunnel = active(&tunnels, "web-tunnel", ACTIVE).await;
    let ip = host_ip(&tunnel);
    let status = tunnel.status.clone().unwrap();
    assert_eq!(status.provider.as_deref(), Some("local"));
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::True, "Active"));
    assert_eq!(status.observed_generation, tunnel.metadata.generation);
    let owner = &tunnel.owner_references()[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("Service", Some(true)));

    // The Service shows the exit server's address, ipMode Proxy, with its ports.
    let svc = eventually("Service ingress set", Duration::from_secs(20), || async {
        let s = services.get("web").await.ok()?;
        (ingress_ip(&s)? == ip).then_some(s)
    })
    .await;
    let ingress = &svc.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0];
    assert_eq!(ingress.ip_mode.as_deref(), Some("Proxy"));
    let ports: Vec<_> = ingress.ports.clone().unwrap().into_iter().map(|p| (p.port, p.protocol)).collect();
    assert_eq!(ports, [(5353, "UDP".to_string()), (8080, "TCP".to_string())]);
    assert!(svc.spec.unwrap().external_ips.is_none(), "spec.externalIPs is never touched");

    // The client Deployment is hardened, single, recreated on change; secrets stay in the Secret.
    let deployment: Deployment = ns.api().get("web-tunnel-client").await.unwrap();
    let spec = deployment.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    let container = &pod.containers[0];
    assert!(container.resources.as_ref().unwrap().limits.is_some());
    let secret: Secret = ns.api().get("web-tunnel-credentials").await.unwrap();
    let token = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    let visible =
        serde_json::to_string(&(&tunnel, &deployment, events(&ns.client, &ns.name, "web-tunnel").await)).unwrap();
    assert!(!visible.contains(&token), "the tunnel token leaked into status, the Deployment or Events");

    // Real bytes: the client Pod and the exit server carry TCP and UDP to the backend Pod.
    carries(&ip, 8080, Some(5353)).await;
    // Steady state: another resync changes nothing.
    let writes = op.ctx.api_writes.get();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(op.ctx.api_writes.get(), writes, "an Active Tunnel costs no API writes");

    // The client's process dies and the kubelet starts it again: bytes flow again through the
    // same exit server.
    let host = host_id(&tunnel);
    let client = running_client(&ns).await;
    let pod = client.name_any();
    let pid = node.container_pid(&pod, "tunnel-client");
    assert!(std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = ns.api();
    eventually("the client container restarted", ACTIVE, || async {
        let p = pods.get(&pod).await.ok()?;
        (restarts(&p) == 1).then_some(())
    })
    .await;
    carries(&ip, 8080, Some(5353)).await;
    let after = active(&tunnels, "web-tunnel", ACTIVE).await;
    assert_eq!((host_id(&after), host_ip(&after)), (host, ip), "a client restart keeps the exit server");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn service_port_changes_follow_on_the_same_exit_server() {
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start("tun-ports", fast_tunnel_settings(), BACKEND).await
    else {
        return;
    };
    let before = active(&tunnels, "web-tunnel", ACTIVE).await;
    carries(&host_ip(&before), 8080, None).await;

    // Add a TCP port and drop the UDP one.
    let patch = serde_json::json!({"spec": {"ports": [
        {"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "admin", "port": 9090, "protocol": "TCP"}]}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let after = eventually("Tunnel exposes 8080 and 9090", ACTIVE, || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let ports: Vec<i32> = t.status.as_ref()?.ports.iter().map(|p| p.port).collect();
        (ports == [8080, 9090] && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;
    assert_eq!(host_id(&after), host_id(&before), "no new exit server for a port change");
    assert_eq!(host_ip(&after), host_ip(&before), "the address stays");
    // Through a config push to the running server, as on a cloud VM: it persisted the push's
    // generation beside its config.
    let generation = std::fs::read_to_string(op.local.host_dir(&host_id(&after)).join("server.toml.generation"));
    assert!(generation.is_ok_and(|g| g.trim().parse::<u64>().is_ok_and(|g| g >= 1)), "no push reached the server");
    carries(&host_ip(&after), 9090, None).await;
    carries(&host_ip(&after), 8080, None).await;
    eventually("UDP 5353 closed", Duration::from_secs(20), || async {
        udp_echo(&host_ip(&after), 5353, b"x").await.is_none().then_some(())
    })
    .await;
    eventually("Service ingress lists 8080 and 9090", Duration::from_secs(20), || async {
        let s = services.get("web").await.ok()?;
        let ports: Vec<i32> =
            s.status?.load_balancer?.ingress?.first()?.ports.clone()?.iter().map(|p| p.port).collect();
        (ports == [8080, 9090]).then_some(())
    })
    .await;
    let reasons: Vec<String> = events(&ns.client, &ns.name, "web-tunnel").await.into_iter().map(|e| e.0).collect();
    assert!(reasons.contains(&"PortsChanged".to_string()), "{reasons:?}");
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn deleting_the_tunnel_gives_a_fresh_exit_server_with_a_new_address() {
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start("tun-fresh", fast_tunnel_settings(), BACKEND).await
    else {
        return;
    };
    let old = active(&tunnels, "web-tunnel", ACTIVE).await;
    tunnels.delete("web-tunnel", &DeleteParams::default()).await.unwrap();

    let new = eventually("a new Tunnel, Active", ACTIVE, || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.uid() != old.uid() && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;
    assert_eq!(op.local.get(&host_id(&old)).await.unwrap(), None, "the old exit server is gone");
    assert_ne!(host_id(&new), host_id(&old));
    assert_ne!(host_ip(&new), host_ip(&old), "a new address");
    eventually("Service shows the new address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&new)).then_some(())
    })
    .await;
    carries(&host_ip(&new), 8080, None).await;
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_exit_server_killed_out_of_band_is_replaced_at_the_next_resync() {
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start("tun-kill", fast_tunnel_settings(), BACKEND).await
    else {
        return;
    };
    let old = active(&tunnels, "web-tunnel", ACTIVE).await;

    tunnels::kill_exit_server(&op, &host_id(&old));
    // Resync is 2 s: replaced well within a few periods, the Service following.
    let new = tunnels::active_elsewhere_within(&tunnels, "web-tunnel", &host_id(&old), ACTIVE).await;
    assert_eq!(op.local.get(&host_id(&old)).await.unwrap(), None, "the dead host is deleted, not left");
    eventually("Service shows the replacement's address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == host_ip(&new)).then_some(())
    })
    .await;
    let reasons: Vec<String> = events(&ns.client, &ns.name, "web-tunnel").await.into_iter().map(|e| e.0).collect();
    assert!(reasons.contains(&"ExitServerLost".to_string()), "{reasons:?}");
    carries(&host_ip(&new), 8080, None).await;
    finish_tunnels(op, ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn deleting_the_service_deletes_the_tunnel_and_its_exit_server() {
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start("tun-svcdel", fast_tunnel_settings(), BACKEND).await
    else {
        return;
    };
    let tunnel = active(&tunnels, "web-tunnel", ACTIVE).await;
    services.delete("web", &DeleteParams::default()).await.unwrap();

    // The garbage collector deletes the owned Tunnel; its finalizer deletes the host.
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert_eq!(op.local.get(&host_id(&tunnel)).await.unwrap(), None);
    let left = op.local.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert!(left.is_empty(), "nothing leaked: {left:?}");
    finish_tunnels(op, ns).await;
}

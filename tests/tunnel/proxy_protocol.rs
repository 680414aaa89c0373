//! The PROXY protocol on the test node: the test connects from an address of its own choosing
//! (127.0.0.2, not the loopback default), through the local exit server, the client Pod and
//! kube-proxy, to the echo backend Pod, which sends back every byte it received. The header the
//! backend got must name the test's own address; v1, then v2 after the annotation changes (a
//! push to the same exit server), then no header at all once the annotation is gone.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::NEEDS_ENV;
use crate::common::eventually;
use crate::common::tunnels::{active, fast_tunnel_settings, finish_tunnels, host_id, host_ip, ingress_ip, service};
use crate::node::tunnels::{ACTIVE, BACKEND_PORTS as BACKEND, NodeTunnel};

/// The test's own source address.
const VISITOR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PAYLOAD: &[u8] = b"ping through the tunnel";

/// Connects from [`VISITOR`] to `ip:port`, sends [`PAYLOAD`] and returns the visitor's address and
/// what the backend received, as it echoed it (without its `<port>\n` greeting).
async fn through(ip: IpAddr, port: u16) -> Option<(SocketAddr, Vec<u8>)> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::new(VISITOR.into(), 0)).ok()?;
    let mut conn =
        tokio::time::timeout(Duration::from_secs(5), socket.connect(SocketAddr::new(ip, port))).await.ok()?.ok()?;
    let visitor = conn.local_addr().ok()?;
    conn.write_all(PAYLOAD).await.ok()?;
    conn.shutdown().await.ok()?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut got)).await.ok()?.ok()?;
    let greeting = format!("{port}\n");
    Some((visitor, got.strip_prefix(greeting.as_bytes())?.to_vec()))
}

/// What the backend must have received from `visitor` on `exit:port` with `version`.
fn wanted(version: Option<&str>, visitor: SocketAddr, exit: SocketAddr) -> Vec<u8> {
    let header = match version {
        Some("v1") => {
            format!("PROXY TCP4 {} {} {} {}\r\n", visitor.ip(), exit.ip(), visitor.port(), exit.port()).into_bytes()
        }
        Some(_) => {
            let header = skyport::tunnel::proxy::header(providers::ProxyProtocol::V2, visitor, exit);
            // Read back with the crate's own parser: the addresses are the visitor's and the exit server's.
            let parsed = ppp::v2::Header::try_from(header.as_slice()).unwrap();
            assert_eq!(parsed.addresses, ppp::v2::Addresses::from((visitor, exit)));
            header
        }
        None => Vec::new(),
    };
    [header.as_slice(), PAYLOAD].concat()
}

async fn set_annotation(services: &kube::Api<k8s_openapi::api::core::v1::Service>, value: Option<&str>) {
    let patch = json!({"metadata": {"annotations": {"skyport.dev/proxy-protocol": value}}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_backend_gets_the_test_clients_own_address_in_v1_then_v2_and_no_header_without_the_annotation() {
    let _ = NEEDS_ENV;
    let web = service(
        "web",
        Some("skyport.dev/tunnel"),
        json!({"skyport.dev/proxy-protocol": "v1"}),
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    );
    let Some(NodeTunnel { ns, op, services, tunnels, turn: _turn, .. }) =
        NodeTunnel::start_with("tun-proxy", fast_tunnel_settings(), BACKEND, None, web).await
    else {
        return;
    };
    let tunnel = active(&tunnels, "web-tunnel", ACTIVE).await;
    let ip: IpAddr = host_ip(&tunnel).parse().unwrap();
    let exit = SocketAddr::new(ip, 8080);
    let svc = eventually("Service ingress set", Duration::from_secs(20), || async {
        let s = services.get("web").await.ok()?;
        (ingress_ip(&s)? == ip.to_string()).then_some(s)
    })
    .await;
    let ingress = &svc.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0];
    assert_eq!(ingress.ip_mode.as_deref(), Some("Proxy"), "in-cluster clients still go through the exit server");

    for version in [Some("v1"), Some("v2"), None] {
        if version != Some("v1") {
            set_annotation(&services, version).await;
        }
        eventually(&format!("the backend gets {version:?} from {VISITOR}"), ACTIVE, || async {
            let (visitor, got) = through(ip, 8080).await?;
            assert_eq!(visitor.ip(), IpAddr::from(VISITOR));
            (got == wanted(version, visitor, exit)).then_some(())
        })
        .await;
        // status.ports says what the server writes.
        let now = eventually(&format!("status.ports with {version:?}"), Duration::from_secs(20), || async {
            let t = tunnels.get("web-tunnel").await.ok()?;
            let recorded = serde_json::to_value(&t.status.as_ref()?.ports).ok()?;
            (recorded[0]["proxyProtocol"].as_str() == version).then_some(t)
        })
        .await;
        assert_eq!(host_id(&now), host_id(&tunnel), "a push to the same exit server, not a new one");
    }
    finish_tunnels(op, ns).await;
}

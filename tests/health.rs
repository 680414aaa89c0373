//! The end-to-end health check through a real tunnel: `skyport tunnel server` and
//! `skyport tunnel client` processes on loopback addresses, the health service rendered by
//! `skyport::tunnel`. The probe passes only while that server serves that client: not before the
//! client connects, not with another tunnel's token, not after the client is gone.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::eventually;
use common::kubelet::skyport_exe;
use providers::exit::userdata::{ExitServer, NoiseKeypair, TunnelClient, render_client_toml, render_server_toml_on};
use skyport::tunnel::{ProbeError, health_client_service, health_server_service, probe};

pub(crate) fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port()
}

pub(crate) fn spawn(args: &[&str], config: &std::path::Path, log: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(skyport_exe())
        .args(args)
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_health_check_passes_only_while_the_exit_server_serves_this_client() {
    // An address of its own in 127.0.0.0/8, like the local provider's exit servers.
    let ip = format!("127.78.{}.{}", rand::random::<u8>(), 1 + rand::random::<u8>() % 250);
    let (control, health, responder) = (free_port(&ip), free_port(&ip), free_port("127.0.0.1"));
    let keys = NoiseKeypair::generate();
    let token = format!("{:032x}", rand::random::<u128>());
    let dir = std::env::temp_dir().join(format!("skyport-health-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();

    let server = ExitServer {
        control_port: control,
        noise_private_key: keys.private_key.clone(),
        services: vec![health_server_service(health, &token)],
    };
    std::fs::write(dir.join("server.toml"), render_server_toml_on(&server, &ip).unwrap()).unwrap();
    let _server = spawn(&["tunnel", "server", "--config"], &dir.join("server.toml"), &dir.join("server.log"));
    let health_addr: SocketAddr = format!("{ip}:{health}").parse().unwrap();

    // The server runs, but no client serves it: the health port is not even published.
    eventually("the exit server listening", Duration::from_secs(20), || async {
        tokio::net::TcpStream::connect((ip.as_str(), control)).await.ok().map(drop)
    })
    .await;
    let before = probe(health_addr, &token, Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(before, ProbeError::Connect(..)), "{before}");

    let client = TunnelClient {
        remote_addr: format!("{ip}:{control}"),
        server_public_key: keys.public_key.clone(),
        services: vec![health_client_service(responder, &token)],
    };
    std::fs::write(dir.join("client.toml"), render_client_toml(&client).unwrap()).unwrap();
    let mut client_process =
        spawn(&["tunnel", "client", "--config"], &dir.join("client.toml"), &dir.join("client.log"));

    eventually("the health check passing through the tunnel", Duration::from_secs(30), || async {
        probe(health_addr, &token, Duration::from_secs(2)).await.ok()
    })
    .await;
    // Another tunnel's token does not verify: the answer is bound to this tunnel's secret.
    let other = probe(health_addr, "another-tunnels-token", Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(other, ProbeError::WrongAnswer(_)), "{other}");

    // The client goes away: the check fails again.
    client_process.kill().await.unwrap();
    eventually("the health check failing without the client", Duration::from_secs(30), || async {
        probe(health_addr, &token, Duration::from_secs(2)).await.err()
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// rathole binds a service's port only once a client connects for it, and one it cannot bind
/// would leave that service dead behind a passing health check: the exit server refuses to start
/// with a port it cannot listen on, and names it.
#[tokio::test(flavor = "multi_thread")]
async fn an_exit_server_that_cannot_listen_on_a_service_port_does_not_start() {
    let ip = format!("127.79.{}.{}", rand::random::<u8>(), 1 + rand::random::<u8>() % 250);
    let taken = std::net::TcpListener::bind((ip.as_str(), 0)).unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let dir = std::env::temp_dir().join(format!("skyport-ports-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = "t0k";
    let mut server = ExitServer {
        control_port: free_port(&ip),
        noise_private_key: NoiseKeypair::generate().private_key,
        services: vec![health_server_service(free_port(&ip), token)],
    };
    server.services.push(providers::TunnelService {
        name: "tcp-web".into(),
        protocol: providers::Protocol::Tcp,
        port: taken_port,
        token: token.into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    });
    std::fs::write(dir.join("server.toml"), render_server_toml_on(&server, &ip).unwrap()).unwrap();
    let out = tokio::process::Command::new(skyport_exe())
        .args(["tunnel", "server", "--config"])
        .arg(dir.join("server.toml"))
        .env("NO_COLOR", "1")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out).await.expect("the server gave up").unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "it started: {said}");
    assert!(said.contains(&format!("tcp-web (tcp {ip}:{taken_port})")), "{said}");
    let control = tokio::net::TcpStream::connect((ip.as_str(), server.control_port)).await;
    assert!(control.is_err(), "no control port either: nothing to pass a health check");
    std::fs::remove_dir_all(&dir).unwrap();
}

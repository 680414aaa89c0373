//! The local provider with real tunnel processes (`skyport tunnel server|client`, the workspace's
//! skyport binary: `SKYPORT_EXE`, which tests/run.sh exports after building it, else
//! target/debug/skyport): the shared contract, real bytes through a real server and client,
//! reconfiguration in place, and a server killed out of band.

mod contract;
mod local_support;

use std::time::Duration;

use local_support::*;
use providers::exit::userdata::{ClientService, ExitServer, NoiseKeypair, Protocol, TunnelClient, TunnelService};
use providers::hosts::{HostProvider, HostState, MANAGED_BY_VALUE, TAG_MANAGED_BY};
use tokio::net::{TcpStream, UdpSocket};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn local_keeps_the_host_provider_contract() {
    let (p, _dir) = provider("contract");
    let mut request = contract::request("skyport-web-tunnel", contract::UID);
    // A real key: rathole refuses to start without one.
    request.server.noise_private_key = NoiseKeypair::generate().private_key;
    request.server.services[0].port = 18080;
    let expect = contract::Expect {
        created_provisioning: false,
        polls_until_running: 3,
        interval: Duration::from_millis(100),
        public_address: false,
    };
    contract::run_with(&p, &request, expect).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn real_bytes_flow_through_a_local_exit_server_and_ports_change_in_place() {
    let (p, _dir) = provider("bytes");
    let keys = NoiseKeypair::generate();
    let service = |name: &str, protocol, port| TunnelService {
        name: name.into(),
        protocol,
        port,
        token: "tok".into(),
        source_ranges: Vec::new(),
        proxy_protocol: None,
        bind: None,
    };
    let mut server = ExitServer {
        control_port: 2333,
        noise_private_key: keys.private_key.clone(),
        services: vec![service("tcp-8080", Protocol::Tcp, 8080), service("udp-5353", Protocol::Udp, 5353)],
    };
    let mut request = contract::request("skyport-bytes", &contract::fresh_uid());
    request.server = server.clone();
    let host = p.create(&request).await.unwrap();
    let ip = host.public_ipv4.clone().unwrap();
    assert!(ip.starts_with("127.77."), "{ip}");

    let (web, admin, dns) = (tcp_backend("web").await, tcp_backend("admin").await, udp_backend().await);
    let client = |services: Vec<ClientService>| TunnelClient {
        remote_addr: format!("{ip}:2333"),
        server_public_key: keys.public_key.clone(),
        services,
    };
    let cs = |name: &str, protocol, local: &str| ClientService {
        name: name.into(),
        protocol,
        token: "tok".into(),
        local_addr: local.into(),
    };
    let (mut rathole_client, config) = start_client(
        "bytes",
        &client(vec![
            cs("tcp-8080", Protocol::Tcp, &web),
            cs("tcp-9090", Protocol::Tcp, &admin),
            cs("udp-5353", Protocol::Udp, &dns),
        ]),
    );

    let (tag, intact) = until("TCP through the tunnel", || tcp_roundtrip(format!("{ip}:8080"))).await;
    assert_eq!((tag.as_str(), intact), ("web", true));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    until("UDP through the tunnel", || async {
        udp.send_to(b"ping", format!("{ip}:5353")).await.ok()?;
        let mut buf = [0u8; 16];
        let (n, _) = tokio::time::timeout(Duration::from_millis(500), udp.recv_from(&mut buf)).await.ok()?.ok()?;
        (&buf[..n] == b"ping").then_some(())
    })
    .await;
    assert!(TcpStream::connect(format!("{ip}:9090")).await.is_err(), "9090 is not exposed yet");

    // A port added on the server side: same host, same address, reloaded without a restart.
    server.services.push(service("tcp-9090", Protocol::Tcp, 9090));
    assert!(p.reconfigure(&host.id, &server).await.unwrap());
    let (tag, intact) = until("the added port", || tcp_roundtrip(format!("{ip}:9090"))).await;
    assert_eq!((tag.as_str(), intact), ("admin", true));
    // And removed again.
    server.services.retain(|s| s.port != 9090);
    p.reconfigure(&host.id, &server).await.unwrap();
    until("the removed port closed", || async {
        TcpStream::connect(format!("{ip}:9090")).await.is_err().then_some(())
    })
    .await;
    assert!(tcp_roundtrip(format!("{ip}:8080")).await.is_some(), "the other port still works");
    let after = p.get(&host.id).await.unwrap().unwrap();
    assert_eq!((after.state, after.public_ipv4.as_deref()), (HostState::Running, Some(ip.as_str())));

    // Killed out of band: reads as stopped; deleting it (twice) is fine and leaves nothing.
    let pid = std::fs::read_to_string(p.host_dir(&host.id).join("pid")).unwrap();
    assert!(std::process::Command::new("kill").args(["-9", pid.trim()]).status().unwrap().success());
    until("the killed server reads as stopped", || async {
        (p.get(&host.id).await.unwrap()?.state == HostState::Stopped).then_some(())
    })
    .await;
    p.delete(&host.id).await.unwrap();
    p.delete(&host.id).await.unwrap();
    assert!(!p.host_dir(&host.id).exists());
    assert!(p.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().is_empty());
    let _ = rathole_client.kill().await;
    let _ = std::fs::remove_file(&config);
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn two_hosts_created_at_once_get_distinct_addresses_and_carry_the_same_port() {
    let (p, _dir) = provider("two");
    let keys = NoiseKeypair::generate();
    let server = |services| ExitServer { control_port: 2333, noise_private_key: keys.private_key.clone(), services };
    let tcp = tcp_service;
    let mut request = contract::request("skyport-two", &contract::fresh_uid());
    request.server = server(vec![tcp(18081)]);
    let (a, b) = tokio::join!(p.create(&request), p.create(&request));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.public_ipv4, b.public_ipv4);

    // Reconfigured right after create (the watcher is up by then): both add the same port 18082.
    let both = server(vec![tcp(18081), tcp(18082)]);
    for h in [&a, &b] {
        assert!(p.reconfigure(&h.id, &both).await.unwrap());
    }
    let mut clients = Vec::new();
    for (h, tag) in [(&a, "a"), (&b, "b")] {
        let backend = tcp_backend(tag).await;
        let ip = h.public_ipv4.clone().unwrap();
        let services = [18081, 18082]
            .map(|port| ClientService {
                name: format!("tcp-{port}"),
                protocol: Protocol::Tcp,
                token: "tok".into(),
                local_addr: backend.clone(),
            })
            .to_vec();
        let client =
            TunnelClient { remote_addr: format!("{ip}:2333"), server_public_key: keys.public_key.clone(), services };
        clients.push(start_client(tag, &client));
    }
    for (h, tag) in [(&a, "a"), (&b, "b")] {
        let ip = h.public_ipv4.clone().unwrap();
        for port in [18081, 18082] {
            let (got, intact) = until("bytes through each host", || tcp_roundtrip(format!("{ip}:{port}"))).await;
            assert_eq!((got.as_str(), intact), (tag, true), "{ip}:{port}");
        }
    }
    for h in [&a, &b] {
        p.delete(&h.id).await.unwrap();
    }
    for (_, config) in clients {
        let _ = std::fs::remove_file(config);
    }
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn an_address_someone_else_listens_on_is_skipped() {
    // A leftover process (or another state directory's host) on the first address of the range.
    let busy = std::net::TcpListener::bind("127.77.250.1:2333").unwrap();
    let (p, _dir) = provider_with("busy", skyport(), |s| {
        s.first_address = "127.77.250.1".parse().unwrap();
        s.last_address = "127.77.250.2".parse().unwrap();
    });
    let mut request = contract::request("skyport-busy", &contract::fresh_uid());
    request.server.noise_private_key = NoiseKeypair::generate().private_key;
    request.server.services[0].port = 18083;
    let host = p.create(&request).await.unwrap();
    assert_eq!(host.public_ipv4.as_deref(), Some("127.77.250.2"));
    // The range is full now: a quota error, nothing created.
    let err = p.create(&request).await.unwrap_err();
    assert!(matches!(err, providers::HostError::Quota { provider: "local", .. }), "{err}");
    p.delete(&host.id).await.unwrap();
    // A reserved address skips it too: a server forwarding it could never bind the ports that
    // other server holds there.
    let reservation = providers::hosts::AddressRequest {
        name: "skyport-busy".into(),
        region: None,
        tags: request.tags.clone(),
        host_id: None,
        movable: true,
    };
    let address = p.reserve_address(&reservation).await.unwrap();
    assert_eq!(address.ip, "127.77.250.2");
    p.release_address(&address.id).await.unwrap();
    drop(busy);
}

/// Needs no tunnel binary: the provider is checked with binaries that cannot be a tunnel server.
#[tokio::test]
async fn a_server_that_fails_to_start_is_reported_and_leaves_nothing_behind() {
    let mut request = contract::request("skyport-bad", &contract::fresh_uid());
    request.server.services[0].token = "tok-never-printed".into();
    for binary in ["false", "/nonexistent/skyport"] {
        let (p, dir) = provider_with("fails", binary.into(), |s| s.start_timeout = Duration::from_secs(2));
        let err = p.create(&request).await.unwrap_err();
        assert!(matches!(err, providers::HostError::Unavailable { provider: "local", .. }), "{binary}: {err}");
        assert!(!err.to_string().contains("tok-never-printed"));
        let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.iter().all(|name| !name.to_string_lossy().starts_with("local-")), "{left:?}");
        assert!(p.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().is_empty());
    }
    // A config rathole would refuse is refused before anything runs, as the user's mistake.
    let (p, _dir) = provider_with("invalid", "false".into(), |_| {});
    let mut bad = request.clone();
    bad.server.noise_private_key = "not base64!".into();
    let err = p.create(&bad).await.unwrap_err();
    assert_eq!(err.class(), providers::ErrorClass::Permanent, "{err}");
}

#[tokio::test]
async fn a_corrupt_host_folder_is_reported_by_get_and_skipped_by_list() {
    let (p, _dir) = provider_with("corrupt", "false".into(), |_| {});
    let id = "local-0123456789ab";
    std::fs::create_dir_all(p.host_dir(id)).unwrap();
    std::fs::write(p.host_dir(id).join("host.json"), "{not json").unwrap();
    let err = p.get(id).await.unwrap_err();
    assert!(matches!(err, providers::HostError::Unavailable { provider: "local", .. }), "{err}");
    assert!(p.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().is_empty());
    assert_eq!(p.get("local-ffffffffffff").await.unwrap(), None);
    assert_eq!(p.get("../../etc").await.unwrap(), None, "ids never leave the state directory");
    let err = p.reconfigure("local-ffffffffffff", &contract::exit_server()).await.unwrap_err();
    assert!(matches!(err, providers::HostError::NotFound { provider: "local", .. }), "{err}");
    p.delete(id).await.unwrap();
    assert!(!p.host_dir(id).exists());
    let ops = p.limiter().counters.snapshot();
    assert_eq!((ops["GetHost"], ops["ListHosts"], ops["DeleteHost"], ops["ReconfigureHost"]), (3, 1, 1, 1));
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn local_keeps_the_reserved_address_contract() {
    let (p, _dir) = provider("addresses");
    let mut request = contract::request("skyport-addr", contract::UID);
    request.server.noise_private_key = NoiseKeypair::generate().private_key;
    request.server.services[0].port = 18081;
    let expect = contract::Expect {
        created_provisioning: false,
        polls_until_running: 3,
        interval: Duration::from_millis(100),
        public_address: false,
    };
    contract::run_addresses(&p, &request, None, &expect).await;
}

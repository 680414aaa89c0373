//! The exit server's user data, proven by a real boot: a Debian guest with systemd
//! and cloud-init (`common::guest`) boots with the exact `#cloud-config` the Tunnel controller
//! hands every cloud provider, rendered by the same functions from a Service's ports and fresh
//! credentials. Nothing in it is special-cased: the download URL is the operator's URL template
//! (`--exit-server-url`) pointing at an HTTPS mirror with a CA of its own that this test serves
//! on the host (`common::mirror`), and the digest is derived from the shipped static binary as
//! the operator derives it from itself. The guest installs, downloads and checks the binary,
//! loads its firewall and starts the server under systemd; then real TCP and UDP bytes flow from
//! this host (the "internet") through the guest to backends behind `skyport tunnel client`. A
//! tampered download is refused on the guest.
//!
//! Needs root (systemd-nspawn, network namespaces) and the guest root file system
//! (tests/env/build-guest.sh; tests/run.sh builds it). Where guests cannot boot the tests fail,
//! unless `SKYPORT_SKIP_GUEST_TESTS=1` opts out (`common::guest`).

use crate::common;
use crate::common::guest;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::eventually;
use common::kubelet::{Backends, skyport_exe, tcp_echo, udp_echo};
use common::mirror::https_mirror;
use guest::{Guest, guest_exe, rootfs_or_skip};
use providers::exit::userdata::{InstallReport, render_client_toml, render_cloud_config, render_server_toml};
use providers::guest::HOST_ALIAS;
use sha2::{Digest, Sha256};
use skyport::controllers::tunnel::desired;
use skyport::crd::tunnel::TunnelPort;

const CONTROL_PORT: u16 = 2333;
const HEALTH_PORT: u16 = 2334;

fn ports() -> Vec<TunnelPort> {
    vec![
        TunnelPort { port: 8080, protocol: "TCP".into(), proxy_protocol: None },
        TunnelPort { port: 5353, protocol: "UDP".into(), proxy_protocol: None },
    ]
}

/// The user data exactly as the controller renders it for a host of `credentials`.
fn user_data(credentials: &desired::Credentials, url_template: &str) -> String {
    let server = desired::exit_server(&ports(), credentials, CONTROL_PORT, HEALTH_PORT);
    let settings = skyport::config::TunnelArgs {
        exit_server_url: url_template.to_string(),
        self_exe: guest_exe(),
        ..Default::default()
    };
    render_cloud_config(&server, &settings.exit_server_artifacts().unwrap()).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// `Some(uid)` of the guest process running `cmdline` (guests' processes are this host's too).
fn process_uid(cmdline: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let raw = std::fs::read(entry.path().join("cmdline")).ok()?;
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.trim_end() != cmdline {
            return None;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
        status.lines().find(|l| l.starts_with("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
    })
}

/// The modules cloud-init reports as failed (`result.json`), once it has finished. cloud-init
/// writes that file after `boot-finished`, so it may be missing or half written for a moment.
async fn cloud_init_errors(guest: &Guest) -> Vec<String> {
    let mut text = String::new();
    for _ in 0..150 {
        text = guest.read("/var/lib/cloud/data/result.json");
        if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let result: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("result.json: {e}: {text}"));
    let errors = result["v1"]["errors"].as_array().expect("an errors list");
    // Each error reads "('<module>', <exception>)".
    errors.iter().map(|e| e.as_str().unwrap_or_default().split('\'').nth(1).unwrap_or_default().to_string()).collect()
}

async fn connects(ip: Ipv4Addr, port: u16, within: Duration) -> bool {
    matches!(tokio::time::timeout(within, tokio::net::TcpStream::connect((ip, port))).await, Ok(Ok(_)))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian guest: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn a_guest_booted_with_the_user_data_carries_tcp_and_udp_to_the_cluster() {
    let Some(rootfs) = rootfs_or_skip("a_guest_booted_with_the_user_data_carries_tcp_and_udp_to_the_cluster") else {
        return;
    };
    let mut guest = Guest::new(&rootfs);
    let binary = std::fs::read(guest_exe()).unwrap();
    let digest = sha256_hex(&binary);
    let mirror = https_mirror(binary).await;
    guest.trust(&mirror.ca_pem()).unwrap();
    let credentials = desired::Credentials::generate();
    let user_data = user_data(&credentials, &mirror.url_template);
    assert!(user_data.contains(&digest) && user_data.contains(&format!("https://{HOST_ALIAS}:")));
    guest.boot(&user_data);

    // The control port answers once cloud-init has installed and started the server.
    let ip = guest.ip;
    let mut up = false;
    for _ in 0..900 {
        if connects(ip, CONTROL_PORT, Duration::from_millis(200)).await {
            up = true;
            break;
        }
        if let Some(status) = guest.exited() {
            panic!("the guest powered off ({status}) before serving\n{}", guest.diagnostics());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(up, "the exit server did not listen on {ip}:{CONTROL_PORT}\n{}", guest.diagnostics());

    // What runs is the checked binary, as the unprivileged user, under systemd.
    let installed = std::fs::read(guest.root().join("usr/local/bin/skyport")).unwrap();
    assert_eq!(sha256_hex(&installed), digest);
    let passwd = guest.read("/etc/passwd");
    let skyport_uid: u32 = passwd
        .lines()
        .find_map(|l| l.strip_prefix("skyport:x:")?.split(':').next()?.parse().ok())
        .expect("the skyport user exists on the guest");
    let uid = process_uid("/usr/local/bin/skyport tunnel server --config /etc/skyport/server.toml")
        .expect("the exit server process runs");
    assert_eq!(uid, skyport_uid, "the server runs as the skyport user");
    assert_eq!(mirror.downloads(), 1, "one download");
    // The install script says so on the console once the server has stayed up a moment.
    let started = eventually("the install report on the console", Duration::from_secs(60), || async {
        InstallReport::find(&guest.console()).filter(|r| *r == InstallReport::Started)
    })
    .await;
    assert_eq!(started, InstallReport::Started);

    // The in-cluster side: `skyport tunnel client`, as the client Deployment runs it, in front of
    // echo backends on loopback (the Service's endpoints).
    let backends = Backends::default();
    // The responder on a free loopback port: this host may run other tests' clients.
    let health_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = std::env::temp_dir().join(format!("skyport-guest-client-{}", guest.name));
    std::fs::create_dir_all(&dir).unwrap();
    let mut client = start_client(&dir, &ports(), &credentials, ip, health_addr, &backends).await;

    // Real bytes from this host's address, through the guest, to the backends.
    let payload: Vec<u8> = (0..256 * 1024).map(|_| rand::random::<u8>()).collect();
    let (tag, echoed) = eventually("TCP through the guest", Duration::from_secs(60), || {
        let payload = payload.clone();
        async move { tcp_echo(&ip.to_string(), 8080, &payload).await }
    })
    .await;
    assert_eq!(tag, 8080);
    assert!(echoed == payload, "the TCP payload came back changed");
    let reply = eventually("UDP through the guest", Duration::from_secs(30), || async {
        udp_echo(&ip.to_string(), 5353, b"ping over udp").await
    })
    .await;
    assert_eq!(reply, b"5353:ping over udp");

    // The operator's health check passes through the guest's firewall to the client's responder.
    let health = std::net::SocketAddr::from((ip, HEALTH_PORT));
    eventually("the health check through the guest", Duration::from_secs(30), || async {
        skyport::tunnel::probe(health, &credentials.token, Duration::from_secs(3)).await.ok()
    })
    .await;

    // The firewall drops every other port: no answer at all, not even a refusal.
    let closed = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect((ip, 22))).await;
    assert!(closed.is_err(), "port 22 must be dropped by the guest's firewall, got {closed:?}");
    assert!(guest.read("/etc/nftables.conf").contains("policy drop"));

    // Every cloud-init module succeeded: users, files, packages, the install script.
    for _ in 0..300 {
        if guest.cloud_init_done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(guest.cloud_init_done(), "cloud-init did not finish\n{}", guest.diagnostics());
    assert_eq!(cloud_init_errors(&guest).await, Vec::<String>::new(), "{}", guest.diagnostics());

    // The Service's ports change (8080/TCP out, 9090/TCP in): the operator pushes the new config
    // to the running server, through its push port, as every cloud adapter's reconfigure does;
    // the client is restarted with its new config, as its Deployment would roll. Same guest,
    // same address; the new port carries bytes, and the firewall followed: the removed port is
    // dropped, not merely refused.
    let changed = vec![
        TunnelPort { port: 9090, protocol: "TCP".into(), proxy_protocol: None },
        TunnelPort { port: 5353, protocol: "UDP".into(), proxy_protocol: None },
    ];
    let server = desired::exit_server(&changed, &credentials, CONTROL_PORT, HEALTH_PORT);
    let started = std::time::Instant::now();
    let pushed_at = providers::exit::push::now_generation();
    let pushed = providers::exit::push::reconfigure_host(
        "guest",
        &ip.to_string(),
        &server,
        &render_server_toml(&server).unwrap(),
    )
    .await
    .unwrap();
    assert!(pushed, "the guest's exit server took the push");
    // Gone before the new one binds the same health address.
    client.kill().await.unwrap();
    let _client = start_client(&dir, &changed, &credentials, ip, health_addr, &backends).await;
    let (tag, echoed) = eventually("TCP on the new port through the guest", Duration::from_secs(30), || {
        let payload = payload.clone();
        async move { tcp_echo(&ip.to_string(), 9090, &payload).await }
    })
    .await;
    let took = started.elapsed();
    assert_eq!(tag, 9090);
    assert!(echoed == payload, "the TCP payload came back changed");
    eprintln!("guest: Service port change -> bytes on the new port, same address: {took:?}");
    let nft = guest.read("/etc/nftables.conf");
    assert!(nft.contains("9090") && !nft.contains("8080"), "{nft}");
    let removed = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect((ip, 8080))).await;
    assert!(removed.is_err(), "8080 must be dropped by the guest's firewall after the push, got {removed:?}");
    assert_eq!(udp_echo(&ip.to_string(), 5353, b"still").await.as_deref(), Some(&b"5353:still"[..]));
    // Generations are milliseconds since the epoch at least (the guest shares the host's clock).
    let generation: u64 = guest.read("/etc/skyport/server.toml.generation").trim().parse().unwrap();
    assert!(generation >= pushed_at, "generation {generation}, pushed at {pushed_at}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `skyport tunnel client` for `ports` of `credentials` against the guest at `ip`,
/// forwarding to `backends` and answering the health check on `health_addr`; killed on drop.
async fn start_client(
    dir: &std::path::Path,
    ports: &[TunnelPort],
    credentials: &desired::Credentials,
    ip: Ipv4Addr,
    health_addr: std::net::SocketAddr,
    backends: &Backends,
) -> tokio::process::Child {
    let mut client = desired::client(ports, credentials, &ip.to_string(), (CONTROL_PORT, HEALTH_PORT), "127.0.0.1");
    for service in &mut client.services {
        if service.name == skyport::tunnel::HEALTH_SERVICE {
            service.local_addr = health_addr.to_string();
            continue;
        }
        // Service names read `<protocol>-<port>`.
        let (protocol, port) = service.name.split_once('-').unwrap();
        service.local_addr = backends.addr(port.parse().unwrap(), protocol).await.to_string();
    }
    let config = dir.join("client.toml");
    std::fs::write(&config, render_client_toml(&client).unwrap()).unwrap();
    tokio::process::Command::new(skyport_exe())
        .args(["tunnel", "client", "--config"])
        .arg(&config)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.join("client.log")).unwrap())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots a Debian guest: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn a_tampered_binary_is_refused_on_the_guest() {
    let Some(rootfs) = rootfs_or_skip("a_tampered_binary_is_refused_on_the_guest") else { return };
    let mut guest = Guest::new(&rootfs);
    let mut tampered = std::fs::read(guest_exe()).unwrap();
    tampered.extend_from_slice(b"\0tampered");
    let mirror = https_mirror(tampered).await;
    guest.trust(&mirror.ca_pem()).unwrap();
    guest.boot(&user_data(&desired::Credentials::generate(), &mirror.url_template));

    for _ in 0..900 {
        if guest.cloud_init_done() || guest.exited().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(guest.cloud_init_done(), "cloud-init did not finish\n{}", guest.diagnostics());
    assert_eq!(mirror.downloads(), 1, "the guest downloaded the binary");
    let output = guest.cloud_init_output();
    assert!(output.contains("refusing to run it"), "{}", guest.diagnostics());
    // One line on the console says so, as the operator reads it.
    let console = guest.console();
    assert_eq!(
        InstallReport::find(&console),
        Some(InstallReport::ArtifactRefused("digest-mismatch".into())),
        "{}",
        guest.diagnostics()
    );
    // Nothing unchecked is left where it could run, the service never started, and cloud-init
    // reports the failed script (what a cloud console shows).
    assert!(!guest.root().join("usr/local/bin/skyport").exists());
    assert!(!guest.root().join("usr/local/bin/skyport.download").exists());
    // No tunnel server: the control port answers every connection with the report alone, which
    // is how the operator hears of it where the provider keeps no console.
    let served = common::guest::served_on(&guest.ip.to_string(), CONTROL_PORT).await;
    assert_eq!(
        InstallReport::find(&served),
        Some(InstallReport::ArtifactRefused("digest-mismatch".into())),
        "{served:?}"
    );
    assert_eq!(served.lines().count(), 1, "the report line and nothing else: {served:?}");
    assert_eq!(
        cloud_init_errors(&guest).await,
        ["scripts-user"],
        "cloud-init reports the failed install, nothing else"
    );
}

//! Benchmarks of the Tunnel path against the real test environment, with the
//! local provider and the real tunnel server and client (`skyport tunnel server|client`, rathole
//! built in; in `--profile dev` runs that is the dev build of skyport):
//!
//! 1. **time to ingress**: from creating a LoadBalancer Service to its
//!    `status.loadBalancer.ingress[0].ip`, against the provider's own part measured in the same
//!    run (a direct `LocalProvider::create`, which returns once the exit server listens). The
//!    difference is skyport's overhead (Service → Tunnel → finalizer → Secret → host → status →
//!    Deployment → ingress). Target: ≤ 1 s.
//! 2. **the data plane against peers measured in the same run**: the same backends reached
//!    through the tunnel (client → exit server → rathole Noise channel → rathole client →
//!    backend), through OpenSSH local port forwarding (`ssh -L`, sshd on a loopback port with
//!    throwaway keys; aes128-gcm and chacha20-poly1305), through a plain userspace TCP relay
//!    (tokio, in this process; and socat), and straight to the backend. For each: throughput of a
//!    bulk transfer, p50/p99 of small request/response round trips on one connection, and new
//!    connections per second (connect, 1-byte echo, close). Targets: throughput ≥ 1.0 × OpenSSH
//!    and ≥ 0.5 × the plain relay; added latency (path p50/p99 − direct p50/p99) ≤ 1.2 × OpenSSH's.
//!
//! 3. **a Service port change**: from patching a port onto the Service (9002/TCP) to the first
//!    bytes echoed through the new port, at the same address and on the same exit server (the
//!    config pushed to the running server, as on cloud VMs; the client pod rolled, as the
//!    kubelet would). Target: ≤ 10 s. A new address or a new host is an error.
//!
//! 4. **`--failover`**: a highly available Tunnel on the test node (client Pods of skyport's image)
//!    while its active exit server is killed, its active exit server hangs (SIGSTOP), its active
//!    client Pod goes for good, and both clients roll for a config change: when the address
//!    moved, the longest gap between answered requests (one every 100 ms), the requests failed
//!    (`tunnel/failover.rs`; `--hung` runs only the hung server, and not the EC2 arm). Then the same
//!    Tunnel on EC2 semantics against LocalStack, through the operator: from the active instance's
//!    termination, and from its check starting to fail, to the Elastic IP on the other instance
//!    (`tunnel/failover_ec2.rs`; no bytes flow there). `--ec2` runs only that arm. 3 runs, 1 with
//!    `--quick`; it replaces 1-3.
//!
//! 5. **`--guest`**: the same path against booted guests (the `guest` provider), from the
//!    Service to the first byte, for a port change, and to recover from a guest powered off
//!    behind skyport's back (`tunnel/guest.rs`; root, tests/env/build-guest.sh and the static
//!    build in `SKYPORT_GUEST_EXE`). 3 runs, 1 with `--quick`; it replaces 1-3.
//!
//! 6. **`--guest --failover`**: a highly available Tunnel on booted guests while its active guest
//!    powers off: when the address moved, the longest gap between answered requests (one every
//!    100 ms), the requests failed (`tunnel/guest_failover.rs`). 3 runs, 1 with `--quick`.
//!
//! 7. **`--proxy`**: the bulk transfer through a Service with the PROXY protocol header (v2) and
//!    through one without, two exit servers in the same run, alternating (`tunnel/proxy.rs`). 7
//!    runs of 256 MiB, 2 of 16 MiB with `--quick`; it replaces 1-3.
//!
//! The tunnel runs the skyport binary of the profile the benchmark is built with (the exit server
//! and the client alike), so `cargo bench` (release) measures a release tunnel; with
//! `SKYPORT_BENCH_EXE=$(tests/env/build-musl.sh)` it runs the static musl binary exit servers
//! download. OpenSSH and socat come from tests/env/install-bench-peers.sh.
//!
//! Medians of several runs; ratios from the same run. Figures only, no timed assertions: the
//! exit status is non-zero only when something is broken (no ingress, bytes corrupted).
//!
//! ```sh
//! eval "$(tests/env.sh up)"
//! tests/env/install-bench-peers.sh
//! cargo bench --bench tunnel                # 7 runs, 256 MiB transfers, 2000 round trips, 3 s of connects
//! cargo bench --bench tunnel -- --quick     # 2 runs, 16 MiB, 200 round trips, 0.5 s (CI, tests/run.sh)
//! cargo bench --bench tunnel -- --guest     # as root, with SKYPORT_GUEST_ROOTFS and SKYPORT_GUEST_EXE
//! cargo bench --bench tunnel -- --failover  # with the node, SKYPORT_IMAGE and SKYPORT_ECHO_IMAGE as tests/run.sh sets them
//! cargo bench --bench tunnel -- --failover --ec2  # the EC2 arm alone (LocalStack, no node)
//! cargo bench --bench tunnel -- --failover --hung  # the hung exit server alone (the node)
//! cargo bench --bench tunnel -- --guest --failover  # as root, as --guest
//! cargo bench --bench tunnel -- --proxy     # with and without the PROXY protocol header
//! ```
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it only says how to run it.

#[path = "../tests/common/mod.rs"]
mod common;
/// The test node's harness (tests/node.rs) and the command runner it builds on, where the
/// integration tests keep it (`crate::deploy::harness`).
#[allow(dead_code)]
#[path = "../tests/deploy/harness.rs"]
mod deploy_harness;
#[allow(dead_code)]
#[path = "entry/mod.rs"]
mod entry;
mod deploy {
    pub(crate) use crate::deploy_harness as harness;
}
/// The EC2 pair of the integration tests (tests/tunnel_ec2_ha.rs), for the EC2 failover arm.
#[allow(dead_code)]
#[path = "../tests/tunnel_ec2_ha/pair.rs"]
mod ec2_pair;
#[path = "tunnel/failover.rs"]
mod failover;
#[path = "tunnel/failover_ec2.rs"]
mod failover_ec2;
#[path = "tunnel/guest_failover.rs"]
mod guest_failover;
#[allow(dead_code)]
#[path = "../tests/node.rs"]
mod node;
#[path = "tunnel/guest.rs"]
mod on_guests;
#[path = "tunnel/peers.rs"]
mod peers;
#[path = "tunnel/proxy.rs"]
mod proxy;
use common::tunnels;

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use common::TestNs;
use common::kubelet::{Backends, ClientRunner};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use providers::HostProvider;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Options {
    runs: usize,
    megabytes: usize,
    round_trips: usize,
    connect_for: Duration,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 }
}

fn service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel",
                 "ports": [{"name": "data", "port": 9000, "protocol": "TCP"},
                           {"name": "echo", "port": 9001, "protocol": "TCP"}]},
    }))
    .expect("valid Service")
}

/// Seconds from creating the Service to its ingress IP.
async fn time_to_ingress(services: &Api<Service>, name: &str) -> anyhow::Result<(f64, String)> {
    let started = Instant::now();
    services.create(&PostParams::default(), &service(name)).await?;
    loop {
        let s = services.get(name).await?;
        let ip = s.status.and_then(|s| s.load_balancer).and_then(|lb| lb.ingress).and_then(|i| i.first()?.ip.clone());
        if let Some(ip) = ip {
            return Ok((started.elapsed().as_secs_f64(), ip));
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("Service {name} got no ingress within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A sink that reads everything and answers with the byte count, so the sender knows every byte
/// arrived (not just left its buffer).
async fn sink() -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                let mut total: u64 = 0;
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => total += n as u64,
                    }
                }
                let _ = conn.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    Ok(addr)
}

/// A plain userspace TCP relay (accept, connect, copy both ways) in front of `target`: the
/// cheapest proxy possible, as a reference for what any extra hop costs on this machine.
async fn relay(target: std::net::SocketAddr) -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok(addr)
}

/// MB/s of sending `megabytes` to `addr` and hearing back that all of it arrived.
async fn throughput(addr: &str, megabytes: usize) -> anyhow::Result<f64> {
    let chunk = vec![0x5au8; 1 << 20];
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
    for _ in 0..megabytes {
        conn.write_all(&chunk).await?;
    }
    conn.shutdown().await?;
    let mut count = [0u8; 8];
    conn.read_exact(&mut count).await.context("the receiver's byte count")?;
    let elapsed = started.elapsed().as_secs_f64();
    let got = u64::from_be_bytes(count);
    if got != (megabytes as u64) << 20 {
        bail!("{got} bytes arrived of {}", (megabytes as u64) << 20);
    }
    Ok(megabytes as f64 * 1.048_576 / elapsed)
}

async fn run(options: Options) -> anyhow::Result<()> {
    let ns = TestNs::new("bench-tun").await;
    let op = tunnels::TunnelOperator::start(&ns, tunnels::fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let backends = Backends::default();
    let (mut total, mut provider_only, mut overhead, mut port_change) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let sink_addr = sink().await?;
    let echo_addr = peers::echo().await?;
    let mut paths = vec![peers::Path::new("direct", sink_addr.to_string(), echo_addr.to_string())];
    paths.push(peers::Path::new("tunnel (rathole)", String::new(), String::new()));
    let ssh = peers::Ssh::start(&[sink_addr, echo_addr]).await;
    match &ssh {
        Ok(ssh) => {
            for (cipher, ports) in &ssh.forwards {
                paths.push(peers::Path::new(
                    &format!("OpenSSH -L {cipher}"),
                    format!("127.0.0.1:{}", ports[0]),
                    format!("127.0.0.1:{}", ports[1]),
                ));
            }
        }
        Err(e) => println!("OpenSSH peer not available ({e:#}): run tests/env/install-bench-peers.sh"),
    }
    paths.push(peers::Path::new(
        "plain relay (tokio)",
        relay(sink_addr).await?.to_string(),
        relay(echo_addr).await?.to_string(),
    ));
    let socat = peers::Socat::start(&[sink_addr, echo_addr]).await;
    match &socat {
        Ok(s) => paths.push(peers::Path::new(
            "plain relay (socat)",
            format!("127.0.0.1:{}", s.ports[0]),
            format!("127.0.0.1:{}", s.ports[1]),
        )),
        Err(e) => println!("socat peer not available ({e:#})"),
    }

    for run in 0..options.runs {
        // The provider's own part: the same create the controller makes, straight to the adapter.
        let mut request = tunnels_request();
        request.name = format!("bench-direct-{run}");
        let started = Instant::now();
        let host = op.local.create(&request).await?;
        let direct_create = started.elapsed().as_secs_f64();
        op.local.delete(&host.id).await?;

        let name = format!("web-{run}");
        // The tunnel's backends are the same sink and echo server as every other path's. The
        // client runs from the start, as the kubelet would run its Deployment: the ingress is
        // published only once the health check went through it, so time to ingress includes it.
        backends.set(9000, "tcp", sink_addr).await;
        backends.set(9001, "tcp", echo_addr).await;
        let _client =
            ClientRunner::start(ns.client.clone(), &ns.name, &format!("{name}-tunnel-client"), backends.clone());
        let (seconds, ip) = time_to_ingress(&services, &name).await?;
        total.push(seconds);
        provider_only.push(direct_create);
        overhead.push(seconds - direct_create);
        paths[1].bulk = format!("{ip}:9000");
        paths[1].echo = format!("{ip}:9001");
        let deadline = Instant::now() + Duration::from_secs(30);
        while throughput(&paths[1].bulk, 1).await.is_err() || peers::round_trips(&paths[1].echo, 1, 64).await.is_err() {
            if Instant::now() > deadline {
                bail!("the tunnel of {name} never carried bytes");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut line = format!("run {}: ingress after {seconds:.3} s (provider {direct_create:.3} s)", run + 1);
        for p in paths.iter_mut() {
            let mbps = throughput(&p.bulk, options.megabytes).await.with_context(|| p.name.clone())?;
            let rtt = peers::round_trips(&p.echo, options.round_trips, 64).await.with_context(|| p.name.clone())?;
            let cps = peers::connections_per_second(&p.echo, options.connect_for, 4).await;
            line += &format!("; {} {mbps:.0} MB/s p50 {:.0} us {cps:.0} conn/s", p.name, peers::percentile(&rtt, 0.5));
            p.record(mbps, &rtt, cps);
        }
        let changed = change_port(&services, &ns, &name, &ip, &backends, echo_addr).await?;
        port_change.push(changed);
        line += &format!("; port change -> bytes on the new port {changed:.3} s");
        eprintln!("{line}");
    }

    let (t, p, o) = (median(&mut total), median(&mut provider_only), median(&mut overhead));
    let mark = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!(
        "## Tunnel (local provider, real skyport tunnel server and client, rathole {})",
        providers::exit::userdata::RATHOLE_VERSION
    );
    println!(
        "runs: {}, per run: {} MiB bulk transfer, {} round trips of 64 bytes, {:?} of new connections (4 at a time)",
        options.runs, options.megabytes, options.round_trips, options.connect_for
    );
    println!("tunnel binary (operator's exit server and client): {}", entry::skyport_build());
    println!("time to ingress IP (median):      {t:.3} s");
    println!("  provider's own create (median): {p:.3} s");
    println!("  skyport overhead (median):      {o:.3} s   target <= 1 s: {}", mark(o <= 1.0));
    let c = median(&mut port_change);
    println!(
        "Service port change -> bytes on the new port, same IP and host (median): {c:.3} s   target <= 10 s: {}",
        mark(c <= 10.0)
    );
    peers::report(&paths);
    tunnels::finish_tunnels(op, ns).await;
    drop((ssh, socat));
    Ok(())
}

/// Seconds from adding 9002/TCP to Service `name` (published at `ip`) to an echo through
/// `ip:9002`; an error if the Tunnel moved to another address or host on the way.
async fn change_port(
    services: &Api<Service>,
    ns: &TestNs,
    name: &str,
    ip: &str,
    backends: &Backends,
    echo_addr: std::net::SocketAddr,
) -> anyhow::Result<f64> {
    use kube::api::{Patch, PatchParams};
    let tunnels: Api<skyport::crd::Tunnel> = ns.api();
    let tunnel = format!("{name}-tunnel");
    let host_before = tunnels.get(&tunnel).await?.status.and_then(|s| s.host_id);
    backends.set(9002, "tcp", echo_addr).await;
    let mut ports = service(name).spec.and_then(|s| s.ports).unwrap_or_default();
    ports.push(serde_json::from_value(serde_json::json!({"name": "added", "port": 9002, "protocol": "TCP"}))?);
    let patch = serde_json::json!({"spec": {"ports": ports}});
    let started = Instant::now();
    services.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let new_port = format!("{ip}:9002");
    let echoed = || async {
        matches!(tokio::time::timeout(Duration::from_secs(2), peers::round_trips(&new_port, 1, 64)).await, Ok(Ok(_)))
    };
    while !echoed().await {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the added port of {name} never carried bytes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let status = tunnels.get(&tunnel).await?.status.unwrap_or_default();
    if status.host_ip.as_deref() != Some(ip) || status.host_id != host_before {
        bail!("the port change of {name} moved the tunnel: {:?} at {:?}", status.host_id, status.host_ip);
    }
    Ok(seconds)
}

/// A host request like the controller's, with a fresh key.
fn tunnels_request() -> providers::HostRequest {
    let keys = providers::NoiseKeypair::generate();
    providers::HostRequest {
        name: String::new(),
        region: None,
        size: None,
        user_data: String::new(),
        server: providers::ExitServer {
            control_port: 2333,
            noise_private_key: keys.private_key,
            services: vec![providers::TunnelService {
                name: "tcp-9000".into(),
                protocol: providers::Protocol::Tcp,
                port: 9000,
                token: "bench".into(),
                source_ranges: Vec::new(),
                proxy_protocol: None,
                bind: None,
            }],
        },
        tags: providers::owner_tags("00000000-0000-0000-0000-000000000000", "bench", "direct"),
        address: None,
        failure_domain: None,
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "benches/tunnel.rs is a benchmark against the test environment: cargo bench --bench tunnel [-- --quick] [--guest] [--failover [--ec2]] [--proxy]"
        );
        return Ok(());
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--guest") && args.iter().any(|a| a == "--failover") {
        let runs = if quick { 1 } else { 3 };
        return tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(guest_failover::run(runs));
    }
    if args.iter().any(|a| a == "--failover") {
        let runs = if quick { 1 } else { 3 };
        let ec2_only = args.iter().any(|a| a == "--ec2");
        return tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
            let hung_only = args.iter().any(|a| a == "--hung");
            if !ec2_only {
                failover::run(runs, hung_only).await?;
            }
            if hung_only {
                return Ok(());
            }
            failover_ec2::run(runs).await
        });
    }
    if args.iter().any(|a| a == "--proxy") {
        let (runs, megabytes) = if quick { (2, 16) } else { (7, 256) };
        return tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(proxy::run(runs, megabytes));
    }
    if args.iter().any(|a| a == "--guest") {
        let runs = if quick { 1 } else { 3 };
        return tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(on_guests::run(runs));
    }
    let options = if quick {
        Options { runs: 2, megabytes: 16, round_trips: 200, connect_for: Duration::from_millis(500) }
    } else {
        Options { runs: 7, megabytes: 256, round_trips: 2000, connect_for: Duration::from_secs(3) }
    };
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(options))
}

//! Benchmarks of the Tunnel path against the real test environment (issue 5, item 5), with the
//! local provider and the real rathole server and client:
//!
//! 1. **time to ingress**: from creating a LoadBalancer Service to its
//!    `status.loadBalancer.ingress[0].ip`, against the provider's own part measured in the same
//!    run (a direct `LocalProvider::create`, which returns once the exit server listens). The
//!    difference is skyport's overhead (Service → Tunnel → finalizer → Secret → host → status →
//!    Deployment → ingress). Target: ≤ 1 s.
//! 2. **throughput**: a bulk TCP transfer through the tunnel (client → exit server → rathole
//!    Noise channel → rathole client → backend) against the same transfer straight to the
//!    backend on loopback. Target: ≥ 0.8 × direct.
//!
//! Medians of several runs; ratios from the same run. Figures only, no timed assertions: the
//! exit status is non-zero only when something is broken (no ingress, bytes corrupted).
//!
//! ```sh
//! eval "$(tests/env.sh up)"; export SKYPORT_RATHOLE="$(tests/env/build-rathole.sh)"
//! cargo bench --bench tunnel                # 7 runs, 256 MiB transfers
//! cargo bench --bench tunnel -- --quick     # 2 runs, 16 MiB (CI, through tests/run.sh)
//! ```
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it only says how to run it.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/tunnels.rs"]
mod tunnels;

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
                 "ports": [{"name": "data", "port": 9000, "protocol": "TCP"}]},
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
    let (mut total, mut provider_only, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
    let (mut direct_mbps, mut tunnel_mbps, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut relay_mbps, mut relay_ratios) = (Vec::new(), Vec::new());
    let sink_addr = sink().await?;
    let relay_addr = relay(sink_addr).await?;

    for run in 0..options.runs {
        // The provider's own part: the same create the controller makes, straight to the adapter.
        let mut request = tunnels_request();
        request.name = format!("bench-direct-{run}");
        let started = Instant::now();
        let host = op.local.create(&request).await?;
        let direct_create = started.elapsed().as_secs_f64();
        op.local.delete(&host.id).await?;

        let name = format!("web-{run}");
        let (seconds, ip) = time_to_ingress(&services, &name).await?;
        total.push(seconds);
        provider_only.push(direct_create);
        overhead.push(seconds - direct_create);

        // Throughput: the tunnel's backend is the same sink as the direct path.
        backends.set(9000, "tcp", sink_addr).await;
        let _client =
            ClientRunner::start(ns.client.clone(), &ns.name, &format!("{name}-tunnel-client"), backends.clone());
        let through = format!("{ip}:9000");
        let deadline = Instant::now() + Duration::from_secs(30);
        while throughput(&through, 1).await.is_err() {
            if Instant::now() > deadline {
                bail!("the tunnel of {name} never carried bytes");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let d = throughput(&sink_addr.to_string(), options.megabytes).await?;
        let t = throughput(&through, options.megabytes).await?;
        let r = throughput(&relay_addr.to_string(), options.megabytes).await?;
        direct_mbps.push(d);
        tunnel_mbps.push(t);
        ratios.push(t / d);
        relay_mbps.push(r);
        relay_ratios.push(r / d);
        eprintln!(
            "run {}: ingress after {seconds:.3} s (provider {direct_create:.3} s); direct {d:.0} MB/s, tunnel {t:.0} MB/s, plain relay {r:.0} MB/s",
            run + 1
        );
    }

    let (t, p, o) = (median(&mut total), median(&mut provider_only), median(&mut overhead));
    let (d, tu, r) = (median(&mut direct_mbps), median(&mut tunnel_mbps), median(&mut ratios));
    let (rm, rr) = (median(&mut relay_mbps), median(&mut relay_ratios));
    let mark = |ok: bool| if ok { "PASS" } else { "MISS" };
    println!("## Tunnel (local provider, real rathole {} server and client)", providers::userdata::RATHOLE_VERSION);
    println!("runs: {}, transfer: {} MiB per measurement", options.runs, options.megabytes);
    println!("time to ingress IP (median):      {t:.3} s");
    println!("  provider's own create (median): {p:.3} s");
    println!("  skyport overhead (median):      {o:.3} s   target <= 1 s: {}", mark(o <= 1.0));
    println!("throughput direct loopback (median): {d:.0} MB/s");
    println!("throughput through the tunnel:       {tu:.0} MB/s");
    println!("ratio tunnel / direct (median of per-run ratios): {r:.2}   target >= 0.8: {}", mark(r >= 0.8));
    println!("reference: a plain userspace TCP relay, no encryption: {rm:.0} MB/s, {rr:.2} x direct");
    tunnels::finish_tunnels(op, ns).await;
    Ok(())
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
            }],
        },
        tags: providers::owner_tags("00000000-0000-0000-0000-000000000000", "bench", "direct"),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "benches/tunnel.rs is a benchmark against the test environment: cargo bench --bench tunnel [-- --quick]"
        );
        return Ok(());
    }
    let quick = args.iter().any(|a| a == "--quick");
    let options = if quick { Options { runs: 2, megabytes: 16 } } else { Options { runs: 7, megabytes: 256 } };
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(options))
}

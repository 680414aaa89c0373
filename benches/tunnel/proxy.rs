//! `--proxy`: what the PROXY protocol header costs. Two Services on the local provider in the
//! same run, one annotated `skyport.dev/proxy-protocol: v2` and one without, each with its own
//! exit server and client; the same bulk transfer through each, alternating, to sinks that count
//! every byte (the proxied one reads and checks the header first).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::TestNs;
use crate::common::kubelet::{Backends, ClientRunner};
use crate::common::tunnels;

/// Port of the plain Service and of the proxied one.
const PLAIN: u16 = 9000;
const PROXIED: u16 = 9010;

fn service(name: &str, port: u16, proxy: Option<&str>) -> Service {
    let annotations: serde_json::Map<_, _> =
        proxy.map(|v| ("skyport.dev/proxy-protocol".to_string(), v.into())).into_iter().collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel",
                 "ports": [{"name": "data", "port": port, "protocol": "TCP"}]},
    }))
    .expect("valid Service")
}

/// A sink like the main benchmark's that first reads a PROXY v2 header (16 bytes, then the
/// length they announce), checks it with ppp's parser, and counts only what follows.
async fn proxy_sink() -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut header = vec![0u8; 16];
                if conn.read_exact(&mut header).await.is_err() {
                    return;
                }
                let rest = usize::from(u16::from_be_bytes([header[14], header[15]]));
                header.resize(16 + rest, 0);
                if conn.read_exact(&mut header[16..]).await.is_err() || ppp::v2::Header::try_from(&header[..]).is_err()
                {
                    return;
                }
                let mut buf = vec![0u8; 1 << 16];
                let mut total: u64 = 0;
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    total += n as u64;
                }
                let _ = conn.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    Ok(addr)
}

async fn ingress(services: &Api<Service>, name: &str) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        let s = services.get(name).await?;
        let ip = s.status.and_then(|s| s.load_balancer).and_then(|lb| lb.ingress).and_then(|i| i.first()?.ip.clone());
        if let Some(ip) = ip {
            return Ok(ip);
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("Service {name} got no ingress within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(runs: usize, megabytes: usize) -> anyhow::Result<()> {
    let ns = TestNs::new("bench-proxy").await;
    let op = tunnels::TunnelOperator::start(&ns, tunnels::fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let backends = Backends::default();
    backends.set(PLAIN, "tcp", crate::sink().await?).await;
    backends.set(PROXIED, "tcp", proxy_sink().await?).await;
    let mut runners = Vec::new();
    let mut targets = Vec::new();
    for (name, port, proxy) in [("plain", PLAIN, None), ("proxied", PROXIED, Some("v2"))] {
        runners.push(ClientRunner::start(
            ns.client.clone(),
            &ns.name,
            &format!("{name}-tunnel-client"),
            backends.clone(),
        ));
        services.create(&PostParams::default(), &service(name, port, proxy)).await?;
        targets.push(format!("{}:{port}", ingress(&services, name).await?));
    }
    for target in &targets {
        let deadline = Instant::now() + Duration::from_secs(30);
        while crate::throughput(target, 1).await.is_err() {
            if Instant::now() > deadline {
                bail!("{target} never carried bytes");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (mut plain, mut proxied) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let a = crate::throughput(&targets[0], megabytes).await.context("without the header")?;
        let b = crate::throughput(&targets[1], megabytes).await.context("with the header")?;
        eprintln!("run {}: without the header {a:.0} MB/s, with PROXY v2 {b:.0} MB/s", run + 1);
        plain.push(a);
        proxied.push(b);
    }
    let (a, b) = (crate::median(&mut plain), crate::median(&mut proxied));
    println!("## Tunnel with and without the PROXY protocol header (local provider, same run)");
    println!("runs: {runs}, per run: {megabytes} MiB bulk transfer through each, alternating");
    println!("tunnel binary (operator's exit server and client): {}", crate::entry::skyport_build());
    println!("without the header (median): {a:.0} MB/s");
    println!("with PROXY v2 (median):      {b:.0} MB/s   ratio {:.2}", b / a);
    drop(runners);
    tunnels::finish_tunnels(op, ns).await;
    Ok(())
}

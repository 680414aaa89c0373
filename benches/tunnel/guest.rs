//! `--guest`: the Tunnel path against booted guests (the `guest` provider: Debian under
//! systemd-nspawn, real cloud-init, the static binary downloaded over HTTPS from a mirror with
//! its own CA and checked against the operator's digest). Per run, from the operator's side:
//! - **Service → first byte**: from creating the Service to the first echo through its ingress
//!   address (guest boot, cloud-init, download, server start, client connect, health check);
//! - **port change**: from patching a port onto the Service to an echo through it, same guest;
//! - **recovery**: from powering the guest off behind skyport's back to an echo through the
//!   replacement's address (found at the Tunnel's resync, 2 s here; 60 s by default).
//!
//! Figures only. Needs root, `SKYPORT_GUEST_ROOTFS` (tests/env/build-guest.sh) and the static
//! build (`SKYPORT_GUEST_EXE`, tests/env/build-musl.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use providers::guest::{GuestProvider, GuestSettings};

use super::{median, peers, service};
use crate::common::kubelet::{Backends, ClientRunner};
use crate::common::{TestNs, guest, mirror, tunnels};

/// Waits for an echo through `addr`; seconds since `started`.
async fn first_echo(addr: &str, started: Instant, within: Duration) -> anyhow::Result<f64> {
    loop {
        let echoed = tokio::time::timeout(Duration::from_secs(2), peers::round_trips(addr, 1, 64)).await;
        if matches!(echoed, Ok(Ok(_))) {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > within {
            bail!("no echo through {addr} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn tunnel_ip(tunnels: &Api<skyport::crd::Tunnel>, name: &str, not: Option<&str>) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status = tunnels.get_opt(name).await?.and_then(|t| t.status);
        if let Some(s) = status
            && s.phase == Some(skyport::crd::TunnelPhase::Active)
            && let Some(ip) = s.host_ip
            && not.is_none_or(|old| s.host_id.as_deref() != Some(old))
        {
            return Ok(ip);
        }
        if Instant::now() > deadline {
            bail!("Tunnel {name} not Active within 10 min");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(runs: usize) -> anyhow::Result<()> {
    let rootfs = guest::available().map_err(|why| anyhow::anyhow!("cannot boot guests here: {why}"))?;
    let exe = guest::guest_exe();
    let mirror = mirror::https_mirror(std::fs::read(&exe)?).await;
    let ns = TestNs::new("bench-guest").await;
    let state = std::env::temp_dir().join(format!("skyport-bench-guests-{}", ns.name));
    let mut settings = GuestSettings::new(&state, rootfs);
    settings.ca_file = Some(mirror.ca_file.clone());
    let guests = Arc::new(GuestProvider::new(settings)?);
    let tunnel_settings = skyport::config::TunnelArgs {
        provider: Some("guest".into()),
        exit_server_url: mirror.url_template.clone(),
        // The mirror's name resolves on the guests only, and its CA is theirs alone.
        skip_exit_server_check: true,
        ..tunnels::fast_tunnel_settings()
    };
    let op = tunnels::TunnelOperator::start_serving(&ns, tunnel_settings, vec![guests.clone()], exe.clone()).await;
    let result = measure(&ns, &guests, &mirror, runs).await;
    if result.is_err() {
        guests.remove_all();
    }
    tunnels::finish_tunnels(op, ns).await;
    let _ = std::fs::remove_dir(&state);
    let (mut first, mut change, mut recovery) = result?;
    println!("## Tunnel on booted guests (guest provider: systemd-nspawn, cloud-init, static binary over HTTPS)");
    println!("runs: {runs}; exit server: {} (downloaded {} times)", exe.display(), mirror.downloads());
    println!("Service created -> first byte through the guest (median):   {:.2} s", median(&mut first));
    println!("port change -> bytes on the new port, same guest (median):  {:.2} s", median(&mut change));
    println!(
        "guest powered off -> bytes through its replacement (median): {:.2} s (resync 2 s)",
        median(&mut recovery)
    );
    Ok(())
}

async fn measure(
    ns: &TestNs,
    guests: &GuestProvider,
    mirror: &mirror::Mirror,
    runs: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let services: Api<Service> = ns.api();
    let tunnels: Api<skyport::crd::Tunnel> = ns.api();
    let (mut first, mut change, mut recovery) = (Vec::new(), Vec::new(), Vec::new());
    let echo = peers::echo().await?;
    let backends = Backends::default();
    for port in [9000, 9001, 9002] {
        backends.set(port, "tcp", echo).await;
    }
    for run in 0..runs {
        let name = format!("web-{run}");
        let tunnel = format!("{name}-tunnel");
        let _client = ClientRunner::start(ns.client.clone(), &ns.name, &format!("{tunnel}-client"), backends.clone());
        let started = Instant::now();
        services.create(&PostParams::default(), &service(&name)).await?;
        let ip = tunnel_ip(&tunnels, &tunnel, None).await?;
        let to_first = first_echo(&format!("{ip}:9001"), started, Duration::from_secs(600)).await?;

        let mut ports = service(&name).spec.and_then(|s| s.ports).unwrap_or_default();
        ports.push(serde_json::from_value(serde_json::json!({"name": "added", "port": 9002, "protocol": "TCP"}))?);
        let started = Instant::now();
        services
            .patch(&name, &PatchParams::default(), &Patch::Merge(&serde_json::json!({"spec": {"ports": ports}})))
            .await?;
        let to_changed = first_echo(&format!("{ip}:9002"), started, Duration::from_secs(60)).await?;

        let host = tunnels.get(&tunnel).await?.status.and_then(|s| s.host_id).context("hostId")?;
        let machine = guests.machine(&host).context("the Tunnel's guest")?;
        let started = Instant::now();
        machine.stop(Duration::from_secs(30));
        let new_ip = tunnel_ip(&tunnels, &tunnel, Some(&host)).await?;
        let to_recovered = first_echo(&format!("{new_ip}:9001"), started, Duration::from_secs(600)).await?;
        eprintln!(
            "run {}: first byte {to_first:.2} s, port change {to_changed:.2} s, recovery {to_recovered:.2} s; \
             {} downloads so far",
            run + 1,
            mirror.downloads()
        );
        first.push(to_first);
        change.push(to_changed);
        recovery.push(to_recovered);
        services.delete(&name, &DeleteParams::default()).await?;
        tunnels::gone(&tunnels, &tunnel).await;
    }
    Ok((first, change, recovery))
}

//! `loadBalancerSourceRanges` on a booted guest: the exit server's own nftables ruleset (the
//! guest's real `nft`, loaded by its systemd) drops a Service port's traffic from any other
//! source, and follows a change pushed to the running guest, while the health port stays open.
//!
//! Needs root, the guest root file system and the static build (tests/run.sh provides them).

use crate::common;
use crate::common::tunnels;
use crate::tunnel_guest::guest_provider;

use std::time::Duration;

use common::guest::{guest_exe, rootfs_or_skip};
use common::kubelet::{Backends, ClientRunner, tcp_echo};
use common::mirror::https_mirror;
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use skyport::crd::Tunnel;
use tunnels::{TunnelOperator, active, carries, host_id, host_ip, service};

/// The address this machine's packets to `ip` leave from (what the guest's firewall sees).
fn source_towards(ip: &str) -> String {
    let out = std::process::Command::new("ip").args(["-o", "route", "get", ip]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.by_ref().find(|w| *w == "src");
    words.next().unwrap_or_else(|| panic!("no source address towards {ip}: {text}")).to_string()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_guests_own_firewall_admits_the_service_port_from_the_source_ranges_only_and_follows_them() {
    let Some(rootfs) = rootfs_or_skip("a_guests_own_firewall_admits") else { return };
    let mirror = https_mirror(std::fs::read(guest_exe()).unwrap()).await;
    let ns = TestNs::new("tun-guest-ranges").await;
    let (guests, _guard) = guest_provider(&ns, &rootfs, &mirror);
    let settings = mirror.check_settings(skyport::config::TunnelArgs {
        provider: Some("guest".into()),
        exit_server_url: mirror.url_template.clone(),
        ..tunnels::fast_tunnel_settings()
    });
    let op = TunnelOperator::start_serving(&ns, settings, vec![guests.clone()], guest_exe()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let ports = serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let mut web = service("web", Some("skyport.dev/tunnel"), serde_json::json!({}), ports);
    // A documentation network: nobody the test runs as.
    web.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["192.0.2.0/24".into()]);
    services.create(&Default::default(), &web).await.unwrap();
    let _kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());

    // Active: the health check went through the open health port, and the ranges are enforced.
    let tunnel = active(&tunnels, "web-tunnel", Duration::from_secs(300)).await;
    let ip = host_ip(&tunnel);
    let status = tunnel.status.clone().unwrap();
    assert_eq!(status.source_ranges, Some(vec!["192.0.2.0/24".to_string()]));
    let message = tunnels::ready(&tunnel).unwrap().2;
    assert!(!message.contains("not enforced"), "{message}");
    let machine = guests.machine(&host_id(&tunnel)).expect("the Tunnel's guest");
    assert!(machine.read("/etc/nftables.conf").contains("ip saddr 192.0.2.0/24 tcp dport 8080 accept"));
    let blocked = tokio::time::timeout(Duration::from_secs(5), tcp_echo(&ip, 8080, b"x")).await;
    assert!(!matches!(blocked, Ok(Some(_))), "port 8080 answered a source outside the ranges");

    // The ranges change to this machine's own address: pushed to the same guest, which admits it.
    let own = format!("{}/32", source_towards(&ip));
    let patch = serde_json::json!({"spec": {"loadBalancerSourceRanges": [own.clone()]}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    carries(&ip, 8080, None).await;
    let after = eventually("the new ranges recorded", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.status.as_ref()?.source_ranges.as_ref() == Some(&vec![own.clone()])).then_some(t)
    })
    .await;
    assert_eq!(host_id(&after), host_id(&tunnel), "a range change costs no guest");
    assert!(machine.read("/etc/nftables.conf").contains(&format!("ip saddr {own} tcp dport 8080 accept")));
    tunnels::finish_tunnels(op, ns).await;
}

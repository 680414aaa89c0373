//! `loadBalancerSourceRanges` on a booted guest: the exit server's own nftables ruleset (the
//! guest's real `nft`, loaded by its systemd) drops a Service port's traffic from any other
//! source, and follows a change pushed to the running guest, while the health port stays open. On
//! an ExitServerPool's shared guest, each member's ranges hold on its own ports only; with an
//! address per member, on its own address only.
//!
//! Needs root, the guest root file system and the static build (tests/run.sh provides them).

use crate::common;
use crate::common::tunnels;
use crate::tunnel_guest::{Guests, guest_provider};

use std::sync::Arc;
use std::time::Duration;

use common::guest::{guest_exe, rootfs_or_skip};
use common::kubelet::{Backends, ClientRunner, tcp_echo};
use common::mirror::{Mirror, https_mirror};
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use providers::HostProvider;
use providers::guest::GuestProvider;
use skyport::crd::Tunnel;
use skyport::crd::pool::{ExitServerPool, ExitServerPoolSpec, PoolAddressing};
use tunnels::{TunnelOperator, active, carries, host_id, host_ip, reaches, service};

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

/// A guest operator serving a new namespace, and an ExitServerPool allowing it; `None` (the test
/// skipped) without the guest root file system. A test binds `_guard` and `_mirror` by name:
/// dropped, they tear the guests down and stop serving the binary.
pub(crate) struct GuestPool {
    pub(crate) ns: TestNs,
    pub(crate) guests: Arc<GuestProvider>,
    pub(crate) op: TunnelOperator,
    pub(crate) pool: String,
    pub(crate) pools: Api<ExitServerPool>,
    pub(crate) _guard: Guests,
    pub(crate) _mirror: Mirror,
}

async fn guest_pool(test: &str, prefix: &str, addressing: PoolAddressing) -> Option<GuestPool> {
    guest_pool_of(test, prefix, ExitServerPoolSpec { addressing, ..Default::default() }).await
}

/// [`GuestPool`] for a pool of `spec`, which allows the new namespace.
pub(crate) async fn guest_pool_of(test: &str, prefix: &str, spec: ExitServerPoolSpec) -> Option<GuestPool> {
    let rootfs = rootfs_or_skip(test)?;
    let mirror = https_mirror(std::fs::read(guest_exe()).unwrap()).await;
    let ns = TestNs::new(prefix).await;
    let (guests, guard) = guest_provider(&ns, &rootfs, &mirror);
    let settings = mirror.check_settings(skyport::config::TunnelArgs {
        provider: Some("guest".into()),
        exit_server_url: mirror.url_template.clone(),
        pool_namespace: Some(ns.name.clone()),
        ..tunnels::fast_tunnel_settings()
    });
    let op = TunnelOperator::start_serving(&ns, settings, vec![guests.clone()], guest_exe()).await;
    let pool = format!("{prefix}-{:08x}", rand::random::<u32>());
    let pools: Api<ExitServerPool> = Api::all(ns.client.clone());
    let spec = ExitServerPoolSpec { allowed_namespaces: vec![ns.name.clone()], ..spec };
    pools.create(&Default::default(), &ExitServerPool::new(&pool, spec)).await.unwrap();
    Some(GuestPool { ns, guests, op, pool, pools, _guard: guard, _mirror: mirror })
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_shared_guests_firewall_holds_each_members_ranges_on_its_own_ports_only() {
    let Some(GuestPool { ns, guests, op, pool, pools, _guard, _mirror }) =
        guest_pool("a_shared_guests_firewall", "tun-guest-pool", PoolAddressing::Shared).await
    else {
        return;
    };
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let annotations = serde_json::json!({"skyport.dev/exit-server-pool": pool});
    for (name, port, ranges) in [("web-a", 8080, Some("192.0.2.0/24")), ("web-b", 9090, None)] {
        let ports = serde_json::json!([{"name": "tcp", "port": port, "protocol": "TCP"}]);
        let mut svc = service(name, Some("skyport.dev/tunnel"), annotations.clone(), ports);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = ranges.map(|r| vec![r.to_string()]);
        services.create(&Default::default(), &svc).await.unwrap();
    }
    let _kubelet = common::kubelet::AllClients::start(ns.client.clone(), &ns.name);

    let a = active(&tunnels, "web-a-tunnel", Duration::from_secs(300)).await;
    let b = active(&tunnels, "web-b-tunnel", Duration::from_secs(60)).await;
    let ip = host_ip(&a);
    assert_eq!(host_ip(&b), ip, "one shared guest");
    let carrier = tunnels.get(&format!("pool-{pool}")).await.unwrap();
    let machine = guests.machine(&host_id(&carrier)).expect("the shared guest");
    // web-b has no ranges: open to this machine; web-a's port drops it, on the same guest.
    carries(&ip, 9090, None).await;
    assert!(machine.read("/etc/nftables.conf").contains("ip saddr 192.0.2.0/24 tcp dport 8080 accept"));
    let blocked = tokio::time::timeout(Duration::from_secs(5), tcp_echo(&ip, 8080, b"x")).await;
    assert!(!matches!(blocked, Ok(Some(_))), "web-a's port answered a source outside its ranges");

    // web-a's ranges change to this machine's address: pushed to the running guest.
    let own = format!("{}/32", source_towards(&ip));
    let patch = serde_json::json!({"spec": {"loadBalancerSourceRanges": [own.clone()]}});
    services.patch("web-a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    carries(&ip, 8080, None).await;
    carries(&ip, 9090, None).await;
    let after = tunnels.get(&format!("pool-{pool}")).await.unwrap();
    assert_eq!(host_id(&after), host_id(&carrier), "a member's range change costs no guest");
    for name in ["web-a", "web-b"] {
        services.delete(name, &Default::default()).await.unwrap();
    }
    eventually("the shared guest's Tunnel gone with its last member", Duration::from_secs(120), || async {
        tunnels.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    pools.delete(&pool, &Default::default()).await.unwrap();
    tunnels::finish_tunnels(op, ns).await;
}

/// The IPv4 addresses on the interfaces of guest `id` (its network namespace is named so).
pub(crate) fn guest_addresses(id: &str) -> String {
    let out = std::process::Command::new("ip").args(["netns", "exec", id, "ip", "-4", "-o", "addr", "show"]).output();
    String::from_utf8_lossy(&out.expect("ip netns exec").stdout).into_owned()
}

/// `addressing: PerService` on a booted guest: two Services on port 8080, each at an address of
/// its own (routed to the guest, put on its interface by its root unit) reaching its own backend;
/// the firewall keys each member's rules by its address, so the open member does not open the
/// restricted one's port; a member that leaves takes its address off the guest's interface.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_shared_guest_gives_each_member_an_address_of_its_own_with_its_own_ranges_there() {
    let Some(GuestPool { ns, guests, op, pool, pools, _guard, _mirror }) =
        guest_pool("a_shared_guest_gives_each_member", "tun-guest-own", PoolAddressing::PerService).await
    else {
        return;
    };
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = serde_json::json!({"skyport.dev/exit-server-pool": pool});
    let ports = serde_json::json!([{"name": "tcp", "port": 8080, "protocol": "TCP"}]);
    let mut runners = Vec::new();
    for (name, ranges, tag) in [("web-a", Some("192.0.2.0/24"), 8080), ("web-b", None, 9090)] {
        let mut svc = service(name, Some("skyport.dev/tunnel"), annotations.clone(), ports.clone());
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = ranges.map(|r| vec![r.to_string()]);
        services.create(&Default::default(), &svc).await.unwrap();
        // Each member's port 8080 reaches an echo tagged its own way, so a reply says whose it is.
        let backends = Backends::default();
        backends.set(8080, "tcp", Backends::default().addr(tag, "tcp").await).await;
        runners.push(ClientRunner::start(ns.client.clone(), &ns.name, &format!("{name}-tunnel-client"), backends));
    }

    let a = active(&tunnels, "web-a-tunnel", Duration::from_secs(300)).await;
    let b = active(&tunnels, "web-b-tunnel", Duration::from_secs(120)).await;
    let (ip_a, ip_b) = (host_ip(&a), host_ip(&b));
    let carrier = tunnels.get(&format!("pool-{pool}")).await.unwrap();
    let own = host_ip(&carrier);
    assert!(ip_a != ip_b && own != ip_a && own != ip_b, "an address each, not the guest's own {own}");
    let machine = guests.machine(&host_id(&carrier)).expect("the shared guest");
    let on_guest = guest_addresses(&host_id(&carrier));
    assert!(on_guest.contains(&format!(" {ip_a}/32 ")) && on_guest.contains(&format!(" {ip_b}/32 ")), "{on_guest}");
    reaches(&ip_b, 8080, 9090).await;
    let rules = machine.read("/etc/nftables.conf");
    assert!(rules.contains(&format!("ip daddr {ip_a} ip saddr 192.0.2.0/24 tcp dport 8080 accept")), "{rules}");
    let blocked = tokio::time::timeout(Duration::from_secs(5), tcp_echo(&ip_a, 8080, b"x")).await;
    assert!(!matches!(blocked, Ok(Some(_))), "web-b's open port 8080 opened web-a's: {rules}");

    // web-a's ranges change to this machine's address: pushed to the running guest.
    let source = format!("{}/32", source_towards(&ip_a));
    let patch = serde_json::json!({"spec": {"loadBalancerSourceRanges": [source]}});
    services.patch("web-a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    reaches(&ip_a, 8080, 8080).await;

    // web-b leaves: its address goes off the guest, and is released; web-a keeps serving.
    services.delete("web-b", &Default::default()).await.unwrap();
    eventually("web-b's address off the guest's interface", Duration::from_secs(120), || async {
        (!guest_addresses(&host_id(&carrier)).contains(&format!(" {ip_b}/32 "))).then_some(())
    })
    .await;
    let released = || async { guests.get_address(&ip_b).await.ok()?.is_none().then_some(()) };
    eventually("web-b's address released", Duration::from_secs(60), released).await;
    reaches(&ip_a, 8080, 8080).await;
    assert_eq!(host_id(&tunnels.get(&format!("pool-{pool}")).await.unwrap()), host_id(&carrier), "no new guest");
    services.delete("web-a", &Default::default()).await.unwrap();
    eventually("the shared guest's Tunnel gone with its last member", Duration::from_secs(120), || async {
        tunnels.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    pools.delete(&pool, &Default::default()).await.unwrap();
    drop(runners);
    tunnels::finish_tunnels(op, ns).await;
}

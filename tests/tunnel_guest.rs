//! The whole Tunnel path against booted guests: a LoadBalancer Service, the Tunnel and Service
//! controllers, the `guest` provider (`providers::guest`: Debian guests booted with
//! systemd-nspawn, real cloud-init reading the user data the controller renders), the shipped
//! static binary downloaded by each guest over HTTPS from a mirror with a CA of its own
//! (`common::mirror`) and checked against the digest the operator derives, the exit server under
//! the guest's systemd, the tunnel client run from its Deployment (`common::kubelet`) and echo
//! backends. Nothing on the guest is started from outside.
//!
//! Needs root, the guest root file system and the static build (tests/run.sh provides them).
//! Where guests cannot boot the test fails, unless `SKYPORT_SKIP_GUEST_TESTS=1` opts out.

use crate::common;
use crate::common::tunnels;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::guest::{guest_exe, rootfs_or_skip};
use common::kubelet::{Backends, ClientRunner};
use common::mirror::https_mirror;
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use providers::HostProvider;
use providers::guest::{GuestProvider, GuestSettings};
use providers::hosts::{MANAGED_BY_VALUE, TAG_MANAGED_BY, TAG_TUNNEL_UID};
use sha2::{Digest, Sha256};
use skyport::crd::{Tunnel, TunnelPhase};
use tunnels::{TunnelOperator, active, carries, events, events_with, host_id, host_ip, ingress_ip, service};

/// Removes every guest the test's provider made, whatever happened to the test.
pub(crate) struct Guests(Arc<GuestProvider>, std::path::PathBuf);

impl Drop for Guests {
    fn drop(&mut self) {
        self.0.remove_all();
        let _ = std::fs::remove_dir(&self.1);
    }
}

/// A guest provider over a fresh state folder of `ns` whose guests trust `mirror`, and the guard
/// that removes its guests.
pub(crate) fn guest_provider(
    ns: &TestNs,
    rootfs: &std::path::Path,
    mirror: &common::mirror::Mirror,
) -> (Arc<GuestProvider>, Guests) {
    let state = std::env::temp_dir().join(format!("skyport-test-guests-{}", ns.name));
    let mut settings = GuestSettings::new(&state, rootfs);
    settings.ca_file = Some(mirror.ca_file.clone());
    let guests = Arc::new(GuestProvider::new(settings).expect("guest provider"));
    (guests.clone(), Guests(guests, state))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// What a guest left on this machine: its folder, network namespace, host-side link or mount.
pub(crate) fn traces(id: &str) -> Vec<String> {
    let output = |args: &[&str]| {
        String::from_utf8_lossy(&std::process::Command::new(args[0]).args(&args[1..]).output().unwrap().stdout)
            .into_owned()
    };
    let mut found = Vec::new();
    if output(&["ip", "netns", "list"]).lines().any(|l| l.split_whitespace().next() == Some(id)) {
        found.push(format!("network namespace {id}"));
    }
    if output(&["ip", "-o", "link"]).contains(&format!(" {id}h@")) {
        found.push(format!("link {id}h"));
    }
    if std::fs::read_to_string("/proc/mounts").unwrap().contains(&format!("/{id}/root ")) {
        found.push(format!("overlay mount of {id}"));
    }
    found
}

pub(crate) async fn ingress_is(services: &Api<Service>, ip: &str) {
    eventually(&format!("Service ingress {ip}"), Duration::from_secs(30), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == ip).then_some(())
    })
    .await;
}

/// `web-tunnel` once Active (within 300 s). Else the test fails with what each side showed: the
/// Tunnel's status, its guest's console and cloud-init output, and how often its client started.
async fn active_on_guest(tunnels: &Api<Tunnel>, guests: &GuestProvider, client: &ClientRunner) -> Tunnel {
    let last = match tunnels::active_within(tunnels, "web-tunnel", Duration::from_secs(300)).await {
        Ok(t) => return t,
        Err(last) => last,
    };
    let machine = last.as_ref().and_then(|t| guests.machine(t.status.as_ref()?.host_id.as_deref()?));
    let guest = machine.map_or_else(|| "no guest recorded".to_string(), |m| m.diagnostics());
    let starts = client.starts.load(std::sync::atomic::Ordering::Relaxed);
    let status = last.and_then(|t| t.status);
    panic!("web-tunnel not Active after 300 s; last status: {status:#?}\nclient starts: {starts}\n{guest}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_tunnel_on_booted_guests_carries_bytes_follows_ports_outlives_a_stopped_guest_and_cleans_up() {
    let Some(rootfs) = rootfs_or_skip("a_tunnel_on_booted_guests") else { return };
    let exe = guest_exe();
    let binary = std::fs::read(&exe).unwrap();
    let digest = sha256_hex(&binary);
    let mirror = https_mirror(binary).await;
    let ns = TestNs::new("tun-guest").await;
    let (guests, guard) = guest_provider(&ns, &rootfs, &mirror);
    let state = guard.1.clone();
    // The operator checks the binary on the mirror before buying a guest, as it would on a cloud.
    let settings = mirror.check_settings(skyport::config::TunnelArgs {
        provider: Some("guest".into()),
        exit_server_url: mirror.url_template.clone(),
        ..tunnels::fast_tunnel_settings()
    });
    let op = TunnelOperator::start_serving(&ns, settings, vec![guests.clone()], exe.clone()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let ports = serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]);
    let web = service("web", Some("skyport.dev/tunnel"), serde_json::json!({"skyport.dev/address": "reserved"}), ports);
    let started = Instant::now();
    services.create(&Default::default(), &web).await.unwrap();
    let kubelet = ClientRunner::start(ns.client.clone(), &ns.name, "web-tunnel-client", Backends::default());

    // Ready: the guest booted, its cloud-init installed the checked binary and started the
    // server, and the health check went through the tunnel; real bytes flow both ways.
    let first = active_on_guest(&tunnels, &guests, &kubelet).await;
    let (id, ip) = (host_id(&first), host_ip(&first));
    carries(&ip, 8080, Some(5353)).await;
    eprintln!("guest provider: Service created -> bytes through the guest: {:?}", started.elapsed());
    let status = first.status.clone().unwrap();
    assert_eq!(status.provider.as_deref(), Some("guest"));
    assert_eq!(status.address_ip.as_deref(), Some(ip.as_str()), "the guest serves on the reserved address");
    ingress_is(&services, &ip).await;
    let machine = guests.machine(&id).expect("the Tunnel's guest");
    assert_eq!(machine.ip.to_string(), ip);
    let installed = std::fs::read(machine.root().join("usr/local/bin/skyport")).unwrap();
    assert_eq!(sha256_hex(&installed), digest, "the guest runs the binary the operator vouched for");
    assert_eq!(mirror.downloads(), 1, "one download, over HTTPS");
    assert_eq!(mirror.checks(), 1, "the operator checked the file before buying the guest");
    let owned = guests.list_by_tag(TAG_TUNNEL_UID, &first.uid().unwrap()).await.unwrap();
    assert_eq!(owned.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), [id.as_str()], "one guest, by owner tag");

    // A port change is pushed to the running guest: same guest, same address, new port open.
    let changed = serde_json::json!({"spec": {"ports": [
        {"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "admin", "port": 9090, "protocol": "TCP"}]}});
    let pushed = Instant::now();
    services.patch("web", &PatchParams::default(), &Patch::Merge(&changed)).await.unwrap();
    carries(&ip, 9090, None).await;
    eprintln!("guest provider: port change -> bytes on the new port: {:?}", pushed.elapsed());
    let after = active(&tunnels, "web-tunnel", Duration::from_secs(30)).await;
    assert_eq!((host_id(&after), host_ip(&after)), (id.clone(), ip.clone()), "no new guest for a port change");
    assert!(machine.read("/etc/skyport/server.toml.generation").trim().parse::<u64>().is_ok_and(|g| g >= 1));
    assert!(machine.read("/etc/nftables.conf").contains("9090"), "the guest's firewall followed");
    assert_eq!(mirror.downloads(), 1, "a push downloads nothing");

    let reasons: Vec<String> = events(&ns.client, &ns.name, "web-tunnel").await.into_iter().map(|e| e.0).collect();
    assert!(!reasons.contains(&"ExitServerLost".to_string()), "no guest was lost so far: {reasons:?}");

    // Powered off behind skyport's back: replaced by a new guest on the reserved address, which
    // downloads and checks the binary anew.
    let stopped = Instant::now();
    machine.stop(Duration::from_secs(30));
    assert!(machine.pid().is_none(), "the guest powered off");
    let replaced = tunnels::active_elsewhere_within(&tunnels, "web-tunnel", &id, Duration::from_secs(300)).await;
    carries(&ip, 9090, None).await;
    eprintln!("guest provider: guest stopped -> bytes through its replacement: {:?}", stopped.elapsed());
    assert_eq!(host_ip(&replaced), ip, "the replacement keeps the reserved address");
    assert_eq!(guests.get(&id).await.unwrap(), None, "the stopped guest is deleted, not left");
    assert!(traces(&id).is_empty(), "the stopped guest left {:?}", traces(&id));
    assert!(!machine.dir.exists(), "the stopped guest's folder is gone");
    assert_eq!(mirror.downloads(), 2);
    events_with(&ns.client, &ns.name, "web-tunnel", "ExitServerLost").await;
    ingress_is(&services, &ip).await;

    // `kubectl delete tunnel`: its guest goes; the Service, which still asks for a Tunnel, gets a
    // fresh one on a fresh guest, which takes the reserved address over.
    let second = host_id(&replaced);
    tunnels.delete("web-tunnel", &DeleteParams::default()).await.unwrap();
    let fresh = eventually("a new Tunnel, Active", Duration::from_secs(300), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (t.uid() != replaced.uid() && t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;
    assert_eq!(guests.get(&second).await.unwrap(), None, "the deleted Tunnel's guest is gone");
    assert!(traces(&second).is_empty(), "the deleted Tunnel's guest left {:?}", traces(&second));
    assert_eq!(host_ip(&fresh), ip, "the reserved address, taken over");
    let address_id = |t: &Tunnel| t.status.as_ref().and_then(|s| s.address_id.clone());
    assert_eq!(address_id(&fresh), address_id(&replaced));
    carries(&host_ip(&fresh), 8080, None).await;

    // The Service goes: nothing is left on this machine.
    let last = host_id(&fresh);
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    let left = guests.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert!(left.is_empty(), "guests leaked: {left:?}");
    assert!(traces(&last).is_empty(), "the last guest left {:?}", traces(&last));
    let files: Vec<_> = std::fs::read_dir(&state).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(files.is_empty(), "files left in the state directory: {files:?}");
    tunnels::finish_tunnels(op, ns).await;
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_guest_that_refuses_the_binary_is_named_as_such_and_never_replaced() {
    let Some(rootfs) = rootfs_or_skip("a_guest_that_refuses_the_binary") else { return };
    let exe = guest_exe();
    // The mirror serves another file than the one whose digest the operator derives.
    let mut tampered = std::fs::read(&exe).unwrap();
    tampered.extend_from_slice(b"\0tampered");
    let mirror = https_mirror(tampered).await;
    let ns = TestNs::new("tun-refused").await;
    let (guests, _guard) = guest_provider(&ns, &rootfs, &mirror);
    // Long enough for most guests to have reported before a replacement is due. On a loaded
    // 2-core machine booting several guests at once, the first may still be replaced as
    // unreachable before it says anything: that is the generic path, not the one tested here.
    let replace_after = Duration::from_secs(90);
    let settings = skyport::config::TunnelArgs {
        provider: Some("guest".into()),
        exit_server_url: mirror.url_template.clone(),
        // The VMs reach a mirror the operator does not (its check would refuse this file before
        // any VM is bought): only the VM can tell.
        skip_exit_server_check: true,
        // Past these a VM that cannot be reached was replaced, with a generic reason.
        boot_timeout: Duration::from_secs(20),
        replace_after,
        max_replacements: 3,
        ..tunnels::fast_tunnel_settings()
    };
    let op = TunnelOperator::start_serving(&ns, settings, vec![guests.clone()], exe.clone()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let ports = serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    services
        .create(&Default::default(), &service("web", Some("skyport.dev/tunnel"), serde_json::json!({}), ports))
        .await
        .unwrap();

    let refused = eventually("Ready=False ExitServerArtifactRefused", Duration::from_secs(180), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let (_, reason, message) = tunnels::ready(&t)?;
        (reason == "ExitServerArtifactRefused").then_some((t, message))
    })
    .await;
    let (tunnel, message) = refused;
    assert!(message.contains("digest-mismatch") && message.contains("--exit-server-url"), "{message}");
    let id = host_id(&tunnel);
    // What was bought before the refusal was heard; nothing may be bought after it.
    let replaced_before = tunnel.status.as_ref().and_then(|s| s.replacements);
    let downloads_before = mirror.downloads();
    println!("before the refusal was read: {replaced_before:?} replacements, {downloads_before} downloads");
    // The guest serves its refusal on the control port, where nothing else listens now: how the
    // operator hears of it where the provider keeps no console (DigitalOcean, Hetzner).
    let served = common::guest::served_on(&host_ip(&tunnel), op.ctx.settings.control_port).await;
    assert!(served.contains("skyport-exit-server-install: refused digest-mismatch"), "{served:?}");
    events_with(&ns.client, &ns.name, "web-tunnel", "ExitServerArtifactRefused").await;
    // The Service's owner is told too.
    events_with(&ns.client, &ns.name, "web", "ExitServerArtifactRefused").await;

    // Well past the replacement wait: the same guest, no new VM, no second download.
    tokio::time::sleep(replace_after + Duration::from_secs(10)).await;
    let after = tunnels.get("web-tunnel").await.unwrap();
    assert_eq!(tunnels::ready(&after).map(|r| r.1), Some("ExitServerArtifactRefused".into()));
    assert_eq!(host_id(&after), id, "a VM that refused the artifact was replaced");
    assert_eq!(after.status.as_ref().and_then(|s| s.replacements), replaced_before);
    let owned = guests.list_by_tag(TAG_TUNNEL_UID, &after.uid().unwrap()).await.unwrap();
    assert_eq!(owned.len(), 1, "one guest: {owned:?}");
    assert_eq!(mirror.downloads(), downloads_before, "no other VM downloaded the binary");

    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    assert!(traces(&id).is_empty(), "the guest left {:?}", traces(&id));
    tunnels::finish_tunnels(op, ns).await;
}

//! A highly available Tunnel (mode `ActiveStandby`) on booted guests, through the operator: two
//! guests (`providers::guest`), each booted by real cloud-init from the user data the controller
//! renders, with the pair's reserved address on its interface and its own client run from its
//! Deployment (`common::kubelet`); this machine routes the address to the active guest. The
//! active guest is powered off while a request goes to the address every 100 ms: the address
//! moves to the other guest and bytes flow through the same address again, with a Failover Event
//! and `status.highAvailability.lastFailover`; the powered-off guest is replaced, and nothing is
//! left once the Service goes.
//!
//! Needs root, the guest root file system and the static build (tests/run.sh provides them).
//! Where guests cannot boot the test fails, unless `SKYPORT_SKIP_GUEST_TESTS=1` opts out.

use crate::common;
use crate::common::tunnels;

use std::time::{Duration, Instant};

use common::guest::{guest_exe, rootfs_or_skip};
use common::kubelet::{Backends, ClientRunner};
use common::mirror::https_mirror;
use common::requests::Requests;
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use providers::HostProvider;
use providers::hosts::{MANAGED_BY_VALUE, TAG_MANAGED_BY, TAG_TUNNEL_UID};
use skyport::crd::Tunnel;
use skyport::crd::tunnel::HighAvailabilityStatus;
use tunnels::{TunnelOperator, active, carries, events, service};

use crate::tunnel_guest::{ingress_is, provider, traces};

const PORT: u16 = 8080;

fn ha(t: &Tunnel) -> HighAvailabilityStatus {
    t.status.as_ref().and_then(|s| s.high_availability.clone()).expect("status.highAvailability")
}

/// This machine's routes of `ip`.
fn routes(ip: &str) -> String {
    let out = std::process::Command::new("ip").args(["-4", "route", "show", &format!("{ip}/32")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Waits until both servers of the pair pass their checks, neither of them `not`.
async fn both_passing(tunnels: &Api<Tunnel>, not: Option<&str>, within: Duration) -> Tunnel {
    eventually("both exit servers of the pair pass their checks", within, || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let servers = ha(&t).servers;
        let fresh = servers.iter().all(|s| s.healthy && s.host_id.is_some() && s.host_id.as_deref() != not);
        (servers.len() == 2 && fresh).then_some(t)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_highly_available_tunnel_on_booted_guests_moves_its_address_off_a_powered_off_guest() {
    let Some(rootfs) = rootfs_or_skip("a_highly_available_tunnel_on_booted_guests") else { return };
    let exe = guest_exe();
    let mirror = https_mirror(std::fs::read(&exe).unwrap()).await;
    let ns = TestNs::new("tun-guest-ha").await;
    let (guests, guard) = provider(&ns, &rootfs, &mirror);
    let state = guard.1.clone();
    let settings = mirror.check_settings(skyport::config::TunnelArgs {
        provider: Some("guest".into()),
        exit_server_url: mirror.url_template.clone(),
        ..tunnels::fast_tunnel_settings()
    });
    let op = TunnelOperator::start_serving(&ns, settings, vec![guests.clone()], exe.clone()).await;
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = serde_json::json!({"skyport.dev/address": "reserved", "skyport.dev/high-availability": "true"});
    let ports = serde_json::json!([{"name": "http", "port": PORT, "protocol": "TCP"}]);
    let started = Instant::now();
    services
        .create(&Default::default(), &service("web", Some("skyport.dev/tunnel"), annotations, ports))
        .await
        .unwrap();
    let backends = Backends::default();
    let _clients = ["a", "b"].map(|slot| {
        let deployment = format!("web-tunnel-client-{slot}");
        ClientRunner::start(ns.client.clone(), &ns.name, &deployment, backends.clone())
    });

    // Active: both guests booted in parallel, installed the checked binary, passed their checks
    // at their own addresses; the reserved address is routed to the active one, and real bytes
    // flow through it.
    let first = active(&tunnels, "web-tunnel", Duration::from_secs(300)).await;
    let ip = first.status.as_ref().and_then(|s| s.address_ip.clone()).expect("addressIp");
    let holder = ha(&first).active.expect("an active exit server");
    carries(&ip, PORT, None).await;
    eprintln!("guest pair: Service created -> bytes through the reserved address: {:?}", started.elapsed());
    assert!(ip.starts_with("10.214."), "a movable address, no guest's link: {ip}");
    assert_eq!(ha(&first).limitation, None, "the guest provider moves the address");
    let (_, _, message) = tunnels::ready(&first).unwrap();
    assert!(message.contains("its own address"), "checked where it was checked: {message}");
    ingress_is(&services, &ip).await;
    let pair = both_passing(&tunnels, None, Duration::from_secs(120)).await;
    for server in ha(&pair).servers {
        let machine = guests.machine(server.host_id.as_deref().unwrap()).unwrap();
        assert_eq!(server.host_ip, Some(machine.ip.to_string()), "each client dials its guest's own address");
        let carried = std::process::Command::new("ip").args(["-n", &machine.name, "-4", "-o", "addr"]).output();
        assert!(String::from_utf8_lossy(&carried.unwrap().stdout).contains(&format!("inet {ip}/32 ")));
    }
    assert!(routes(&ip).contains(&format!("dev {holder}h")), "routed to {holder}: {}", routes(&ip));
    assert_eq!(mirror.downloads(), 2, "each guest downloaded the binary once");

    // The active guest powers off while a request goes to the address every 100 ms.
    let requests = Requests::start(ip.clone(), PORT);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let machine = guests.machine(&holder).unwrap();
    let fault = Instant::now();
    // Powering off blocks until nspawn is gone: off the runtime's threads, so requests go on.
    let off = tokio::task::spawn_blocking(move || machine.stop(Duration::from_secs(30)));
    let moved = eventually("the address on the other guest", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        ha(&t).active.filter(|a| *a != holder).map(|_| t)
    })
    .await;
    let moved_after = fault.elapsed();
    off.await.unwrap();
    eventually("requests through the same address again", Duration::from_secs(60), || async {
        requests.last_answered().filter(|last| *last > fault).map(drop)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ((answered, sent), gap) = (requests.tally(), requests.longest_gap());
    drop(requests);
    // A figure, not an assertion of speed.
    println!(
        "guest failover after the active guest powered off: address moved {:.1} s after it; longest gap \
         without an answer {:.1} s ({answered} of {sent} requests answered)",
        moved_after.as_secs_f64(),
        gap.as_secs_f64()
    );
    let to = ha(&moved).active.unwrap();
    let last = ha(&moved).last_failover.expect("lastFailover");
    assert_eq!((last.from.as_str(), last.to.as_str()), (holder.as_str(), to.as_str()));
    assert_eq!(ha(&moved).failovers, Some(1));
    assert!(routes(&ip).contains(&format!("dev {to}h")), "routed to {to}: {}", routes(&ip));
    let failover = events(&ns.client, &ns.name, "web-tunnel").await;
    assert!(failover.iter().any(|(r, note)| r == "Failover" && note.contains(&holder)), "{failover:?}");
    ingress_is(&services, &ip).await;
    carries(&ip, PORT, None).await;

    // The powered-off guest is replaced by a new standby on a new link address; it leaves nothing.
    both_passing(&tunnels, Some(&holder), Duration::from_secs(300)).await;
    assert_eq!(guests.get(&holder).await.unwrap(), None, "the powered-off guest is deleted");
    assert!(traces(&holder).is_empty(), "the powered-off guest left {:?}", traces(&holder));
    let uid = moved.uid().unwrap();
    assert_eq!(guests.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 2, "no leftover guest");
    assert_eq!(guests.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 1);
    carries(&ip, PORT, None).await;

    // The Service goes: no guest, route, address or file is left.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels, "web-tunnel").await;
    let left = guests.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert!(left.is_empty(), "guests leaked: {left:?}");
    assert_eq!(routes(&ip), "", "the reserved address is still routed");
    let files: Vec<_> = std::fs::read_dir(&state).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(files.is_empty(), "files left in the state directory: {files:?}");
    eprintln!("guest pair: whole test {:?}", started.elapsed());
    tunnels::finish_tunnels(op, ns).await;
}

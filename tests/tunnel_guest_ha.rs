//! A highly available Tunnel (mode `ActiveStandby`) on booted guests, through the operator
//! (`common::guest_pair`): two guests, each booted by real cloud-init from the user data the
//! controller renders, with the pair's reserved address on its interface and its own client;
//! this machine routes the address to the active guest. The active guest is powered off while a
//! request goes to the address every 100 ms: the address moves to the other guest and bytes flow
//! through the same address again, with a Failover Event and
//! `status.highAvailability.lastFailover`; the powered-off guest is replaced by a standby that
//! takes the address when the other is killed in turn (SIGKILL to all its processes, no
//! shutdown), and nothing is left once the Service goes. benches/tunnel.rs `--guest --failover`
//! measures these faults and three more (a hung server, a lost client, the operator with it).
//!
//! Needs root, the guest root file system and the static build (tests/run.sh provides them).
//! Where guests cannot boot the test fails, unless `SKYPORT_SKIP_GUEST_TESTS=1` opts out.

use crate::common;
use crate::common::tunnels;

use std::time::{Duration, Instant};

use common::guest::{guest_exe, rootfs_or_skip};
use common::guest_pair::{GuestPair, PORT, PowerOff, ha};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use providers::HostProvider;
use providers::guest::Machine;
use providers::hosts::{MANAGED_BY_VALUE, TAG_MANAGED_BY, TAG_TUNNEL_UID};
use serde_json::json;
use skyport::crd::Tunnel;
use skyport::crd::pool::{ExitServerPoolSpec, PoolAddressing};
use skyport::crd::tunnel::{AddressMode, HighAvailability, TunnelAddress};
use tunnels::{carries, events_with};

use crate::tunnel_guest::{ingress_is, traces};
use crate::tunnel_guest_ranges::{GuestPool, guest_addresses, guest_pool_of};

/// What guest `machine`'s journal says of the units that put addresses on its interface (read in
/// its own namespaces, through its systemd).
fn journal(machine: &Machine) -> String {
    let comm = |pid: &i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let Some(init) = machine.processes().into_iter().find(|pid| comm(pid).trim() == "systemd") else {
        return format!("no systemd of guest {} found", machine.name);
    };
    use providers::exit::userdata::{ADDRESSES_UNIT_NAME, FIREWALL_UNIT_NAME, UNIT_NAME};
    let units = ["-u", FIREWALL_UNIT_NAME, "-u", ADDRESSES_UNIT_NAME, "-u", UNIT_NAME];
    let out = std::process::Command::new("nsenter")
        .args(["-t", &init.to_string(), "-m", "-p", "journalctl", "--no-pager", "-n", "80"])
        .args(units)
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        .unwrap_or_else(|e| format!("nsenter: {e}"))
}

/// This machine's routes of `ip`.
fn routes(ip: &str) -> String {
    let out = std::process::Command::new("ip").args(["-4", "route", "show", &format!("{ip}/32")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Each guest of the pair carries the reserved address on its interface, and its client dials
/// the guest's own address.
fn carried_by_both(pair: &GuestPair, t: &skyport::crd::Tunnel) {
    for server in ha(t).servers {
        let machine = pair.guests.machine(server.host_id.as_deref().unwrap()).unwrap();
        assert_eq!(server.host_ip, Some(machine.ip.to_string()), "each client dials its guest's own address");
        let carried = guest_addresses(&machine.name);
        assert!(carried.contains(&format!("inet {}/32 ", pair.ip)), "{}: {carried}", machine.name);
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_highly_available_tunnel_on_booted_guests_moves_its_address_off_a_powered_off_guest() {
    let Some(rootfs) = rootfs_or_skip("a_highly_available_tunnel_on_booted_guests") else { return };
    let started = Instant::now();
    // Active: both guests booted in parallel, installed the checked binary, passed their checks
    // at their own addresses; the reserved address is routed to the active one, and real bytes
    // flow through it.
    let pair = GuestPair::start("tun-guest-ha", &rootfs, &guest_exe()).await;
    let (ip, holder, guests) = (pair.ip.clone(), pair.active.clone(), pair.guests.clone());
    eprintln!("guest pair: Service created -> bytes through the reserved address: {:?}", pair.first_bytes);
    assert!(ip.starts_with("10.214."), "a movable address, no guest's link: {ip}");
    let first = pair.tunnels.get("web-tunnel").await.unwrap();
    assert_eq!(ha(&first).limitation, None, "the guest provider moves the address");
    let (_, _, message) = tunnels::ready(&first).unwrap();
    assert!(message.contains("its own address"), "checked where it was checked: {message}");
    ingress_is(&pair.services, &ip).await;
    carried_by_both(&pair, &first);
    assert!(routes(&ip).contains(&format!("dev {holder}h")), "routed to {holder}: {}", routes(&ip));
    assert_eq!(pair.mirror.downloads(), 2, "each guest downloaded the binary once");

    let PowerOff { moved, moved_after, gap, answered, sent } = pair.power_off(&holder).await;
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
    let failover = events_with(&pair.ns.client, &pair.ns.name, "web-tunnel", "Failover").await;
    assert!(failover.iter().any(|(r, note)| r == "Failover" && note.contains(&holder)), "{failover:?}");
    ingress_is(&pair.services, &ip).await;
    carries(&ip, PORT, None).await;

    // The powered-off guest is replaced by a new standby on a new link address, carrying the
    // reserved address too; it leaves nothing.
    let replaced = pair.both_passing(Some(&holder), Duration::from_secs(300)).await;
    carried_by_both(&pair, &replaced);
    assert_eq!(guests.get(&holder).await.unwrap(), None, "the powered-off guest is deleted");
    assert!(traces(&holder).is_empty(), "the powered-off guest left {:?}", traces(&holder));
    let uid = moved.uid().unwrap();
    assert_eq!(guests.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 2, "no leftover guest");
    assert_eq!(guests.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 1);
    carries(&ip, PORT, None).await;

    // Now the other one is killed, with no shutdown (its host died): the address moves onto the
    // replacement all the same.
    let again = pair.kill(&to).await;
    let last = ha(&again.moved).last_failover.expect("lastFailover");
    assert_eq!(last.from, to);
    assert_eq!(ha(&again.moved).failovers, Some(2));
    assert!(routes(&ip).contains(&format!("dev {}h", last.to)), "routed to {}: {}", last.to, routes(&ip));
    carries(&ip, PORT, None).await;

    // The Service goes: no guest, route, address or file is left.
    pair.services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&pair.tunnels, "web-tunnel").await;
    let left = guests.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap();
    assert!(left.is_empty(), "guests leaked: {left:?}");
    assert_eq!(routes(&ip), "", "the reserved address is still routed");
    let files: Vec<_> = std::fs::read_dir(&pair.state).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(files.is_empty(), "files left in the state directory: {files:?}");
    eprintln!("guest pair: whole test {:?}", started.elapsed());
    pair.finish().await;
}

/// An ActiveStandby ExitServerPool with an address per Service, on booted guests: both guests
/// carry the member's own address on their interfaces (their root unit puts each bound address
/// there) and this machine routes it to the active guest. The active guest is powered off: the
/// member's address moves with the pool's reserved one to the other guest, where bytes flow
/// through it again, and the member is published there still.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "boots Debian guests: root, tests/env/build-guest.sh, the static build and tests/env.sh up"]
async fn a_per_service_pool_pair_moves_the_members_address_off_a_powered_off_guest() {
    let spec = ExitServerPoolSpec {
        addressing: PoolAddressing::PerService,
        address: Some(TunnelAddress { mode: AddressMode::Reserved, ..Default::default() }),
        high_availability: Some(HighAvailability::default()),
        ..Default::default()
    };
    let Some(GuestPool { ns, guests, op, pool, pools, _guard, _mirror }) =
        guest_pool_of("a_per_service_pool_pair", "tun-guest-own-ha", spec).await
    else {
        return;
    };
    let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
    let annotations = json!({"skyport.dev/exit-server-pool": pool});
    let ports = json!([{"name": "tcp", "port": PORT, "protocol": "TCP"}]);
    let web = tunnels::service("web", Some("skyport.dev/tunnel"), annotations, ports);
    services.create(&Default::default(), &web).await.unwrap();
    let _kubelet = common::kubelet::AllClients::start(ns.client.clone(), &ns.name);

    let own = tunnels::host_ip(&tunnels::active(&tunnels, "web-tunnel", Duration::from_secs(400)).await);
    let carrier_name = format!("pool-{pool}");
    // The member is Active once the active guest carries it; the standby may still be installing.
    let carrier = common::eventually("both guests of the pair passing", Duration::from_secs(300), || async {
        let t = tunnels.get(&carrier_name).await.ok()?;
        let servers = ha(&t).servers;
        (servers.len() == 2 && servers.iter().all(|s| s.healthy)).then_some(t)
    })
    .await;
    let holder = ha(&carrier).active.expect("an active guest");
    assert_ne!(carrier.status.clone().unwrap().address_ip, Some(own.clone()), "its own address, not the pool's");
    for server in ha(&carrier).servers {
        let id = server.host_id.clone().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !guest_addresses(&id).contains(&format!(" {own}/32 ")) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !guest_addresses(&id).contains(&format!(" {own}/32 ")) {
            let said = guests.machine(&id).map(|m| format!("{}\n{}", journal(&m), m.diagnostics())).unwrap_or_default();
            panic!("{} ({id}) lacks {own}: {}\n{said}", server.slot, guest_addresses(&id));
        }
    }
    assert!(routes(&own).contains(&format!("dev {holder}h")), "routed to {holder}: {}", routes(&own));
    carries(&own, PORT, None).await;

    let machine = guests.machine(&holder).expect("the active guest");
    tokio::task::spawn_blocking(move || machine.stop(Duration::from_secs(30))).await.unwrap();
    let to = common::eventually("the member's address routed to the other guest", Duration::from_secs(180), || async {
        let to = ha(&tunnels.get(&carrier_name).await.ok()?).active.filter(|a| a != &holder)?;
        routes(&own).contains(&format!("dev {to}h")).then_some(to)
    })
    .await;
    carries(&own, PORT, None).await;
    let member = tunnels::active(&tunnels, "web-tunnel", Duration::from_secs(120)).await;
    assert_eq!(tunnels::host_ip(&member), own, "published at its own address on {to}");

    services.delete("web", &DeleteParams::default()).await.unwrap();
    common::eventually("the pool's Tunnels gone with its last member", Duration::from_secs(180), || async {
        tunnels.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    assert_eq!(routes(&own), "", "the member's address is still routed");
    pools.delete(&pool, &Default::default()).await.unwrap();
    tunnels::finish_tunnels(op, ns).await;
}

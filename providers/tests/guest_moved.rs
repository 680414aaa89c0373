//! A highly available pair's address on the guest provider, with two real booted guests: reserved
//! movable (of its own range, no guest's link), carried on both guests' interfaces by the user
//! data the controller renders for such a pair, and moved between them by this machine's route,
//! so bytes sent to it reach whichever guest holds it: both running, then off one powered off.
//! Nothing of the address is left once its holder is deleted and it is released. A small HTTP
//! server in each guest (started by its cloud-init) stands in for the exit server, whose download
//! leads nowhere here, and answers with the guest's name.
//!
//! Needs root. Where guests cannot boot this fails, unless `SKYPORT_SKIP_GUEST_TESTS=1` opts out.

mod contract;
mod guest_support;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use guest_support::{provider, until_carried};
use providers::exit::userdata::{Artifact, render_cloud_config_with};
use providers::hosts::{AddressRequest, HostProvider, HostState, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The exit server's service port (`contract::exit_server`), which the guest's firewall admits.
const PORT: u16 = 80;

/// A pair's server's user data, as the controller renders it where the provider binds the moved
/// address, and a script serving the guest's name on [`PORT`].
fn user_data(moved: Ipv4Addr) -> String {
    let artifact =
        Artifact { arch: "x86_64".into(), url: "https://example.test/skyport-x86_64".into(), sha256: "ab".repeat(32) };
    let config = render_cloud_config_with(&contract::exit_server(), &[artifact], &[moved]).unwrap();
    let script = format!(
        "#!/bin/sh\nmkdir -p /srv/who && hostname > /srv/who/name\n\
         systemd-run --unit=who python3 -m http.server {PORT} --directory /srv/who\n"
    );
    let b = "skyport-moved-test";
    format!(
        "Content-Type: multipart/mixed; boundary=\"{b}\"\nMIME-Version: 1.0\n\n\
         --{b}\nContent-Type: text/cloud-config; charset=\"us-ascii\"\n\n{config}\n\
         --{b}\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\n\n{script}\n--{b}--\n"
    )
}

/// The name of the guest answering on `ip`, or `None` when none does within 2 s.
async fn who(ip: &str) -> Option<String> {
    let ask = async {
        let mut conn = tokio::net::TcpStream::connect((ip, PORT)).await.ok()?;
        conn.write_all(b"GET /name HTTP/1.0\r\n\r\n").await.ok()?;
        let mut reply = String::new();
        conn.read_to_string(&mut reply).await.ok()?;
        reply.split_once("\r\n\r\n").map(|(_, body)| body.trim().to_string())
    };
    tokio::time::timeout(Duration::from_secs(2), ask).await.ok()?
}

/// Waits until guest `name` answers on `ip`; how long that took.
async fn answers(ip: &str, name: &str, within: Duration) -> Duration {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < within {
        last = who(ip).await;
        if last.as_deref() == Some(name) {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} did not answer on {ip} within {within:?}; last answer: {last:?}");
}

/// This machine's routes of `ip`.
fn routes(ip: &str) -> String {
    let out = std::process::Command::new("ip").args(["-4", "route", "show", &format!("{ip}/32")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn a_pairs_address_moves_between_booted_guests_and_reaches_whichever_holds_it() {
    let Some((p, state)) = provider("moved-pair") else { return };
    assert_eq!(p.capabilities().may_move_addresses(p.name()), Ok(()));
    assert!(p.capabilities().binds_moved_address(), "a pair's guests carry the address on their interfaces");
    let uid = contract::fresh_uid();
    let base = contract::request("skyport-pair", &uid);
    let request = AddressRequest {
        name: "skyport-pair".into(),
        region: None,
        tags: base.tags.clone(),
        host_id: None,
        movable: true,
    };
    let address = p.reserve_address(&request).await.unwrap();
    let ip = address.ip.clone();
    assert!(ip.starts_with("10.214."), "of the moved range, no guest's link: {ip}");
    assert_eq!(address.host_id, None);

    let started = Instant::now();
    let create = |slot: &'static str| {
        let mut request = base.clone();
        request.name = format!("skyport-pair-{slot}");
        request.user_data = user_data(ip.parse().unwrap());
        request.tags.insert(TAG_TUNNEL_SLOT.into(), slot.into());
        let p = &p;
        async move { p.create(&request).await.unwrap() }
    };
    let (a, b) = tokio::join!(create("a"), create("b"));
    let (ma, mb) = (p.machine(&a.id).unwrap(), p.machine(&b.id).unwrap());
    for (host, machine) in [(&a, &ma), (&b, &mb)] {
        assert_eq!(host.public_ipv4, Some(machine.ip.to_string()), "a pair's guest keeps its own link address");
        until_carried(machine, &ip).await;
        answers(&machine.ip.to_string(), &machine.name, Duration::from_secs(120)).await;
    }
    eprintln!("two guests booted and serving: {:?}", started.elapsed());
    // Carried by both guests, routed to neither: neither answers (whatever the machine's default
    // route leads to may).
    let before = who(&ip).await;
    assert!(![&ma.name, &mb.name].map(|n| Some(n.clone())).contains(&before), "{before:?}");

    // Onto a, then onto b while both run, then back: each time the holder answers.
    for (host, name) in [(&a, &ma.name), (&b, &mb.name), (&a, &ma.name)] {
        p.assign_address(&address.id, &host.id).await.unwrap();
        p.assign_address(&address.id, &host.id).await.expect("already there is success");
        let took = answers(&ip, name, Duration::from_secs(10)).await;
        eprintln!("moved to {}: answered after {took:?}", host.id);
        assert_eq!(p.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(host.id.as_str()));
        let listed = p.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
        assert_eq!(listed.iter().map(|a| a.host_id.clone()).collect::<Vec<_>>(), [Some(host.id.clone())]);
    }

    // a powers off while holding it: still routed there (a failover moves it), and no guest
    // that is not running takes it.
    ma.stop(Duration::from_secs(30));
    assert_eq!(p.get(&a.id).await.unwrap().map(|h| h.state), Some(HostState::Stopped));
    let off = who(&ip).await;
    assert!(![&ma.name, &mb.name].map(|n| Some(n.clone())).contains(&off), "{off:?}");
    assert_eq!(p.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(a.id.as_str()));
    let refused = p.assign_address(&address.id, &a.id).await.unwrap_err().to_string();
    assert!(refused.contains("not running"), "{refused}");
    let moved = Instant::now();
    p.assign_address(&address.id, &b.id).await.unwrap();
    let took = answers(&ip, &mb.name, Duration::from_secs(10)).await;
    eprintln!("moved off the powered-off guest: answered {took:?} after the move ({:?} with it)", moved.elapsed());
    // An operator started anew over the same state sees the same holder.
    let restarted = providers::guest::GuestProvider::new(state.0.clone()).unwrap();
    assert_eq!(restarted.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(b.id.as_str()));

    // The holder deleted: its route goes with its link; the address is kept, held by nobody.
    p.delete(&a.id).await.unwrap();
    p.delete(&b.id).await.unwrap();
    assert_eq!(routes(&ip), "", "no route to a deleted guest");
    assert_eq!(p.get_address(&address.id).await.unwrap().map(|a| a.host_id), Some(None));
    p.release_address(&address.id).await.unwrap();
    p.release_address(&address.id).await.expect("released twice");
    assert_eq!(p.get_address(&address.id).await.unwrap(), None);
}

/// Released while a running guest holds it: its route goes too, and the guest keeps running.
#[tokio::test]
#[ignore = "boots Debian guests: root and tests/env/build-guest.sh (tests/run.sh)"]
async fn releasing_a_pairs_address_removes_its_route() {
    let Some((p, _state)) = provider("moved-release") else { return };
    let mut request = contract::request("skyport-release", &contract::fresh_uid());
    let reserve = AddressRequest {
        name: "skyport-release".into(),
        region: None,
        tags: request.tags.clone(),
        host_id: None,
        movable: true,
    };
    let address = p.reserve_address(&reserve).await.unwrap();
    request.tags.insert(TAG_TUNNEL_SLOT.into(), "a".into());
    let host = p.create(&request).await.unwrap();
    p.assign_address(&address.id, &host.id).await.unwrap();
    assert!(routes(&address.ip).contains(&format!("dev {}h", host.id)), "{}", routes(&address.ip));
    p.release_address(&address.id).await.unwrap();
    assert_eq!(routes(&address.ip), "");
    assert_eq!(p.get(&host.id).await.unwrap().map(|h| h.state), Some(HostState::Running));
    // A single exit server's reservation is still a link address, which new guests are made with.
    let single = AddressRequest { movable: false, ..reserve };
    let link = p.reserve_address(&single).await.unwrap();
    assert!(link.ip.starts_with("10.213."), "{}", link.ip);
    let err = p.assign_address(&link.id, &host.id).await.unwrap_err().to_string();
    assert!(err.contains("not created with address"), "{err}");
    p.delete(&host.id).await.unwrap();
}

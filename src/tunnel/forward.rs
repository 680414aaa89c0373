//! `skyport tunnel server --forward-file`: how the local provider gives an exit server a reserved
//! address that can move without disturbing any tunnel. A cloud points a reserved address at a VM
//! by translating it at its edge: the VM's services stay bound to its own address and its client
//! stays connected, so new connections reach whichever VM the cloud points the address at. Here
//! the server itself listens on the address named in the forward file, on every service port of
//! its configuration (TCP and UDP), and relays to its own rathole listener on that port.
//!
//! The listeners set `SO_REUSEPORT`, so during a move both servers hold the address for a moment:
//! the provider names the address in the new holder's forward file, waits until the server
//! acknowledges (the `.bound` file next to it repeats the request, generation included, once
//! every port is bound), and only then empties the old holder's, whose listeners close. New
//! connections go to the new holder from the moment it binds, even while an old holder that hangs
//! keeps its listeners ([`to_the_newer`]). No connection attempt finds nobody listening; with `net.ipv4.tcp_migrate_req=1` the kernel hands
//! connections still queued on a closing listener to the new holder's instead of resetting them.
//! Established connections carry on where they were, as a cloud's connection tracking keeps them.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use providers::ProxyProtocol;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{info, warn};

pub use providers::local::forward_file::{FORWARD_REFUSED, Forward, bound_file};

use super::front::Layout;

/// How often the forward file and the configuration are looked at.
const POLL: Duration = Duration::from_millis(50);
/// A UDP peer silent for this long loses its relay socket.
const UDP_IDLE: Duration = Duration::from_secs(60);

/// One relay: a port of the reserved address and the server's own listener behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Relay {
    pub udp: bool,
    pub listen: SocketAddr,
    pub target: SocketAddr,
    /// The header this relay writes first: a PROXY protocol service's relay goes straight to
    /// rathole's loopback listener, since only the relay knows the visitor ([`super::proxy`]).
    pub proxy: Option<ProxyProtocol>,
}

/// The relays for reserved address `ip` (none without one) in front of rathole's services in
/// `layout`. A service bound to every address is reached on loopback; one behind a PROXY
/// listener is published on that listener's port.
pub fn relays(ip: Option<Ipv4Addr>, layout: &Layout) -> BTreeSet<Relay> {
    let Some(ip) = ip else { return BTreeSet::new() };
    let parsed =
        layout.services.iter().filter_map(|(kind, address)| Some((kind == "udp", address.parse::<SocketAddr>().ok()?)));
    parsed
        .map(|(udp, mut target)| {
            if target.ip().is_unspecified() {
                target.set_ip(Ipv4Addr::LOCALHOST.into());
            }
            let front = layout.fronts.get(&target).filter(|_| !udp);
            let port = front.map_or(target.port(), |(public, _)| *public);
            Relay { udp, listen: SocketAddr::new(ip.into(), port), target, proxy: front.map(|(_, v)| *v) }
        })
        .collect()
}

/// Keeps the relays of `forward_file`'s address in front of the server's services (`layout`), for
/// as long as the server runs.
pub fn spawn(forward_file: PathBuf, layout: watch::Receiver<Layout>) {
    tokio::spawn(async move {
        let mut running: BTreeMap<Relay, JoinHandle<()>> = BTreeMap::new();
        let mut acked: Option<Forward> = None;
        let mut failing = BTreeSet::new();
        let mut malformed = None;
        loop {
            let request = wanted(&forward_file, &mut malformed);
            let ip = request.address;
            let want = relays(ip, &layout.borrow());
            running.retain(|relay, task| {
                let keep = want.contains(relay) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            let missing: Vec<Relay> = want.iter().filter(|r| !running.contains_key(r)).copied().collect();
            for relay in missing {
                match start(relay) {
                    Ok(task) => {
                        failing.remove(&relay);
                        running.insert(relay, task);
                    }
                    Err(e) if failing.insert(relay) => {
                        warn!(listen = %relay.listen, udp = relay.udp, "{FORWARD_REFUSED}: {e}")
                    }
                    Err(_) => {}
                }
            }
            // A new generation for the same address is acknowledged too: its requester waits
            // for exactly that one.
            if running.len() == want.len() && acked != Some(request) {
                match acknowledge(&forward_file, request) {
                    Ok(()) => {
                        let (generation, ports) = (request.generation, want.len());
                        info!(address = ?ip, generation, ports, "forwarding the reserved address");
                        if ip.is_some() && !migrates() {
                            warn!(
                                "net.ipv4.tcp_migrate_req is not 1: when this server gives the address up, a connection still queued on its listener is reset"
                            );
                        }
                        acked = Some(request);
                    }
                    Err(e) => warn!("cannot acknowledge the forward file: {e}"),
                }
            }
            tokio::time::sleep(POLL).await;
        }
    });
}

/// Whether the kernel hands connections queued on a closed listener to another of its
/// `SO_REUSEPORT` group, which makes giving the address up lossless.
fn migrates() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_migrate_req").is_ok_and(|v| v.trim() == "1")
}

/// The forward file's request; none without the file. A malformed file forwards nothing either,
/// and is said so once (`malformed` keeps the last error) rather than at every poll.
fn wanted(forward_file: &Path, malformed: &mut Option<String>) -> Forward {
    match Forward::read(forward_file) {
        Ok(request) => {
            *malformed = None;
            request.unwrap_or_default()
        }
        Err(e) => {
            if malformed.as_ref() != Some(&e) {
                warn!("the forward file is not `<generation> [<IPv4 address>]`, so nothing is forwarded: {e}");
                *malformed = Some(e);
            }
            Forward::default()
        }
    }
}

/// Writes `request` as the acknowledgement through a rename, or, without an address, removes it.
fn acknowledge(forward_file: &Path, request: Forward) -> std::io::Result<()> {
    let bound = bound_file(forward_file);
    if request.address.is_none() {
        return match std::fs::remove_file(&bound) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let tmp = bound.with_extension("tmp");
    std::fs::write(&tmp, request.render())?;
    std::fs::rename(tmp, bound)
}

/// Binds `relay`'s listener ([`bind`]) and relays from it until aborted.
fn start(relay: Relay) -> std::io::Result<JoinHandle<()>> {
    let socket = bind(&relay)?;
    if relay.udp {
        let socket = UdpSocket::from_std(socket.into())?;
        return Ok(tokio::spawn(udp(Arc::new(socket), relay.target)));
    }
    let listener = TcpListener::from_std(socket.into())?;
    Ok(tokio::spawn(super::proxy::serve(listener, relay.target, relay.proxy)))
}

/// `relay`'s socket on the reserved address, non-blocking, with `SO_REUSEPORT` (listening, for
/// TCP), and the newer of two servers on it taking what arrives ([`to_the_newer`]).
fn bind(relay: &Relay) -> std::io::Result<socket2::Socket> {
    let kind = if relay.udp { socket2::Type::DGRAM } else { socket2::Type::STREAM };
    let socket = socket2::Socket::new(socket2::Domain::IPV4, kind, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&relay.listen.into())?;
    if !relay.udp {
        socket.listen(1024)?;
    }
    to_the_newer(&socket)?;
    Ok(socket)
}

/// Sends every new connection (or datagram) on the address to the second socket of its
/// `SO_REUSEPORT` group, a classic BPF program returning 1. During a move the group holds the
/// old holder's socket and then the new holder's, in that order (the kernel appends a socket,
/// and moves the last into a closed one's place), so the new holder takes everything from the
/// moment it binds, as a cloud sends new connections to the VM it moved the address to; without
/// it the kernel spreads them by hash, and an old holder that hangs, never closing its
/// listeners, would keep about half. With one socket the index is out of range and the kernel
/// falls back to its hash, that is to the only one.
fn to_the_newer(socket: &socket2::Socket) -> std::io::Result<()> {
    use nix::libc::{BPF_K, BPF_RET, sock_filter, sock_fprog};
    let mut program = [sock_filter { code: (BPF_RET | BPF_K) as u16, jt: 0, jf: 0, k: 1 }];
    let program = sock_fprog { len: 1, filter: program.as_mut_ptr() };
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::AttachReusePortCbpf, &program)?;
    Ok(())
}

/// One relay socket per peer, connected to `target`; its replies go back from the reserved
/// address. The relays are this task's: they end with it, so a stopped forward holds no socket.
async fn udp(socket: Arc<UdpSocket>, target: SocketAddr) {
    let mut peers: BTreeMap<SocketAddr, (Arc<UdpSocket>, tokio::task::AbortHandle)> = BTreeMap::new();
    let mut replies = JoinSet::new();
    let mut buf = vec![0u8; 65_535];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            tokio::time::sleep(POLL).await;
            continue;
        };
        while replies.try_join_next().is_some() {}
        peers.retain(|_, (_, task)| !task.is_finished());
        let relay = match peers.entry(peer) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => match open_relay(&socket, target, peer, &mut replies).await {
                Some(relay) => e.insert(relay),
                None => continue,
            },
        };
        let _ = relay.0.send(&buf[..n]).await;
    }
}

/// A socket connected to `target` for `peer`, whose replies a task of `replies` sends back to
/// `peer` from `socket`, until `peer` has been silent for [`UDP_IDLE`].
async fn open_relay(
    socket: &Arc<UdpSocket>,
    target: SocketAddr,
    peer: SocketAddr,
    replies: &mut JoinSet<()>,
) -> Option<(Arc<UdpSocket>, tokio::task::AbortHandle)> {
    let upstream = UdpSocket::bind(SocketAddr::new(target.ip(), 0)).await.ok()?;
    upstream.connect(target).await.ok()?;
    let upstream = Arc::new(upstream);
    let (back, from) = (socket.clone(), upstream.clone());
    let task = replies.spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE, from.recv(&mut buf)).await {
            let _ = back.send_to(&buf[..n], peer).await;
        }
    });
    Some((upstream, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn services(list: &[(&str, &str)]) -> Layout {
        Layout { services: list.iter().map(|(k, a)| (k.to_string(), a.to_string())).collect(), ..Layout::default() }
    }

    #[test]
    fn every_service_port_is_relayed_from_the_reserved_address_to_the_servers_own() {
        let own = services(&[("tcp", "10.204.0.5:8080"), ("udp", "10.204.0.5:5353"), ("tcp", "0.0.0.0:9000")]);
        let got: Vec<Relay> = relays(Some(Ipv4Addr::new(10, 204, 0, 3)), &own).into_iter().collect();
        let relay = |udp, port, target: &str| Relay {
            udp,
            listen: SocketAddr::new(Ipv4Addr::new(10, 204, 0, 3).into(), port),
            target: target.parse().unwrap(),
            proxy: None,
        };
        assert_eq!(
            got,
            [
                relay(false, 8080, "10.204.0.5:8080"),
                relay(false, 9000, "127.0.0.1:9000"),
                relay(true, 5353, "10.204.0.5:5353")
            ]
        );
        assert!(relays(None, &own).is_empty(), "no address, nothing forwarded");
    }

    #[test]
    fn a_proxy_protocol_service_is_relayed_on_its_public_port_straight_to_rathole_with_the_header() {
        let mut layout = services(&[("tcp", "127.0.0.1:41000"), ("tcp", "10.204.0.5:8080")]);
        layout.fronts.insert("127.0.0.1:41000".parse().unwrap(), (443, ProxyProtocol::V2));
        let got: Vec<Relay> = relays(Some(Ipv4Addr::new(10, 204, 0, 3)), &layout).into_iter().collect();
        let listen = |port| SocketAddr::new(Ipv4Addr::new(10, 204, 0, 3).into(), port);
        assert_eq!(
            got,
            [
                Relay {
                    udp: false,
                    listen: listen(443),
                    target: "127.0.0.1:41000".parse().unwrap(),
                    proxy: Some(ProxyProtocol::V2)
                },
                Relay { udp: false, listen: listen(8080), target: "10.204.0.5:8080".parse().unwrap(), proxy: None },
            ]
        );
    }

    /// How many connections `listener` has queued (it is non-blocking).
    fn queued(listener: &socket2::Socket) -> usize {
        std::iter::from_fn(|| listener.accept().ok()).count()
    }

    #[test]
    fn while_two_servers_hold_the_address_every_new_connection_goes_to_the_newer() {
        // The holder the address moves off, hung: it never closes its listener nor accepts.
        let relay = |port| Relay {
            udp: false,
            listen: SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port),
            target: "127.0.0.1:9".parse().unwrap(),
            proxy: None,
        };
        let old = bind(&relay(0)).unwrap();
        let port = old.local_addr().unwrap().as_socket().unwrap().port();
        let new = bind(&relay(port)).unwrap();
        let connections: Vec<_> =
            (0..20).map(|_| std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!((queued(&old), queued(&new)), (0, 20), "the new holder's listener takes them all");
        // The old one gone, the new one takes them as the only one.
        drop((old, connections));
        let _more: Vec<_> =
            (0..5).map(|_| std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(queued(&new), 5);
    }

    #[test]
    fn the_acknowledgement_lives_next_to_the_forward_file() {
        assert_eq!(bound_file(Path::new("/var/x/forward")), PathBuf::from("/var/x/forward.bound"));
    }

    #[test]
    fn the_acknowledgement_repeats_the_request_it_answers_and_a_withdrawal_removes_it() {
        let dir = std::env::temp_dir().join(format!("skyport-forward-ack-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("forward");
        let mut malformed = None;
        let request = Forward { generation: 4, address: Some(Ipv4Addr::new(10, 204, 0, 3)) };
        std::fs::write(&file, request.render()).unwrap();
        assert_eq!(wanted(&file, &mut malformed), request);
        acknowledge(&file, request).unwrap();
        assert_eq!(Forward::read(&bound_file(&file)), Ok(Some(request)));
        acknowledge(&file, Forward { generation: 5, address: None }).unwrap();
        assert_eq!(Forward::read(&bound_file(&file)), Ok(None));

        // An address without its generation is no request: nothing is forwarded, and said why.
        std::fs::write(&file, "10.204.0.3\n").unwrap();
        assert_eq!(wanted(&file, &mut malformed), Forward::default());
        assert!(malformed.as_deref().is_some_and(|e| e.contains("not a generation")), "{malformed:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

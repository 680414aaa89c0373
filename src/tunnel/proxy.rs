//! The PROXY protocol (HAProxy's specification, v1 text and v2 binary) on the exit server: the
//! only place that knows a visitor's address. A service that asks for it is published by
//! skyport's own listener instead of rathole's ([`super::front`]): each accepted connection is
//! relayed to rathole's listener for the service, moved to loopback, after a header naming the
//! visitor and the address it connected to. The tunnel client and the backend's Service see
//! those bytes as the connection's first, and the backend (nginx, HAProxy, Envoy) reads the
//! visitor's address from them.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use providers::ProxyProtocol;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// How long to wait after `accept` fails (out of file descriptors, most likely) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The header for a connection from `source` to `destination`. The two are put in one address
/// family (an IPv4 address as IPv4-mapped IPv6 when the other is IPv6), as both versions require.
pub fn header(version: ProxyProtocol, source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    let (source, destination) = one_family(source, destination);
    match version {
        ProxyProtocol::V1 => ppp::v1::Addresses::from((source, destination)).to_string().into_bytes(),
        ProxyProtocol::V2 => {
            use ppp::v2::{Builder, Command, Protocol, Version};
            // Fails only when TLVs overflow the 16-bit length; this header carries none.
            Builder::with_addresses(Version::Two | Command::Proxy, Protocol::Stream, (source, destination))
                .build()
                .unwrap_or_default()
        }
    }
}

fn one_family(source: SocketAddr, destination: SocketAddr) -> (SocketAddr, SocketAddr) {
    let v6 = |a: SocketAddr| match a.ip() {
        IpAddr::V4(ip) => SocketAddr::new(ip.to_ipv6_mapped().into(), a.port()),
        IpAddr::V6(_) => a,
    };
    if source.is_ipv4() == destination.is_ipv4() { (source, destination) } else { (v6(source), v6(destination)) }
}

/// Relays each connection accepted on `listener` to `target`, in a task of its own that outlives
/// the listener; with `proxy`, the header goes first.
pub async fn serve(listener: TcpListener, target: SocketAddr, proxy: Option<ProxyProtocol>) {
    loop {
        let Ok((inbound, visitor)) = listener.accept().await else {
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            continue;
        };
        tokio::spawn(relay(inbound, visitor, target, proxy));
    }
}

async fn relay(mut inbound: TcpStream, visitor: SocketAddr, target: SocketAddr, proxy: Option<ProxyProtocol>) {
    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
    if let Some(version) = proxy {
        let Ok(local) = inbound.local_addr() else { return };
        if outbound.write_all(&header(version, visitor, local)).await.is_err() {
            return;
        }
    }
    let _ = outbound.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_is_the_text_line_and_v2_parses_back_to_the_same_addresses() {
        let (visitor, local) = (addr("198.51.100.7:40000"), addr("10.0.0.5:443"));
        let v1 = header(ProxyProtocol::V1, visitor, local);
        assert_eq!(v1, b"PROXY TCP4 198.51.100.7 10.0.0.5 40000 443\r\n");

        let v2 = header(ProxyProtocol::V2, visitor, local);
        let parsed = ppp::v2::Header::try_from(v2.as_slice()).unwrap();
        assert_eq!(parsed.command, ppp::v2::Command::Proxy);
        assert_eq!(parsed.addresses, ppp::v2::Addresses::from((visitor, local)));
        assert_eq!(parsed.len(), v2.len(), "the header and nothing after it");
    }

    #[test]
    fn mixed_families_are_sent_as_ipv6() {
        let (visitor, local) = (addr("198.51.100.7:40000"), addr("[2001:db8::5]:443"));
        let v1 = String::from_utf8(header(ProxyProtocol::V1, visitor, local)).unwrap();
        assert_eq!(v1, "PROXY TCP6 ::ffff:198.51.100.7 2001:db8::5 40000 443\r\n");
    }

    /// A visitor from a source address of the test's choosing (127.0.0.2, not the loopback
    /// default) comes out of the relay with that address in the header, then its own bytes.
    #[tokio::test]
    async fn the_relay_writes_the_visitors_own_address_ahead_of_its_bytes() {
        use tokio::io::AsyncReadExt;
        for version in [Some(ProxyProtocol::V1), Some(ProxyProtocol::V2), None] {
            let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let front_at = front.local_addr().unwrap();
            let relay = tokio::spawn(serve(front, backend.local_addr().unwrap(), version));
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(addr("127.0.0.2:0")).unwrap();
            let mut visitor = socket.connect(front_at).await.unwrap();
            let visitor_at = visitor.local_addr().unwrap();
            visitor.write_all(b"hello").await.unwrap();
            visitor.shutdown().await.unwrap();
            let (mut conn, _) = backend.accept().await.unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).await.unwrap();
            let want = version.map(|v| header(v, visitor_at, front_at)).unwrap_or_default();
            assert_eq!(got, [want.as_slice(), b"hello"].concat(), "{version:?}");
            if version == Some(ProxyProtocol::V1) {
                assert!(got.starts_with(format!("PROXY TCP4 127.0.0.2 127.0.0.1 {} ", visitor_at.port()).as_bytes()));
            }
            relay.abort();
        }
    }
}

//! What a pool's shared exit server runs for its members, and what each member's client runs:
//! pure functions.
//!
//! The shared server holds one Noise key, its carrier's. Every member gets rathole services of
//! its own, named by its Tunnel's UID, with a token of its own derived from the carrier's: a
//! member's client can serve only its own services, and knowing its token says nothing of the
//! others'. Each member also has a health service of its own on its health port, so the
//! operator's check of one member passes through that member's client alone.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use providers::exit::userdata::{ClientService, Protocol, TunnelClient, TunnelService};

use super::admit::Admission;
use crate::controllers::tunnel::desired::{Credentials, service_name};
use crate::crd::tunnel::TunnelPort;

/// Domain separation: a member token is useless as anything else derived from the carrier's.
const MEMBER_TOKEN_CONTEXT: &str = "skyport-pool-member-v1:";

/// The token of the member whose Tunnel has `uid`, on the carrier's shared server.
pub fn member_token(carrier: &Credentials, uid: &str) -> String {
    let mac = crate::mac::hmac_sha256(carrier.token.as_bytes(), format!("{MEMBER_TOKEN_CONTEXT}{uid}").as_bytes());
    mac.iter().map(|b| format!("{b:02x}")).collect()
}

/// rathole's name of a member's service: `<uid>.tcp-80`, `<uid>.skyport-health`.
fn member_service(uid: &str, service: &str) -> String {
    format!("{uid}.{service}")
}

fn protocol(port: &TunnelPort) -> Protocol {
    if port.protocol == "UDP" { Protocol::Udp } else { Protocol::Tcp }
}

/// Where each member's services listen: everywhere the server answers (`Shared`), or each on the
/// address of its own the shared server reserved for it (`PerService`, by UID).
#[derive(Debug, Clone, Copy)]
pub enum Binds<'a> {
    Shared,
    PerService(&'a BTreeMap<String, Ipv4Addr>),
}

impl Binds<'_> {
    /// Where member `uid`'s services listen: `Some(None)` on the shared address, `Some(ip)` on
    /// its own; `None` while it has no address of its own yet (not served at all: on every
    /// address it would take its ports from every other member).
    fn of(&self, uid: &str) -> Option<Option<Ipv4Addr>> {
        match self {
            Binds::Shared => Some(None),
            Binds::PerService(own) => own.get(uid).map(|ip| Some(*ip)),
        }
    }
}

/// The shared server's services for every carried member, by UID, with their own tokens and
/// their own source ranges (`ranges`, canonical, by UID; none: anywhere), which the server's
/// firewall enforces per service, on the address `binds` gives each.
pub fn member_services<'a>(
    carrier: &Credentials,
    members: impl IntoIterator<Item = (&'a String, &'a Admission)>,
    ranges: &BTreeMap<String, Vec<String>>,
    binds: Binds,
) -> Vec<TunnelService> {
    let mut services = Vec::new();
    for (uid, admission) in members {
        let Admission::Carried { ports, health_port, .. } = admission else { continue };
        let Some(bind) = binds.of(uid) else { continue };
        let token = member_token(carrier, uid);
        services.extend(ports.iter().map(|p| TunnelService {
            name: member_service(uid, &service_name(p)),
            protocol: protocol(p),
            port: u16::try_from(p.port).unwrap_or_default(),
            token: token.clone(),
            source_ranges: ranges.get(uid).cloned().unwrap_or_default(),
            proxy_protocol: p.proxy_protocol.map(Into::into),
            bind,
        }));
        let mut health = crate::tunnel::health_server_service(*health_port, &token);
        health.name = member_service(uid, crate::tunnel::HEALTH_SERVICE);
        health.bind = bind;
        services.push(health);
    }
    services
}

/// Where a member's client dials and what it forwards.
pub struct MemberClient<'a> {
    pub uid: &'a str,
    /// The ports the shared server carries for the member.
    pub ports: &'a [TunnelPort],
    pub health_port: u16,
    /// The member's own token ([`member_token`]).
    pub token: &'a str,
    /// The shared server's Noise public key, pinned by the client.
    pub server_public_key: &'a str,
    /// The shared server's control channel, `ip:port`.
    pub remote_addr: String,
    /// The member Service's cluster IP.
    pub cluster_ip: &'a str,
}

/// A member's client config: its own services only, forwarded to its Service's cluster IP.
pub fn member_client(member: &MemberClient) -> TunnelClient {
    let target =
        if member.cluster_ip.contains(':') { format!("[{}]", member.cluster_ip) } else { member.cluster_ip.into() };
    let mut services: Vec<ClientService> = member
        .ports
        .iter()
        .map(|p| ClientService {
            name: member_service(member.uid, &service_name(p)),
            protocol: protocol(p),
            token: member.token.into(),
            local_addr: format!("{target}:{}", p.port),
        })
        .collect();
    let mut health = crate::tunnel::health_client_service(member.health_port, member.token);
    health.name = member_service(member.uid, crate::tunnel::HEALTH_SERVICE);
    services.push(health);
    TunnelClient {
        remote_addr: member.remote_addr.clone(),
        server_public_key: member.server_public_key.into(),
        services,
    }
}

/// The digest status keeps of what a shared server was configured with: the credentials', and
/// on a pool's shared server its members' (UIDs, health ports, source ranges and own addresses),
/// so a member that joins, leaves, changes its ranges or gets its address makes the server's
/// configuration be pushed again. Without members, `credentials`.
pub fn server_digest<'a>(
    credentials: &str,
    members: impl IntoIterator<Item = (&'a String, &'a Admission)>,
    ranges: &BTreeMap<String, Vec<String>>,
    binds: Binds,
) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new().chain_update(credentials.as_bytes());
    let mut any = false;
    for (uid, admission) in members {
        if let Admission::Carried { health_port, .. } = admission {
            let ranges = ranges.get(uid).map(|r| r.join(",")).unwrap_or_default();
            // Unchanged for a Shared pool's members, so their servers are not pushed again.
            let bind = match binds.of(uid) {
                Some(None) => String::new(),
                Some(Some(ip)) => format!(":{ip}"),
                None => ":-".into(),
            };
            hash.update(format!("\0{uid}:{health_port}:{ranges}{bind}").as_bytes());
            any = true;
        }
    }
    if !any {
        return credentials.to_string();
    }
    hash.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[path = "desired_tests.rs"]
mod tests;

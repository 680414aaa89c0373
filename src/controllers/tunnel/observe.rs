//! Reads what exists: the exit server and its reserved address at the provider, the credentials Secret in the cluster,
//! whether the tunnel carries traffic ([`Probe`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Client, Resource, ResourceExt};
use providers::exit::userdata::NoiseKeypair;
use providers::hosts::{TAG_POOL_MEMBER, TAG_TUNNEL_SLOT, TAG_TUNNEL_UID};
use providers::{Address, Host, HostProvider};
use tracing::info;

use super::desired::{Credentials, KEY_PRIVATE, KEY_TOKEN};
use super::placement::{KEY_CLIENT, Placement, SLOTS};
use super::plan::failover::PROBE_TIMEOUT;
use crate::controllers::MANAGED_BY;
use crate::controllers::owned::{self, Guarded};
use crate::crd::tunnel::{Tunnel, TunnelStatus};
use crate::error::{Error, Result};

/// The Tunnel's exit server, chosen so that every operator looking at the same cloud picks the same
/// one: of the hosts carrying the Tunnel's UID tag (plus the one recorded in status, which a
/// lagging tag index may not list yet), the lowest id. Two operators that both created a host
/// (leader election off by mistake, or a crash between create and record) thus agree on which
/// to keep instead of each keeping its own.
pub struct Found {
    pub host: Option<Host>,
    /// The other hosts with the Tunnel's tag: `act::host` deletes them, so none leaks.
    pub extras: Vec<Host>,
}

/// Looks for the Tunnel's exit server (see [`Found`]).
pub async fn find_host(provider: &dyn HostProvider, status: &TunnelStatus, uid: &str) -> Result<Found> {
    let mut hosts: Vec<Host> = provider
        .list_by_tag(TAG_TUNNEL_UID, uid)
        .await?
        .into_iter()
        .filter(|h| h.state != providers::HostState::Deleting)
        .collect();
    let recorded = status.host_id.clone().filter(|_| status.provider.as_deref() == Some(provider.name()));
    if let Some(id) = recorded
        && !hosts.iter().any(|h| h.id == id)
        && let Some(host) = provider.get(&id).await?
        && host.state != providers::HostState::Deleting
        && tagged_for(&host.tags, uid)
    {
        hosts.push(host);
    }
    hosts.sort_by(|a, b| a.id.cmp(&b.id));
    let mut hosts = hosts.into_iter();
    let host = hosts.next();
    if let Some(h) = &host
        && status.host_id.as_deref() != Some(h.id.as_str())
    {
        info!(host = %h.id, "found the exit server by its owner tag");
    }
    Ok(Found { host, extras: hosts.collect() })
}

/// Whether a host or address an id in status names carries the Tunnel's UID tag: an id in status
/// is not proof (whoever may write `tunnels/status` chooses it), the cloud's tag is. A host read by
/// its id has the tags it was created with, even while a lagging tag index does not list it yet.
/// Whether an address's tags name this Tunnel's namespace and name: one taken over from the
/// Service's previous Tunnel of the same name (never another namespace's).
fn taken_over(tags: &BTreeMap<String, String>, (namespace, name): (&str, &str)) -> bool {
    tags.get(providers::hosts::TAG_TUNNEL_NAMESPACE).is_some_and(|n| n == namespace)
        && tags.get(providers::hosts::TAG_TUNNEL_NAME).is_some_and(|n| n == name)
}

/// Whether `address` is the retained address of this namespace and cluster (`at`) that the
/// Service names (`skyport.dev/reserved-address`, id or IP): handed over to its Tunnel, whose
/// UID and name its tags do not carry. Only the Service's annotation, which skyport's token
/// cannot write, makes an id in status this proof, and only for an address the first take would
/// accept by its tags ([`super::plan::address::retained_here`]).
fn handed(address: &Address, at: (&str, &str), named: &str) -> bool {
    (address.id == named || address.ip == named) && super::plan::address::retained_here(address, at).is_ok()
}

pub fn tagged_for(tags: &BTreeMap<String, String>, uid: &str) -> bool {
    let ours = tags.get(TAG_TUNNEL_UID).is_some_and(|t| t == uid);
    if !ours {
        info!(tunnel_uid = uid, "an id recorded in status names a cloud object without this Tunnel's tag: left alone");
    }
    ours
}

/// A highly available Tunnel's exit servers by slot ([`SLOTS`]): of the hosts carrying its UID
/// tag (plus those recorded in status, which a lagging tag index may not list yet) and the
/// slot's tag, the lowest id; `extras` are the others (a second one for a slot, or one without
/// a slot), to delete.
#[derive(Clone)]
pub struct FoundPair {
    pub hosts: [Option<Host>; 2],
    pub extras: Vec<Host>,
}

/// Looks for a highly available Tunnel's exit servers (see [`FoundPair`]).
pub async fn find_pair(provider: &dyn HostProvider, status: &TunnelStatus, uid: &str) -> Result<FoundPair> {
    let mut hosts = provider.list_by_tag(TAG_TUNNEL_UID, uid).await?;
    let recorded = status.high_availability.iter().flat_map(|ha| &ha.servers).filter_map(|s| s.host_id.clone());
    for id in recorded.collect::<Vec<_>>() {
        if status.provider.as_deref() == Some(provider.name())
            && !hosts.iter().any(|h| h.id == id)
            && let Some(host) = provider.get(&id).await?
            && tagged_for(&host.tags, uid)
        {
            hosts.push(host);
        }
    }
    hosts.retain(|h| h.state != providers::HostState::Deleting);
    hosts.sort_by(|a, b| a.id.cmp(&b.id));
    let (mut pair, mut extras) = ([None, None], Vec::new());
    for host in hosts {
        let slot = host.tags.get(TAG_TUNNEL_SLOT).and_then(|s| SLOTS.iter().position(|slot| slot == s));
        match slot {
            Some(i) if pair[i].is_none() => pair[i] = Some(host),
            _ => extras.push(host),
        }
    }
    Ok(FoundPair { hosts: pair, extras })
}

/// Per highly available Tunnel (by uid): what the provider said of its address and servers at
/// the last read, while every pass since was quiet (both servers running and passing, nothing
/// to do). A quiet pair is re-read only every `--tunnel-resync`, so it costs no cloud calls
/// between: at the 1 s check interval, reading at every pass spent about 3 EC2 calls a second
/// per Tunnel, most of a region's budget, and more than Hetzner's hourly quota allows.
#[derive(Default)]
pub struct PairViews(Mutex<HashMap<String, PairView>>);

/// When it was read, the address, the servers.
type PairView = (Instant, Option<Address>, FoundPair);

impl PairViews {
    fn views(&self) -> std::sync::MutexGuard<'_, HashMap<String, PairView>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tunnel `uid`'s view, if read within `within`.
    pub fn recent(&self, uid: &str, within: Duration) -> Option<(Option<Address>, FoundPair)> {
        let views = self.views();
        let (read, address, found) = views.get(uid)?;
        (read.elapsed() < within).then(|| (address.clone(), found.clone()))
    }

    /// Keeps what a quiet pass read just now.
    pub fn keep(&self, uid: &str, address: Option<Address>, found: FoundPair) {
        self.views().insert(uid.to_string(), (Instant::now(), address, found));
    }

    /// Drops Tunnel `uid`'s view: a pass that was not quiet, or a deleted Tunnel.
    pub fn forget(&self, uid: &str) {
        self.views().remove(uid);
    }
}

/// The Tunnel's reserved address: the one recorded in status if it still exists (it is the one
/// that may be published), else the lowest id of those carrying the Tunnel's UID tag.
pub struct FoundAddress {
    pub address: Option<Address>,
    /// Others with the Tunnel's tag (a crash between reserving and recording): released.
    pub extras: Vec<Address>,
}

/// Looks for the Tunnel's reserved address (see [`FoundAddress`]). The recorded id is read
/// directly too: a DigitalOcean reserved IP between two droplets carries no tags to list it by,
/// and one taken over from this Service's previous Tunnel still carries that Tunnel's UID, with
/// this Tunnel's namespace and name (`tunnel` is (namespace, name)); one handed over by the
/// Service's annotation (`named`) carries this namespace's and `cluster`'s tags.
pub async fn find_address(
    provider: &dyn HostProvider,
    status: &TunnelStatus,
    uid: &str,
    tunnel: (&str, &str),
    (named, cluster): (Option<&str>, &str),
) -> Result<FoundAddress> {
    let listed = provider.list_addresses_by_tag(TAG_TUNNEL_UID, uid).await?;
    let mut addresses: Vec<Address> = listed.into_iter().filter(|a| !is_member_address(&a.tags)).collect();
    let recorded = status.address_id.clone().filter(|_| status.provider.as_deref() == Some(provider.name()));
    if let Some(id) = &recorded
        && !addresses.iter().any(|a| &a.id == id)
        && let Some(address) = provider.get_address(id).await?
        && !is_member_address(&address.tags)
        && (!address.tags.contains_key(TAG_TUNNEL_UID)
            || taken_over(&address.tags, tunnel)
            || named.is_some_and(|n| handed(&address, (tunnel.0, cluster), n))
            || tagged_for(&address.tags, uid))
    {
        // Untagged: a DigitalOcean reserved IP between droplets has no tags to prove it by.
        addresses.push(address);
    }
    addresses.sort_by(|a, b| (Some(&a.id) != recorded.as_ref(), &a.id).cmp(&(Some(&b.id) != recorded.as_ref(), &b.id)));
    let mut addresses = addresses.into_iter();
    Ok(FoundAddress { address: addresses.next(), extras: addresses.collect() })
}

/// Whether `tags` mark a pool member's own address ([`TAG_POOL_MEMBER`]): the shared server's
/// Tunnel UID is on it too, but it is that member's, bound and released by the member's entry
/// alone, never the Tunnel's reserved address nor an extra of it (nor one a Service may name).
pub fn is_member_address(tags: &BTreeMap<String, String>) -> bool {
    tags.contains_key(TAG_POOL_MEMBER)
}

/// The reserved addresses tagged with the Tunnel name `name` (of any namespace and cluster).
pub async fn addresses_named(provider: &dyn HostProvider, name: &str) -> Result<Vec<Address>> {
    Ok(provider.list_addresses_by_tag(providers::hosts::TAG_TUNNEL_NAME, name).await?)
}

/// What the Tunnel's Secret holds.
pub struct Stored {
    pub credentials: Credentials,
    /// The client config last written, if any.
    pub client_toml: Option<String>,
    /// A highly available Tunnel's client configs, by Secret key ([`Placement::client_key`]).
    pub pair_clients: BTreeMap<String, String>,
}

/// The Tunnel's credentials Secret as found.
pub enum SecretState {
    Missing,
    /// Made by skyport for an earlier Tunnel of the same name (deleted, its Secret not yet
    /// garbage-collected): its keys died with that Tunnel and must not serve this one.
    Stale {
        secret_uid: Option<String>,
    },
    Stored(Stored),
}

/// The credentials in the Tunnel's Secret, read only if a Tunnel of this name controls it
/// ([`owned`]: skyport has no `get` on Secrets). A Secret skyport labelled that another Tunnel of
/// this name controls (an earlier one, deleted) is [`SecretState::Stale`]; any other Secret of
/// that name is someone else's: not read, not replaced, reported.
pub async fn credentials(client: &Client, tunnel: &Tunnel, at: &Placement) -> Result<SecretState> {
    let name = &at.secret;
    let tunnel_uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let tests = at.secret_tests(&Tunnel::api_version(&()));
    let secret = match owned::json_patch::<Secret>(client, &at.namespace, name, &tests).await? {
        Guarded::Missing => return Ok(SecretState::Missing),
        Guarded::Ours(secret) => secret,
        Guarded::NotOurs => return Err(not_this_tunnels(name)),
    };
    if !at.is_ours(&secret.metadata) {
        // In the clients' namespace the tests proved it a Tunnel's of this namespace and name.
        if at.beside && !stale(&secret, &tunnel_uid) {
            return Err(not_this_tunnels(name));
        }
        return Ok(SecretState::Stale { secret_uid: secret.metadata.uid.clone() });
    }
    let data = secret.data.unwrap_or_default();
    let read = |key: &str| data.get(key).and_then(|v| String::from_utf8(v.0.clone()).ok());
    match (read(KEY_PRIVATE), read(KEY_TOKEN)) {
        (Some(private), Some(token)) if !token.is_empty() => {
            let keypair = NoiseKeypair::from_private(&private).map_err(|_| {
                Error::InvalidSpec(format!(
                    "Secret {name} holds an unusable {KEY_PRIVATE}; delete the Secret and the Tunnel to start over"
                ))
            })?;
            let pair_clients = SLOTS
                .iter()
                .map(|slot| at.for_slot(slot).client_key())
                .filter_map(|key| Some((key.clone(), read(&key)?)))
                .collect();
            let stored =
                Stored { credentials: Credentials { keypair, token }, client_toml: read(KEY_CLIENT), pair_clients };
            Ok(SecretState::Stored(stored))
        }
        _ => Err(Error::InvalidSpec(format!(
            "Secret {name} lacks {KEY_PRIVATE} or {KEY_TOKEN}; delete the Secret and the Tunnel to start over"
        ))),
    }
}

fn not_this_tunnels(name: &str) -> Error {
    Error::InvalidSpec(format!(
        "Secret {name} exists and is not this Tunnel's (not made by skyport for it); skyport neither reads nor replaces it: delete or rename it"
    ))
}

/// Labelled by skyport and controlled by a Tunnel, but not by this one.
pub fn stale(secret: &Secret, tunnel_uid: &str) -> bool {
    let ours =
        secret.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) == Some(MANAGED_BY.1);
    let controller = secret.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    ours && controller.is_some_and(|o| o.kind == "Tunnel" && o.uid != tunnel_uid)
}

/// The end-to-end health check of the tunnel through an exit server; a trait so reconcile tests
/// can say "answered" or "not answered" without a tunnel.
#[async_trait::async_trait]
pub trait Probe: Send + Sync {
    /// `Ok` only if this tunnel's client answered through `host_ip:port` within `timeout`. The
    /// error is a message for status and Events: it names the address, never the token.
    async fn check(&self, host_ip: &str, port: u16, token: &str, timeout: Duration) -> std::result::Result<(), String>;

    /// Whether `host_ip:port` accepts a TCP connection: asked of the exit server's control port,
    /// which it binds whether or not a client is connected, to tell a server that is down or
    /// unreachable from one that waits for its client.
    async fn reachable(&self, host_ip: &str, port: u16) -> bool;

    /// What `host_ip:port` says unasked, if anything, within a moment: the install report a VM
    /// that refused the binary serves on its control port (a tunnel server there says nothing
    /// until the client's handshake). How a provider without a console tells its VM's refusal.
    async fn install_report(&self, host_ip: &str, port: u16) -> Option<String>;
}

/// The real check, [`crate::tunnel::probe`]: a fresh nonce to the exit server's health port must
/// come back as `HMAC(token, nonce)`. It cannot pass while the exit server is not serving this
/// tunnel: the MAC is computed only by the client's responder, which listens on the client pod's
/// loopback and is reachable from outside solely through a rathole data channel, which the
/// client opens only to a server that proved the Noise private key and sent this service's
/// token; and the exit server binds the health port only while that client is connected. A
/// released or reused address, another tunnel's server or client, or a replayed answer (the
/// nonce is new each time) all fail the comparison.
pub struct NetworkProbe;

#[async_trait::async_trait]
impl Probe for NetworkProbe {
    async fn check(&self, host_ip: &str, port: u16, token: &str, timeout: Duration) -> std::result::Result<(), String> {
        let ip: std::net::IpAddr =
            host_ip.parse().map_err(|_| format!("the exit server's address {host_ip:?} is not an IP address"))?;
        crate::tunnel::probe(std::net::SocketAddr::new(ip, port), token, timeout).await.map_err(|e| e.to_string())
    }

    async fn reachable(&self, host_ip: &str, port: u16) -> bool {
        let Ok(ip) = host_ip.parse::<std::net::IpAddr>() else { return false };
        let connect = tokio::net::TcpStream::connect(std::net::SocketAddr::new(ip, port));
        matches!(tokio::time::timeout(PROBE_TIMEOUT, connect).await, Ok(Ok(_)))
    }

    async fn install_report(&self, host_ip: &str, port: u16) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let ip = host_ip.parse::<std::net::IpAddr>().ok()?;
        let connect = tokio::net::TcpStream::connect(std::net::SocketAddr::new(ip, port));
        let mut conn = tokio::time::timeout(PROBE_TIMEOUT, connect).await.ok()?.ok()?;
        // One report line; the read ends at the server's close, or after a moment of silence.
        let mut buf = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_millis(500), conn.read(&mut buf)).await.ok()?.ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned()).filter(|s| !s.is_empty())
    }
}

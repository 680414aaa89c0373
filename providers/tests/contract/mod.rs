//! The behaviour every host provider must have, shared by the adapters' test files
//! (`mod contract;`): DigitalOcean and Hetzner against their fakes, EC2 against LocalStack, local
//! against real rathole processes.
#![allow(dead_code)] // each test binary uses a different part

use std::time::Duration;

use providers::exit::userdata::{Artifact, ExitServer, Protocol, TunnelService, render_cloud_config};
use providers::hosts::{
    Address, AddressBinding, AddressRequest, HostProvider, HostRequest, HostState, MANAGED_BY_VALUE, TAG_CLUSTER,
    TAG_MANAGED_BY, TAG_TUNNEL_UID, owner_tags,
};

pub const UID: &str = "0b6e3c57-4d0e-4b52-9a43-3f4f7e7d2a10";

/// What differs between providers while they keep the same contract.
pub struct Expect {
    /// `create` reports the host as still provisioning (a booting VM), not yet running.
    pub created_provisioning: bool,
    /// Reads of the host, `interval` apart, after which it must be running.
    pub polls_until_running: u32,
    pub interval: Duration,
    /// The public address is a globally routable one (clouds), not a loopback one (local).
    pub public_address: bool,
}

impl Expect {
    /// A cloud VM that boots for a few reads, then runs with a public address.
    pub fn booting_cloud(polls_until_running: u32) -> Self {
        Expect { created_provisioning: true, polls_until_running, interval: Duration::ZERO, public_address: true }
    }
}

pub fn exit_server() -> ExitServer {
    ExitServer {
        control_port: 2333,
        noise_private_key: "cGhhbnRvbS1rZXktZm9yLXRlc3RzLW9ubHktMzJieXRlcw==".into(),
        services: vec![TunnelService {
            name: "team-a.web.80-tcp".into(),
            protocol: Protocol::Tcp,
            port: 80,
            token: "tok".into(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
            bind: None,
        }],
    }
}

pub fn user_data() -> String {
    let artifact =
        Artifact { arch: "x86_64".into(), url: "https://example.test/skyport-x86_64".into(), sha256: "ab".repeat(32) };
    render_cloud_config(&exit_server(), &[artifact]).unwrap()
}

pub fn request(name: &str, uid: &str) -> HostRequest {
    HostRequest {
        name: name.into(),
        region: None,
        size: None,
        user_data: user_data(),
        server: exit_server(),
        tags: owner_tags(uid, "team-a", "web-tunnel"),
        address: None,
        failure_domain: None,
    }
}

/// The behaviour every host provider must have.
pub async fn run(provider: &dyn HostProvider, expect: Expect) {
    run_with(provider, &request("skyport-web-tunnel", UID), expect).await
}

/// A random UUID-shaped UID, so tests against a shared backend never see each other's hosts.
pub fn fresh_uid() -> String {
    let h: String = (0..16).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Creates a host as the controller would: an `Unavailable` answer (a 5xx) is tried again, a few
/// times. LocalStack's EC2 sometimes answers `InternalError` when parallel tests write security
/// groups at once ("dictionary changed size during iteration"); AWS's 5xx are retried the same way.
/// The adapter deletes what a failed create made, so a retry leaves nothing behind.
pub async fn create(provider: &dyn HostProvider, request: &HostRequest) -> providers::Host {
    let mut attempts = 0;
    loop {
        match provider.create(request).await {
            Ok(host) => return host,
            Err(e @ providers::HostError::Unavailable { .. }) if attempts < 4 => {
                attempts += 1;
                eprintln!("create {}: {e}; trying again", request.name);
                tokio::time::sleep(Duration::from_millis(500 * attempts)).await;
            }
            Err(e) => panic!("create {}: {e}", request.name),
        }
    }
}

/// [`run`] with a request of the caller's (its tags must be `owner_tags(UID, "team-a", "web-tunnel")`).
pub async fn run_with(provider: &dyn HostProvider, request: &HostRequest, expect: Expect) {
    let created = create(provider, request).await;
    assert!(!created.id.is_empty());
    // A provider may make the name unique (Hetzner appends a suffix from the owner's UID).
    assert!(created.name.starts_with(&request.name), "{} for {}", created.name, request.name);
    if expect.created_provisioning {
        assert_eq!(created.state, HostState::Provisioning);
    }
    assert_eq!(created.tags, owner_tags(UID, "team-a", "web-tunnel"), "tags come back in canonical form");

    // Booting: provisioning for a few reads, then running with a public address.
    if expect.created_provisioning {
        let first = provider.get(&created.id).await.unwrap().expect("exists");
        assert_eq!(first.state, HostState::Provisioning);
    }
    let mut running = None;
    for _ in 0..expect.polls_until_running {
        tokio::time::sleep(expect.interval).await;
        let host = provider.get(&created.id).await.unwrap().expect("exists");
        if host.state == HostState::Running {
            running = Some(host);
            break;
        }
    }
    let running = running.expect("running after a few polls");
    let ip: std::net::Ipv4Addr = running.public_ipv4.as_deref().expect("public IPv4").parse().expect("an IPv4 address");
    if expect.public_address {
        assert!(!ip.is_private() && !ip.is_loopback(), "the public address, not the private one");
    }

    // Found by its owner's UID and by the managed-by tag; nothing under another UID.
    let by_uid = provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap();
    assert_eq!(by_uid.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), [created.id.as_str()]);
    assert_eq!(by_uid[0].tags, owner_tags(UID, "team-a", "web-tunnel"));
    assert!(provider.list_by_tag(TAG_MANAGED_BY, MANAGED_BY_VALUE).await.unwrap().iter().any(|h| h.id == created.id));
    assert!(provider.list_by_tag(TAG_TUNNEL_UID, "11111111-2222-3333-4444-555555555555").await.unwrap().is_empty());

    // Deleting is idempotent.
    provider.delete(&created.id).await.expect("delete");
    assert_eq!(provider.get(&created.id).await.unwrap(), None);
    provider.delete(&created.id).await.expect("deleting an already-gone host is success");
    assert!(provider.list_by_tag(TAG_TUNNEL_UID, UID).await.unwrap().is_empty());

    // Every call went through the limiter and was counted.
    let counts = provider.limiter().counters.snapshot();
    assert!(counts.values().sum::<u64>() >= 9, "{counts:?}");
}

/// The reserved-address contract: reserved and tagged like hosts, found by tag, put on the
/// Tunnel's host the provider's way ([`AddressBinding`]: at creation, the one the request
/// names, and a request naming an address another host holds makes no host), kept when that
/// host is replaced, and released. Hosts are made from `base` (its server, size, region); `region` is where to reserve
/// when the provider needs one (Hetzner).
pub async fn run_addresses(provider: &dyn HostProvider, base: &HostRequest, region: Option<&str>, expect: &Expect) {
    let uid = fresh_uid();
    let mut tags = owner_tags(&uid, "team-a", "web-tunnel");
    tags.insert(TAG_CLUSTER.into(), "cluster-contract".into());
    let host_request = |name: &str| HostRequest { name: name.into(), tags: tags.clone(), ..base.clone() };
    // As the controller asks for a single exit server of a Tunnel with a reserved address.
    let with = |request: HostRequest, address: &Address| HostRequest { address: Some(address.id.clone()), ..request };
    let address_request = |host_id: Option<String>| AddressRequest {
        name: format!("skyport-{uid}"),
        region: region.map(str::to_string),
        tags: tags.clone(),
        host_id,
        movable: false,
    };
    let binding = provider.capabilities().address_binding;

    // Reserve it the provider's way and get it onto a first host.
    let (first, address) = match binding {
        AddressBinding::Assign | AddressBinding::AtCreate => {
            let address = provider.reserve_address(&address_request(None)).await.expect("reserve");
            assert_eq!(address.host_id, None);
            let first = running(provider, &with(host_request("skyport-addr-1"), &address), expect).await;
            (first, address)
        }
        AddressBinding::WithHost => {
            let first = running(provider, &host_request("skyport-addr-1"), expect).await;
            let address = provider.reserve_address(&address_request(Some(first.id.clone()))).await.expect("reserve");
            (first, address)
        }
    };
    assert!(address.ip.parse::<std::net::Ipv4Addr>().is_ok(), "{address:?}");
    assert_eq!(address.tags, tags, "reserved addresses carry the owner's tags");
    provider.assign_address(&address.id, &first.id).await.expect("assign (or already there)");
    let got = provider.get_address(&address.id).await.unwrap().expect("exists");
    assert_eq!((got.ip.as_str(), got.host_id.as_deref()), (address.ip.as_str(), Some(first.id.as_str())));
    if binding == AddressBinding::AtCreate {
        assert_eq!(first.public_ipv4.as_deref(), Some(address.ip.as_str()), "created with the reserved address");
        let hosts = provider.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len();
        let taken = with(host_request("skyport-addr-x"), &address);
        assert!(provider.create(&taken).await.is_err(), "an address another host holds is refused");
        assert_eq!(provider.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), hosts, "and no host made");
    }

    // Found by tag after a restart; nothing under another UID.
    let listed = provider.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap();
    assert_eq!(listed.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), [address.id.as_str()]);
    assert!(
        provider
            .list_addresses_by_tag(TAG_CLUSTER, "cluster-contract")
            .await
            .unwrap()
            .iter()
            .any(|a| a.id == address.id)
    );
    assert!(provider.list_addresses_by_tag(TAG_TUNNEL_UID, &fresh_uid()).await.unwrap().is_empty());

    // The host is replaced: the next one gets the same address.
    provider.delete(&first.id).await.expect("delete the first host");
    // Where the address is bound to a region, the replacement is made there (as the controller
    // does); a region the request names already holds both.
    let mut replacement = with(host_request("skyport-addr-2"), &address);
    if replacement.region.is_none() {
        replacement.region = provider.address_region(&address.id).await.expect("the address's region");
    }
    let second = running(provider, &replacement, expect).await;
    provider.assign_address(&address.id, &second.id).await.expect("assign to the replacement");
    let got = provider.get_address(&address.id).await.unwrap().expect("kept across the replacement");
    assert_eq!((got.ip.as_str(), got.host_id.as_deref()), (address.ip.as_str(), Some(second.id.as_str())));
    if binding == AddressBinding::AtCreate {
        assert_eq!(second.public_ipv4.as_deref(), Some(address.ip.as_str()), "the same address again");
    }

    // Released with the Tunnel; releasing twice is success.
    provider.delete(&second.id).await.expect("delete the second host");
    provider.release_address(&address.id).await.expect("release");
    assert_eq!(provider.get_address(&address.id).await.unwrap(), None);
    provider.release_address(&address.id).await.expect("releasing a released address is success");
    assert!(provider.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().is_empty());
}

/// Creates a host and reads it until it runs with a public address.
pub async fn running(provider: &dyn HostProvider, request: &HostRequest, expect: &Expect) -> providers::Host {
    let created = create(provider, request).await;
    for _ in 0..expect.polls_until_running.max(1) {
        tokio::time::sleep(expect.interval).await;
        let host = provider.get(&created.id).await.unwrap().expect("exists");
        if host.state == HostState::Running && host.public_ipv4.is_some() {
            return host;
        }
    }
    panic!("host {} not running after {} reads", created.id, expect.polls_until_running);
}

//! What a host provider can do, as one value ([`Capabilities`]): the Tunnel controller reads it
//! and branches on its fields, never on which provider it talks to.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use super::{AddressBinding, Host, MOVED_ADDRESS_SECONDARY, TAG_BOUND_ADDRESS, TAG_MOVED_ADDRESS};
use crate::exit::userdata::InterfaceAddresses;

/// How a highly available Tunnel's moved address reaches the exit server holding it, which
/// decides how the adapter makes that pair's hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MovedAddress {
    /// The cloud translates the address to one the host already has on the way in (DigitalOcean
    /// reserved IPs), or the adapter binds it itself (local): the host needs nothing for it.
    #[default]
    Translated,
    /// The host's OS must carry the address on its interface to answer on it (Hetzner floating
    /// IPs, guests): a pair's host is made with it configured and tagged with it
    /// ([`super::TAG_BOUND_ADDRESS`]); a host carrying another cannot take this one.
    OnInterface,
    /// The address goes onto a secondary private IPv4 of each host, which the adapter gives a
    /// host at creation and its OS reads from the instance metadata at boot (EC2: an Elastic IP
    /// on the primary one replaces the public IPv4 the server's client dials). Each server keeps
    /// that own address beside the moved one, so the controller checks it there, not where the
    /// API reports its public IPv4 (an emulator may report the moved address).
    SecondaryIp,
}

/// How a host is made to answer on a moved address: what its user data puts on its interface,
/// and the tags that record it on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedSetup {
    /// For the host's user data ([`crate::exit::userdata::render_cloud_config_on`]).
    pub on_interface: InterfaceAddresses,
    /// Added to the host's tags.
    pub tags: BTreeMap<String, String>,
}

impl MovedAddress {
    /// How a highly available Tunnel's host is made to take the moved address `ip` here; `None`
    /// (the default) is a host that takes none (a single server, or a pair publishing both its
    /// servers' own addresses). `Err`: `ip` is not IPv4, where the host must carry it itself.
    pub fn setup(self, ip: Option<&str>) -> Result<MovedSetup, String> {
        let none = MovedSetup { on_interface: InterfaceAddresses::Fixed(Vec::new()), tags: BTreeMap::new() };
        let Some(ip) = ip else { return Ok(none) };
        match self {
            MovedAddress::Translated => Ok(none),
            MovedAddress::OnInterface => {
                let parsed: Ipv4Addr = ip.parse().map_err(|_| format!("reserved address {ip:?} is not IPv4"))?;
                Ok(MovedSetup {
                    on_interface: InterfaceAddresses::Fixed(vec![parsed]),
                    tags: BTreeMap::from([(TAG_BOUND_ADDRESS.to_string(), parsed.to_string())]),
                })
            }
            MovedAddress::SecondaryIp => Ok(MovedSetup {
                on_interface: InterfaceAddresses::Ec2Secondary,
                tags: BTreeMap::from([(TAG_MOVED_ADDRESS.to_string(), MOVED_ADDRESS_SECONDARY.to_string())]),
            }),
        }
    }

    /// Whether `host` can answer on the reserved address `ip`: where the host must carry it on
    /// its interface, only one made with it ([`MovedAddress::setup`] tagged it). Elsewhere every
    /// host can.
    pub fn carried_by(self, host: &Host, ip: Option<&str>) -> bool {
        self != MovedAddress::OnInterface || ip.is_none() || host.tags.get(TAG_BOUND_ADDRESS).map(String::as_str) == ip
    }
}

/// Whether a provider places a highly available Tunnel's two hosts in different failure domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Hosts requested with different [`super::HostRequest::failure_domain`]s go to different
    /// zones, and each host reports its zone ([`Host::placement`]), so status shows what was
    /// checked.
    Zones,
    /// Hosts requested with a failure domain go into one spread placement group per Tunnel,
    /// whose members run on different physical hosts, and each reports its group
    /// ([`Host::placement`]): apart when both report the same one.
    Group,
    /// Placed wherever the provider puts them: why, and what would change it, for the status.
    No(&'static str),
}

impl Default for Spread {
    fn default() -> Self {
        Spread::No(
            "the provider gives no control over where its servers run, so both exit servers may share a failure domain",
        )
    }
}

impl Spread {
    /// What a pair's status says of where its servers run, from their reported zones.
    pub fn describe(self, zones: [Option<&str>; 2]) -> String {
        match (self, zones) {
            (Spread::No(why), _) => why.to_string(),
            (Spread::Zones, [Some(a), Some(b)]) if a != b => format!("in different zones: {a} and {b}"),
            (Spread::Zones, [Some(a), Some(_)]) => format!("both in zone {a}, where the provider placed them"),
            (Spread::Zones, _) => "asked for in different zones; not both reported yet".into(),
            (Spread::Group, [Some(a), Some(b)]) if a == b => format!("on different physical hosts: both in {a}"),
            (Spread::Group, _) => "asked for in one spread placement group; not both reported in it yet".into(),
        }
    }
}

/// What a provider can do, returned by [`super::HostProvider::capabilities`]. The default is a
/// cloud's: reads cost API budget, hosts download the exit-server binary, addresses are assigned
/// to running hosts and cannot be moved for a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Whether reading hosts and addresses costs nothing against a cloud API's budget (hosts on
    /// this machine), so a highly available Tunnel re-reads them at every check pass instead of
    /// only after a change, a failed check or its resync.
    pub reads_are_free: bool,
    /// Whether this provider's hosts download the exit-server binary from the artifact URL, so
    /// the operator checks that URL before buying one (the local provider runs the operator's
    /// own executable).
    pub fetches_artifact: bool,
    /// How reserved addresses get onto hosts here, which decides when the controller reserves
    /// one.
    pub address_binding: AddressBinding,
    /// Whether [`super::HostProvider::assign_address`] moves a reserved address between two
    /// running hosts within seconds while each keeps the address its client dials, which a
    /// highly available Tunnel's failover needs. Only adapters whose move is proven by tests say
    /// yes; [`Capabilities::may_move_addresses`] says why not otherwise.
    pub moves_addresses: bool,
    /// How a moved address reaches the host holding it.
    pub moved_address: MovedAddress,
    /// Whether the exit server's own firewall enforces each service's `source_ranges`: its
    /// nftables ruleset, rendered from the server config the ranges travel in
    /// ([`crate::exit::userdata::render_nftables`]). True for VM providers (the default). The
    /// local provider's exit servers run on the operator's machine without that firewall; EC2
    /// enforces the ranges with the host's security group instead, so its hosts' configs carry
    /// none and a range change touches the group alone.
    pub host_enforces_source_ranges: bool,
    /// Whether one host answers on several addresses of its own, one per Service of an
    /// ExitServerPool with `addressing: PerService`.
    pub pool_addresses: PoolAddresses,
    /// Whether a pair's two hosts are placed in different failure domains.
    pub spread: Spread,
}

/// How an ExitServerPool's shared server gets an address per member Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolAddresses {
    /// One public address per host; why, for the pool's condition.
    One(&'static str),
    /// Each reserved address reaches the host as it is, and the member's services bind it: the
    /// local provider's addresses are local to its machine.
    Bound,
    /// Each is a movable reserved address ([`crate::AddressRequest::movable`]) assigned to the
    /// host ([`super::HostProvider::assign_address`]), which reaches it unchanged; the host puts
    /// the addresses its config binds on its interface (`skyport tunnel addresses`, run as root
    /// after each config push): Hetzner floating IPs, the guest provider's routed addresses.
    Assigned,
    /// Each is assigned to the host as under `Assigned`, but reaches it translated to a private
    /// IPv4 of its own there ([`crate::Address::private_ip`]), which the member's services bind
    /// and the host puts on its interface: an EC2 Elastic IP on a secondary private IPv4 of the
    /// instance. Not on a pair: each server would hold a member's address at a private IPv4 of
    /// its own, and both run one configuration.
    Translated,
}

impl PoolAddresses {
    /// Whether a server here may hold addresses reserved for pool members.
    pub fn several(self) -> bool {
        !matches!(self, PoolAddresses::One(_))
    }

    /// Whether a member's address is reserved movable and assigned to the server holding it.
    pub fn assigned(self) -> bool {
        matches!(self, PoolAddresses::Assigned | PoolAddresses::Translated)
    }

    /// Whether a member's services bind the private IPv4 its address reaches the host at, not
    /// the address itself.
    pub fn translated(self) -> bool {
        matches!(self, PoolAddresses::Translated)
    }

    /// Whether a pool on provider `provider` may give each member an address of its own, on one
    /// server or (`paired`) on whichever server of an ActiveStandby pair is active; why not.
    pub fn per_service(self, provider: &str, paired: bool) -> Result<(), String> {
        match self {
            PoolAddresses::Assigned => Ok(()),
            PoolAddresses::Bound | PoolAddresses::Translated if !paired => Ok(()),
            PoolAddresses::Translated => Err(format!(
                "provider {provider} gives each member's address a private IPv4 of one server, and a pair's two servers run one configuration, which cannot bind both servers' private IPv4s; leave highAvailability out of the pool there"
            )),
            PoolAddresses::Bound => Err(format!(
                "provider {provider} binds each member's address on the machine itself, where a pair's two servers cannot both listen on it; leave highAvailability out of the pool there"
            )),
            PoolAddresses::One(why) => Err(format!(
                "provider {provider} gives a pool's shared server one public address ({why}); use addressing: Shared there"
            )),
        }
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            reads_are_free: false,
            fetches_artifact: true,
            address_binding: AddressBinding::Assign,
            moves_addresses: false,
            moved_address: MovedAddress::Translated,
            host_enforces_source_ranges: true,
            pool_addresses: PoolAddresses::One("skyport puts one address on each of its servers"),
            spread: Spread::default(),
        }
    }
}

impl Capabilities {
    /// `Ok` where a highly available Tunnel's address can move between running hosts of
    /// `provider`; else why not, for the Tunnel's status.
    pub fn may_move_addresses(&self, provider: &str) -> Result<(), String> {
        if self.moves_addresses {
            return Ok(());
        }
        Err(match self.address_binding {
            AddressBinding::AtCreate => format!(
                "{provider} gives a reserved address to a host only when the host is created, so moving it to a standby means replacing that standby"
            ),
            AddressBinding::Assign | AddressBinding::WithHost => {
                format!("skyport does not move reserved addresses between running exit servers at {provider} yet")
            }
        })
    }

    /// Whether a pair's host must carry the moved address on its interface
    /// ([`MovedAddress::OnInterface`]).
    pub fn binds_moved_address(&self) -> bool {
        self.moved_address == MovedAddress::OnInterface
    }

    /// Whether a pair's hosts take the moved address on a secondary private IPv4
    /// ([`MovedAddress::SecondaryIp`]).
    pub fn moves_to_secondary_ip(&self) -> bool {
        self.moved_address == MovedAddress::SecondaryIp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_that_cannot_move_addresses_says_why_by_its_binding() {
        let at_create = Capabilities { address_binding: AddressBinding::AtCreate, ..Capabilities::default() };
        let why = at_create.may_move_addresses("hetzner").unwrap_err();
        assert!(why.contains("only when the host is created"), "{why}");
        let why = Capabilities::default().may_move_addresses("digitalocean").unwrap_err();
        assert!(why.contains("does not move reserved addresses") && why.contains("digitalocean"), "{why}");
        let moves = Capabilities { moves_addresses: true, ..at_create };
        assert_eq!(moves.may_move_addresses("hetzner"), Ok(()));
    }

    #[test]
    fn a_pair_host_is_made_to_take_the_moved_address_as_its_provider_needs() {
        let ip = Some("198.51.100.7");
        let bound = MovedAddress::OnInterface.setup(ip).unwrap();
        assert_eq!(bound.on_interface, InterfaceAddresses::Fixed(vec![Ipv4Addr::new(198, 51, 100, 7)]));
        assert_eq!(bound.tags, BTreeMap::from([(TAG_BOUND_ADDRESS.into(), "198.51.100.7".into())]));
        let secondary = MovedAddress::SecondaryIp.setup(ip).unwrap();
        assert_eq!(secondary.on_interface, InterfaceAddresses::Ec2Secondary);
        assert_eq!(secondary.tags, BTreeMap::from([(TAG_MOVED_ADDRESS.into(), MOVED_ADDRESS_SECONDARY.into())]));
        let nothing = MovedSetup { on_interface: InterfaceAddresses::Fixed(Vec::new()), tags: BTreeMap::new() };
        assert_eq!(MovedAddress::Translated.setup(ip), Ok(nothing.clone()));
        for moved in [MovedAddress::Translated, MovedAddress::OnInterface, MovedAddress::SecondaryIp] {
            assert_eq!(moved.setup(None), Ok(nothing.clone()), "{moved:?}: no address, nothing to carry");
        }
        assert!(MovedAddress::OnInterface.setup(Some("2001:db8::1")).is_err());
    }

    #[test]
    fn a_pair_reads_as_spread_only_where_both_reported_zones_differ() {
        assert_eq!(
            Spread::Zones.describe([Some("eu-west-1a"), Some("eu-west-1b")]),
            "in different zones: eu-west-1a and eu-west-1b"
        );
        assert!(
            Spread::Zones.describe([Some("eu-west-1a"), Some("eu-west-1a")]).starts_with("both in zone eu-west-1a")
        );
        // Not both reported: what was asked for, never a claim of where they run.
        let pending = Spread::Zones.describe([Some("eu-west-1a"), None]);
        assert!(pending.starts_with("asked for in different zones") && pending.contains("not both reported"));
        assert_eq!(Spread::No("same machine").describe([Some("x"), Some("y")]), "same machine");
        let group = Some("placement group 7");
        assert_eq!(Spread::Group.describe([group, group]), "on different physical hosts: both in placement group 7");
        assert!(Spread::Group.describe([group, Some("placement group 8")]).contains("not both"));
        assert!(Spread::Group.describe([group, None]).starts_with("asked for in one spread placement group"));
    }

    #[test]
    fn only_a_host_made_with_the_address_carries_it_where_the_host_must() {
        let host = |tags: &[(&str, &str)]| Host {
            id: "h-1".into(),
            name: "h".into(),
            public_ipv4: None,
            state: super::super::HostState::Running,
            placement: None,
            tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        let made_with = host(&[(TAG_BOUND_ADDRESS, "198.51.100.7")]);
        assert!(MovedAddress::OnInterface.carried_by(&made_with, Some("198.51.100.7")));
        assert!(!MovedAddress::OnInterface.carried_by(&made_with, Some("198.51.100.8")), "reserved anew");
        assert!(!MovedAddress::OnInterface.carried_by(&host(&[]), Some("198.51.100.7")));
        assert!(MovedAddress::OnInterface.carried_by(&host(&[]), None));
        assert!(MovedAddress::Translated.carried_by(&host(&[]), Some("198.51.100.7")));
        assert!(MovedAddress::SecondaryIp.carried_by(&host(&[]), Some("198.51.100.7")));
    }
}

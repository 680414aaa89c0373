//! The in-memory provider's state: its hosts and addresses, and how an address reaches a host
//! as each cloud's does ([`super::provider::FakeProvider`] sets which).

use std::collections::BTreeMap;

use providers::hosts::{TAG_MOVED_ADDRESS, TAG_POOL_MEMBER};
use providers::{Address, AddressBinding, ExitServer, Host, HostError, HostState};

#[derive(Default)]
pub(super) struct Hosts {
    pub(super) by_id: BTreeMap<String, Host>,
    pub(super) next_id: u32,
    pub(super) calls: Vec<&'static str>,
    pub(super) failures: BTreeMap<&'static str, HostError>,
    /// The state a created host reports at first.
    pub(super) created_state: Option<HostState>,
    /// Per host: the Noise private key it was created or last reconfigured with.
    pub(super) keys: BTreeMap<String, String>,
    pub(super) addresses: BTreeMap<String, Address>,
    pub(super) next_address: u32,
    /// How addresses reach hosts here (`Assign` by default).
    pub(super) binding: Option<AddressBinding>,
    /// Whether `reconfigure` refuses, as a cloud VM's fixed user data does.
    pub(super) fixed_config: bool,
    /// Whether hosts enforce source ranges (as VM providers' exit servers do), and what each
    /// host admits.
    pub(super) enforce_ranges: bool,
    pub(super) ranges: BTreeMap<String, Vec<String>>,
    /// As Hetzner: addresses go onto hosts at creation (`AtCreate`), except the movable ones
    /// reserved for a pair, which are assigned to running hosts that keep their own address and
    /// carry the moved one on their interface (floating IPs).
    pub(super) floating: bool,
    /// As EC2: a pair's hosts made to take the moved address (tagged so) take it on a secondary
    /// private address and keep their own public one.
    pub(super) secondary: bool,
    /// As EC2 given subnets in two zones: a host goes to zone `zone-<its failure domain>`.
    pub(super) zones: bool,
    /// As EC2's Elastic IPs for pool members: each assigned onto a private IPv4 of its own on the
    /// host (`10.0.<host>.<n>`), at most this many per host; the host keeps its own address.
    pub(super) translated: Option<usize>,
    /// The exit server each host was created or last reconfigured with.
    pub(super) servers: BTreeMap<String, ExitServer>,
    /// The addresses reserved as movable.
    pub(super) movable: Vec<String>,
    /// The user data each host was created with.
    pub(super) user_data: BTreeMap<String, String>,
    /// Whether the next `reserve_address` makes the address but its answer is lost.
    pub(super) lose_reserve_answer: bool,
    /// Whether reads count against a budget, as at a cloud ([`FakeProvider::charge_reads`]).
    pub(super) charged_reads: bool,
    /// As Hetzner's spread placement groups: per Tunnel UID, the tags of what keeps its pair's
    /// hosts apart, made with its first host asked for in a failure domain.
    pub(super) placements: BTreeMap<String, BTreeMap<String, String>>,
}

impl Hosts {
    pub(super) fn binding(&self) -> AddressBinding {
        self.binding.unwrap_or(AddressBinding::Assign)
    }

    /// Puts address `id` on host `host_id`, whose public address it becomes, as on a cloud (a
    /// movable one of a `floating` provider leaves the host its own).
    pub(super) fn attach(&mut self, id: &str, host_id: &str) {
        let Some(ip) = self.addresses.get(id).map(|a| a.ip.clone()) else { return };
        if let Some(private_ip) = self.private_ip_for(id, host_id) {
            let address = self.addresses.get_mut(id).expect("read above");
            (address.host_id, address.private_ip) = (Some(host_id.to_string()), Some(private_ip));
            return;
        }
        let keeps_own =
            self.secondary && self.by_id.get(host_id).is_some_and(|h| h.tags.contains_key(TAG_MOVED_ADDRESS));
        if keeps_own || (self.floating && self.movable.iter().any(|m| m == id)) {
            for address in self.addresses.values_mut().filter(|a| a.id == id) {
                address.host_id = Some(host_id.to_string());
            }
            return;
        }
        for address in self.addresses.values_mut() {
            if address.host_id.as_deref() == Some(host_id) {
                address.host_id = None;
            }
        }
        if let Some(address) = self.addresses.get_mut(id) {
            address.host_id = Some(host_id.to_string());
        }
        // The host it leaves gets its own address back (`h-N`'s is 203.0.113.N).
        for host in self.by_id.values_mut().filter(|h| h.public_ipv4.as_deref() == Some(&ip)) {
            host.public_ipv4 = host.id.strip_prefix("h-").map(|n| format!("203.0.113.{n}"));
        }
        if let Some(host) = self.by_id.get_mut(host_id) {
            host.public_ipv4 = Some(ip);
        }
    }

    /// Where a pool member's address `id` goes on host `host_id` when the provider translates
    /// them: the first private IPv4 of the host no other address holds.
    pub(super) fn private_ip_for(&self, id: &str, host_id: &str) -> Option<String> {
        self.translated?;
        self.addresses.get(id)?.tags.get(TAG_POOL_MEMBER)?;
        let n = host_id.strip_prefix("h-").unwrap_or("0");
        let held: Vec<&str> = self
            .addresses
            .values()
            .filter(|a| a.id != id && a.host_id.as_deref() == Some(host_id))
            .filter_map(|a| a.private_ip.as_deref())
            .collect();
        (10..).map(|k| format!("10.0.{n}.{k}")).find(|ip| !held.contains(&ip.as_str()))
    }

    /// Whether host `host_id` holds its limit of translated member addresses other than `id`.
    pub(super) fn full(&self, id: &str, host_id: &str) -> bool {
        let Some(limit) = self.translated else { return false };
        let on_host = self.addresses.values().filter(|a| a.id != id && a.host_id.as_deref() == Some(host_id));
        on_host.filter(|a| a.private_ip.is_some()).count() >= limit
    }

    /// An address as the provider reports it: with `WithHost` (DigitalOcean) it carries no tags
    /// of its own, only its host's.
    pub(super) fn report(&self, address: &Address) -> Address {
        let mut address = address.clone();
        if self.binding() == AddressBinding::WithHost {
            address.tags =
                address.host_id.as_ref().and_then(|h| self.by_id.get(h)).map(|h| h.tags.clone()).unwrap_or_default();
        }
        address
    }
}

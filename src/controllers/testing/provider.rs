//! An in-memory host provider with failure injection, counting calls.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Mutex;

use async_trait::async_trait;
use providers::hosts::{TAG_TUNNEL_SLOT, TAG_TUNNEL_UID};

use super::hosts::Hosts;
use providers::{
    Address, AddressBinding, AddressRequest, Capabilities, ExitServer, Host, HostError, HostProvider, HostRequest,
    HostState, Limiter, MovedAddress, Spread,
};

pub struct FakeProvider {
    hosts: Mutex<Hosts>,
    limiter: Limiter,
}

pub const NAME: &str = "fake";

impl Default for FakeProvider {
    fn default() -> Self {
        let n = NonZeroU32::new(1000).expect("non-zero");
        FakeProvider { hosts: Mutex::default(), limiter: Limiter::new(n, n) }
    }
}

impl FakeProvider {
    fn call(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Hosts>, HostError> {
        let mut h = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        h.calls.push(op);
        match h.failures.remove(op) {
            Some(e) => Err(e),
            None => Ok(h),
        }
    }

    /// The next call of `op` (`"create"`, `"delete"`, `"list_by_tag"`, …) fails with `error`.
    pub fn fail_next(&self, op: &'static str, error: HostError) {
        self.hosts.lock().unwrap().failures.insert(op, error);
    }

    /// The next `reserve_address` makes the address, then fails as a dropped connection does.
    pub fn lose_next_reserve_answer(&self) {
        self.hosts.lock().unwrap().lose_reserve_answer = true;
    }

    /// Created hosts report `state` (Running with an address by default).
    pub fn create_as(&self, state: HostState) {
        self.hosts.lock().unwrap().created_state = Some(state);
    }

    pub fn calls(&self) -> Vec<&'static str> {
        self.hosts.lock().unwrap().calls.clone()
    }

    pub fn hosts(&self) -> Vec<Host> {
        self.hosts.lock().unwrap().by_id.values().cloned().collect()
    }

    /// The Noise private key host `id` runs with.
    pub fn key_of(&self, id: &str) -> Option<String> {
        self.hosts.lock().unwrap().keys.get(id).cloned()
    }

    /// Addresses reach hosts by `binding`.
    /// Reads count against an API budget from now on, as at a cloud: a quiet highly available
    /// pair stops re-reading them at every pass.
    pub fn charge_reads(&self) {
        self.hosts.lock().unwrap().charged_reads = true;
    }

    pub fn bind_addresses(&self, binding: AddressBinding) {
        self.hosts.lock().unwrap().binding = Some(binding);
    }

    /// Addresses behave as on Hetzner from now on: primary IPs at creation, floating IPs moved for
    /// a pair (see `Hosts::floating`).
    pub fn float_moved_addresses(&self) {
        let mut h = self.hosts.lock().unwrap();
        h.binding = Some(AddressBinding::AtCreate);
        h.floating = true;
    }

    /// Addresses behave as on EC2 from now on: assigned to running hosts, a pair's onto a
    /// secondary private address (see `Hosts::secondary`).
    pub fn spread_over_zones(&self) {
        self.hosts.lock().unwrap().zones = true;
    }

    /// Pool member addresses behave as EC2's from now on: each onto a private IPv4 of its own,
    /// `limit` per host (see `Hosts::translated`).
    pub fn translate_member_addresses(&self, limit: usize) {
        self.hosts.lock().unwrap().translated = Some(limit);
    }

    /// The exit server host `id` was created or last reconfigured with.
    pub fn server_of(&self, id: &str) -> Option<ExitServer> {
        self.hosts.lock().unwrap().servers.get(id).cloned()
    }

    pub fn move_to_secondary_addresses(&self) {
        self.hosts.lock().unwrap().secondary = true;
    }

    /// Whether address `id` was reserved as movable.
    pub fn is_movable(&self, id: &str) -> bool {
        self.hosts.lock().unwrap().movable.iter().any(|m| m == id)
    }

    /// The user data host `id` was created with.
    pub fn user_data_of(&self, id: &str) -> Option<String> {
        self.hosts.lock().unwrap().user_data.get(id).cloned()
    }

    /// Releases address `id` behind the operator's back.
    pub fn remove_address(&self, id: &str) {
        self.hosts.lock().unwrap().addresses.remove(id);
    }

    /// `reconfigure` answers "cannot" from now on, as for cloud VMs: the host is replaced.
    pub fn fix_config(&self) {
        self.hosts.lock().unwrap().fixed_config = true;
    }

    /// Hosts enforce the ranges from now on (made with them, and `sync_source_ranges` brings them
    /// to new ones), as a VM provider's exit servers do.
    pub fn enforce_ranges(&self) {
        self.hosts.lock().unwrap().enforce_ranges = true;
    }

    /// The source ranges host `id` admits to its first service port, as made or last synced.
    pub fn ranges_of(&self, id: &str) -> Option<Vec<String>> {
        self.hosts.lock().unwrap().ranges.get(id).cloned()
    }

    /// Every reserved address, as stored (with the tags it was reserved with).
    pub fn addresses(&self) -> Vec<Address> {
        self.hosts.lock().unwrap().addresses.values().cloned().collect()
    }

    /// The tags of each placement made to keep a pair apart.
    pub fn placements(&self) -> Vec<BTreeMap<String, String>> {
        self.hosts.lock().unwrap().placements.values().cloned().collect()
    }

    /// Stores a placement with `tags` for Tunnel UID `uid` (for orphans the sweep should find).
    pub fn insert_placement(&self, uid: &str, tags: BTreeMap<String, String>) {
        self.hosts.lock().unwrap().placements.insert(uid.to_string(), tags);
    }

    /// Stores an address as it is (for orphans the sweep should find).
    pub fn insert_address(&self, address: Address) {
        self.hosts.lock().unwrap().addresses.insert(address.id.clone(), address);
    }

    /// How many calls of `op` were made.
    pub fn count(&self, op: &str) -> usize {
        self.hosts.lock().unwrap().calls.iter().filter(|c| **c == op).count()
    }

    pub fn insert(&self, host: Host) {
        self.hosts.lock().unwrap().by_id.insert(host.id.clone(), host);
    }
}

#[async_trait]
impl HostProvider for FakeProvider {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        let mut h = self.call("create")?;
        // As the real ones: the address named, refused (no host made) when another host holds it.
        let bind = match request.address.as_ref().filter(|_| h.binding() == AddressBinding::AtCreate) {
            Some(id) if h.addresses.get(id).is_some_and(|a| a.host_id.is_none()) && !h.movable.contains(id) => {
                Some(id.clone())
            }
            Some(id) => {
                return Err(HostError::Unavailable { provider: NAME, message: format!("address {id} is not free") });
            }
            None => None,
        };
        h.next_id += 1;
        let state = h.created_state.unwrap_or(HostState::Running);
        let host = Host {
            id: format!("h-{}", h.next_id),
            name: request.name.clone(),
            public_ipv4: (state == HostState::Running).then(|| format!("203.0.113.{}", h.next_id)),
            state,
            tags: request.tags.clone(),
            placement: request.failure_domain.filter(|_| h.zones).map(|d| format!("zone-{d}")),
        };
        h.by_id.insert(host.id.clone(), host.clone());
        if let Some(uid) = request.tags.get(TAG_TUNNEL_UID).filter(|_| request.failure_domain.is_some()) {
            let tags = request.tags.iter().filter(|(k, _)| *k != TAG_TUNNEL_SLOT).map(|(k, v)| (k.clone(), v.clone()));
            h.placements.entry(uid.clone()).or_insert_with(|| tags.collect());
        }
        h.keys.insert(host.id.clone(), request.server.noise_private_key.clone());
        h.user_data.insert(host.id.clone(), request.user_data.clone());
        h.servers.insert(host.id.clone(), request.server.clone());
        if h.enforce_ranges {
            let ranges = request.server.services.first().map(|s| s.source_ranges.clone()).unwrap_or_default();
            h.ranges.insert(host.id.clone(), ranges);
        }
        if let Some(id) = bind {
            h.attach(&id, &host.id);
        }
        Ok(h.by_id[&host.id].clone())
    }
    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        Ok(self.call("get")?.by_id.get(id).cloned())
    }
    async fn delete(&self, id: &str) -> Result<(), HostError> {
        let mut h = self.call("delete")?;
        h.by_id.remove(id);
        for address in h.addresses.values_mut() {
            if address.host_id.as_deref() == Some(id) {
                address.host_id = None;
            }
        }
        Ok(())
    }
    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        let h = self.call("list_by_tag")?;
        Ok(h.by_id.values().filter(|host| host.tags.get(key).map(String::as_str) == Some(value)).cloned().collect())
    }
    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        let mut h = self.call("reconfigure")?;
        if h.fixed_config {
            return Ok(false);
        }
        h.keys.insert(id.to_string(), server.noise_private_key.clone());
        h.servers.insert(id.to_string(), server.clone());
        Ok(true)
    }
    /// As Hetzner's: refused while one of the Tunnel's hosts is left.
    async fn delete_placement(&self, uid: &str) -> Result<(), HostError> {
        let mut h = self.call("delete_placement")?;
        if h.by_id.values().any(|host| host.tags.get(TAG_TUNNEL_UID).map(String::as_str) == Some(uid)) {
            return Err(HostError::Unavailable {
                provider: NAME,
                message: format!("the placement of {uid} holds hosts"),
            });
        }
        h.placements.remove(uid);
        Ok(())
    }
    async fn list_placements_by_tag(&self, key: &str, value: &str) -> Result<Vec<BTreeMap<String, String>>, HostError> {
        let h = self.call("list_placements_by_tag")?;
        Ok(h.placements.values().filter(|tags| tags.get(key).map(String::as_str) == Some(value)).cloned().collect())
    }
    /// Addresses move as a cloud's assigned to running hosts do (or Hetzner's floating IPs);
    /// its hosts download nothing: no artifact check (tests/tunnel/artifact.rs has one).
    fn capabilities(&self) -> Capabilities {
        let h = self.hosts.lock().unwrap();
        let moved_address = match (h.floating, h.secondary) {
            (true, _) => MovedAddress::OnInterface,
            (false, true) => MovedAddress::SecondaryIp,
            (false, false) => MovedAddress::Translated,
        };
        Capabilities {
            reads_are_free: !h.charged_reads,
            fetches_artifact: false,
            address_binding: h.binding(),
            moves_addresses: h.floating || h.binding() != AddressBinding::AtCreate,
            moved_address,
            host_enforces_source_ranges: h.enforce_ranges,
            // Its addresses are strings in memory: any number goes onto a host; as Hetzner's
            // floating IPs, assigned to it, when it floats them.
            pool_addresses: match (h.floating, h.translated) {
                (_, Some(_)) => providers::hosts::PoolAddresses::Translated,
                (true, None) => providers::hosts::PoolAddresses::Assigned,
                (false, None) => providers::hosts::PoolAddresses::Bound,
            },
            spread: if h.zones { Spread::Zones } else { Spread::No("all fake hosts share one machine") },
        }
    }
    async fn reserve_address(&self, request: &AddressRequest) -> Result<Address, HostError> {
        let mut h = self.call("reserve_address")?;
        let binding = if h.floating && request.movable { AddressBinding::Assign } else { h.binding() };
        let invalid = |message: &str| HostError::Invalid { provider: NAME, message: message.into() };
        match (binding, &request.host_id) {
            (AddressBinding::WithHost, None) => return Err(invalid("reserved with its first host only")),
            (AddressBinding::AtCreate, Some(_)) => return Err(invalid("goes onto a host at creation only")),
            (_, Some(host)) if !h.by_id.contains_key(host) => return Err(invalid("no such host")),
            _ => {}
        }
        h.next_address += 1;
        let address = Address {
            private_ip: None,
            id: format!("a-{}", h.next_address),
            ip: format!("198.51.100.{}", h.next_address),
            host_id: None,
            tags: request.tags.clone(),
        };
        h.addresses.insert(address.id.clone(), address.clone());
        if h.floating && request.movable {
            h.movable.push(address.id.clone());
        }
        if let Some(host) = &request.host_id {
            h.attach(&address.id, host);
        }
        if std::mem::take(&mut h.lose_reserve_answer) {
            return Err(HostError::Unavailable { provider: NAME, message: "connection reset".into() });
        }
        let stored = h.addresses[&address.id].clone();
        Ok(h.report(&stored))
    }
    async fn get_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        let h = self.call("get_address")?;
        Ok(h.addresses.get(id).map(|a| h.report(a)))
    }
    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        let mut h = self.call("assign_address")?;
        if h.binding() == AddressBinding::AtCreate && !h.movable.iter().any(|m| m == id) {
            return Err(HostError::Invalid { provider: NAME, message: "goes onto a host at creation only".into() });
        }
        if !h.addresses.contains_key(id) || !h.by_id.contains_key(host_id) {
            return Err(HostError::NotFound { provider: NAME, message: format!("address {id} or host {host_id}") });
        }
        if h.full(id, host_id) {
            let message = "PrivateIpAddressLimitExceeded".to_string();
            return Err(HostError::Quota { provider: NAME, message });
        }
        h.attach(id, host_id);
        Ok(())
    }
    async fn member_addresses_limit(&self, _: Option<&str>, _: Option<&str>) -> Result<Option<usize>, HostError> {
        Ok(self.call("member_addresses_limit")?.translated)
    }
    async fn release_address(&self, id: &str) -> Result<(), HostError> {
        self.call("release_address")?.addresses.remove(id);
        Ok(())
    }
    async fn list_addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        let h = self.call("list_addresses_by_tag")?;
        let reported = h.addresses.values().map(|a| h.report(a));
        Ok(reported.filter(|a| a.tags.get(key).map(String::as_str) == Some(value)).collect())
    }
    /// As DigitalOcean, whose reserved IPs carry no tags: every one, whoever made it.
    async fn list_untagged_addresses(&self) -> Result<Option<Vec<Address>>, HostError> {
        let h = self.call("list_untagged_addresses")?;
        let all = h.addresses.values().map(|a| h.report(a)).collect();
        Ok((h.binding() == AddressBinding::WithHost).then_some(all))
    }
    async fn sync_source_ranges(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        let mut h = self.call("sync_source_ranges")?;
        if !h.enforce_ranges {
            return Ok(false);
        }
        let ranges = server.services.first().map(|s| s.source_ranges.clone()).unwrap_or_default();
        h.ranges.insert(id.to_string(), ranges);
        Ok(true)
    }
    fn name(&self) -> &'static str {
        NAME
    }
    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
}

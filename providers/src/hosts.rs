//! Exit-server hosts: the small VMs a Tunnel provisions, behind one object-safe trait.
//!
//! Every adapter (DigitalOcean, Hetzner Cloud, later EC2 and local) creates, reads, deletes and
//! lists hosts the same way, so the Tunnel controller and its contract tests never see a cloud's
//! own vocabulary. Ownership travels as tags: each host carries the owning Tunnel's UID,
//! namespace and name under the keys below, so a controller that crashed between "create" and
//! "write status" finds its host again by tag instead of creating a second one, and the orphan
//! sweep can tell which hosts no Tunnel owns any more.
//!
//! Tags are written here in one canonical form (`key → value`, keys like Kubernetes label
//! keys). Each cloud has its own syntax, so each adapter maps them with [`TagSyntax`].
//!
//! The UID is a 36-character UUID and always survives unchanged; namespace and name are for
//! people reading the cloud console. Controllers match hosts by UID.

mod capabilities;
mod tags;

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::error::HostError;
use crate::exit::push::reconfigure_host;
use crate::exit::userdata::{ExitServer, render_server_toml};
use crate::limiter::Limiter;

pub use crate::addresses::{Address, AddressBinding, AddressRequest};
pub use capabilities::{Capabilities, MovedAddress, MovedSetup, PoolAddresses, Spread};
pub(crate) use tags::fnv1a32;
pub use tags::{DO_TAG_MAX, HETZNER_VALUE_MAX, TagSyntax, fit_value};

/// Marks a host as created by skyport (value [`MANAGED_BY_VALUE`]); the orphan sweep lists by it.
pub const TAG_MANAGED_BY: &str = "skyport.dev/managed-by";
/// The value of [`TAG_MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "skyport";
/// `metadata.uid` of the owning Tunnel.
pub const TAG_TUNNEL_UID: &str = "skyport.dev/tunnel-uid";
/// `metadata.namespace` of the owning Tunnel.
pub const TAG_TUNNEL_NAMESPACE: &str = "skyport.dev/tunnel-namespace";
/// `metadata.name` of the owning Tunnel.
pub const TAG_TUNNEL_NAME: &str = "skyport.dev/tunnel-name";
/// On the two exit servers of a highly available Tunnel: which of the pair (`a` or `b`) a host
/// is, kept by its replacements. Such a host gets its own address at creation, never the
/// Tunnel's reserved one, which is moved onto it while it runs
/// ([`HostProvider::assign_address`]).
pub const TAG_TUNNEL_SLOT: &str = "skyport.dev/tunnel-slot";
/// Identity of the cluster whose skyport created the host (the `kube-system` namespace's UID by
/// default), so the orphan sweeps of several clusters sharing one cloud account never delete
/// each other's hosts.
pub const TAG_CLUSTER: &str = "skyport.dev/cluster";

/// On a reserved address: what deleting its Tunnel does to it, `Delete` or `Retain` (the Tunnel's
/// `spec.address.deletionPolicy` when it was reserved). The orphan sweep never releases a
/// `Retain` address: a person asked to keep it.
pub const TAG_DELETION_POLICY: &str = "skyport.dev/deletion-policy";

/// On an address an ExitServerPool's shared server reserved for one member Service
/// (`addressing: PerService`): the member Tunnel's UID. Its owner tags are the shared server's,
/// which reserves, adopts and releases it.
pub const TAG_POOL_MEMBER: &str = "skyport.dev/pool-member";

/// On an exit server of a highly available Tunnel whose provider needs the moved address on the
/// host's interface ([`MovedAddress::OnInterface`]): the reserved address its user data
/// configured there. A host carrying another (the address was released outside skyport and
/// reserved anew) cannot answer on the new one and is replaced.
pub const TAG_BOUND_ADDRESS: &str = "skyport.dev/bound-address";

/// On a highly available Tunnel's exit server that takes the moved address on a secondary private
/// IPv4 ([`MovedAddress::SecondaryIp`]), which the adapter gives it at creation.
pub const TAG_MOVED_ADDRESS: &str = "skyport.dev/moved-address";
/// The value of [`TAG_MOVED_ADDRESS`].
pub const MOVED_ADDRESS_SECONDARY: &str = "secondary-private-ipv4";

/// The tags every host of a Tunnel carries.
pub fn owner_tags(uid: &str, namespace: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (TAG_MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (TAG_TUNNEL_UID.to_string(), uid.to_string()),
        (TAG_TUNNEL_NAMESPACE.to_string(), namespace.to_string()),
        (TAG_TUNNEL_NAME.to_string(), name.to_string()),
    ])
}

/// What to create. `Debug` leaves the user data out: it holds the tunnel's secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct HostRequest {
    /// Host name; must be a valid hostname (RFC 1123) and unique per project on Hetzner.
    pub name: String,
    /// Provider region / location slug; `None` uses the adapter's default (or the cloud's).
    pub region: Option<String>,
    /// Provider size / server type slug; `None` uses the adapter's default.
    pub size: Option<String>,
    /// cloud-init user data for a cloud VM, normally [`crate::exit::userdata::render_cloud_config`] of
    /// `server`. Contains the tunnel's secrets: adapters never log it and never put it in errors.
    pub user_data: String,
    /// The tunnel server the host runs, as data: for adapters that start it themselves instead
    /// of through cloud-init (the local provider). Secret, like `user_data`.
    pub server: ExitServer,
    /// Canonical tags, normally [`owner_tags`].
    pub tags: BTreeMap<String, String>,
    /// The reserved address (its id) a single exit server comes up with, for providers that
    /// bind an address only at creation ([`AddressBinding::AtCreate`]): the caller proved it the
    /// Tunnel's (it may carry a previous Tunnel's tags, taken over). Named, not looked up by
    /// tag, so a taken-over address is not missed; others bind it after creation and ignore it.
    pub address: Option<String>,
    /// Which failure domain the host goes to, where the provider places hosts apart
    /// ([`Capabilities::spread`]): a pair's slots are 0 and 1, and go to different zones (EC2),
    /// or both into the Tunnel's spread placement group (Hetzner). `None`: wherever the provider
    /// puts it (a single exit server).
    pub failure_domain: Option<usize>,
}

impl std::fmt::Debug for HostRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRequest")
            .field("name", &self.name)
            .field("region", &self.region)
            .field("size", &self.size)
            .field("user_data", &format_args!("<{} bytes>", self.user_data.len()))
            .field("server", &self.server)
            .field("tags", &self.tags)
            .field("address", &self.address)
            .field("failure_domain", &self.failure_domain)
            .finish()
    }
}

/// Lifecycle of a host, reduced to what the Tunnel controller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// Accepted but not yet running (booting, initialising, migrating).
    Provisioning,
    /// Running; `public_ipv4` is normally set.
    Running,
    /// Powered off or archived: needs a replacement (or a power-on) to carry traffic.
    Stopped,
    /// Being deleted.
    Deleting,
}

/// A host as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The provider's id, as a string (numeric on DigitalOcean and Hetzner).
    pub id: String,
    pub name: String,
    pub public_ipv4: Option<String>,
    pub state: HostState,
    /// Canonical tags decoded from the provider's syntax; tags skyport did not write appear
    /// with their provider spelling as key and an empty value (DigitalOcean) or unchanged
    /// (Hetzner).
    pub tags: BTreeMap<String, String>,
    /// Where the provider reports the host placed, as far as that keeps hosts apart
    /// ([`Capabilities::spread`]): an EC2 availability zone, or a Hetzner spread placement group
    /// (`placement group <id>`, whose servers run on different physical hosts); `None` where it
    /// reports nothing of the kind.
    pub placement: Option<String>,
}

/// Exit-server VMs. Implementations are idempotent where it matters for reconciling:
/// deleting a host that is already gone is success, `get` of a missing host is `Ok(None)`.
#[async_trait]
pub trait HostProvider: Send + Sync {
    /// Starts creating a host and returns it as first reported (usually `Provisioning`).
    /// Not idempotent: callers look up by tag before creating.
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError>;
    /// The host with this id, or `None` when it no longer exists.
    async fn get(&self, id: &str) -> Result<Option<Host>, HostError>;
    /// Deletes the host; a host that is already gone counts as deleted.
    async fn delete(&self, id: &str) -> Result<(), HostError>;
    /// All hosts carrying the canonical tag `key=value`, across every page.
    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError>;
    /// Replaces the tunnel server's configuration on a running host (the Service's ports
    /// changed), so the host keeps its address. `Ok(false)` means this provider cannot change a
    /// host after it was created (or this host takes no pushes); the controller then replaces
    /// the host.
    ///
    /// rathole declares public ports on the server side and cloud user data runs once, so every
    /// adapter here pushes the new config to the server's push port ([`crate::exit::push`]), sealed
    /// with a key derived from the server's Noise key; EC2 also updates the host's security
    /// group.
    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        reconfigure_running(self, id, server).await
    }
    /// Makes the host admit each service port only from its `source_ranges` (the Service's
    /// `loadBalancerSourceRanges` changed): by default a config push, after which the exit
    /// server's firewall follows ([`Capabilities::host_enforces_source_ranges`]); EC2 updates the
    /// host's security group. `Ok(false)`: the ranges are not enforced on this host (a provider
    /// without a firewall, or a host that takes no pushes).
    async fn sync_source_ranges(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        if !self.capabilities().host_enforces_source_ranges {
            return Ok(false);
        }
        self.reconfigure(id, server).await
    }
    /// What the host's console printed, as far as the provider keeps it (EC2's
    /// GetConsoleOutput, a guest's console): the exit server's install script reports its
    /// outcome there ([`crate::exit::userdata::InstallReport`]), so the operator can tell a VM
    /// that refused the artifact from one it cannot reach. `Ok(None)`: this provider reads no
    /// consoles (the default), or the host has none yet. May hold anything the VM printed: read
    /// the report from it, never pass it on.
    async fn console_output(&self, _id: &str) -> Result<Option<String>, HostError> {
        Ok(None)
    }
    /// Where this provider keeps its reserved addresses as files beside its hosts (`local`,
    /// `guest`), which makes the address methods below theirs; `None` (the default) for the
    /// clouds, which override those methods with their own API.
    fn booked(&self) -> Option<&dyn crate::reservations::Booked> {
        None
    }
    /// Reserves a public address tagged with `request.tags` (and assigns it to
    /// `request.host_id` if set). Not idempotent: callers look up by tag first.
    async fn reserve_address(&self, request: &AddressRequest) -> Result<Address, HostError> {
        self.booked().ok_or_else(|| no_addresses(self.name()))?.reserve(request).await
    }
    /// The address with this id, or `None` when it was released.
    async fn get_address(&self, id: &str) -> Result<Option<Address>, HostError> {
        self.booked().ok_or_else(|| no_addresses(self.name()))?.find_address(id).await
    }
    /// Points the address at host `host_id` (moving it from any earlier host); already there is
    /// success.
    async fn assign_address(&self, id: &str, host_id: &str) -> Result<(), HostError> {
        self.booked().ok_or_else(|| no_addresses(self.name()))?.check_assigned(id, host_id).await
    }
    /// Unassigns and releases the address; one already released counts as released.
    async fn release_address(&self, id: &str) -> Result<(), HostError> {
        self.booked().ok_or_else(|| no_addresses(self.name()))?.unreserve(id).await
    }
    /// How many pool members' addresses one host of `size` in `region` holds where each takes a
    /// private IPv4 of the host's own ([`PoolAddresses::Translated`]); `None` (the default): no
    /// limit skyport knows of.
    async fn member_addresses_limit(
        &self,
        _region: Option<&str>,
        _size: Option<&str>,
    ) -> Result<Option<usize>, HostError> {
        Ok(None)
    }
    /// The region a reserved address is bound to, where a host must be created to take it;
    /// `None` where any host of the provider's region can (the default).
    async fn address_region(&self, _id: &str) -> Result<Option<String>, HostError> {
        Ok(None)
    }
    /// All reserved addresses carrying the canonical tag `key=value`, across every page.
    async fn list_addresses_by_tag(&self, key: &str, value: &str) -> Result<Vec<Address>, HostError> {
        self.booked().ok_or_else(|| no_addresses(self.name()))?.addresses_by_tag(key, value).await
    }
    /// Where reserved addresses carry no tags of their own (DigitalOcean), every reserved
    /// address of the account, whoever made it, so one made by a reservation whose answer was
    /// lost can be told apart from those there before. `None` (the default) where an address is
    /// tagged as it is made, and found by its tags.
    async fn list_untagged_addresses(&self) -> Result<Option<Vec<Address>>, HostError> {
        Ok(None)
    }
    /// Deletes what the provider made to keep Tunnel `uid`'s hosts apart (Hetzner's spread
    /// placement group), once its hosts are deleted: `Unavailable` while one is still going.
    /// Idempotent. The default: nothing was made.
    async fn delete_placement(&self, _uid: &str) -> Result<(), HostError> {
        Ok(())
    }

    /// The canonical tags of each thing the provider made to keep a pair's hosts apart (Hetzner's
    /// spread placement groups) that carries tag `key=value`, across every page: the orphan sweep
    /// finds those of Tunnels gone without their finalizer by them. The default: none is made.
    async fn list_placements_by_tag(
        &self,
        _key: &str,
        _value: &str,
    ) -> Result<Vec<BTreeMap<String, String>>, HostError> {
        Ok(Vec::new())
    }

    /// What this provider can do: the controller branches on this value, not on the provider.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// Whether a pair's hosts in `region` (`None`: the provider's default) go to different
    /// failure domains: [`Capabilities::spread`], unless that holds in some regions only.
    fn spread_in(&self, _region: Option<&str>) -> crate::hosts::Spread {
        self.capabilities().spread
    }
    /// Short provider name for messages, metrics and config (`digitalocean`, `hetzner`).
    fn name(&self) -> &'static str;
    /// The limiter every call of this provider goes through.
    fn limiter(&self) -> &Limiter;
}

fn no_addresses(provider: &'static str) -> HostError {
    HostError::Invalid { provider, message: format!("{provider} does not support reserved addresses") }
}

/// [`HostProvider::reconfigure`] of a cloud host: pushes `server` (rendered for a VM) to the
/// host's public address.
pub async fn reconfigure_running<P: HostProvider + ?Sized>(
    provider: &P,
    id: &str,
    server: &ExitServer,
) -> Result<bool, HostError> {
    let name = provider.name();
    let host =
        provider.get(id).await?.ok_or_else(|| HostError::NotFound { provider: name, message: format!("host {id}") })?;
    let Some(ip) = host.public_ipv4 else {
        return Err(HostError::Unavailable { provider: name, message: format!("host {id} has no public address yet") });
    };
    let config =
        render_server_toml(server).map_err(|e| HostError::Invalid { provider: name, message: e.to_string() })?;
    reconfigure_host(name, &ip, server, &config).await
}

#[cfg(test)]
mod tests;

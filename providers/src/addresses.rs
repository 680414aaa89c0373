//! Reserved public addresses as every host provider reports and requests them, apart from the
//! hosts that use them, so the adapters and the address book of the providers on this machine
//! (`reservations`) share them without depending on the `hosts` module.

use std::collections::BTreeMap;

/// A reserved public IPv4 address: a Tunnel keeps it across host replacements, so the Service's
/// address survives a lost VM or a port change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The provider's id: the EC2 allocation id (region-qualified like host ids), the address
    /// itself on DigitalOcean and local, the primary IP's number on Hetzner.
    pub id: String,
    /// The IPv4 address.
    pub ip: String,
    /// The host it is assigned to, if any (a host id as `HostProvider::get` takes it).
    pub host_id: Option<String>,
    /// The host's private IPv4 the address reaches it at, where the cloud translates it (an EC2
    /// Elastic IP's association); `None` where the host receives the address itself, or it is
    /// on no host.
    pub private_ip: Option<String>,
    /// Canonical tags, as on hosts: the owner's UID, namespace, name, and the cluster.
    pub tags: BTreeMap<String, String>,
}

/// What to reserve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRequest {
    /// A name for people reading the cloud console (where the cloud has names).
    pub name: String,
    /// Region / location; `None` uses the adapter's default.
    pub region: Option<String>,
    /// Canonical tags, normally the hosts' owner tags plus the cluster tag.
    pub tags: BTreeMap<String, String>,
    /// A running host to assign the address to right away (required for
    /// [`AddressBinding::WithHost`], optional otherwise).
    pub host_id: Option<String>,
    /// The address will be moved between running hosts (a highly available Tunnel's). A provider
    /// whose usual reserved address cannot be (Hetzner primary IPs go only onto powered-off
    /// servers) reserves one that can (a Hetzner floating IP); elsewhere the one kind serves both.
    pub movable: bool,
}

/// How a provider's reserved address gets onto a host, which decides when the controller
/// reserves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressBinding {
    /// Reserved before the host, assigned to each running host (EC2 Elastic IPs, local).
    Assign,
    /// Reserved before the host; `create` gives a new host the Tunnel's unassigned address,
    /// found by the owner's UID tag. A running host without it is replaced (Hetzner: a primary
    /// IP can only be assigned to a powered-off server).
    AtCreate,
    /// Reserved together with the first running host ([`AddressRequest::host_id`]), assigned to
    /// later ones (DigitalOcean: a reserved IP carries no tags, so one is only ever made already
    /// assigned to a tagged droplet, through which it is found again).
    WithHost,
}

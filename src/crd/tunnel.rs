//! `Tunnel`: a public exit server (a small VM) forwarding a Service's ports into the cluster.
//!
//! skyport creates one per LoadBalancer Service it serves (named `<service>-tunnel`, owned by
//! the Service); one can also be written by hand. Where the exit server runs is fixed when it is
//! created, so provider, region and size are immutable: to move a tunnel, delete it and a new one
//! (with a new address) is made.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

#[path = "tunnel/status.rs"]
mod status;
pub use status::*;

/// Desired state of a tunnel.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "skyport.dev",
    version = "v1alpha1",
    kind = "Tunnel",
    namespaced,
    status = "TunnelStatus",
    shortname = "tun",
    category = "skyport",
    doc = "A public exit server provisioned by skyport that forwards a Service's ports into the cluster through an encrypted tunnel (rathole, Noise transport). The exit server's address appears in `status.hostIp` and, when the Tunnel is owned by its Service, in the Service's `status.loadBalancer.ingress`.",
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.serviceRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Address","type":"string","description":"The reserved address, when the Tunnel has one (else the exit server's IP is the address)","jsonPath":".status.addressIp"}"#,
    printcolumn = r#"{"name":"Host IP","type":"string","jsonPath":".status.hostIp"}"#,
    printcolumn = r#"{"name":"Active","type":"string","description":"Highly available Tunnels: the slot whose server holds the address","jsonPath":".status.highAvailability.active"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".status.provider","priority":1}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.serviceRef) == has(oldSelf.serviceRef) && (!has(self.serviceRef) || self.serviceRef == oldSelf.serviceRef)").message("serviceRef is immutable: create another Tunnel for another Service"),
    validation = Rule::new("has(self.serviceRef) || has(self.pool)").message("serviceRef is required: the Service whose ports the exit server exposes"),
    validation = Rule::new("has(self.provider) == has(oldSelf.provider) && (!has(self.provider) || self.provider == oldSelf.provider)").message("provider is immutable: delete the Tunnel to move it (a new exit server with a new address is provisioned)"),
    validation = Rule::new("has(self.region) == has(oldSelf.region) && (!has(self.region) || self.region == oldSelf.region)").message("region is immutable: delete the Tunnel to move it (a new exit server with a new address is provisioned)"),
    validation = Rule::new("has(self.size) == has(oldSelf.size) && (!has(self.size) || self.size == oldSelf.size)").message("size is immutable: delete the Tunnel to resize it (a new exit server with a new address is provisioned)"),
    validation = Rule::new("has(self.address) == has(oldSelf.address) && (!has(self.address) || self.address == oldSelf.address)").message("address is immutable: a reserved address is tagged with its deletion policy when it is reserved; delete the Tunnel and create another to change it"),
    validation = Rule::new("!has(self.sourceRanges) || self.sourceRanges.all(r, isCIDR(r))").message("sourceRanges must be CIDRs, like 203.0.113.0/24 or 2001:db8::/32"),
    validation = Rule::new("!has(self.highAvailability) || (has(self.highAvailability.mode) && self.highAvailability.mode == 'BothAddresses') || (has(self.address) && self.address.mode == 'Reserved')").message("highAvailability (mode ActiveStandby) needs address.mode: Reserved: the Service's address is a reserved address moved between the two exit servers; where the provider cannot move one, use mode: BothAddresses"),
    validation = Rule::new("!has(self.highAvailability) || !has(self.highAvailability.mode) || self.highAvailability.mode != 'BothAddresses' || !has(self.address) || self.address.mode != 'Reserved'").message("highAvailability mode BothAddresses publishes each exit server's own address, so address.mode: Reserved does not apply: leave address out"),
    validation = Rule::new("has(self.highAvailability) == has(oldSelf.highAvailability) && (!has(self.highAvailability) || self.highAvailability == oldSelf.highAvailability)").message("highAvailability is immutable: delete the Tunnel and create another to change it"),
    validation = Rule::new("has(self.pool) == has(oldSelf.pool) && (!has(self.pool) || self.pool == oldSelf.pool)").message("pool is immutable: delete the Tunnel and create another to move the Service"),
    validation = Rule::new("!has(self.pool) || !has(self.serviceRef) || !(has(self.provider) || has(self.region) || has(self.size) || has(self.address) || has(self.highAvailability))").message("a Tunnel on an ExitServerPool takes provider, region, size, address and highAvailability from the pool: leave them unset")
)]
pub struct TunnelSpec {
    /// The Service in this namespace whose ports the exit server exposes. Immutable. Unset only
    /// on the Tunnel that runs an ExitServerPool's shared exit server, which skyport makes in its
    /// own namespace (`spec.pool` names the pool) and whose ports are its members'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_ref: Option<ServiceRef>,

    /// Name of a provider configured in the operator: `local`, `guest`, `ec2`, `digitalocean` or
    /// `hetzner`. Unset uses the operator's default (`skyport run --provider`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(local|guest|ec2|digitalocean|hetzner)$"))]
    pub provider: Option<String>,

    /// Provider region or location slug (for example `eu-central-1`, `fra1`, `nbg1`). Unset uses
    /// the provider's default. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9-]+$"))]
    pub region: Option<String>,

    /// Provider instance size slug (for example `t3.nano`, `s-1vcpu-512mb-10gb`, `cx22`). Unset
    /// uses the provider's default, the smallest that runs the tunnel. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9.-]+$"))]
    pub size: Option<String>,

    /// The exit server's public address. Unset: an `Ephemeral` address, which changes whenever
    /// the exit server is replaced. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<TunnelAddress>,

    /// CIDRs allowed to reach the Service's ports on the exit server (for example
    /// `203.0.113.0/24`); empty or unset: anywhere. skyport copies the Service's
    /// `spec.loadBalancerSourceRanges` (or its `service.beta.kubernetes.io/load-balancer-source-ranges`
    /// annotation) here and keeps it in step. Enforced by the exit server's cloud firewall where the
    /// provider has one per host (EC2: its security group); other providers report in the `Ready`
    /// condition that the ranges are not enforced. The tunnel's control, push and health ports stay
    /// open: the client and the operator connect from addresses that are not listed. Mutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 64)))]
    pub source_ranges: Vec<String>,

    /// The PROXY protocol header (HAProxy's specification) the exit server writes ahead of each
    /// TCP connection's bytes, so the backend learns the visitor's address instead of the tunnel
    /// client's: `v1` (a text line) or `v2` (binary). The backend must expect it (nginx
    /// `proxy_protocol`, HAProxy `accept-proxy`, Envoy's proxy_protocol listener filter, most
    /// ingress controllers' `use-proxy-protocol`); unset: the bytes as they come. TCP only: a
    /// Tunnel asking for it whose Service has a UDP port is Failed with reason `InvalidService`.
    /// skyport copies the Service's `skyport.dev/proxy-protocol` annotation here. Mutable: a change
    /// reaches the running exit server as a configuration push.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,

    /// Two exit servers instead of one, each with its own tunnel client Pod. In mode
    /// `ActiveStandby` the Service's address is the Tunnel's reserved address (so
    /// `address.mode: Reserved` is required), held by the active server and moved to the standby
    /// when the active one fails its end-to-end health check several times in a row
    /// (`--tunnel-failover-after-failures`, over at least `--tunnel-failover-after`), never to a
    /// standby whose own check fails. In mode `BothAddresses` (any provider, for those that cannot
    /// move an address) the Service lists both servers' own addresses and drops one at once when
    /// its check fails. Both servers, the active one and the last failover are in
    /// `status.highAvailability`. A new client config or image rolls the two clients one at a
    /// time; in `ActiveStandby` the address first goes to the server whose new client is rolled
    /// out and passes, so a planned roll interrupts nothing. Costs a second exit server.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailability>,

    /// The ExitServerPool whose shared exit server carries the Service, on the Service's own ports
    /// of the pool's address, instead of an exit server of its own. The pool decides where that
    /// server runs, so `provider`, `region`, `size`, `address` and `highAvailability` stay unset.
    /// skyport copies the Service's `skyport.dev/exit-server-pool` annotation here. On the pool's
    /// shared server itself (no `serviceRef`), the pool it serves, whose placement skyport copies
    /// into the other fields. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolRef>,
}

/// An ExitServerPool (cluster-scoped).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PoolRef {
    /// Name of the ExitServerPool.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// How a highly available Tunnel runs its exit servers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HighAvailability {
    /// `ActiveStandby` (default): one server holds the reserved address and carries the
    /// traffic, the other runs with its own client, ready to take the address over; needs a
    /// provider that moves addresses between running servers (`status.highAvailability.limitation`
    /// says why one cannot). `BothAddresses`: both servers carry traffic on their own addresses,
    /// both in the Service's `status.loadBalancer.ingress`; one whose check fails leaves it at
    /// once and is replaced. Clients must try the other address (DNS with both records, or a
    /// client that retries), and a replaced server comes back on a new address.
    #[serde(default)]
    pub mode: HighAvailabilityMode,
}

/// `ActiveStandby` or `BothAddresses`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HighAvailabilityMode {
    /// One active exit server holding the reserved address, one standby.
    #[default]
    ActiveStandby,
    /// Both exit servers active, each on its own address, both in the Service's ingress.
    BothAddresses,
}

/// Whether the Tunnel keeps one public address across exit server replacements.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelAddress {
    /// `Ephemeral` (default): the exit server's own address, a new one with every replacement.
    /// `Reserved`: a reserved address (EC2 Elastic IP, DigitalOcean reserved IP, Hetzner primary
    /// IP, or with `highAvailability` a Hetzner floating IP) kept for this Tunnel, so the Service's address survives a lost exit server, a port
    /// change and new credentials. It is tagged with the Tunnel's UID like the exit server and
    /// shown in `status.addressId` and `status.addressIp`. It may cost money while reserved.
    #[serde(default)]
    pub mode: AddressMode,

    /// What deleting the Tunnel does to a `Reserved` address: `Delete` (default) releases it;
    /// `Retain` keeps it reserved at the provider (tagged `skyport.dev/deletion-policy=Retain`,
    /// which the orphan sweep never releases), for a person to reuse or release in the cloud's
    /// console or CLI.
    #[serde(default)]
    pub deletion_policy: AddressDeletionPolicy,
}

/// `Ephemeral` or `Reserved`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AddressMode {
    /// The exit server's own address; a replacement exit server gets another one.
    #[default]
    Ephemeral,
    /// A reserved address that stays with the Tunnel across exit server replacements.
    Reserved,
}

/// `Delete` or `Retain`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AddressDeletionPolicy {
    /// Release the reserved address when the Tunnel is deleted.
    #[default]
    Delete,
    /// Keep the reserved address when the Tunnel is deleted.
    Retain,
}

impl TunnelSpec {
    /// Whether the Tunnel keeps a reserved address.
    pub fn reserves_address(&self) -> bool {
        self.address.as_ref().is_some_and(|a| a.mode == AddressMode::Reserved)
    }

    /// The name of the Service the Tunnel exposes; `None` on a pool's shared server.
    pub fn service_name(&self) -> Option<&str> {
        self.service_ref.as_ref().map(|r| r.name.as_str())
    }

    /// Whether this is an ExitServerPool's shared server rather than a Service's exit server.
    pub fn carries_pool(&self) -> bool {
        self.service_ref.is_none() && self.pool.is_some()
    }

    /// Whether the Tunnel runs two exit servers.
    pub fn high_availability(&self) -> bool {
        self.high_availability.is_some()
    }

    /// Highly available with both exit servers' own addresses published.
    pub fn both_addresses(&self) -> bool {
        self.high_availability.as_ref().is_some_and(|h| h.mode == HighAvailabilityMode::BothAddresses)
    }

    /// The deletion policy of the reserved address.
    pub fn address_deletion_policy(&self) -> AddressDeletionPolicy {
        self.address.as_ref().map(|a| a.deletion_policy).unwrap_or_default()
    }
}

/// Rules on the whole object (they need `metadata.name`), as (CEL rule, message); added to the
/// CRD's root schema by [`super::all`].
pub const ROOT_RULES: &[(&str, &str)] = &[
    (
        "size(self.metadata.name) <= 235",
        "a Tunnel's name is at most 235 characters: its client Deployment is named <name>-client and that Deployment's ReplicaSets add up to 11 more, within Kubernetes' 253",
    ),
    (
        "!has(self.spec.highAvailability) || size(self.metadata.name) <= 233",
        "a highly available Tunnel's name is at most 233 characters: its client Deployments are named <name>-client-a and <name>-client-b",
    ),
];

/// A Service in the Tunnel's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ServiceRef {
    /// Name of the Service.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
}

/// Where the tunnel is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TunnelPhase {
    /// Waiting for something outside the exit server: the Service, its ports, a provider.
    Pending,
    /// The exit server is being created or is booting.
    Provisioning,
    /// The exit server runs and the client forwards the Service's ports.
    Active,
    /// The exit server is being deleted.
    Deleting,
    /// A problem that needs a person: see the `Ready` condition.
    Failed,
}

/// One port the exit server exposes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelPort {
    /// Public port number on the exit server (the Service's `port`).
    pub port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The PROXY protocol header the exit server writes ahead of this port's connections
    /// (`spec.proxyProtocol`); unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// The PROXY protocol header (HAProxy's specification) the exit server writes ahead of each TCP
/// connection's bytes, so the backend learns the visitor's address instead of the tunnel
/// client's: `v1` (a text line) or `v2` (binary); unset: none, the bytes as they come. The
/// backend must expect it (nginx `proxy_protocol`, HAProxy `accept-proxy`, Envoy's
/// proxy_protocol listener filter, ingress-nginx `use-proxy-protocol`). TCP only: a Tunnel asking
/// for it whose Service has a UDP port is Failed with reason `InvalidService`. skyport copies the
/// Service's `skyport.dev/proxy-protocol` annotation to `spec.proxyProtocol`; a change reaches the
/// running exit server as a configuration push.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum ProxyProtocol {
    /// Version 1: a text line, `PROXY TCP4 <visitor> <exit server> <ports>`.
    #[serde(rename = "v1")]
    V1,
    /// Version 2: binary.
    #[serde(rename = "v2")]
    V2,
}

impl From<ProxyProtocol> for providers::ProxyProtocol {
    fn from(version: ProxyProtocol) -> Self {
        match version {
            ProxyProtocol::V1 => providers::ProxyProtocol::V1,
            ProxyProtocol::V2 => providers::ProxyProtocol::V2,
        }
    }
}

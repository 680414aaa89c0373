//! `ExitServerPool`: one exit server (or a highly available pair) that the platform team offers
//! to many Services, each on its own ports of one shared address, instead of a VM per Service.
//!
//! Cluster-scoped, so only those who may create cluster-wide objects decide which namespaces
//! share a server. Every member Service keeps its own tunnel client, credentials and rathole
//! services on the shared server, so one namespace's client never carries or sees another's
//! traffic.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;
use super::tunnel::{HighAvailability, TunnelAddress, TunnelPort};

/// The lowest port of the default health-check range.
pub const DEFAULT_HEALTH_PORTS_FIRST: u16 = 40000;
/// How many ports the default health-check range has: the most Services a pool carries.
pub const DEFAULT_HEALTH_PORTS_COUNT: u16 = 64;

/// A shared exit server for the Services of several namespaces.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "skyport.dev",
    version = "v1alpha1",
    kind = "ExitServerPool",
    status = "ExitServerPoolStatus",
    shortname = "esp",
    category = "skyport",
    doc = "An exit server (or a highly available pair) shared by many LoadBalancer Services, each on its own ports of one public address (or, with addressing: PerService, each on an address of its own). A Service uses it with the annotation `skyport.dev/exit-server-pool: <name>`, from a namespace in `allowedNamespaces`. The server is created with the first member and deleted after the last; a member's port change or deletion leaves the others' connections up. A port another member already serves is refused with a reason that names no other namespace.",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.address"}"#,
    printcolumn = r#"{"name":"Members","type":"integer","jsonPath":".status.members"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.provider) == has(oldSelf.provider) && (!has(self.provider) || self.provider == oldSelf.provider)").message("provider is immutable: create another pool and move the Services to it"),
    validation = Rule::new("has(self.region) == has(oldSelf.region) && (!has(self.region) || self.region == oldSelf.region)").message("region is immutable: create another pool and move the Services to it"),
    validation = Rule::new("has(self.size) == has(oldSelf.size) && (!has(self.size) || self.size == oldSelf.size)").message("size is immutable: create another pool and move the Services to it"),
    validation = Rule::new("has(self.address) == has(oldSelf.address) && (!has(self.address) || self.address == oldSelf.address)").message("address is immutable: create another pool and move the Services to it"),
    validation = Rule::new("has(self.highAvailability) == has(oldSelf.highAvailability) && (!has(self.highAvailability) || self.highAvailability == oldSelf.highAvailability)").message("highAvailability is immutable: create another pool and move the Services to it"),
    validation = Rule::new("self.healthPorts == oldSelf.healthPorts").message("healthPorts is immutable: members' health checks are configured on their clients"),
    validation = Rule::new("self.addressing == oldSelf.addressing").message("addressing is immutable: every member's address would change at once; create another pool and move the Services to it"),
    validation = Rule::new("self.addressing != 'PerService' || !has(self.address) || has(self.highAvailability)").message("addressing PerService reserves an address for each Service; address configures the one shared address: leave it out (only a highAvailability pool keeps one, which marks its active server)"),
    validation = Rule::new("self.addressing != 'PerService' || !has(self.highAvailability) || !has(self.highAvailability.mode) || self.highAvailability.mode == 'ActiveStandby'").message("addressing PerService moves every Service's address to the active server: highAvailability mode BothAddresses is not available with it; use mode ActiveStandby"),
    validation = Rule::new("!has(self.highAvailability) || (has(self.highAvailability.mode) && self.highAvailability.mode == 'BothAddresses') || (has(self.address) && self.address.mode == 'Reserved')").message("highAvailability (mode ActiveStandby) needs address.mode: Reserved; where the provider cannot move an address, use mode: BothAddresses")
)]
pub struct ExitServerPoolSpec {
    /// Name of a provider configured in the operator: `local`, `guest`, `ec2`, `digitalocean` or
    /// `hetzner`. Unset uses the operator's default (`skyport run --provider`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub provider: Option<String>,

    /// Provider region or location slug (for example `eu-central-1`, `fra1`, `nbg1`). Unset uses
    /// the provider's default. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub region: Option<String>,

    /// Provider instance size slug. Unset uses the provider's default, the smallest that runs the
    /// tunnel; a pool carrying much traffic may want a larger one. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub size: Option<String>,

    /// The shared public address, as a Tunnel's `address`: `Reserved` keeps it across exit
    /// server replacements. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<TunnelAddress>,

    /// Two exit servers instead of one, as a Tunnel's `highAvailability`; every member is then
    /// carried by both. With `addressing: PerService`, mode `ActiveStandby` only: the members'
    /// addresses move with the pool's reserved `address` to the server that works. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailability>,

    /// Namespaces whose Services may use the pool. A Service from any other namespace is refused
    /// (its Tunnel reports `PoolNotAllowed`); removing a namespace takes its Services off the
    /// shared server.
    #[schemars(
        length(min = 1, max = 256),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    pub allowed_namespaces: Vec<String>,

    /// Ports of the exit server kept for the members' health checks, one per member, so the
    /// operator checks each member's tunnel through that member's client alone. Their count is
    /// the most Services the pool carries; Services may not use them. Immutable.
    #[serde(default)]
    pub health_ports: HealthPorts,

    /// How the members reach the shared server. `Shared` (the default): one public address, each
    /// Service on ports of its own; a port another Service serves is refused. `PerService`: each
    /// Service gets a public address of its own on the same server, so Services may use the same
    /// ports; each address costs what the provider charges for one. Only where the provider puts
    /// several addresses on one server (Hetzner Cloud; EC2, as many as the instance type takes,
    /// without highAvailability; `local` and `guest` for development); elsewhere the pool reports
    /// `PoolAddressingUnavailable` and buys nothing. Immutable.
    #[serde(default)]
    pub addressing: PoolAddressing,
}

/// How the members of a pool reach its shared server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PoolAddressing {
    /// One public address; each member on its own ports of it.
    #[default]
    Shared,
    /// A public address per member; members may use the same ports.
    PerService,
}

/// A range of ports on the exit server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.first + self.count - 1 <= 65535").message("healthPorts must end at or below port 65535"))]
pub struct HealthPorts {
    /// The lowest port.
    #[schemars(range(min = 1024, max = 65535))]
    pub first: u16,
    /// How many ports.
    #[schemars(range(min = 1, max = 1024))]
    pub count: u16,
}

impl Default for HealthPorts {
    fn default() -> Self {
        HealthPorts { first: DEFAULT_HEALTH_PORTS_FIRST, count: DEFAULT_HEALTH_PORTS_COUNT }
    }
}

impl HealthPorts {
    /// The ports, first to last.
    pub fn range(&self) -> std::ops::RangeInclusive<u16> {
        self.first..=self.first.saturating_add(self.count.saturating_sub(1))
    }
}

/// The shared server and what it carries.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExitServerPoolStatus {
    /// The shared public address, once a member's traffic passed the health check through it; on
    /// a `BothAddresses` pair, the first of `addresses`. Unset under `addressing: PerService`,
    /// where each Service's own address is on its own status only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Every address members are published at while the shared server is Active: the shared
    /// address, or a `BothAddresses` pair's two servers' own addresses, those whose check passes.
    /// Empty under `addressing: PerService`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Services the shared server carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<u32>,
    /// The ports the shared server serves, of every member (which member serves a port is not
    /// shown: the pool's status is readable by every namespace it allows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<TunnelPort>,
    /// `Ready`: the shared server runs and its address passed a member's health check.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

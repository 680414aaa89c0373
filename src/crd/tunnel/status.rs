//! A Tunnel's observed state: its exit server (or pair), address, members when it is a pool's
//! shared server, and the daily budget's record.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, TunnelPhase, TunnelPort};

/// Observed state of a tunnel.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelStatus {
    /// `Pending`, `Provisioning`, `Active`, `Deleting` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TunnelPhase>,
    /// The provider the exit server lives at (spec.provider or the operator's default at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The provider's id of the exit server. Recorded before waiting for it to boot, so a restarted
    /// operator finds it instead of creating a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Public IPv4 address of the exit server (its reserved address once that is assigned to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// The provider's id of the Tunnel's reserved address (`spec.address.mode: Reserved`).
    /// Recorded as soon as it is reserved, so it is found again while no exit server holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_id: Option<String>,
    /// The reserved address itself. It is published on the Service only once it is assigned to
    /// a running exit server whose tunnel passed the health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_ip: Option<String>,
    /// A reservation under way where reserved addresses carry no tags (DigitalOcean): recorded
    /// before the call and cleared once the address is recorded, so an address made by a call
    /// whose answer was lost (the operator stopped) is found again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_reservation: Option<AddressReservation>,
    /// The ports the exit server currently exposes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<TunnelPort>,
    /// A digest (a SHA-256 prefix, never the credentials themselves) of the tunnel credentials the
    /// exit server was configured with. When the credentials Secret is re-created with new keys,
    /// a different digest makes skyport reconfigure or replace the exit server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_digest: Option<String>,
    /// The source ranges (`spec.sourceRanges`, canonical) the exit server admits to the Service's
    /// ports, once its firewall enforces them (its own nftables ruleset; on EC2 its security
    /// group); unset where the provider does not enforce them (local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<String>>,
    /// The `metadata.generation` last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Exit servers replaced because their tunnel did not come up, since the Tunnel was last
    /// Active. At `--tunnel-max-replacements` skyport stops replacing and reports the cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacements: Option<u32>,
    /// The earliest time (RFC 3339) of the next such replacement: each one waits twice as long
    /// as the one before. Kept in status, so an operator restart does not reset it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_replacement_after: Option<String>,
    /// Exit servers this Tunnel created in the last 24 hours, by slot: what
    /// `--tunnel-max-hosts-per-day` counts. Recorded before each creation, so a crash never
    /// makes one uncounted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts_created: Vec<HostCreated>,
    /// With `spec.highAvailability`: both exit servers, which one holds the address, and the
    /// last failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_availability: Option<HighAvailabilityStatus>,
    /// On a pool's shared server: what it does for each member Tunnel. The members read their
    /// ports and health port here; a member keeps what it holds while another asks for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pool_members: Vec<PoolMember>,
    /// On the shared server of a pool with `addressing: PerService`: the address reserved for each
    /// member, kept here from its reservation until its release (after the server stopped
    /// listening on it), so none is ever lost or reserved twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub member_addresses: Vec<MemberAddress>,
    /// `Ready`: the exit server runs, the client is deployed and the Service's ports are exposed.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One member of a pool, as its shared server carries it ([`TunnelStatus::pool_members`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolMember {
    /// The member Tunnel's UID.
    pub uid: String,
    /// The ports the shared server carries for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<TunnelPort>,
    /// The port of its health check on the shared server; unset while it is not carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_port: Option<u16>,
    /// Why it is not carried, or not as its Service asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A member's own address on its pool's shared server ([`TunnelStatus::member_addresses`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberAddress {
    /// The member Tunnel's UID.
    pub uid: String,
    /// The provider's id of the reserved address.
    pub id: String,
    /// The address (IPv4).
    pub ip: String,
}

/// A reservation of an untagged address under way ([`TunnelStatus::address_reservation`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressReservation {
    /// When the reservation was started (RFC 3339).
    pub since: String,
    /// The reserved addresses (their ids) the account had just before: one that appears
    /// unassigned after, and that no other Tunnel records, was made by this reservation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<String>,
}

/// One exit server creation a Tunnel made (or was about to make), for its daily budget.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostCreated {
    /// The slot of a highly available pair (`a` or `b`); absent for a single exit server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// When (RFC 3339).
    pub at: String,
}

/// The exit servers of a highly available Tunnel.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HighAvailabilityStatus {
    /// The provider's id of the exit server holding the reserved address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<String>,
    /// Both exit servers, as last checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerStatus>,
    /// Failovers since the Tunnel was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failovers: Option<u32>,
    /// The last time the address moved to the standby, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<Failover>,
    /// Why the address cannot be moved quickly at this provider, when it cannot (every built-in
    /// provider moves it; a provider that gives addresses to servers only at creation would not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limitation: Option<String>,
    /// Whether the two exit servers run in different failure domains, from where the provider
    /// reports them placed (`servers[].placement`: for example `in different zones: eu-west-1a
    /// and eu-west-1b`), or why they may share one and what would change that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<String>,
}

/// One exit server of a highly available Tunnel.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerStatus {
    /// `a` or `b`: the slot the server fills, kept across its replacements; its client
    /// Deployment and its key in the credentials Secret are named after it.
    pub slot: String,
    /// The provider's id of the exit server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Its own public address, which its client dials (the reserved address is moved onto it
    /// beside that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// Whether its last end-to-end health check passed.
    #[serde(default)]
    pub healthy: bool,
    /// Exit servers of this slot replaced in a row because their check kept failing while the
    /// other server served (each after twice the wait of the one before, starting at
    /// `--tunnel-replace-after`, at most `--tunnel-max-replacements`); reset once the slot's
    /// server passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacements: Option<u32>,
    /// Why a server whose check fails is kept rather than replaced: the failure is not one a new
    /// exit server can cure (its client Deployment has no available replica, or the VM refused
    /// the exit-server binary), or the slot's replacements are spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_because: Option<String>,
    /// Where the provider reports the server placed, as far as that keeps servers apart: an EC2
    /// availability zone, or a Hetzner spread placement group; unset where it reports neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

/// A move of the reserved address from one exit server to the other.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failover {
    /// When the address was moved (RFC 3339).
    pub time: String,
    /// The exit server that held it.
    pub from: String,
    /// The exit server that holds it now.
    pub to: String,
    /// What the health check of `from` said.
    pub reason: String,
}

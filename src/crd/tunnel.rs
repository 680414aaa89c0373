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
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Host IP","type":"string","jsonPath":".status.hostIp"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".status.provider"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.serviceRef == oldSelf.serviceRef").message("serviceRef is immutable: create another Tunnel for another Service"),
    validation = Rule::new("has(self.provider) == has(oldSelf.provider) && (!has(self.provider) || self.provider == oldSelf.provider)").message("provider is immutable: delete the Tunnel to move it (a new exit server with a new address is provisioned)"),
    validation = Rule::new("has(self.region) == has(oldSelf.region) && (!has(self.region) || self.region == oldSelf.region)").message("region is immutable: delete the Tunnel to move it (a new exit server with a new address is provisioned)"),
    validation = Rule::new("has(self.size) == has(oldSelf.size) && (!has(self.size) || self.size == oldSelf.size)").message("size is immutable: delete the Tunnel to resize it (a new exit server with a new address is provisioned)")
)]
pub struct TunnelSpec {
    /// The Service in this namespace whose ports the exit server exposes. Immutable.
    pub service_ref: ServiceRef,

    /// Name of a provider configured in the operator: `local`, `ec2`, `digitalocean` or
    /// `hetzner`. Unset uses the operator's default (`skyport run --provider`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(local|ec2|digitalocean|hetzner)$"))]
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
}

/// Rules on the whole object (they need `metadata.name`), as (CEL rule, message); added to the
/// CRD's root schema by [`super::all`].
pub const ROOT_RULES: &[(&str, &str)] = &[(
    "size(self.metadata.name) <= 235",
    "a Tunnel's name is at most 235 characters: its client Deployment is named <name>-client and that Deployment's ReplicaSets add up to 11 more, within Kubernetes' 253",
)];

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
pub struct TunnelPort {
    /// Public port number on the exit server (the Service's `port`).
    pub port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
}

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
    /// Public IPv4 address of the exit server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    /// The ports the exit server currently exposes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<TunnelPort>,
    /// A digest (a SHA-256 prefix, never the credentials themselves) of the tunnel credentials the
    /// exit server was configured with. When the credentials Secret is re-created with new keys,
    /// a different digest makes skyport reconfigure or replace the exit server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_digest: Option<String>,
    /// The `metadata.generation` last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the exit server runs, the client is deployed and the Service's ports are exposed.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

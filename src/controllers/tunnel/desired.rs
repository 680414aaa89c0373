//! What a Tunnel should look like, computed from its Service and credentials: pure functions.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::ResourceExt;
use providers::exit::userdata::{ClientService, ExitServer, NoiseKeypair, Protocol, TunnelClient, TunnelService};
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, owner_tags};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::placement::{KEY_CLIENT, LABEL_TUNNEL_UID, Placement, fit_label};
use crate::controllers::MANAGED_BY;
use crate::crd::tunnel::{ProxyProtocol, Tunnel, TunnelPort};
use crate::error::{Error, Result};

/// Why a Service's ports cannot be exposed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortProblem {
    #[error("the Service has no ports to expose")]
    NoPorts,
    #[error("port {port} ({name}) uses {protocol}; tunnels carry TCP and UDP only")]
    Unsupported { port: i32, name: String, protocol: String },
    #[error(
        "port {0}/TCP is the tunnel's control port on the exit server; use another port or run skyport with a different --tunnel-control-port"
    )]
    Reserved(i32),
    #[error(
        "port {0}/TCP is the tunnel's health-check port on the exit server; use another port or run skyport with a different --tunnel-health-port"
    )]
    HealthReserved(i32),
    #[error("port {0}/TCP is where the exit server takes configuration pushes from skyport; use another port")]
    PushReserved(i32),
    #[error(
        "port {0}/UDP cannot carry the PROXY protocol header (spec.proxyProtocol, from the annotation skyport.dev/proxy-protocol): it is written ahead of TCP connections only; remove the annotation or put the UDP ports in a Service of their own"
    )]
    ProxyOverUdp(i32),
}

/// The ports the exit server must expose for `service`, sorted and without duplicates.
pub fn service_ports(service: &Service, control_port: u16, health_port: u16) -> Result<Vec<TunnelPort>, PortProblem> {
    let mut ports = Vec::new();
    for p in service.spec.as_ref().and_then(|s| s.ports.as_ref()).into_iter().flatten() {
        let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        if protocol != "TCP" && protocol != "UDP" {
            return Err(PortProblem::Unsupported { port: p.port, name: p.name.clone().unwrap_or_default(), protocol });
        }
        if protocol == "TCP" && p.port == i32::from(control_port) {
            return Err(PortProblem::Reserved(p.port));
        }
        if protocol == "TCP" && p.port == i32::from(health_port) {
            return Err(PortProblem::HealthReserved(p.port));
        }
        if protocol == "TCP" && p.port == i32::from(providers::exit::push::PUSH_PORT) {
            return Err(PortProblem::PushReserved(p.port));
        }
        ports.push(TunnelPort { port: p.port, protocol, proxy_protocol: None });
    }
    ports.sort();
    ports.dedup();
    if ports.is_empty() {
        return Err(PortProblem::NoPorts);
    }
    Ok(ports)
}

/// `ports` with the Tunnel's `spec.proxyProtocol`, refused when one of them is UDP.
pub fn proxied(mut ports: Vec<TunnelPort>, proxy: Option<ProxyProtocol>) -> Result<Vec<TunnelPort>, PortProblem> {
    if let (Some(_), Some(udp)) = (proxy, ports.iter().find(|p| p.protocol == "UDP")) {
        return Err(PortProblem::ProxyOverUdp(udp.port));
    }
    ports.iter_mut().for_each(|p| p.proxy_protocol = proxy);
    Ok(ports)
}

fn protocol(port: &TunnelPort) -> Protocol {
    if port.protocol == "UDP" { Protocol::Udp } else { Protocol::Tcp }
}

/// rathole service name of a port, shared by the server and client configs: `tcp-80`.
pub fn service_name(port: &TunnelPort) -> String {
    format!("{}-{}", port.protocol.to_ascii_lowercase(), port.port)
}

/// The tunnel's secrets, kept in the Tunnel's Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub keypair: NoiseKeypair,
    /// Shared by every service of the tunnel: one client serves them all.
    pub token: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

impl Credentials {
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        Credentials { keypair: NoiseKeypair::generate(), token: hex(&bytes) }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the exit server runs: the Service's ports (from anywhere, see `ranges::restrict`) and the health check's.
pub fn exit_server(ports: &[TunnelPort], credentials: &Credentials, control_port: u16, health_port: u16) -> ExitServer {
    let mut services: Vec<TunnelService> = ports
        .iter()
        .map(|p| TunnelService {
            name: service_name(p),
            protocol: protocol(p),
            // Validated by service_ports: 1..=65535 comes from the Service's schema.
            port: u16::try_from(p.port).unwrap_or_default(),
            token: credentials.token.clone(),
            source_ranges: Vec::new(),
            proxy_protocol: p.proxy_protocol.map(Into::into),
            bind: None,
        })
        .collect();
    services.push(crate::tunnel::health_server_service(health_port, &credentials.token));
    ExitServer { control_port, noise_private_key: credentials.keypair.private_key.clone(), services }
}

/// What the in-cluster client runs: every port forwarded to the Service's cluster IP, so the
/// client needs no DNS and kube-proxy balances over the endpoints.
pub fn client(
    ports: &[TunnelPort],
    credentials: &Credentials,
    host_ip: &str,
    (control_port, health_port): (u16, u16),
    cluster_ip: &str,
) -> TunnelClient {
    let mut services: Vec<ClientService> = ports
        .iter()
        .map(|p| ClientService {
            name: service_name(p),
            protocol: protocol(p),
            token: credentials.token.clone(),
            local_addr: format!("{}:{}", bracket(cluster_ip), p.port),
        })
        .collect();
    // The responder listens on the pod's loopback; the port number is the exit server's, only
    // for symmetry (nothing else in the pod uses it).
    services.push(crate::tunnel::health_client_service(health_port, &credentials.token));
    TunnelClient {
        remote_addr: format!("{host_ip}:{control_port}"),
        server_public_key: credentials.keypair.public_key.clone(),
        services,
    }
}

fn bracket(ip: &str) -> String {
    if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() }
}

/// The exit server's host name: `skyport-<namespace>-<name>`, as a valid RFC 1123 label (at most
/// 63 characters; longer ones keep a prefix and a hash of the whole, so they stay unique).
pub fn host_name(namespace: &str, name: &str) -> String {
    fit_label(&format!("skyport-{namespace}-{name}").replace('.', "-"))
}

/// Labels of the client Deployment's pods (and its selector): the instance is the Deployment's
/// name, unique in its namespace, so two clients in the clients' namespace never select each
/// other's pods.
pub fn client_labels(tunnel: &Tunnel, at: &Placement) -> BTreeMap<String, String> {
    let instance = if at.beside && at.slot.is_none() { tunnel.name_any() } else { at.deployment.clone() };
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "skyport-tunnel-client".into()),
        ("app.kubernetes.io/instance".into(), fit_label(&instance)),
        (MANAGED_BY.0.into(), MANAGED_BY.1.into()),
    ])
}

/// SHA-256 of the client config as a pod annotation: a change rolls the pod (the client misses Secret updates).
pub fn checksum(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// Whether `tunnel` may write `service`'s status: only the Tunnel the Service controls (the one
/// skyport made for it, or one a person gave a controller reference to the Service). A Tunnel
/// written by hand for someone else's Service exposes it but leaves its status alone.
pub fn controls_service_status(tunnel: &Tunnel, service: &Service) -> bool {
    let Some(uid) = service.metadata.uid.as_deref() else { return false };
    tunnel.owner_references().iter().any(|r| r.kind == "Service" && r.uid == uid && r.controller == Some(true))
}

/// `status.loadBalancer.ingress` for the exit server, `ipMode: Proxy` because traffic arrives
/// from the tunnel client, not with the client's source address.
pub fn ingress(host_ip: &str, ports: &[TunnelPort]) -> serde_json::Value {
    let ports: Vec<_> = ports.iter().map(|p| serde_json::json!({"port": p.port, "protocol": p.protocol})).collect();
    serde_json::json!([{"ip": host_ip, "ipMode": "Proxy", "ports": ports}])
}

/// `status.loadBalancer.ingress` for several exit servers, each carrying every port: a highly
/// available Tunnel publishing both servers' own addresses.
pub fn ingress_all(host_ips: &[&str], ports: &[TunnelPort]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> =
        host_ips.iter().filter_map(|ip| ingress(ip, ports).as_array().and_then(|a| a.first()).cloned()).collect();
    serde_json::Value::Array(entries)
}

/// Whether the Service already shows exactly `want` as its ingress.
pub fn ingress_matches(service: &Service, want: &serde_json::Value) -> bool {
    let current = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    let Some(current) = current.and_then(|c| serde_json::to_value(c).ok()) else { return false };
    // An API server without the LoadBalancerIPMode feature drops `ipMode` from what it stores;
    // counting that as a difference would write the same status on every reconcile. An
    // `ipMode` the server kept must still match.
    &current == want || (!has_ip_mode(&current) && current == without_ip_mode(want))
}

fn has_ip_mode(ingress: &serde_json::Value) -> bool {
    ingress.as_array().into_iter().flatten().any(|entry| entry.get("ipMode").is_some())
}

fn without_ip_mode(ingress: &serde_json::Value) -> serde_json::Value {
    let mut stripped = ingress.clone();
    for entry in stripped.as_array_mut().into_iter().flatten() {
        if let Some(fields) = entry.as_object_mut() {
            fields.remove("ipMode");
        }
    }
    stripped
}

/// Keys of the Tunnel's Secret.
pub const KEY_PRIVATE: &str = "noise-private-key";
pub const KEY_PUBLIC: &str = "noise-public-key";
pub const KEY_TOKEN: &str = "token";

/// The server-side apply of the client config into the Tunnel's Secret (only that key). It
/// carries the Secret's labels and owner too: if the Secret was deleted since it was read, the
/// apply creates it, and a Secret without them would be refused by the admission policy (it lets
/// skyport write only labelled objects) and never garbage-collected.
pub fn client_config(tunnel: &Tunnel, at: &Placement, client_toml: &str) -> Result<serde_json::Value> {
    pair_client_config(tunnel, at, &BTreeMap::from([(KEY_CLIENT.to_string(), client_toml.to_string())]))
}

/// Like [`client_config`], for the clients of a highly available pair: every key in `configs`
/// (by [`Placement::client_key`]) in one apply, as an apply drops the keys it no longer names.
pub fn pair_client_config(
    tunnel: &Tunnel,
    at: &Placement,
    configs: &BTreeMap<String, String>,
) -> Result<serde_json::Value> {
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": at.meta(tunnel, &at.secret)?,
        "stringData": configs,
    }))
}

/// The tags of the Tunnel's hosts and of its reserved address: the owner's and the cluster's,
/// and with a reserved address its deletion policy, on the hosts as well (a DigitalOcean
/// reserved IP carries no tags of its own, only its droplet's).
pub fn tags(tunnel: &Tunnel, cluster_id: &str) -> Result<BTreeMap<String, String>> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let mut tags = owner_tags(&uid, &ns, &tunnel.name_any());
    tags.insert(TAG_CLUSTER.to_string(), cluster_id.to_string());
    if tunnel.spec.reserves_address() {
        tags.insert(TAG_DELETION_POLICY.to_string(), format!("{:?}", tunnel.spec.address_deletion_policy()));
    }
    Ok(tags)
}

/// Pod template annotation carrying [`checksum`] of the client config.
pub const CHECKSUM_ANNOTATION: &str = "skyport.dev/config-checksum";

/// The Tunnel's Secret holding fresh `credentials` (the client config is added later).
pub fn secret(tunnel: &Tunnel, at: &Placement, credentials: &Credentials) -> Result<Secret> {
    Ok(Secret {
        metadata: at.meta(tunnel, &at.secret)?,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (KEY_PRIVATE.to_string(), ByteString(credentials.keypair.private_key.clone().into_bytes())),
            (KEY_PUBLIC.to_string(), ByteString(credentials.keypair.public_key.clone().into_bytes())),
            (KEY_TOKEN.to_string(), ByteString(credentials.token.clone().into_bytes())),
        ])),
        ..Default::default()
    })
}

/// The client Deployment: one replica (two clients with one token would take the service from
/// each other), `Recreate` for the same reason, restarted when the config checksum changes.
pub fn deployment(tunnel: &Tunnel, at: &Placement, image: &str, checksum: &str) -> Result<Deployment> {
    let labels = client_labels(tunnel, at);
    let mut value = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": at.meta(tunnel, &at.deployment)?,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {CHECKSUM_ANNOTATION: checksum}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    // fsGroup: the mounted config is root's, mode 0440; its group lets uid 65532 read it.
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "tunnel-client",
                        "image": image,
                        "command": ["/skyport"],
                        "args": ["tunnel", "client", "--config", "/etc/skyport/client.toml"],
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"memory": "128Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/skyport", "readOnly": true}],
                    }],
                    "volumes": [{
                        "name": "config",
                        "secret": {
                            "secretName": at.secret,
                            "items": [{"key": at.client_key(), "path": "client.toml"}],
                            "defaultMode": 0o440,
                        },
                    }],
                },
            },
        },
    });
    if at.slot.is_some() {
        apart(&mut value, &tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?);
    }
    serde_json::from_value(value).map_err(|e| Error::Internal(format!("client Deployment: {e}")))
}

/// The clients of a pair keep apart: each Pod carries its Tunnel's UID, and the scheduler prefers
/// a node, then a zone, without the other, so losing one node leaves one client running. Preferred,
/// not required: on a one-node cluster both still run (skyport reads no Nodes to know which).
fn apart(deployment: &mut serde_json::Value, tunnel_uid: &str) {
    let template = &mut deployment["spec"]["template"];
    template["metadata"]["labels"][LABEL_TUNNEL_UID] = json!(tunnel_uid);
    let term = |key: &str, weight: u32| {
        json!({"weight": weight, "podAffinityTerm": {
            "labelSelector": {"matchLabels": {LABEL_TUNNEL_UID: tunnel_uid}},
            "topologyKey": key,
        }})
    };
    template["spec"]["affinity"] = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        term("kubernetes.io/hostname", 100),
        term("topology.kubernetes.io/zone", 50),
    ]}});
}

#[cfg(test)]
mod tests;

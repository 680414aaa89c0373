//! cloud-init user data for the exit server: pure functions, no IO.
//!
//! The exit server runs the tunnel server, rathole 0.5.0 (Apache-2.0) built into the skyport
//! binary (`skyport tunnel server`), with the Noise transport ([`NOISE_PATTERN`]:
//! the server holds an X25519 key, each service has its own token). rathole declares public ports
//! on the server side, one `[server.services.<name>]` per port, so the rendered `server.toml`
//! lists exactly the Service's ports; it hot-reloads that file when it changes. Why rathole:
//! docs/exit-server.md, *Tunnel software*; its measured behaviour: BENCHMARKS.md, *Tunnel*.
//! The rendered `#cloud-config`:
//! - downloads the skyport binary for the VM's architecture from an [`Artifact`] URL and refuses
//!   to run it unless its SHA-256 is the artifact's digest (derived by the operator from its own
//!   executable, never typed in): a mismatch or an unknown architecture ends the install script
//!   with an error before the service is enabled, and cloud-init reports the failure; the
//!   script prints its outcome on the console in one line ([`InstallReport`]) for the operator;
//! - writes `/etc/skyport/server.toml` (mode 0600, owned by the unprivileged `skyport` user), the
//!   only place secrets appear (the Noise private key and the service tokens);
//! - writes a systemd unit that runs `skyport tunnel server` as that user, allowed to bind ports
//!   below 1024 and nothing more;
//! - writes an nftables ruleset that drops all inbound traffic except the control port (TCP),
//!   the push port ([`PUSH_PORT`], TCP), the service ports (TCP and UDP as given, each from
//!   its source ranges only where it has any), replies, loopback and ICMP. SSH stays closed:
//!   the operator never logs in;
//! - writes a path unit that, whenever a config push replaces `server.toml`, runs a root oneshot
//!   re-rendering that ruleset from the new config's port numbers, bound addresses and source
//!   ranges and loading it (`skyport tunnel firewall`), then putting the addresses services are
//!   bound to on the public interface (`skyport tunnel addresses`): the VM follows the config,
//!   and the unprivileged server never runs `nft` or `ip`. The oneshot also runs at every boot;
//!
//! Everything is sorted, so the same input always renders byte-for-byte the same document.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde::Serialize;
use serde_saphyr::LitString;

mod addresses;
mod install;
mod nftables;
mod ports;
mod rathole;
mod units;

pub use addresses::{
    ADDRESSES_SCRIPT_PATH, ADDRESSES_UNIT_NAME, ADDRESSES_UNIT_PATH, InterfaceAddresses, render_addresses_script,
    render_addresses_unit, render_ec2_secondary_script,
};
pub use install::{INSTALL_REPORT, InstallReport, render_install};
pub use nftables::{Openings, render_nftables, render_nftables_openings};

pub use rathole::{
    ClientService, NOISE_PATTERN, NoiseKeypair, ProxyProtocol, SKYPORT_TABLE, TunnelClient, render_client_toml,
    render_server_toml, render_server_toml_on, render_server_toml_split,
};
pub use units::{render_firewall_path, render_firewall_unit, render_unit};

/// The rathole version built into skyport (the latest stable, 2023-10-01).
pub const RATHOLE_VERSION: &str = "0.5.0";
/// Default TCP port the tunnel client dials.
pub const DEFAULT_CONTROL_PORT: u16 = 2333;
/// The TCP port exit servers take config pushes on ([`super::push`]), beside the control port.
pub const PUSH_PORT: u16 = 2335;

/// Where the server configuration lives on the exit server.
pub const SERVER_CONFIG_PATH: &str = "/etc/skyport/server.toml";
/// The systemd unit's name and path.
pub const UNIT_NAME: &str = "skyport-exit-server.service";
pub const UNIT_PATH: &str = "/etc/systemd/system/skyport-exit-server.service";
/// The oneshot unit following the server config as root, so the unprivileged server never runs
/// `nft` or `ip` itself: re-renders the ruleset from the config and loads it, and puts the
/// addresses services are bound to on the interface. Runs after each push and at every boot.
pub const FIREWALL_UNIT_NAME: &str = "skyport-firewall.service";
pub const FIREWALL_UNIT_PATH: &str = "/etc/systemd/system/skyport-firewall.service";
/// The path unit that starts the firewall unit whenever the server config changes (a push).
pub const FIREWALL_PATH_NAME: &str = "skyport-firewall.path";
pub const FIREWALL_PATH_PATH: &str = "/etc/systemd/system/skyport-firewall.path";
/// The folder of the server config: owned by the service user, who replaces the config (by a
/// rename) when a push arrives and keeps the push generation beside it.
pub const CONFIG_DIR: &str = "/etc/skyport";
/// Where the checked binary is installed.
pub const BINARY_PATH: &str = "/usr/local/bin/skyport";
/// The unprivileged user the server runs as.
pub const SERVICE_USER: &str = "skyport";

/// One downloadable skyport binary: the exit server for machines of `arch` (as `uname -m`
/// prints it: `x86_64`, `aarch64`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    pub arch: String,
    pub url: String,
    /// Lowercase hex SHA-256 the downloaded file must have.
    pub sha256: String,
}
/// The firewall ruleset's path (loaded by `nftables.service` on Debian and Ubuntu).
pub const NFTABLES_PATH: &str = "/etc/nftables.conf";

/// Transport protocol of one public port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// One public port of the exit server, forwarded to the in-cluster client.
#[derive(Clone, PartialEq, Eq)]
pub struct TunnelService {
    /// rathole service name, shared with the client config: `[A-Za-z0-9_.-]`, 1–63 characters.
    pub name: String,
    pub protocol: Protocol,
    /// The public port on the exit server.
    pub port: u16,
    /// The service's token (secret).
    pub token: String,
    /// CIDRs allowed to reach `port` (the Service's `loadBalancerSourceRanges`), canonical
    /// ([`crate::cidr::canonical`]); empty: anywhere. Carried in the server config's `[skyport]`
    /// table and enforced by the host's own nftables ruleset ([`render_nftables`]), and also by
    /// the cloud firewall where the provider has one per host (EC2 security groups).
    pub source_ranges: Vec<String>,
    /// The PROXY protocol header the exit server writes ahead of each connection's bytes, so the
    /// backend learns the visitor's address; `None`: the bytes as they come. TCP services only.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// The one address the service listens on, where the server answers on several: an
    /// ExitServerPool member's own (`addressing: PerService`), so Services of different members
    /// may share a port number. `None`: the server's service address, as every other service.
    pub bind: Option<std::net::Ipv4Addr>,
}

impl std::fmt::Debug for TunnelService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelService")
            .field("name", &self.name)
            .field("protocol", &self.protocol)
            .field("port", &self.port)
            .field("token", &"<redacted>")
            .field("source_ranges", &self.source_ranges)
            .field("proxy_protocol", &self.proxy_protocol)
            .field("bind", &self.bind)
            .finish()
    }
}

/// Everything the exit server needs.
#[derive(Clone, PartialEq, Eq)]
pub struct ExitServer {
    /// TCP port rathole's control channel listens on.
    pub control_port: u16,
    /// Base64 X25519 private key (as `rathole --genkey` prints it); the client gets the public
    /// half.
    pub noise_private_key: String,
    pub services: Vec<TunnelService>,
}

impl std::fmt::Debug for ExitServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExitServer")
            .field("control_port", &self.control_port)
            .field("noise_private_key", &"<redacted>")
            .field("services", &self.services)
            .finish()
    }
}

/// Why an [`ExitServer`] cannot be rendered. Messages never contain secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserDataError {
    #[error("service name {0:?} must be 1-63 characters of A-Z, a-z, 0-9, '_', '.', '-'")]
    InvalidName(String),
    #[error("service name {0:?} is used twice")]
    DuplicateName(String),
    #[error("port {port}/{protocol} is used twice (the control port is {control_port}/tcp)")]
    DuplicatePort { port: u16, protocol: &'static str, control_port: u16 },
    #[error("port 0 is not a valid port (service {0:?} or the control port)")]
    PortZero(String),
    #[error("service {0:?} has an empty token")]
    EmptyToken(String),
    #[error("the Noise private key must be non-empty base64")]
    InvalidKey,
    #[error("no exit-server binary to download (the operator could not derive one)")]
    NoArtifact,
    #[error("exit-server artifact for {0:?}: the architecture, URL or SHA-256 is malformed")]
    InvalidArtifact(String),
    #[error("service {name:?}: source range {message}")]
    InvalidSourceRange { name: String, message: String },
    #[error("service {0:?} is UDP: the PROXY protocol header is written ahead of a TCP connection's bytes only")]
    ProxyOverUdp(String),
}

impl ExitServer {
    /// The same server for a host whose cloud firewall enforces the source ranges in front of it
    /// (or that has no firewall): every port open to anyone, except on services bound to an
    /// address of their own (ExitServerPool members with `addressing: PerService`). A cloud
    /// firewall keyed by port admits the union of the ranges of every member serving that port,
    /// so the server's own firewall, keyed by address, keeps each member's.
    pub fn for_cloud_firewall(&self) -> ExitServer {
        let mut open = self.clone();
        open.services.iter_mut().filter(|s| s.bind.is_none()).for_each(|s| s.source_ranges.clear());
        open
    }

    /// Services sorted by name, after checking names, ports, tokens and the key.
    fn validated(&self) -> Result<Vec<&TunnelService>, UserDataError> {
        if self.noise_private_key.is_empty()
            || !self.noise_private_key.chars().all(|c| c.is_ascii_alphanumeric() || "+/=".contains(c))
        {
            return Err(UserDataError::InvalidKey);
        }
        if self.control_port == 0 {
            return Err(UserDataError::PortZero("control".into()));
        }
        let mut names = BTreeSet::new();
        let mut ports = ports::Ports::new(self.control_port);
        if self.control_port == PUSH_PORT {
            return Err(UserDataError::DuplicatePort {
                port: PUSH_PORT,
                protocol: "tcp",
                control_port: self.control_port,
            });
        }
        for s in &self.services {
            let name_ok = (1..=63).contains(&s.name.len())
                && s.name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !name_ok {
                return Err(UserDataError::InvalidName(s.name.clone()));
            }
            if !names.insert(s.name.as_str()) {
                return Err(UserDataError::DuplicateName(s.name.clone()));
            }
            if s.port == 0 {
                return Err(UserDataError::PortZero(s.name.clone()));
            }
            if !ports.insert(s) {
                return Err(UserDataError::DuplicatePort {
                    port: s.port,
                    protocol: s.protocol.as_str(),
                    control_port: self.control_port,
                });
            }
            if s.token.is_empty() {
                return Err(UserDataError::EmptyToken(s.name.clone()));
            }
            if s.proxy_protocol.is_some() && s.protocol == Protocol::Udp {
                return Err(UserDataError::ProxyOverUdp(s.name.clone()));
            }
            for range in &s.source_ranges {
                crate::cidr::Cidr::parse_canonical(range)
                    .map_err(|message| UserDataError::InvalidSourceRange { name: s.name.clone(), message })?;
            }
        }
        let mut sorted: Vec<&TunnelService> = self.services.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(sorted)
    }
}

#[derive(Serialize)]
struct CloudConfig {
    package_update: bool,
    packages: Vec<&'static str>,
    users: Vec<User>,
    write_files: Vec<WriteFile>,
    runcmd: Vec<Vec<String>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum User {
    /// The image's default user (keeps the provider's SSH-key handling intact).
    Default(&'static str),
    System {
        name: &'static str,
        system: bool,
        shell: &'static str,
        lock_passwd: bool,
    },
}

#[derive(Serialize)]
struct WriteFile {
    path: &'static str,
    owner: &'static str,
    permissions: &'static str,
    /// Written in cloud-init's final stage: after packages are installed (so a package never
    /// finds our file in its way) and the `skyport` user exists, before `runcmd` runs.
    defer: bool,
    content: LitString,
}

/// The `#cloud-config` user data for an exit server that downloads one of `artifacts`.
pub fn render_cloud_config(server: &ExitServer, artifacts: &[Artifact]) -> Result<String, UserDataError> {
    render_cloud_config_with(server, artifacts, &[])
}

/// [`render_cloud_config`] for an exit server that must also answer on `moved`: the reserved
/// address of a highly available Tunnel, where the provider needs it on the server's interface
/// ([`addresses`]). Without any, the same document as [`render_cloud_config`].
pub fn render_cloud_config_with(
    server: &ExitServer,
    artifacts: &[Artifact],
    moved: &[Ipv4Addr],
) -> Result<String, UserDataError> {
    render_cloud_config_on(server, artifacts, &InterfaceAddresses::Fixed(moved.to_vec()))
}

/// [`render_cloud_config`] for a highly available Tunnel's exit server that puts `addresses` on
/// its interface at every boot ([`addresses`]).
pub fn render_cloud_config_on(
    server: &ExitServer,
    artifacts: &[Artifact],
    addresses: &InterfaceAddresses,
) -> Result<String, UserDataError> {
    let server_toml = render_server_toml(server)?;
    let install = render_install(artifacts, server.control_port)?;
    let argv = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut doc = CloudConfig {
        package_update: true,
        packages: vec!["ca-certificates", "curl", "nftables"],
        users: vec![
            User::Default("default"),
            User::System { name: SERVICE_USER, system: true, shell: "/usr/sbin/nologin", lock_passwd: true },
        ],
        write_files: vec![
            WriteFile {
                path: NFTABLES_PATH,
                owner: "root:root",
                permissions: "0644",
                defer: true,
                content: LitString(render_nftables(server)),
            },
            WriteFile {
                path: UNIT_PATH,
                owner: "root:root",
                permissions: "0644",
                defer: true,
                content: LitString(render_unit()),
            },
            WriteFile {
                path: FIREWALL_UNIT_PATH,
                owner: "root:root",
                permissions: "0644",
                defer: true,
                content: LitString(render_firewall_unit()),
            },
            WriteFile {
                path: FIREWALL_PATH_PATH,
                owner: "root:root",
                permissions: "0644",
                defer: true,
                content: LitString(render_firewall_path()),
            },
            WriteFile {
                path: SERVER_CONFIG_PATH,
                owner: "skyport:skyport",
                permissions: "0600",
                defer: true,
                content: LitString(server_toml),
            },
        ],
        // cloud-init runs each `runcmd` line whatever the previous one returned, so the ruleset
        // is loaded inside the install script: a firewall that fails to load stops it before the
        // server is downloaded or enabled.
        runcmd: vec![
            argv(&["systemctl", "enable", "--now", "nftables.service"]),
            vec!["sh".into(), "-c".into(), install],
        ],
    };
    if let Some(script) = addresses.script() {
        doc.write_files.push(WriteFile {
            path: ADDRESSES_SCRIPT_PATH,
            owner: "root:root",
            permissions: "0755",
            defer: true,
            content: LitString(script),
        });
        doc.write_files.push(WriteFile {
            path: ADDRESSES_UNIT_PATH,
            owner: "root:root",
            permissions: "0644",
            defer: true,
            content: LitString(render_addresses_unit()),
        });
        doc.runcmd.insert(1, argv(&["systemctl", "enable", "--now", ADDRESSES_UNIT_NAME]));
    }
    let yaml = serde_saphyr::to_string(&doc).expect("plain structs always serialize");
    Ok(format!("#cloud-config\n{yaml}"))
}

#[cfg(test)]
mod tests;

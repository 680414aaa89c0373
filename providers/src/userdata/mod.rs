//! cloud-init user data for the exit server: pure functions, no IO.
//!
//! The exit server runs the tunnel server, rathole 0.5.0 (Apache-2.0) built into the skyport
//! binary (`skyport tunnel server`), with the Noise transport (`Noise_NK_25519_ChaChaPoly_BLAKE2s`:
//! the server holds an X25519 key, each service has its own token). rathole declares public ports
//! on the server side, one `[server.services.<name>]` per port, so the rendered `server.toml`
//! lists exactly the Service's ports; it hot-reloads that file when it changes. See
//! `../shared/research/tunnel.md` for why rathole and for the measured behaviour.
//!
//! The rendered `#cloud-config`:
//! - downloads the skyport binary for the VM's architecture from an [`Artifact`] URL and refuses
//!   to run it unless its SHA-256 is the artifact's digest (derived by the operator from its own
//!   executable, never typed in): a mismatch or an unknown architecture ends the install script
//!   with an error before the service is enabled, and cloud-init reports the failure;
//! - writes `/etc/skyport/server.toml` (mode 0600, owned by the unprivileged `skyport` user), the
//!   only place secrets appear (the Noise private key and the service tokens);
//! - writes a systemd unit that runs `skyport tunnel server` as that user, allowed to bind ports
//!   below 1024 and nothing more;
//! - writes an nftables ruleset that drops all inbound traffic except the control port (TCP),
//!   the push port ([`crate::push::PUSH_PORT`], TCP), the service ports (TCP and UDP as given),
//!   replies, loopback and ICMP. SSH stays closed: the operator never logs in;
//! - writes a path unit that, whenever a config push replaces `server.toml`, runs a root oneshot
//!   (`skyport tunnel firewall`) re-rendering that ruleset from the new config's port numbers and
//!   loading it: the firewall follows the ports, and the unprivileged server never runs `nft`.
//!
//! Everything is sorted, so the same input always renders byte-for-byte the same document.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_saphyr::LitString;

use crate::push::PUSH_PORT;

mod rathole;

pub use rathole::{
    ClientService, NoiseKeypair, TunnelClient, render_client_toml, render_server_toml, render_server_toml_on,
};

/// The rathole version built into skyport (the latest stable, 2023-10-01).
pub const RATHOLE_VERSION: &str = "0.5.0";
/// Default TCP port the tunnel client dials.
pub const DEFAULT_CONTROL_PORT: u16 = 2333;

/// Where the server configuration lives on the exit server.
pub const SERVER_CONFIG_PATH: &str = "/etc/skyport/server.toml";
/// The systemd unit's name and path.
pub const UNIT_NAME: &str = "skyport-exit-server.service";
pub const UNIT_PATH: &str = "/etc/systemd/system/skyport-exit-server.service";
/// The firewall's oneshot unit: re-renders the ruleset from the ports in the server config and
/// loads it, as root, so the unprivileged server never runs `nft` itself.
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
}

impl std::fmt::Debug for TunnelService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelService")
            .field("name", &self.name)
            .field("protocol", &self.protocol)
            .field("port", &self.port)
            .field("token", &"<redacted>")
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
}

impl ExitServer {
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
        let mut ports = BTreeSet::from([(Protocol::Tcp, self.control_port), (Protocol::Tcp, PUSH_PORT)]);
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
            if !ports.insert((s.protocol, s.port)) {
                return Err(UserDataError::DuplicatePort {
                    port: s.port,
                    protocol: s.protocol.as_str(),
                    control_port: self.control_port,
                });
            }
            if s.token.is_empty() {
                return Err(UserDataError::EmptyToken(s.name.clone()));
            }
        }
        let mut sorted: Vec<&TunnelService> = self.services.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(sorted)
    }

    fn ports(&self, protocol: Protocol) -> BTreeSet<u16> {
        let mut ports: BTreeSet<u16> =
            self.services.iter().filter(|s| s.protocol == protocol).map(|s| s.port).collect();
        if protocol == Protocol::Tcp {
            ports.insert(self.control_port);
            ports.insert(PUSH_PORT);
        }
        ports
    }
}

/// The host firewall: inbound traffic only to the control port, the push port and the service
/// ports.
pub fn render_nftables(server: &ExitServer) -> String {
    render_nftables_ports(&server.ports(Protocol::Tcp), &server.ports(Protocol::Udp))
}

/// The host firewall opening exactly `tcp` and `udp`. Also what `skyport tunnel firewall`
/// renders on the VM from the ports of a pushed config: ports are numbers, so whatever the
/// unprivileged server writes, it can only open ports, never add other rules.
pub fn render_nftables_ports(tcp: &BTreeSet<u16>, udp: &BTreeSet<u16>) -> String {
    let set = |ports: &BTreeSet<u16>| ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    let mut out = String::new();
    out.push_str("#!/usr/sbin/nft -f\n");
    out.push_str(
        "# Generated by skyport: only the tunnel's control and push ports and the Service's ports are open.\n",
    );
    out.push_str("flush ruleset\n\n");
    out.push_str("table inet skyport {\n");
    out.push_str("  chain input {\n");
    out.push_str("    type filter hook input priority filter; policy drop;\n");
    out.push_str("    ct state established,related accept\n");
    out.push_str("    ct state invalid drop\n");
    out.push_str("    iif \"lo\" accept\n");
    out.push_str("    meta l4proto { icmp, ipv6-icmp } accept\n");
    out.push_str(&format!("    tcp dport {{ {} }} accept\n", set(tcp)));
    if !udp.is_empty() {
        out.push_str(&format!("    udp dport {{ {} }} accept\n", set(udp)));
    }
    out.push_str("  }\n");
    out.push_str("}\n");
    out
}

/// The systemd unit running the tunnel server.
pub fn render_unit() -> String {
    format!(
        "[Unit]\n\
         Description=skyport exit server (tunnel server, rathole {RATHOLE_VERSION})\n\
         After=network-online.target nftables.service\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         User={SERVICE_USER}\n\
         Group={SERVICE_USER}\n\
         ExecStart={BINARY_PATH} tunnel server --config {SERVER_CONFIG_PATH}\n\
         Restart=always\n\
         RestartSec=1\n\
         LimitNOFILE=1048576\n\
         AmbientCapabilities=CAP_NET_BIND_SERVICE\n\
         CapabilityBoundingSet=CAP_NET_BIND_SERVICE\n\
         NoNewPrivileges=true\n\
         ProtectSystem=strict\n\
         ReadWritePaths={CONFIG_DIR}\n\
         ProtectHome=true\n\
         PrivateTmp=true\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// The oneshot unit that makes the firewall follow the server config's ports (see
/// [`render_nftables_ports`]); the ruleset file is rewritten too, so a reboot loads the same.
pub fn render_firewall_unit() -> String {
    format!(
        "[Unit]\n\
         Description=skyport exit server firewall: open exactly the tunnel's ports\n\
         After=nftables.service\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         ExecStart={BINARY_PATH} tunnel firewall --config {SERVER_CONFIG_PATH} --output {NFTABLES_PATH}\n\
         ExecStart=/usr/sbin/nft -f {NFTABLES_PATH}\n"
    )
}

/// The path unit starting [`render_firewall_unit`] when the server config is replaced.
pub fn render_firewall_path() -> String {
    format!(
        "[Unit]\n\
         Description=skyport exit server: follow pushed tunnel ports with the firewall\n\
         \n\
         [Path]\n\
         PathChanged={SERVER_CONFIG_PATH}\n\
         Unit={FIREWALL_UNIT_NAME}\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
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

/// The install script: picks the artifact for the machine's architecture, downloads it beside
/// its final path, and installs it only if the digest matches; otherwise it fails, so the unit is
/// never enabled (fail closed). Values are validated before they are quoted.
pub fn render_install(artifacts: &[Artifact]) -> Result<String, UserDataError> {
    if artifacts.is_empty() {
        return Err(UserDataError::NoArtifact);
    }
    let mut sorted: Vec<&Artifact> = artifacts.iter().collect();
    sorted.sort_by(|a, b| a.arch.cmp(&b.arch));
    let mut cases = String::new();
    for a in sorted {
        let arch_ok = !a.arch.is_empty() && a.arch.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let sum_ok = a.sha256.len() == 64 && a.sha256.chars().all(|c| c.is_ascii_hexdigit());
        let url_ok = (a.url.starts_with("https://") || a.url.starts_with("http://"))
            && !a.url.chars().any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c));
        if !(arch_ok && sum_ok && url_ok) {
            return Err(UserDataError::InvalidArtifact(a.arch.clone()));
        }
        cases.push_str(&format!("  {}) url='{}'; sum='{}' ;;\n", a.arch, a.url, a.sha256.to_ascii_lowercase()));
    }
    let download = format!("{BINARY_PATH}.download");
    Ok(format!(
        "set -eu\n\
         arch=\"$(uname -m)\"\n\
         case \"$arch\" in\n\
         {cases}  \
         *) echo \"skyport: no exit-server binary for architecture $arch\" >&2; exit 1 ;;\n\
         esac\n\
         rm -f {download}\n\
         curl -fsSL --retry 5 --retry-connrefused -o {download} \"$url\"\n\
         if ! echo \"$sum  {download}\" | sha256sum -c --status -; then\n  \
         rm -f {download}\n  \
         echo \"skyport: $url does not have SHA-256 $sum; refusing to run it\" >&2\n  \
         exit 1\n\
         fi\n\
         chmod 0755 {download}\n\
         mv -f {download} {BINARY_PATH}\n\
         chown {SERVICE_USER}:{SERVICE_USER} {CONFIG_DIR}\n\
         chmod 0700 {CONFIG_DIR}\n\
         systemctl daemon-reload\n\
         systemctl enable --now {FIREWALL_PATH_NAME}\n\
         systemctl enable --now {UNIT_NAME}\n"
    ))
}

/// The `#cloud-config` user data for an exit server that downloads one of `artifacts`.
pub fn render_cloud_config(server: &ExitServer, artifacts: &[Artifact]) -> Result<String, UserDataError> {
    let server_toml = render_server_toml(server)?;
    let install = render_install(artifacts)?;
    let argv = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let doc = CloudConfig {
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
        // The firewall first, so the tunnel's ports are never open without it; one script for
        // the install so nothing after a failed check runs.
        runcmd: vec![
            argv(&["systemctl", "enable", "--now", "nftables.service"]),
            argv(&["nft", "-f", NFTABLES_PATH]),
            vec!["sh".into(), "-c".into(), install],
        ],
    };
    let yaml = serde_saphyr::to_string(&doc).expect("plain structs always serialize");
    Ok(format!("#cloud-config\n{yaml}"))
}

#[cfg(test)]
mod tests {
    use super::rathole::toml_string;
    use super::*;

    const GENKEY_PRIVATE: &str = "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=";
    const GENKEY_PUBLIC: &str = "E5GbisDny7Rpe9Z28U1FLgm4zrvBrRDs+BTKatK1mUY=";
    use serde_json::Value;

    const KEY: &str = "cGhhbnRvbS1rZXktZm9yLXRlc3RzLW9ubHktMzJieXRlcw==";

    fn service(name: &str, protocol: Protocol, port: u16, token: &str) -> TunnelService {
        TunnelService { name: name.into(), protocol, port, token: token.into() }
    }

    fn sample() -> ExitServer {
        ExitServer {
            control_port: DEFAULT_CONTROL_PORT,
            noise_private_key: KEY.into(),
            services: vec![
                service("default.web.80-tcp", Protocol::Tcp, 80, "tok-web-80-Zq8\"x\\y"),
                service("default.web.443-tcp", Protocol::Tcp, 443, "tok-web-443-Lm2"),
                service("default.dns.53-udp", Protocol::Udp, 53, "tok-dns-53-Pp7: #not-a-comment"),
            ],
        }
    }

    const SUM: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn artifacts() -> Vec<Artifact> {
        vec![
            Artifact {
                arch: "x86_64".into(),
                url: "https://example.test/v1/skyport-x86_64".into(),
                sha256: SUM.into(),
            },
            Artifact { arch: "aarch64".into(), url: "http://10.1.2.3/skyport-aarch64".into(), sha256: "ab".repeat(32) },
        ]
    }

    fn parse(doc: &str) -> Value {
        serde_saphyr::from_str::<Value>(doc).expect("valid YAML")
    }

    fn file<'a>(doc: &'a Value, path: &str) -> &'a str {
        doc["write_files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .and_then(|f| f["content"].as_str())
            .unwrap_or_else(|| panic!("no {path}"))
    }

    /// Calls `f(path, string)` for every string in the document.
    fn walk(v: &Value, path: &mut Vec<String>, f: &mut dyn FnMut(&[String], &str)) {
        match v {
            Value::String(s) => f(path, s),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    path.push(i.to_string());
                    walk(item, path, f);
                    path.pop();
                }
            }
            Value::Object(map) => {
                for (k, item) in map {
                    path.push(k.clone());
                    walk(item, path, f);
                    path.pop();
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_output_is_a_cloud_config_that_parses_as_yaml() {
        let out = render_cloud_config(&sample(), &artifacts()).unwrap();
        assert!(out.starts_with("#cloud-config\n"));
        let doc = parse(&out);
        assert_eq!(doc["packages"].as_array().unwrap().len(), 3);
        let toml_file =
            doc["write_files"].as_array().unwrap().iter().find(|f| f["path"] == SERVER_CONFIG_PATH).unwrap();
        assert_eq!(toml_file["permissions"], "0600", "the mode stays a string");
        assert_eq!(toml_file["owner"], "skyport:skyport");
        // The file contents survive YAML round-tripping byte for byte.
        assert_eq!(file(&doc, SERVER_CONFIG_PATH), render_server_toml(&sample()).unwrap());
        assert_eq!(file(&doc, NFTABLES_PATH), render_nftables(&sample()));
        assert_eq!(file(&doc, UNIT_PATH), render_unit());
        assert_eq!(file(&doc, FIREWALL_UNIT_PATH), render_firewall_unit());
        assert_eq!(file(&doc, FIREWALL_PATH_PATH), render_firewall_path());
        assert!(render_unit().contains(&format!("ReadWritePaths={CONFIG_DIR}\n")), "the server can replace its config");
        assert_eq!(doc["runcmd"][2][2].as_str().unwrap(), render_install(&artifacts()).unwrap());
    }

    #[test]
    fn the_install_checks_the_digest_before_anything_runs_and_refuses_bad_artifacts() {
        let script = render_install(&artifacts()).unwrap();
        assert!(script.contains(&format!("  x86_64) url='https://example.test/v1/skyport-x86_64'; sum='{SUM}' ;;")));
        assert!(script.contains("  aarch64) url='http://10.1.2.3/skyport-aarch64'"));
        let check = script.find("sha256sum -c").unwrap();
        let install = script.find(&format!("mv -f {BINARY_PATH}.download {BINARY_PATH}")).unwrap();
        let enable = script.find(&format!("systemctl enable --now {UNIT_NAME}")).unwrap();
        assert!(script.starts_with("set -eu\n") && check < install && install < enable, "{script}");
        assert!(
            render_unit().contains(&format!("ExecStart={BINARY_PATH} tunnel server --config {SERVER_CONFIG_PATH}"))
        );

        assert_eq!(render_install(&[]), Err(UserDataError::NoArtifact));
        for bad in [
            Artifact { url: "https://x/'; reboot; '".into(), ..artifacts()[0].clone() },
            Artifact { url: "ftp://x/skyport".into(), ..artifacts()[0].clone() },
            Artifact { sha256: "00".into(), ..artifacts()[0].clone() },
            Artifact { arch: "x86_64) echo".into(), ..artifacts()[0].clone() },
        ] {
            assert!(matches!(render_install(&[bad]), Err(UserDataError::InvalidArtifact(_))));
        }
    }

    #[test]
    fn exactly_the_given_ports_are_bound_and_opened() {
        let doc = parse(&render_cloud_config(&sample(), &artifacts()).unwrap());
        let toml = file(&doc, SERVER_CONFIG_PATH);
        let mut bound: Vec<&str> = toml.lines().filter_map(|l| l.strip_prefix("bind_addr = \"0.0.0.0:")).collect();
        bound.sort();
        assert_eq!(bound, ["2333\"", "443\"", "53\"", "80\""]);
        assert!(toml.contains("type = \"udp\"\ntoken = \"tok-dns-53"));

        let nft = file(&doc, NFTABLES_PATH);
        let rule = |proto: &str| {
            nft.lines().find_map(|l| l.trim().strip_prefix(&format!("{proto} dport {{ "))?.strip_suffix(" } accept"))
        };
        assert_eq!(rule("tcp"), Some("80, 443, 2333, 2335"), "the Service's, control and push ports");
        assert_eq!(rule("udp"), Some("53"));
        assert!(nft.contains("policy drop"));
        assert_eq!(nft.matches("dport").count(), 2, "no other port is opened");

        let tcp_only = ExitServer { services: vec![service("a", Protocol::Tcp, 8080, "t")], ..sample() };
        let nft = render_nftables(&tcp_only);
        assert!(nft.contains("tcp dport { 2333, 2335, 8080 } accept") && !nft.contains("udp dport"));
    }

    #[test]
    fn secrets_appear_only_in_the_server_config() {
        let server = sample();
        let out = render_cloud_config(&server, &artifacts()).unwrap();
        let doc = parse(&out);
        let config_index =
            doc["write_files"].as_array().unwrap().iter().position(|f| f["path"] == SERVER_CONFIG_PATH).unwrap();
        let allowed = ["write_files".to_string(), config_index.to_string(), "content".to_string()];
        // As they appear in the TOML (quotes and backslashes escaped).
        let secrets: Vec<String> = server
            .services
            .iter()
            .map(|s| s.token.as_str())
            .chain([server.noise_private_key.as_str()])
            .map(|s| toml_string(s).trim_matches('"').to_string())
            .collect();
        let mut seen = 0;
        walk(&doc, &mut Vec::new(), &mut |path, s| {
            for secret in &secrets {
                if s.contains(secret.as_str()) {
                    assert_eq!(path, allowed, "secret found outside server.toml");
                    seen += 1;
                }
            }
        });
        assert_eq!(seen, secrets.len());
        // In the raw text, too: each secret exactly once.
        for secret in &secrets {
            assert_eq!(out.matches(secret.as_str()).count(), 1, "{secret}");
        }
        assert!(!format!("{server:?}").contains("tok-") && !format!("{server:?}").contains(KEY));
    }

    #[test]
    fn rendering_is_deterministic_and_independent_of_service_order() {
        let a = render_cloud_config(&sample(), &artifacts()).unwrap();
        assert_eq!(a, render_cloud_config(&sample(), &artifacts()).unwrap());
        let mut reversed = sample();
        reversed.services.reverse();
        assert_eq!(a, render_cloud_config(&reversed, &artifacts()).unwrap());
    }

    #[test]
    fn bad_input_is_refused_without_revealing_secrets() {
        let mut s = sample();
        s.services.push(service("dup", Protocol::Tcp, 80, "tok-dup-secret"));
        let e = render_cloud_config(&s, &artifacts()).unwrap_err();
        assert!(matches!(e, UserDataError::DuplicatePort { port: 80, .. }), "{e}");
        assert!(!e.to_string().contains("tok-"));

        let mut s = sample();
        s.services.push(service("ctl", Protocol::Tcp, DEFAULT_CONTROL_PORT, "t"));
        assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::DuplicatePort { .. })));
        // The same number over UDP is a different port.
        let mut s = sample();
        s.services.push(service("ctl-udp", Protocol::Udp, DEFAULT_CONTROL_PORT, "t"));
        assert!(render_cloud_config(&s, &artifacts()).is_ok());

        let mut s = sample();
        s.services[0].name = "bad name]".into();
        assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::InvalidName(_))));
        let mut s = sample();
        s.services[1].name = s.services[0].name.clone();
        assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::DuplicateName(_))));
        let mut s = sample();
        s.services[0].token.clear();
        assert!(matches!(render_cloud_config(&s, &artifacts()), Err(UserDataError::EmptyToken(_))));
        let s = ExitServer { noise_private_key: "not base64!".into(), ..sample() };
        assert_eq!(render_cloud_config(&s, &artifacts()), Err(UserDataError::InvalidKey));
    }

    #[test]
    fn noise_keys_match_what_rathole_genkey_prints() {
        // `rathole --genkey` (0.5.0) printed this pair on this machine.
        let pair = NoiseKeypair::from_private(GENKEY_PRIVATE).unwrap();
        assert_eq!(pair.public_key, GENKEY_PUBLIC);
        assert_eq!(pair.private_key, GENKEY_PRIVATE);
        // A second pair from a later run, so the fixture is not a lucky match.
        let second = NoiseKeypair::from_private("ljQqivQjyn4K6qv2SSldOpHeLToaIIzXNB+C6GYVXvY=").unwrap();
        assert_eq!(second.public_key, "zhugQPoNYvapZkTPN1CRqHtU4pUve+MFTEKPwgmS91I=");
        let fresh = NoiseKeypair::generate();
        assert_ne!(fresh.private_key, NoiseKeypair::generate().private_key);
        assert_eq!(NoiseKeypair::from_private(&fresh.private_key).unwrap(), fresh);
        assert!(!format!("{fresh:?}").contains(&fresh.private_key));
        assert_eq!(NoiseKeypair::from_private("c2hvcnQ="), Err(UserDataError::InvalidKey));
    }

    #[test]
    fn the_client_config_is_sorted_escaped_and_validated() {
        let service = |name: &str, protocol| ClientService {
            name: name.into(),
            protocol,
            token: "t\"ok".into(),
            local_addr: "10.0.0.7:80".into(),
        };
        let client = TunnelClient {
            remote_addr: "203.0.113.9:2333".into(),
            server_public_key: GENKEY_PUBLIC.into(),
            services: vec![service("udp-53", Protocol::Udp), service("tcp-80", Protocol::Tcp)],
        };
        let toml = render_client_toml(&client).unwrap();
        assert!(
            toml.find("[client.services.\"tcp-80\"]").unwrap() < toml.find("[client.services.\"udp-53\"]").unwrap()
        );
        assert!(toml.contains("remote_addr = \"203.0.113.9:2333\""));
        assert!(toml.contains(&format!("remote_public_key = \"{GENKEY_PUBLIC}\"")));
        assert!(toml.contains("token = \"t\\\"ok\""), "{toml}");
        assert!(toml.contains("type = \"udp\""));
        assert_eq!(toml, render_client_toml(&client).unwrap());
        let mut twice = client.clone();
        twice.services.push(service("tcp-80", Protocol::Tcp));
        assert_eq!(render_client_toml(&twice), Err(UserDataError::DuplicateName("tcp-80".into())));
        let mut no_key = client.clone();
        no_key.server_public_key = String::new();
        assert_eq!(render_client_toml(&no_key), Err(UserDataError::InvalidKey));
        assert!(!format!("{:?}", client.services[0]).contains("t\"ok"));
    }

    #[test]
    fn the_local_server_config_binds_one_address() {
        let server = ExitServer {
            control_port: 2333,
            noise_private_key: GENKEY_PRIVATE.into(),
            services: vec![TunnelService {
                name: "tcp-80".into(),
                protocol: Protocol::Tcp,
                port: 80,
                token: "t".into(),
            }],
        };
        let toml = render_server_toml_on(&server, "127.77.0.3").unwrap();
        assert!(toml.contains("bind_addr = \"127.77.0.3:2333\"") && toml.contains("bind_addr = \"127.77.0.3:80\""));
        assert!(render_server_toml(&server).unwrap().contains("bind_addr = \"0.0.0.0:80\""));
    }

    #[test]
    fn many_services_still_fit_the_smallest_user_data_limit() {
        // 100 ports with 64-character tokens: about 19 KiB, under Hetzner's 32 KiB.
        let services =
            (0..100).map(|i| service(&format!("ns.svc.{i}-tcp"), Protocol::Tcp, 10000 + i, &"t".repeat(64))).collect();
        let out = render_cloud_config(&ExitServer { services, ..sample() }, &artifacts()).unwrap();
        assert!(out.len() < crate::hetzner::MAX_USER_DATA, "{} bytes", out.len());
    }
}

//! `skyport tunnel firewall`: the exit server's nftables ruleset from the ports of its config,
//! so the firewall follows a config push (docs/exit-server.md, *Config push*).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::{Context as _, bail};
use providers::Protocol;
use providers::exit::userdata::Openings;
use tracing::info;

/// `skyport tunnel firewall`: the nftables ruleset opening exactly the ports of the server
/// config at `config` (its control port, `push_port` and its services, each service to its
/// `source_ranges` where it has any, on its bound address where it has one), written to `output`
/// through a rename. Runs as root on the VM after each push; only port numbers, parsed addresses
/// and parsed networks are taken from the file, so whatever the unprivileged server wrote can
/// only open ports, never add other rules.
pub async fn firewall(config: &Path, output: &Path, push_port: u16) -> anyhow::Result<()> {
    let text = tokio::fs::read_to_string(config).await.with_context(|| format!("reading {}", config.display()))?;
    let openings =
        openings(&text, push_port).with_context(|| format!("reading the tunnel configuration {}", config.display()))?;
    let rules = providers::exit::userdata::render_nftables_openings(&openings);
    super::options::replace_private(output, rules.as_bytes())
        .with_context(|| format!("writing {}", output.display()))?;
    let (open, restricted) = (&openings.open, openings.restricted.keys().collect::<Vec<_>>());
    info!(output = %output.display(), ?open, ?restricted, "rendered the exit server's firewall");
    Ok(())
}

/// Who may reach which port by the server config `text`: rathole's part read for ports and
/// bound addresses (without writing anything beside it), the `[skyport]` table for source ranges.
fn openings(text: &str, push_port: u16) -> anyhow::Result<Openings> {
    let document = super::options::split(text)?;
    let parsed = document.parsed()?;
    let server = parsed.server.as_ref().context("not a tunnel server configuration")?;
    let mut openings = Openings::default();
    // The control port is open on every address, as the user data opens it.
    openings.add(Protocol::Tcp, None, socket(&server.bind_addr)?.port(), []);
    if push_port != 0 {
        openings.add(Protocol::Tcp, None, push_port, []);
    }
    for (name, service) in &server.services {
        // rathole's service type is not exported by name; its serialized form is.
        let kind = serde_json::to_value(service.service_type).ok().and_then(|v| v.as_str().map(str::to_owned));
        let protocol = if kind.as_deref() == Some("udp") { Protocol::Udp } else { Protocol::Tcp };
        let sources = document.ranges.get(name).cloned().unwrap_or_default();
        let (address, port) = destination(&service.bind_addr)?;
        openings.add(protocol, address, port, sources);
    }
    Ok(openings)
}

/// The address and port a `bind_addr` listens on: `None` for every address (`0.0.0.0`, `[::]`),
/// the IPv4 address a service is bound to otherwise. skyport binds services to IPv4 addresses
/// only, so a specific IPv6 one is refused rather than read as "every address", which would
/// open the port wider than the file says.
pub(super) fn destination(bind_addr: &str) -> anyhow::Result<(Option<Ipv4Addr>, u16)> {
    let parsed = socket(bind_addr)?;
    match parsed.ip() {
        ip if ip.is_unspecified() => Ok((None, parsed.port())),
        IpAddr::V4(ip) => Ok((Some(ip), parsed.port())),
        IpAddr::V6(_) => bail!("bind_addr {bind_addr:?}: a service is bound to an IPv4 address or to every address"),
    }
}

fn socket(bind_addr: &str) -> anyhow::Result<SocketAddr> {
    bind_addr.parse().with_context(|| format!("bind_addr {bind_addr:?} is not ip:port"))
}

#[cfg(test)]
mod tests {
    use providers::exit::userdata::render_server_toml;
    use providers::{ExitServer, Protocol, TunnelService};

    use super::*;

    #[tokio::test]
    async fn the_ruleset_opens_exactly_the_configs_ports_and_the_push_port() {
        let dir = std::env::temp_dir().join(format!("skyport-firewall-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let service = |name: &str, protocol, port| TunnelService {
            name: name.into(),
            protocol,
            port,
            token: "t".into(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
            bind: None,
        };
        let server = ExitServer {
            control_port: 2333,
            noise_private_key: "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=".into(),
            services: vec![service("tcp-9090", Protocol::Tcp, 9090), service("udp-53", Protocol::Udp, 53)],
        };
        let config = dir.join("server.toml");
        std::fs::write(&config, render_server_toml(&server).unwrap()).unwrap();
        let output = dir.join("nftables.conf");
        firewall(&config, &output, 2335).await.unwrap();
        let rules = std::fs::read_to_string(&output).unwrap();
        assert!(rules.contains("tcp dport { 2333, 2335, 9090 } accept"), "{rules}");
        assert!(rules.contains("udp dport { 53 } accept"), "{rules}");
        assert_eq!(
            rules,
            providers::exit::userdata::render_nftables(&server),
            "the same ruleset the user data starts with"
        );

        // A config that does not parse leaves the ruleset as it was.
        std::fs::write(&config, "[server\nbind_addr = 1").unwrap();
        assert!(firewall(&config, &output, 2335).await.is_err());
        assert_eq!(std::fs::read_to_string(&output).unwrap(), rules);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_pushed_config_with_source_ranges_opens_that_port_to_them_only() {
        let dir = std::env::temp_dir().join(format!("skyport-firewall-ranges-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let service = |name: &str, port, ranges: &[&str]| TunnelService {
            name: name.into(),
            protocol: Protocol::Tcp,
            port,
            token: "t".into(),
            source_ranges: ranges.iter().map(|r| r.to_string()).collect(),
            proxy_protocol: None,
            bind: None,
        };
        let server = ExitServer {
            control_port: 2333,
            noise_private_key: "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=".into(),
            services: vec![
                service("tcp-443", 443, &["198.51.100.0/24", "2001:db8::/32"]),
                service("health", 2334, &[]),
            ],
        };
        let config = dir.join("server.toml");
        std::fs::write(&config, render_server_toml(&server).unwrap()).unwrap();
        let output = dir.join("nftables.conf");
        firewall(&config, &output, 2335).await.unwrap();
        let rules = std::fs::read_to_string(&output).unwrap();
        assert!(rules.contains("tcp dport { 2333, 2334, 2335 } accept"), "443 is not open to anyone: {rules}");
        assert!(rules.contains("ip saddr 198.51.100.0/24 tcp dport 443 accept"), "{rules}");
        assert!(rules.contains("ip6 saddr 2001:db8::/32 tcp dport 443 accept"), "{rules}");
        assert_eq!(rules, providers::exit::userdata::render_nftables(&server), "as the user data starts");

        // A config whose ranges were tampered with is refused: the ruleset stays as it was.
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, text.replace("198.51.100.0/24", "0.0.0.0/0 accept; tcp dport 22")).unwrap();
        assert!(firewall(&config, &output, 2335).await.is_err());
        assert_eq!(std::fs::read_to_string(&output).unwrap(), rules);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Pool members on one port, each bound to its own address: the pushed config renders what
    /// the user data starts with, each member's rule naming its address.
    #[tokio::test]
    async fn bound_services_are_opened_on_their_own_addresses() {
        let dir = std::env::temp_dir().join(format!("skyport-firewall-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let member = |name: &str, address: [u8; 4], ranges: &[&str]| TunnelService {
            name: name.into(),
            protocol: Protocol::Tcp,
            port: 443,
            token: "t".into(),
            source_ranges: ranges.iter().map(|r| r.to_string()).collect(),
            proxy_protocol: None,
            bind: Some(address.into()),
        };
        let server = ExitServer {
            control_port: 2333,
            noise_private_key: "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=".into(),
            services: vec![
                member("a.https", [198, 51, 100, 1], &["192.0.2.0/24"]),
                member("b.https", [198, 51, 100, 2], &[]),
            ],
        };
        let config = dir.join("server.toml");
        std::fs::write(&config, render_server_toml(&server).unwrap()).unwrap();
        let output = dir.join("nftables.conf");
        firewall(&config, &output, 2335).await.unwrap();
        let rules = std::fs::read_to_string(&output).unwrap();
        assert!(rules.contains("    tcp dport { 2333, 2335 } accept\n"), "443 is open on no address: {rules}");
        assert!(rules.contains("    ip daddr 198.51.100.2 tcp dport { 443 } accept\n"), "{rules}");
        assert!(rules.contains("    ip daddr 198.51.100.1 ip saddr 192.0.2.0/24 tcp dport 443 accept\n"), "{rules}");
        assert_eq!(rules, providers::exit::userdata::render_nftables(&server), "as the user data starts");

        // A service bound to one IPv6 address is refused, not opened on every address.
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, text.replace("198.51.100.2:443", "[2001:db8::2]:443")).unwrap();
        assert!(firewall(&config, &output, 2335).await.is_err());
        assert_eq!(std::fs::read_to_string(&output).unwrap(), rules);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

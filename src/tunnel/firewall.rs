//! `skyport tunnel firewall`: the exit server's nftables ruleset from the ports of its config,
//! so the firewall follows a config push (docs/exit-server.md, *Config push*).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context as _;
use tracing::info;

/// `skyport tunnel firewall`: the nftables ruleset opening exactly the ports of the server
/// config at `config` (its control port, `push_port` and its services), written to `output`
/// through a rename. Runs as root on the VM after each push; only port numbers are taken from
/// the file, so whatever the unprivileged server wrote can only open ports.
pub async fn firewall(config: &Path, output: &Path, push_port: u16) -> anyhow::Result<()> {
    // Ports only: rathole's part of the document, read without writing anything beside it.
    let text = tokio::fs::read_to_string(config).await.with_context(|| format!("reading {}", config.display()))?;
    let parsed = super::options::split(&text)
        .and_then(|document| document.parsed())
        .with_context(|| format!("reading the tunnel configuration {}", config.display()))?;
    let server = parsed.server.as_ref().context("not a tunnel server configuration")?;
    let port = |addr: &str| -> anyhow::Result<u16> {
        let parsed: SocketAddr = addr.parse().with_context(|| format!("bind_addr {addr:?} is not ip:port"))?;
        Ok(parsed.port())
    };
    let mut tcp = BTreeSet::from([port(&server.bind_addr)?]);
    if push_port != 0 {
        tcp.insert(push_port);
    }
    let mut udp = BTreeSet::new();
    for service in server.services.values() {
        // rathole's service type is not exported by name; its serialized form is.
        let udp_service = serde_json::to_value(service.service_type).ok().and_then(|v| v.as_str().map(str::to_owned));
        match udp_service.as_deref() {
            Some("udp") => udp.insert(port(&service.bind_addr)?),
            _ => tcp.insert(port(&service.bind_addr)?),
        };
    }
    let rules = providers::exit::userdata::render_nftables_ports(&tcp, &udp);
    let mut staged = output.as_os_str().to_owned();
    staged.push(".skyport-tmp");
    std::fs::write(&staged, rules).with_context(|| format!("writing {}", output.display()))?;
    std::fs::rename(&staged, output).with_context(|| format!("replacing {}", output.display()))?;
    info!(output = %output.display(), ?tcp, ?udp, "rendered the exit server's firewall");
    Ok(())
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
}

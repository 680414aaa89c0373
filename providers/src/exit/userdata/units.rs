//! The systemd units the user data installs: the tunnel server, and the root oneshot that
//! follows its config (the firewall, the bound addresses); and the kernel setting that lets a
//! service bind its address before that oneshot puts it on the interface.

use super::{
    ADDRESSES_UNIT_NAME, BINARY_PATH, CONFIG_DIR, FIREWALL_UNIT_NAME, NFTABLES_PATH, RATHOLE_VERSION,
    SERVER_CONFIG_PATH, SERVICE_USER, UNIT_NAME,
};

/// The systemd unit running the tunnel server.
pub fn render_unit() -> String {
    format!(
        "[Unit]\n\
         Description=skyport exit server (tunnel server, rathole {RATHOLE_VERSION})\n\
         After=network-online.target nftables.service\n\
         Requires=nftables.service\n\
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

/// The oneshot unit that makes the VM follow the server config as root: the firewall admits
/// exactly its ports (see [`super::render_nftables_openings`]; the ruleset file is rewritten
/// too, so a reboot loads the same), and the addresses its services are bound to are on the
/// public interface (`skyport tunnel addresses`). Started by [`render_firewall_path`] on each
/// push, and at every boot before the tunnel server: the addresses are gone after a reboot. At
/// boot it waits for a highly available pair's moved address ([`ADDRESSES_UNIT_NAME`]), so an
/// address already there is seen as someone else's and never taken over.
pub fn render_firewall_unit() -> String {
    format!(
        "[Unit]\n\
         Description=skyport exit server: follow the tunnel's config as root (firewall, bound addresses)\n\
         After=nftables.service network-online.target {ADDRESSES_UNIT_NAME}\n\
         Wants=network-online.target\n\
         Before={UNIT_NAME}\n\
         \n\
         [Service]\n\
         Type=oneshot\n\
         ExecStart={BINARY_PATH} tunnel firewall --config {SERVER_CONFIG_PATH} --output {NFTABLES_PATH}\n\
         ExecStart=/usr/sbin/nft -f {NFTABLES_PATH}\n\
         ExecStart={BINARY_PATH} tunnel addresses --config {SERVER_CONFIG_PATH}\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// The path unit starting [`render_firewall_unit`] when the server config is replaced.
pub fn render_firewall_path() -> String {
    format!(
        "[Unit]\n\
         Description=skyport exit server: follow each pushed tunnel config (firewall, bound addresses)\n\
         \n\
         [Path]\n\
         PathChanged={SERVER_CONFIG_PATH}\n\
         Unit={FIREWALL_UNIT_NAME}\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// The unit following the config puts the bound addresses on the interface once the firewall
    /// admits exactly the config's ports, and runs at every boot before the server.
    #[test]
    fn the_config_is_followed_as_root_after_each_push_and_at_every_boot() {
        let unit = render_firewall_unit();
        let starts: Vec<&str> = unit.lines().filter_map(|l| l.strip_prefix("ExecStart=")).collect();
        assert_eq!(
            starts,
            [
                "/usr/local/bin/skyport tunnel firewall --config /etc/skyport/server.toml --output /etc/nftables.conf",
                "/usr/sbin/nft -f /etc/nftables.conf",
                "/usr/local/bin/skyport tunnel addresses --config /etc/skyport/server.toml",
            ]
        );
        assert!(!unit.contains("User="), "root's: {unit}");
        assert!(unit.contains(&format!("Before={UNIT_NAME}\n")) && unit.ends_with("WantedBy=multi-user.target\n"));
    }

    /// The install script runs the unit following the config once the binary is in place,
    /// before the server starts.
    #[test]
    fn the_config_unit_runs_before_the_server() {
        let artifacts = [Artifact { arch: "x86_64".into(), url: "https://x/skyport".into(), sha256: "ab".repeat(32) }];
        let script = render_install(&artifacts, DEFAULT_CONTROL_PORT).unwrap();
        let at = |line: &str| script.find(line).unwrap_or_else(|| panic!("no {line:?} in {script}"));
        let installed = at(&format!("mv -f {BINARY_PATH}.download {BINARY_PATH}\n"));
        let follow = at(&format!("systemctl enable --now {FIREWALL_UNIT_NAME}\n"));
        let server = at(&format!("systemctl enable --now {UNIT_NAME}\n"));
        assert!(installed < follow && follow < server, "{script}");
    }
}

//! The systemd units the user data installs: the tunnel server, and the firewall that follows
//! the ports of a pushed config.

use super::{
    BINARY_PATH, CONFIG_DIR, FIREWALL_UNIT_NAME, NFTABLES_PATH, RATHOLE_VERSION, SERVER_CONFIG_PATH, SERVICE_USER,
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

/// The oneshot unit that makes the firewall follow the server config's ports (see
/// [`super::render_nftables_openings`]); the ruleset file is rewritten too, so a reboot loads the same.
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

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use providers::exit::userdata::render_server_toml;
use providers::{ExitServer, Protocol, TunnelService};

use super::*;

/// A stand-in for `ip`: records each call in `calls` and keeps the host's addresses in `addrs`
/// (as `ip -4 -o addr show` prints them), so runs see what earlier ones did.
const STUB: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo "$*" >> "$d/calls"
case "$*" in
  "-4 route show default") echo "default via 192.0.2.1 dev eth0 proto static" ;;
  "-4 -o addr show") cat "$d/addrs" ;;
  "addr replace "*) echo "2: $5    inet $3 scope global $5" >> "$d/addrs" ;;
  "addr del "*) grep -vF "inet $3 " "$d/addrs" > "$d/addrs.new"; mv "$d/addrs.new" "$d/addrs" ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"#;

/// The host's own address and a highly available pair's moved address, which are not ours.
const HOST: &str = "2: eth0    inet 192.0.2.10/24 brd 192.0.2.255 scope global eth0\n\
                    2: eth0    inet 203.0.113.7/32 scope global eth0\n";

struct Host {
    dir: PathBuf,
}

impl Host {
    fn new() -> Host {
        let dir = std::env::temp_dir().join(format!("skyport-addresses-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ip"), STUB).unwrap();
        std::fs::set_permissions(dir.join("ip"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("addrs"), HOST).unwrap();
        Host { dir }
    }

    /// Runs with a config binding one service to each of `bound`, beside an unbound one; the
    /// `ip` calls it made.
    fn run(&self, bound: &[[u8; 4]]) -> anyhow::Result<Vec<String>> {
        let service = |name: String, port, bind| TunnelService {
            name,
            protocol: Protocol::Tcp,
            port,
            token: "t".into(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
            bind,
        };
        let members = bound.iter().enumerate().map(|(i, a)| service(format!("m{i}.https"), 443, Some((*a).into())));
        let server = ExitServer {
            control_port: 2333,
            noise_private_key: "wCR3TomqL60P4MLphr9nSLR+tS5cgq7pccADVo2zaaQ=".into(),
            services: members.chain([service("health".into(), 2334, None)]).collect(),
        };
        std::fs::write(self.config(), render_server_toml(&server).unwrap()).unwrap();
        self.follow()
    }

    fn follow(&self) -> anyhow::Result<Vec<String>> {
        let _ = std::fs::remove_file(self.dir.join("calls"));
        let ip = self.dir.join("ip");
        let result = follow(&self.config(), &self.state(), ip.to_str().unwrap());
        let calls = std::fs::read_to_string(self.dir.join("calls")).unwrap_or_default();
        result.map(|()| calls.lines().filter(|c| c.starts_with("addr ")).map(str::to_string).collect())
    }

    fn config(&self) -> PathBuf {
        self.dir.join("server.toml")
    }

    fn state(&self) -> PathBuf {
        self.dir.join("run").join("bound-addresses")
    }

    fn recorded(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.state()).unwrap();
        text.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn bound_addresses_follow_the_config_and_only_those_put_there_are_removed() {
    let host = Host::new();
    // The moved address is bound too, but was on the host already: it is not ours.
    let calls = host.run(&[[198, 51, 100, 1], [198, 51, 100, 2], [203, 0, 113, 7]]).unwrap();
    assert_eq!(calls, ["addr replace 198.51.100.1/32 dev eth0", "addr replace 198.51.100.2/32 dev eth0"]);
    assert_eq!(host.recorded(), ["198.51.100.1 eth0", "198.51.100.2 eth0"]);
    let mode = std::fs::metadata(host.state()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "root's only");

    // Only b stays bound: a goes, b stays as it is, and the moved address is never removed.
    let calls = host.run(&[[198, 51, 100, 2]]).unwrap();
    assert_eq!(calls, ["addr del 198.51.100.1/32 dev eth0"]);
    assert_eq!(host.recorded(), ["198.51.100.2 eth0"]);
    let addrs = std::fs::read_to_string(host.dir.join("addrs")).unwrap();
    assert!(addrs.contains("inet 203.0.113.7/32") && addrs.contains("inet 192.0.2.10/24"), "{addrs}");
    assert!(addrs.contains("inet 198.51.100.2/32") && !addrs.contains("198.51.100.1"), "{addrs}");

    // A config that does not parse changes nothing.
    std::fs::write(host.config(), "[server\nbind_addr = 1").unwrap();
    assert!(host.follow().is_err());
    assert_eq!(host.recorded(), ["198.51.100.2 eth0"]);

    // Nothing bound: b goes, and the state is empty.
    assert_eq!(host.run(&[]).unwrap(), ["addr del 198.51.100.2/32 dev eth0"]);
    assert!(host.recorded().is_empty());
}

#[test]
fn an_address_that_is_not_a_public_unicast_one_is_never_put_on_the_interface() {
    let host = Host::new();
    let calls = host.run(&[[127, 0, 0, 5], [169, 254, 0, 9], [224, 0, 0, 1], [255, 255, 255, 255]]).unwrap();
    assert!(calls.is_empty(), "{calls:?}");
    // Nothing to do: not even the interface is looked up, and no state is written.
    assert!(!host.state().exists());
}

#[test]
fn a_recorded_address_removed_behind_its_back_is_put_back() {
    let host = Host::new();
    host.run(&[[198, 51, 100, 1]]).unwrap();
    std::fs::write(host.dir.join("addrs"), HOST).unwrap();
    assert_eq!(host.run(&[[198, 51, 100, 1]]).unwrap(), ["addr replace 198.51.100.1/32 dev eth0"]);
    assert_eq!(host.recorded(), ["198.51.100.1 eth0"]);
}

#[test]
fn the_interface_is_the_default_routes_or_the_first_one_up() {
    let route = "default via 172.31.0.1 dev ens5 proto dhcp src 172.31.5.10 metric 100\n";
    assert_eq!(route_dev(route).as_deref(), Some("ens5"));
    assert_eq!(route_dev(""), None);
    let links = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n\
                 2: host0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\n";
    assert_eq!(first_up(links).as_deref(), Some("host0"));
    assert_eq!(first_up("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536\n"), None);
    let addrs = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n\
                 2: eth0    inet 192.0.2.10/24 brd 192.0.2.255 scope global eth0\n";
    let parsed: Vec<Ipv4Addr> = inet_addresses(addrs).into_iter().collect();
    assert_eq!(parsed, [Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(192, 0, 2, 10)]);
}

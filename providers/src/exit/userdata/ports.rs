//! Which ports of an exit server its services take, so two never take the same one.

use std::collections::BTreeSet;

use super::{PUSH_PORT, Protocol, TunnelService};

/// The ports a server's services take. A port on every address (the control and push ports, a
/// service without `bind`) clashes with the same port anywhere; a service bound to one address
/// clashes only there, so members of a pool with an address each may share port numbers.
pub(super) struct Ports {
    everywhere: BTreeSet<(Protocol, u16)>,
    bound: BTreeSet<(std::net::Ipv4Addr, Protocol, u16)>,
}

impl Ports {
    pub(super) fn new(control_port: u16) -> Self {
        let everywhere = BTreeSet::from([(Protocol::Tcp, control_port), (Protocol::Tcp, PUSH_PORT)]);
        Ports { everywhere, bound: BTreeSet::new() }
    }

    /// Takes `service`'s port; false if it clashes.
    pub(super) fn insert(&mut self, service: &TunnelService) -> bool {
        let port = (service.protocol, service.port);
        if self.everywhere.contains(&port) {
            return false;
        }
        match service.bind {
            Some(ip) => self.bound.insert((ip, port.0, port.1)),
            None => {
                let on_some_address = self.bound.iter().any(|(_, protocol, n)| (*protocol, *n) == port);
                !on_some_address && self.everywhere.insert(port)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{sample, service};
    use super::super::*;

    /// Members of a pool with an address each (`bind`) may use the same port number; a port on every
    /// address still clashes with it anywhere, and each binds where it is told.
    #[test]
    fn services_bound_to_their_own_addresses_share_port_numbers() {
        let bound = |name: &str, ip: [u8; 4]| TunnelService {
            bind: Some(ip.into()),
            ..service(name, Protocol::Tcp, 8080, "t")
        };
        let mut s = sample();
        s.services.extend([bound("a.http", [198, 51, 100, 1]), bound("b.http", [198, 51, 100, 2])]);
        let toml = render_server_toml_on(&s, "192.0.2.7").unwrap();
        assert!(toml.contains("bind_addr = \"198.51.100.1:8080\""), "{toml}");
        assert!(toml.contains("bind_addr = \"198.51.100.2:8080\""), "{toml}");
        assert!(
            toml.contains("bind_addr = \"192.0.2.7:80\""),
            "an unbound service stays on the server's address: {toml}"
        );

        let mut twice = s.clone();
        twice.services.push(bound("c.http", [198, 51, 100, 2]));
        assert!(matches!(twice.validated(), Err(UserDataError::DuplicatePort { port: 8080, .. })));
        // A port on every address clashes with a bound one, and the control port with anything.
        let on_control_port = TunnelService { port: DEFAULT_CONTROL_PORT, ..bound("ctl", [198, 51, 100, 3]) };
        for extra in [service("d.http", Protocol::Tcp, 8080, "t"), on_control_port] {
            let mut clash = s.clone();
            clash.services.push(extra);
            assert!(matches!(clash.validated(), Err(UserDataError::DuplicatePort { .. })), "{:?}", clash.services);
        }
        // In either order: an unbound service first, then a bound one on its port.
        let mut s = sample();
        s.services.push(bound("e.web", [198, 51, 100, 4]));
        s.services[3].port = 80;
        assert!(matches!(s.validated(), Err(UserDataError::DuplicatePort { port: 80, .. })));
    }
}

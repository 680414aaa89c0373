//! The exit server's service ports, checked before they are promised. rathole binds a service's
//! port only once a client connects for it, and a port it cannot bind (taken, or below 1024
//! without the right) is retried in the background while every other service, the health
//! check's included, works: the operator would see a passing check and call the Tunnel Ready
//! with a port that carries nothing. So the server binds each port once before it starts, and
//! before it takes a push that adds ports, and refuses what it cannot serve.

use std::collections::BTreeSet;

/// (type, address) of each service of a server config: `("tcp", "0.0.0.0:80")`.
pub type Ports = BTreeSet<(String, String)>;

/// The services of `config` this process cannot listen on, each as
/// `<name> (<type> <address>): <error>`; those in `skip` (already held) are not tried.
pub fn unbindable(config: &rathole::Config, skip: &Ports) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, (kind, address)) in services(config) {
        if skip.contains(&(kind.clone(), address.clone())) {
            continue;
        }
        if let Err(e) = probe(&kind, &address) {
            problems.push(format!("{name} ({kind} {address}): {e}"));
        }
    }
    problems.sort();
    problems
}

/// Binds `address` once as rathole would (TCP listening, with `SO_REUSEADDR` as tokio sets it).
/// A service bound to an address of its own (a pool member's) may be probed before the VM's root
/// unit puts that address on the interface, which follows the config this server is about to
/// write: `IP_FREEBIND` lets that bind succeed while a port taken on it still fails, and rathole
/// retries its own bind until the address is there.
fn probe(kind: &str, address: &str) -> std::io::Result<()> {
    use socket2::{Domain, Protocol, Socket, Type};
    let at: std::net::SocketAddr =
        address.parse().map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not ip:port"))?;
    let (kind, protocol) = match kind {
        "udp" => (Type::DGRAM, Protocol::UDP),
        _ => (Type::STREAM, Protocol::TCP),
    };
    let socket = Socket::new(Domain::for_address(at), kind, Some(protocol))?;
    if kind == Type::STREAM {
        socket.set_reuse_address(true)?;
    }
    if !at.ip().is_unspecified() {
        match at {
            std::net::SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
            std::net::SocketAddr::V6(_) => socket.set_freebind_v6(true)?,
        }
    }
    socket.bind(&at.into())?;
    if kind == Type::STREAM {
        socket.listen(1)?;
    }
    Ok(())
}

/// What a running server with `config` already holds.
pub fn bound(config: &rathole::Config) -> Ports {
    services(config).into_iter().map(|(_, port)| port).collect()
}

/// Each server service's name, type and address. The type is read through its serde name:
/// rathole does not export the enum.
fn services(config: &rathole::Config) -> Vec<(String, (String, String))> {
    let Some(server) = config.server.as_ref() else { return Vec::new() };
    server
        .services
        .iter()
        .map(|(name, s)| {
            let kind = serde_json::to_value(s.service_type).ok().and_then(|v| v.as_str().map(str::to_string));
            (name.clone(), (kind.unwrap_or_else(|| "tcp".into()), s.bind_addr.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn server(toml: &str) -> rathole::Config {
        let dir = std::env::temp_dir().join(format!("skyport-ports-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.toml");
        std::fs::write(&path, toml).unwrap();
        let parsed = rathole::Config::from_file(&path).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        parsed
    }

    #[tokio::test]
    async fn a_taken_port_is_named_and_a_free_or_already_held_one_is_not() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken_at = taken.local_addr().unwrap().to_string();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let config = server(&format!(
            "[server]\nbind_addr = \"127.0.0.1:0\"\n\
             [server.services.web]\ntype = \"tcp\"\ntoken = \"t\"\nbind_addr = \"{taken_at}\"\n\
             [server.services.dns]\ntype = \"udp\"\ntoken = \"t\"\nbind_addr = \"{free}\"\n"
        ))
        .await;
        let problems = unbindable(&config, &BTreeSet::new());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with(&format!("web (tcp {taken_at}): ")), "{problems:?}");
        // A port this server already serves (held by its own rathole) is not checked again.
        assert!(unbindable(&config, &bound(&config)).is_empty());
    }

    /// A pool member's own address is put on the interface only after the server took the push
    /// that binds it: an address no interface carries yet is no problem.
    #[tokio::test]
    async fn an_address_not_on_an_interface_yet_is_bindable() {
        let config = server(
            "[server]\nbind_addr = \"127.0.0.1:0\"\n\
             [server.services.web]\ntype = \"tcp\"\ntoken = \"t\"\nbind_addr = \"192.0.2.77:8080\"\n\
             [server.services.dns]\ntype = \"udp\"\ntoken = \"t\"\nbind_addr = \"192.0.2.77:5353\"\n",
        )
        .await;
        assert_eq!(unbindable(&config, &BTreeSet::new()), Vec::<String>::new());
    }
}

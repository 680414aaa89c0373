//! Both adapters push a port change to a real exit server, found at the address their fake
//! reports for the host. Needs root (a network namespace) and `SKYPORT_EXE`.

use std::time::Duration;

use providers::hosts::HostProvider;

use crate::contract::{UID, request};
use crate::fake_server::{Fake, Kind};
use crate::{POLLS_UNTIL_RUNNING, TOKEN, do_provider, hz_provider};

/// A real `skyport tunnel server` in a network namespace of its own (so it binds 0.0.0.0 as on a
/// VM, beside anything on this host), reachable at its veth address; removed on drop.
struct NamespacedServer {
    name: String,
    ip: String,
    dir: std::path::PathBuf,
    child: std::process::Child,
}

impl NamespacedServer {
    fn start(server: &providers::ExitServer) -> Result<Self, String> {
        let root = std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
        let exe = std::env::var_os("SKYPORT_EXE").map(std::path::PathBuf::from).ok_or("SKYPORT_EXE is not set")?;
        if !root {
            return Err("not running as root (network namespaces)".into());
        }
        let name = format!("skp{:06x}", rand::random::<u32>() & 0xffffff);
        let n: u32 = rand::random::<u32>() & 0x3fff;
        let base = u32::from(std::net::Ipv4Addr::new(10, 215, 0, 0)) + n * 4;
        let (host_ip, ip) = (std::net::Ipv4Addr::from(base + 1), std::net::Ipv4Addr::from(base + 2));
        let (host_if, peer_if) = (format!("{name}h"), format!("{name}g"));
        let (host_cidr, peer_cidr) = (format!("{host_ip}/30"), format!("{ip}/30"));
        for cmd in [
            vec!["ip", "netns", "add", &name],
            vec!["ip", "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if],
            vec!["ip", "link", "set", &peer_if, "netns", &name],
            vec!["ip", "addr", "add", &host_cidr, "dev", &host_if],
            vec!["ip", "link", "set", &host_if, "up"],
            vec!["ip", "-n", &name, "addr", "add", &peer_cidr, "dev", &peer_if],
            vec!["ip", "-n", &name, "link", "set", &peer_if, "up"],
            vec!["ip", "-n", &name, "link", "set", "lo", "up"],
        ] {
            let status = std::process::Command::new(cmd[0]).args(&cmd[1..]).status().map_err(|e| e.to_string())?;
            if !status.success() {
                return Err(format!("{} failed", cmd.join(" ")));
            }
        }
        let dir = std::env::temp_dir().join(format!("skyport-push-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("server.toml"), providers::exit::userdata::render_server_toml(server).unwrap())
            .unwrap();
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &name])
            .arg(exe)
            .args(["tunnel", "server", "--config"])
            .arg(dir.join("server.toml"))
            .stdout(std::fs::File::create(dir.join("server.log")).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        Ok(NamespacedServer { name, ip: ip.to_string(), dir, child })
    }
}

impl Drop for NamespacedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
        let _ = std::process::Command::new("ip").args(["link", "del", &format!("{}h", self.name)]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
#[ignore = "needs root (a network namespace) and SKYPORT_EXE, the skyport binary (tests/run.sh)"]
async fn digitalocean_and_hetzner_push_a_port_change_to_the_running_exit_server() {
    for kind in [Kind::DigitalOcean, Kind::Hetzner] {
        let mut request = request("skyport-push", UID);
        request.server.noise_private_key = providers::NoiseKeypair::generate().private_key;
        let server = match NamespacedServer::start(&request.server) {
            Ok(server) => server,
            Err(why) => {
                eprintln!("\n!!! SKIPPED the push test: {why}. CI runs it as root.\n");
                return;
            }
        };
        let (fake, base) = Fake::start(kind).await;
        fake.state().public_ip = Some(server.ip.clone());
        let provider: Box<dyn HostProvider> = match kind {
            Kind::DigitalOcean => Box::new(do_provider(&base, TOKEN, 200)),
            Kind::Hetzner => Box::new(hz_provider(&base, TOKEN, 200)),
        };
        let host = provider.create(&request).await.unwrap();
        let mut running = None;
        for _ in 0..=POLLS_UNTIL_RUNNING + 1 {
            running = provider.get(&host.id).await.unwrap().filter(|h| h.public_ipv4.is_some());
        }
        assert_eq!(running.unwrap().public_ipv4.as_deref(), Some(server.ip.as_str()));
        let push_port = format!("{}:{}", server.ip, providers::exit::push::PUSH_PORT);
        let mut listening = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(&push_port).await.is_ok() {
                listening = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(listening, "the exit server takes pushes on {push_port}");

        // A port added: pushed to the host's public address, applied by the real server.
        let mut changed = request.server.clone();
        changed.services.push(providers::TunnelService {
            name: "team-a.web.8443-tcp".into(),
            protocol: providers::Protocol::Tcp,
            port: 8443,
            token: "tok".into(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
            bind: None,
        });
        assert!(provider.reconfigure(&host.id, &changed).await.unwrap(), "{kind:?}");
        let applied = std::fs::read_to_string(server.dir.join("server.toml")).unwrap();
        assert_eq!(applied, providers::exit::userdata::render_server_toml(&changed).unwrap(), "{kind:?}");
        // Generations are milliseconds since the epoch at least, so they rise across hosts.
        let generation: u64 =
            std::fs::read_to_string(server.dir.join("server.toml.generation")).unwrap().parse().unwrap();
        assert!(generation >= providers::exit::push::now_generation() - 60_000, "{generation}");

        // Other credentials (the Secret was re-created): the push does not open on this host,
        // so it is reported as not reconfigurable, and nothing changes on it.
        let rekeyed = providers::ExitServer {
            noise_private_key: providers::NoiseKeypair::generate().private_key,
            ..changed.clone()
        };
        assert!(!provider.reconfigure(&host.id, &rekeyed).await.unwrap(), "{kind:?}");
        assert_eq!(std::fs::read_to_string(server.dir.join("server.toml")).unwrap(), applied);
    }
}

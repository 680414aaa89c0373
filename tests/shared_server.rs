//! One exit server carrying several tunnel clients, as a pool's shared server does: real
//! `skyport tunnel server` and `skyport tunnel client` processes on loopback addresses. Each client
//! has its own services and tokens; a client cannot claim another's service; and a configuration
//! rewrite that moves one client's port leaves the other's open connection up.

use crate::common;

use std::time::Duration;

use common::eventually;
use common::kubelet::skyport_exe;
use providers::Protocol;
use providers::exit::userdata::{
    ClientService, ExitServer, NoiseKeypair, TunnelClient, TunnelService, render_client_toml, render_server_toml_on,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port()
}

fn spawn(args: &[&str], config: &std::path::Path, log: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(skyport_exe())
        .args(args)
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// An echo backend that prefixes every answer with `tag`, so a test sees whose backend answered.
async fn backend(tag: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&[tag.as_bytes(), &buf[..n]].concat()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `line` on `conn` and reads the answer.
async fn ask(conn: &mut TcpStream, line: &str) -> Option<String> {
    conn.write_all(line.as_bytes()).await.ok()?;
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.ok()?.ok()?;
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n]).into_owned())
}

async fn answer(ip: &str, port: u16, line: &str) -> Option<String> {
    ask(&mut TcpStream::connect((ip, port)).await.ok()?, line).await
}

struct Member {
    name: &'static str,
    token: String,
    port: u16,
    backend: String,
}

impl Member {
    fn service(&self) -> String {
        format!("{}-tcp-{}", self.name, self.port)
    }

    fn server_side(&self) -> TunnelService {
        TunnelService {
            name: self.service(),
            protocol: Protocol::Tcp,
            port: self.port,
            token: self.token.clone(),
            source_ranges: Vec::new(),
            proxy_protocol: None,
        }
    }

    fn client(&self, remote_addr: &str, key: &str) -> TunnelClient {
        let service = ClientService {
            name: self.service(),
            protocol: Protocol::Tcp,
            token: self.token.clone(),
            local_addr: self.backend.clone(),
        };
        TunnelClient { remote_addr: remote_addr.into(), server_public_key: key.into(), services: vec![service] }
    }
}

fn write_by_rename(path: &std::path::Path, text: &str) {
    let staged = path.with_extension("tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_sharing_an_exit_server_carry_only_their_own_ports_and_a_port_move_keeps_the_others_connections() {
    let ip = format!("127.81.{}.{}", rand::random::<u8>(), 1 + rand::random::<u8>() % 250);
    let keys = NoiseKeypair::generate();
    let control = free_port(&ip);
    let dir = std::env::temp_dir().join(format!("skyport-shared-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = || format!("{:032x}", rand::random::<u128>());
    let a = Member { name: "a", token: token(), port: free_port(&ip), backend: backend("a:").await };
    let mut b = Member { name: "b", token: token(), port: free_port(&ip), backend: backend("b:").await };

    let server = |members: &[&Member]| ExitServer {
        control_port: control,
        noise_private_key: keys.private_key.clone(),
        services: members.iter().map(|m| m.server_side()).collect(),
    };
    let config = dir.join("server.toml");
    std::fs::write(&config, render_server_toml_on(&server(&[&a, &b]), &ip).unwrap()).unwrap();
    let _server = spawn(&["tunnel", "server", "--config"], &config, &dir.join("server.log"));
    let remote = format!("{ip}:{control}");
    let start_client = |m: &Member, file: &str| {
        let path = dir.join(file);
        std::fs::write(&path, render_client_toml(&m.client(&remote, &keys.public_key)).unwrap()).unwrap();
        spawn(&["tunnel", "client", "--config"], &path, &dir.join(format!("{file}.log")))
    };
    let _client_a = start_client(&a, "a.toml");
    let mut client_b = start_client(&b, "b.toml");

    let mut held = eventually("a's port through a's client", Duration::from_secs(30), || async {
        let mut conn = TcpStream::connect((ip.as_str(), a.port)).await.ok()?;
        (ask(&mut conn, "hello").await? == "a:hello").then_some(conn)
    })
    .await;
    eventually("b's port through b's client", Duration::from_secs(30), || async {
        (answer(&ip, b.port, "hi").await? == "b:hi").then_some(())
    })
    .await;

    // A client holding a's token cannot serve b's service: rathole checks each service's token.
    let thief = Member { name: "b", token: a.token.clone(), port: b.port, backend: backend("thief:").await };
    let _thief = start_client(&thief, "thief.toml");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..5 {
        assert_eq!(answer(&ip, b.port, "x").await.as_deref(), Some("b:x"), "b's traffic stays b's");
    }

    // b moves to another port: the server's file is replaced whole, b's client rolls.
    let old_port = b.port;
    b.port = free_port(&ip);
    write_by_rename(&config, &render_server_toml_on(&server(&[&a, &b]), &ip).unwrap());
    client_b.kill().await.unwrap();
    let _client_b = start_client(&b, "b2.toml");
    eventually("b's new port", Duration::from_secs(30), || async {
        (answer(&ip, b.port, "moved").await? == "b:moved").then_some(())
    })
    .await;
    eventually("b's old port closed", Duration::from_secs(30), || async {
        TcpStream::connect((ip.as_str(), old_port)).await.is_err().then_some(())
    })
    .await;
    // a's connection, open all along, still carries bytes.
    assert_eq!(ask(&mut held, "still").await.as_deref(), Some("a:still"), "a's open connection survived");

    // b leaves the server: a's connection still carries bytes.
    write_by_rename(&config, &render_server_toml_on(&server(&[&a]), &ip).unwrap());
    eventually("b's port closed", Duration::from_secs(30), || async {
        TcpStream::connect((ip.as_str(), b.port)).await.is_err().then_some(())
    })
    .await;
    assert_eq!(ask(&mut held, "after").await.as_deref(), Some("a:after"), "a's open connection survived b leaving");
    let _ = std::fs::remove_dir_all(&dir);
}

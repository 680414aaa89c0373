//! One exit server carrying several tunnel clients, as a pool's shared server does: real
//! `skyport tunnel server` and `skyport tunnel client` processes on loopback addresses. Each client
//! has its own services and tokens ([`skyport::controllers::pool::desired`]), its own health check,
//! and cannot claim another's service; a configuration rewrite that moves one client's port, or
//! drops that client, leaves the other's open connection up.

use crate::common;
use crate::health::{free_port, spawn};

use std::collections::BTreeMap;
use std::time::Duration;

use common::eventually;
use providers::exit::userdata::{ExitServer, render_client_toml, render_server_toml_on};
use skyport::controllers::pool::admit::Admission;
use skyport::controllers::pool::desired::{Binds, MemberClient, member_client, member_services, member_token};
use skyport::controllers::tunnel::desired::Credentials;
use skyport::crd::tunnel::TunnelPort;
use skyport::tunnel::{ProbeError, probe};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An echo backend on 127.0.0.1 that prefixes every answer with `tag`, so a test sees whose
/// backend answered; its port is the public port too, as a Service's port is on the exit server.
async fn backend(tag: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
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
    port
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

fn tcp(port: u16) -> TunnelPort {
    TunnelPort { port: i32::from(port), protocol: "TCP".into(), proxy_protocol: None }
}

fn carried(port: u16, health_port: u16) -> Admission {
    Admission::Carried { ports: vec![tcp(port)], health_port, refused: None }
}

fn write_by_rename(path: &std::path::Path, text: &str) {
    let staged = path.with_extension("tmp");
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_sharing_an_exit_server_carry_only_their_own_ports_and_a_port_move_keeps_the_others_connections() {
    let ip = format!("127.81.{}.{}", rand::random::<u8>(), 1 + rand::random::<u8>() % 250);
    let carrier = Credentials::generate();
    let control = free_port(&ip);
    let dir = std::env::temp_dir().join(format!("skyport-shared-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) =
        ("6f1c2a4e-0b7d-4c55-9a3e-2d8f7e1b9c01".to_string(), "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d".to_string());
    let (a_port, b_port) = (backend("a:").await, backend("b:").await);
    let (a_health, b_health) = (free_port(&ip), free_port(&ip));
    let mut members = BTreeMap::from([(a.clone(), carried(a_port, a_health)), (b.clone(), carried(b_port, b_health))]);

    let config = dir.join("server.toml");
    let render = |members: &BTreeMap<String, Admission>| {
        let services = member_services(&carrier, members, &BTreeMap::new(), Binds::Shared);
        let server =
            ExitServer { control_port: control, noise_private_key: carrier.keypair.private_key.clone(), services };
        render_server_toml_on(&server, &ip).unwrap()
    };
    std::fs::write(&config, render(&members)).unwrap();
    let _server = spawn(&["tunnel", "server", "--config"], &config, &dir.join("server.log"));
    let client = |uid: &str, token: &str, ports: &[TunnelPort], health_port: u16, file: &str| {
        let member = MemberClient {
            uid,
            ports,
            health_port,
            token,
            server_public_key: &carrier.keypair.public_key,
            remote_addr: format!("{ip}:{control}"),
            cluster_ip: "127.0.0.1",
        };
        let path = dir.join(file);
        std::fs::write(&path, render_client_toml(&member_client(&member)).unwrap()).unwrap();
        spawn(&["tunnel", "client", "--config"], &path, &dir.join(format!("{file}.log")))
    };
    let (a_token, b_token) = (member_token(&carrier, &a), member_token(&carrier, &b));
    let _client_a = client(&a, &a_token, &[tcp(a_port)], a_health, "a.toml");
    let mut client_b = client(&b, &b_token, &[tcp(b_port)], b_health, "b.toml");

    let mut held = eventually("a's port through a's client", Duration::from_secs(30), || async {
        let mut conn = TcpStream::connect((ip.as_str(), a_port)).await.ok()?;
        (ask(&mut conn, "hello").await? == "a:hello").then_some(conn)
    })
    .await;
    eventually("b's port through b's client", Duration::from_secs(30), || async {
        (answer(&ip, b_port, "hi").await? == "b:hi").then_some(())
    })
    .await;
    // Each member's health check passes through its own client, bound to its own token. The
    // server binds each service's port on its own once the client claims it, so a data port
    // answering does not mean the health port is bound yet.
    let health = |port: u16| format!("{ip}:{port}").parse::<std::net::SocketAddr>().unwrap();
    for (port, token) in [(a_health, &a_token), (b_health, &b_token)] {
        eventually("a member's health check through its own client", Duration::from_secs(30), || async {
            probe(health(port), token, Duration::from_secs(2)).await.ok()
        })
        .await;
    }
    let crossed = probe(health(a_health), &b_token, Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(crossed, ProbeError::WrongAnswer(_)), "{crossed}");

    // A client holding a's token cannot serve b's services: rathole checks each service's token.
    let _thief = client(&b, &a_token, &[tcp(b_port)], b_health, "thief.toml");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..5 {
        assert_eq!(answer(&ip, b_port, "x").await.as_deref(), Some("b:x"), "b's traffic stays b's");
    }
    probe(health(b_health), &b_token, Duration::from_secs(2)).await.unwrap();

    // b moves to another port: the server's file is replaced whole, b's client rolls.
    let moved = backend("b:").await;
    members.insert(b.clone(), carried(moved, b_health));
    write_by_rename(&config, &render(&members));
    client_b.kill().await.unwrap();
    let _client_b = client(&b, &b_token, &[tcp(moved)], b_health, "b2.toml");
    eventually("b's new port", Duration::from_secs(30), || async {
        (answer(&ip, moved, "moved").await? == "b:moved").then_some(())
    })
    .await;
    eventually("b's old port closed", Duration::from_secs(30), || async {
        TcpStream::connect((ip.as_str(), b_port)).await.is_err().then_some(())
    })
    .await;
    assert_eq!(ask(&mut held, "still").await.as_deref(), Some("a:still"), "a's open connection survived");

    // b leaves the server: a's connection, open all along, still carries bytes.
    members.remove(&b);
    write_by_rename(&config, &render(&members));
    eventually("b's port closed", Duration::from_secs(30), || async {
        TcpStream::connect((ip.as_str(), moved)).await.is_err().then_some(())
    })
    .await;
    assert_eq!(ask(&mut held, "after").await.as_deref(), Some("a:after"), "a's open connection survived b leaving");
    probe(health(a_health), &a_token, Duration::from_secs(2)).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

//! The local provider's reserved address moving between two running exit servers, as a highly
//! available Tunnel's failover moves it: real servers, real clients, bytes through the reserved
//! address reaching whichever server holds it.

mod contract;
mod local_support;

use local_support::*;
use providers::exit::userdata::{ClientService, ExitServer, NoiseKeypair, Protocol, TunnelClient};
use providers::hosts::{AddressRequest, HostProvider, HostState, TAG_TUNNEL_SLOT};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_reserved_address_moves_between_running_servers_and_off_a_dead_one() {
    let (p, _dir) = provider("failover");
    assert_eq!(p.capabilities().may_move_addresses(p.name()), Ok(()));
    let keys = NoiseKeypair::generate();
    let port = 18091;
    let server = ExitServer {
        control_port: 2333,
        noise_private_key: keys.private_key.clone(),
        services: vec![tcp_service(port)],
    };
    let uid = contract::fresh_uid();
    let base = contract::request("skyport-pair", &uid);
    let address = p
        .reserve_address(&AddressRequest {
            name: "skyport-pair".into(),
            region: None,
            tags: base.tags.clone(),
            host_id: None,
            movable: true,
        })
        .await
        .unwrap();
    let mut hosts = Vec::new();
    for slot in ["a", "b"] {
        let mut request = base.clone();
        request.name = format!("skyport-pair-{slot}");
        request.server = server.clone();
        request.tags.insert(TAG_TUNNEL_SLOT.into(), slot.into());
        let host = p.create(&request).await.unwrap();
        assert_ne!(host.public_ipv4.as_deref(), Some(address.ip.as_str()), "a pair's server gets its own address");
        hosts.push(host);
    }
    let (a, b) = (&hosts[0], &hosts[1]);
    let mut clients = Vec::new();
    for (host, tag) in [(a, "a"), (b, "b")] {
        let backend = tcp_backend(tag).await;
        let client = TunnelClient {
            remote_addr: format!("{}:2333", host.public_ipv4.as_deref().unwrap()),
            server_public_key: keys.public_key.clone(),
            services: vec![ClientService {
                name: format!("tcp-{port}"),
                protocol: Protocol::Tcp,
                token: "tok".into(),
                local_addr: backend,
            }],
        };
        clients.push(start_client(tag, &client));
    }
    let reserved = format!("{}:{port}", address.ip);
    let reaches = |tag: &'static str| {
        let reserved = reserved.clone();
        move || {
            let reserved = reserved.clone();
            async move { tcp_roundtrip(reserved).await.filter(|(got, intact)| got == tag && *intact) }
        }
    };

    // Onto a: its service port answers on the reserved address, its client untouched.
    p.assign_address(&address.id, &a.id).await.unwrap();
    until("bytes through the reserved address to a", reaches("a")).await;
    let on_a = p.get(&a.id).await.unwrap().unwrap();
    assert_eq!(on_a.public_ipv4.as_deref(), Some(address.ip.as_str()), "a is reached at the reserved address");
    let got = p.get_address(&address.id).await.unwrap().unwrap();
    assert_eq!(got.host_id.as_deref(), Some(a.id.as_str()));

    // Moved to b while a runs: a lets go of it, b takes it.
    p.assign_address(&address.id, &b.id).await.unwrap();
    until("bytes through the reserved address to b", reaches("b")).await;
    let a_own = format!("{}:{port}", a.public_ipv4.as_deref().unwrap());
    until("a serving on its own address again", || tcp_roundtrip(a_own.clone())).await;
    p.assign_address(&address.id, &b.id).await.expect("already there is success");

    // a is killed; back onto a is refused while it is dead, and the address stays with b.
    let pid = std::fs::read_to_string(p.host_dir(&a.id).join("pid")).unwrap();
    assert!(std::process::Command::new("kill").args(["-9", pid.trim()]).status().unwrap().success());
    until("a reads as stopped", || async { (p.get(&a.id).await.unwrap()?.state == HostState::Stopped).then_some(()) })
        .await;
    let refused = p.assign_address(&address.id, &a.id).await.unwrap_err().to_string();
    assert!(refused.contains("not running"), "{refused}");
    until("still b", reaches("b")).await;

    // b is killed too and a replacement for a comes up: the address moves off the dead holder.
    p.delete(&a.id).await.unwrap();
    let mut request = base.clone();
    request.server = server.clone();
    request.tags.insert(TAG_TUNNEL_SLOT.into(), "a".into());
    let a2 = p.create(&request).await.unwrap();
    assert_ne!(a2.public_ipv4.as_deref(), Some(address.ip.as_str()), "b still holds it");
    let pid = std::fs::read_to_string(p.host_dir(&b.id).join("pid")).unwrap();
    assert!(std::process::Command::new("kill").args(["-9", pid.trim()]).status().unwrap().success());
    until("b reads as stopped", || async { (p.get(&b.id).await.unwrap()?.state == HostState::Stopped).then_some(()) })
        .await;
    p.assign_address(&address.id, &a2.id).await.unwrap();
    assert_eq!(p.get_address(&address.id).await.unwrap().unwrap().host_id.as_deref(), Some(a2.id.as_str()));
    // Whether a2's server holds the port before a client asks is rathole's business (it binds on
    // demand, after a bind probe); what counts is that a2's client is reached there.
    let client = TunnelClient {
        remote_addr: format!("{}:2333", a2.public_ipv4.as_deref().unwrap()),
        server_public_key: keys.public_key.clone(),
        services: vec![ClientService {
            name: format!("tcp-{port}"),
            protocol: Protocol::Tcp,
            token: "tok".into(),
            local_addr: tcp_backend("a2").await,
        }],
    };
    clients.push(start_client("a2", &client));
    until("bytes through the reserved address to a2", reaches("a2")).await;

    for host in [&a2, b] {
        p.delete(&host.id).await.unwrap();
    }
    p.release_address(&address.id).await.unwrap();
    for (_, config) in clients {
        let _ = std::fs::remove_file(config);
    }
}

/// A port of the reserved address held by some other program: the server cannot listen there,
/// and the move's error says so (it ends up in the Tunnel's condition), not "see the log".
#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_move_onto_a_port_held_elsewhere_names_the_cause() {
    let (p, _dir) = provider("held");
    let keys = NoiseKeypair::generate();
    let port = 18092;
    let uid = contract::fresh_uid();
    let mut request = contract::request("skyport-held", &uid);
    let movable = AddressRequest {
        name: "skyport-held".into(),
        region: None,
        tags: request.tags.clone(),
        host_id: None,
        movable: true,
    };
    let address = p.reserve_address(&movable).await.unwrap();
    request.server = ExitServer {
        control_port: 2333,
        noise_private_key: keys.private_key.clone(),
        services: vec![tcp_service(port)],
    };
    request.tags.insert(TAG_TUNNEL_SLOT.into(), "a".into());
    let host = p.create(&request).await.unwrap();
    // Without SO_REUSEPORT: nobody else may join it on that port.
    let holder = std::net::TcpListener::bind((address.ip.as_str(), port)).unwrap();

    let refused = p.assign_address(&address.id, &host.id).await.unwrap_err().to_string();
    assert!(refused.contains("cannot forward"), "{refused}");
    assert!(refused.contains(&format!("{}:{port}", address.ip)), "names the port: {refused}");
    assert!(refused.to_lowercase().contains("in use"), "names the OS's reason: {refused}");

    // Once the port is free the move succeeds.
    drop(holder);
    p.assign_address(&address.id, &host.id).await.unwrap();
    p.delete(&host.id).await.unwrap();
    p.release_address(&address.id).await.unwrap();
}

//! The exit-server binary is checked before a VM is bought: a Tunnel on EC2 (LocalStack) whose
//! `--exit-server-url` serves nothing, or other bytes than the operator's own binary, creates no
//! instance and says why; once the URL serves the right file, the instance is created.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use providers::HostProvider;
use providers::hosts::TAG_TUNNEL_UID;
use skyport::crd::Tunnel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::tunnels::{TunnelOperator, events, fast_tunnel_settings, finish_tunnels, host_id, ready, service};
use crate::common::{TestNs, eventually, kubelet};

/// What the mirror answers: `None` is 404.
type Served = Arc<Mutex<Option<Vec<u8>>>>;

/// A plain HTTP/1.1 mirror on loopback answering HEAD and GET for any path with `served`, and
/// counting GETs. Returns the URL template for `--exit-server-url`.
async fn mirror(served: Served, gets: Arc<Mutex<u32>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { continue };
            let (served, gets) = (served.clone(), gets.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read_exact(&mut byte).await.is_ok() {
                    head.push(byte[0]);
                }
                let is_get = head.starts_with(b"GET ");
                let body = served.lock().unwrap().clone();
                let (status, body) = match body {
                    Some(b) => ("200 OK", b),
                    None => ("404 Not Found", b"not here".to_vec()),
                };
                if is_get {
                    *gets.lock().unwrap() += 1;
                }
                let header =
                    format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = conn.write_all(header.as_bytes()).await;
                if is_get {
                    let _ = conn.write_all(&body).await;
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    format!("http://127.0.0.1:{port}/v{{version}}/skyport-{{arch}}")
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_url_serving_nothing_or_other_bytes_buys_no_vm_and_the_right_file_does() {
    let ns = TestNs::new("tun-artifact").await;
    let ec2 =
        Arc::new(providers::Ec2Provider::from_env(providers::Ec2Settings::new("ami-0123456789abcdef0")).await.unwrap());
    let served: Served = Arc::new(Mutex::new(None));
    let gets = Arc::new(Mutex::new(0));
    let settings = skyport::config::TunnelArgs {
        exit_server_url: mirror(served.clone(), gets.clone()).await,
        skip_exit_server_check: false,
        exit_server_check_ttl: Duration::from_secs(1),
        ..fast_tunnel_settings()
    };
    let op = TunnelOperator::start_with(&ns, settings, vec![ec2.clone()]).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let svc = service(
        "web",
        Some("skyport.dev/tunnel"),
        serde_json::json!({"skyport.dev/provider": "ec2"}),
        serde_json::json!([{"name": "http", "port": 8080}]),
    );
    services.create(&PostParams::default(), &svc).await.unwrap();
    let reason_is = |want: &'static str| {
        let tunnels = tunnels.clone();
        move || {
            let tunnels = tunnels.clone();
            async move {
                let t = tunnels.get("web-tunnel").await.ok()?;
                let (_, reason, message) = ready(&t)?;
                (reason == want).then_some((t, message))
            }
        }
    };

    // Nothing published at the URL.
    let (tunnel, message) =
        eventually("ArtifactUnavailable", Duration::from_secs(30), reason_is("ArtifactUnavailable")).await;
    assert!(message.contains("404") && message.contains("127.0.0.1"), "{message}");
    let uid = tunnel.metadata.uid.clone().unwrap();
    let instances = || async { ec2.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap() };
    assert!(instances().await.is_empty(), "no instance for a URL that serves nothing");

    // Other bytes: the digest the VM would refuse is named.
    *served.lock().unwrap() = Some(b"#!/bin/sh\necho not skyport\n".to_vec());
    let (tunnel, message) =
        eventually("ArtifactDigestMismatch", Duration::from_secs(30), reason_is("ArtifactDigestMismatch")).await;
    let own = skyport::tunnel::file_sha256(&kubelet::skyport_exe()).unwrap();
    assert!(message.contains(&own), "names the expected digest: {message}");
    assert!(tunnel.status.as_ref().unwrap().host_id.is_none());
    assert!(instances().await.is_empty(), "no instance for a URL serving other bytes");
    let tunnel_events = events(&ns.client, &ns.name, "web-tunnel").await;
    let service_events = events(&ns.client, &ns.name, "web").await;
    for reason in ["ArtifactUnavailable", "ArtifactDigestMismatch"] {
        assert!(tunnel_events.iter().any(|(r, _)| r == reason), "{reason} on the Tunnel: {tunnel_events:?}");
        assert!(service_events.iter().any(|(r, _)| r == reason), "{reason} on the Service: {service_events:?}");
    }
    // Retries come from the cache between downloads, not one download per reconcile.
    let downloads = *gets.lock().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(*gets.lock().unwrap() <= downloads + 3, "{downloads} then {}", gets.lock().unwrap());

    // The operator's own binary: the instance is bought.
    *served.lock().unwrap() = Some(std::fs::read(kubelet::skyport_exe()).unwrap());
    let tunnel = eventually("an instance once the file is right", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        t.status.as_ref()?.host_id.is_some().then_some(t)
    })
    .await;
    let hosts = instances().await;
    assert_eq!(hosts.len(), 1, "{hosts:?}");
    assert_eq!(hosts[0].id, host_id(&tunnel));
    finish_tunnels(op, ns).await;
}

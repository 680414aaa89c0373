//! Tunnel clients in the clients' namespace (`--tunnel-client-namespace`, as the manifests
//! install skyport): the client Deployment and credentials Secret of a tenant's Tunnel live there
//! and nowhere in the tenant's namespace, serve the tunnel, and go with the Tunnel; one whose
//! Tunnel vanished without its finalizer is deleted by the orphan sweep.

use crate::common;

use std::time::Duration;

use common::kubelet::{Backends, ClientRunner};
use common::tunnels::{self, TunnelOperator, finish_tunnels};
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use skyport::controllers::tunnel::placement::{LABEL_TUNNEL_UID, Placement};
use skyport::crd::{Tunnel, TunnelPhase};

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_tenants_tunnel_client_and_keys_live_in_the_operators_namespace_and_go_with_it() {
    let ns = TestNs::new("tun-tenant").await;
    let operator = TestNs::new("tun-operator").await;
    let settings =
        skyport::config::TunnelArgs { client_namespace: Some(operator.name.clone()), ..tunnels::sweeping_settings() };
    let op = TunnelOperator::start(&ns, settings).await;
    let services: Api<Service> = ns.api();
    services.create(&PostParams::default(), &tunnels::web("web")).await.unwrap();
    let (_, client, secret) = Placement::names(&ns.name, "web-tunnel", Some(&operator.name));
    let _kubelet = ClientRunner::start(operator.client.clone(), &operator.name, &client, Backends::default());
    let tunnels_api: Api<Tunnel> = ns.api();
    let tunnel = eventually("Tunnel Active", TIMEOUT, || async {
        let t = tunnels_api.get("web-tunnel").await.ok()?;
        (t.status.as_ref()?.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await;

    let deployments: Api<Deployment> = operator.api();
    let secrets: Api<Secret> = operator.api();
    let live = deployments.get(&client).await.expect("the client Deployment in the clients' namespace");
    assert_eq!(live.metadata.labels.as_ref().unwrap().get(LABEL_TUNNEL_UID), tunnel.metadata.uid.as_ref());
    secrets.get(&secret).await.expect("the credentials Secret in the clients' namespace");
    assert!(ns.api::<Deployment>().list(&ListParams::default()).await.unwrap().items.is_empty());
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=skyport");
    assert!(ns.api::<Secret>().list(&managed).await.unwrap().items.is_empty(), "no Tunnel keys with the tenant");

    // A client whose Tunnel vanished without its finalizer (its UID is nobody's now).
    let (orphan_client, orphan_secret) = (format!("{client}-gone-client"), format!("{client}-gone-credentials"));
    let mut orphan = live.clone();
    orphan.metadata = kube::api::ObjectMeta {
        name: Some(orphan_client.clone()),
        labels: live.metadata.labels.clone().map(|mut l| {
            l.insert(LABEL_TUNNEL_UID.into(), tunnels::uuid());
            l
        }),
        ..Default::default()
    };
    orphan.status = None;
    deployments.create(&PostParams::default(), &orphan).await.unwrap();
    let keys: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": orphan_secret, "labels": orphan.metadata.labels},
        "stringData": {"token": "x"},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &keys).await.unwrap();
    eventually("the orphaned client swept", Duration::from_secs(30), || async {
        let gone = deployments.get_opt(&orphan_client).await.ok()?.is_none();
        (gone && secrets.get_opt(&orphan_secret).await.ok()?.is_none()).then_some(())
    })
    .await;
    assert!(deployments.get_opt(&client).await.unwrap().is_some(), "a live Tunnel's client is kept");

    // The Service opts out: its Tunnel goes, and with it the client and its keys.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    tunnels::gone(&tunnels_api, "web-tunnel").await;
    eventually("the client and its keys deleted with the Tunnel", TIMEOUT, || async {
        let gone = deployments.get_opt(&client).await.ok()?.is_none();
        (gone && secrets.get_opt(&secret).await.ok()?.is_none()).then_some(())
    })
    .await;
    assert_no_failures(&op.ctx.metrics, "reconciles failed");
    finish_tunnels(op, ns).await;
    operator.cleanup().await;
}

/// A client Pod can start with an older Secret than its template's checksum names (two writers
/// racing), and the kubelet later rewrites the file through a symlink swap no file watcher sees:
/// the client ends when its file's bytes change, so the kubelet starts it again with the new file.
#[tokio::test]
async fn a_client_whose_configuration_file_changes_ends_to_be_started_with_it() {
    let dir = std::env::temp_dir().join(format!("skyport-client-reread-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("client.toml");
    let config = |port: u16| {
        format!(
            "[client]\nremote_addr = \"127.0.0.1:{port}\"\n\n[client.services.web]\ntype = \"tcp\"\n\
             token = \"t\"\nlocal_addr = \"127.0.0.1:9\"\n"
        )
    };
    std::fs::write(&path, config(1)).unwrap();
    let mut child = tokio::process::Command::new(common::kubelet::skyport_exe())
        .args(["tunnel", "client", "--config"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(child.try_wait().unwrap().is_none(), "the client runs while its file is unchanged");
    std::fs::write(&path, config(2)).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("a client whose configuration changed ends within a few seconds")
        .unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).await.unwrap();
    assert!(!status.success(), "ends non-zero, so the kubelet starts it again: {stderr}");
    assert!(stderr.contains("changed"), "says why: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

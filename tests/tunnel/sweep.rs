//! The orphan sweep: exit servers tagged as skyport's with no Tunnel left go, others stay.

use std::time::Duration;

use providers::HostProvider;
use providers::hosts::TAG_CLUSTER;

use crate::common::tunnels::{self, WebTunnel, active, finish_tunnels, host_id};
use crate::common::{TestNs, eventually};

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_orphan_sweep_deletes_tagged_hosts_without_a_tunnel_and_keeps_the_rest() {
    use std::sync::atomic::Ordering::Relaxed;
    let ns = TestNs::new("tun-sweep").await;

    // Hosts as a crashed or finalizer-less skyport could leave them, made before the operator
    // starts (a host made while a sweep runs may be swept halfway through its own creation):
    // one of this cluster and namespace with no Tunnel, one of another cluster, one of another
    // namespace.
    let make = |cluster: &str, namespace: &str| {
        let mut tags = providers::owner_tags(&tunnels::uuid(), namespace, "gone-tunnel");
        tags.insert(TAG_CLUSTER.to_string(), cluster.to_string());
        providers::HostRequest {
            name: "skyport-orphan".into(),
            region: None,
            size: None,
            user_data: String::new(),
            server: providers::ExitServer {
                control_port: 2333,
                noise_private_key: providers::exit::userdata::NoiseKeypair::generate().private_key,
                services: vec![providers::TunnelService {
                    name: "tcp-8080".into(),
                    protocol: providers::Protocol::Tcp,
                    port: 8080,
                    token: "t".into(),
                    source_ranges: Vec::new(),
                    proxy_protocol: None,
                    bind: None,
                }],
            },
            tags,
            address: None,
            failure_domain: None,
        }
    };
    let leftovers = tunnels::local_provider(&ns);
    let cluster = tunnels::test_cluster_id(&ns);
    let orphan = leftovers.create(&make(&cluster, &ns.name)).await.unwrap();
    let foreign = leftovers.create(&make("another-cluster", &ns.name)).await.unwrap();
    let elsewhere = leftovers.create(&make(&cluster, "another-namespace")).await.unwrap();

    let WebTunnel { ns, op, tunnels, kubelet: _kubelet, .. } = WebTunnel::start(ns, tunnels::sweeping_settings()).await;
    assert_eq!(op.ctx.cluster_id, cluster);
    let live = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;

    eventually("orphan deleted by the sweep", Duration::from_secs(20), || async {
        op.local.get(&orphan.id).await.unwrap().is_none().then_some(())
    })
    .await;
    tunnels::two_more_sweeps(&op).await;
    assert_eq!(op.ctx.orphans_deleted.load(Relaxed), 1, "only the orphan is deleted");
    assert!(op.local.get(&foreign.id).await.unwrap().is_some(), "another cluster's host is kept");
    assert!(op.local.get(&elsewhere.id).await.unwrap().is_some(), "a host outside the namespace is kept");
    assert!(op.local.get(&host_id(&live)).await.unwrap().is_some(), "a live Tunnel's host is kept");
    op.local.delete(&foreign.id).await.unwrap();
    op.local.delete(&elsewhere.id).await.unwrap();
    finish_tunnels(op, ns).await;
}

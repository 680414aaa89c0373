//! Highly available Tunnels (`skyport.dev/high-availability: "true"`) against the real test
//! environment, on the local provider: two real exit servers with a real client each, the
//! active one killed while a client sends a request every 100 ms to the Service's address.

use crate::common;
use crate::common::tunnels;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::kubelet::{Backends, ClientRunner, tcp_echo};
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use providers::HostProvider;
use providers::hosts::TAG_TUNNEL_UID;
use skyport::crd::Tunnel;
use skyport::crd::tunnel::HighAvailabilityStatus;
use tunnels::{TunnelOperator, active, carries, fast_tunnel_settings, finish_tunnels, ingress_ip, service};

fn ha(t: &Tunnel) -> HighAvailabilityStatus {
    t.status.as_ref().and_then(|s| s.high_availability.clone()).expect("status.highAvailability")
}

/// Sends a request to `addr` every 100 ms, each given 1 s; records when each successful one was
/// sent.
struct Requests {
    succeeded: Arc<Mutex<Vec<Instant>>>,
    sent: Arc<std::sync::atomic::AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Requests {
    fn start(ip: String, port: u16) -> Self {
        let succeeded = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (log, count) = (succeeded.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let (ip, log) = (ip.clone(), log.clone());
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(async move {
                    let at = Instant::now();
                    let answer = tokio::time::timeout(Duration::from_secs(1), tcp_echo(&ip, port, b"ping")).await;
                    if matches!(answer, Ok(Some((_, echoed))) if echoed == b"ping") {
                        log.lock().unwrap().push(at);
                    }
                });
            }
        });
        Requests { succeeded, sent, task }
    }

    /// The longest time between two successful requests (by when they were sent).
    fn longest_gap(&self) -> Duration {
        let mut times = self.succeeded.lock().unwrap().clone();
        times.sort();
        times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_killed_active_exit_server_hands_the_address_to_the_standby() {
    let ns = TestNs::new("tun-ha").await;
    let op = TunnelOperator::start(&ns, fast_tunnel_settings()).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let annotations = serde_json::json!({"skyport.dev/address": "reserved", "skyport.dev/high-availability": "true"});
    let ports = serde_json::json!([{"name": "http", "port": 18480, "protocol": "TCP"}]);
    services
        .create(&Default::default(), &service("web", Some("skyport.dev/tunnel"), annotations, ports))
        .await
        .unwrap();
    let _clients = ["a", "b"].map(|slot| {
        ClientRunner::start(ns.client.clone(), &ns.name, &format!("web-tunnel-client-{slot}"), Backends::default())
    });

    let t = active(&tunnels, "web-tunnel", Duration::from_secs(60)).await;
    let ip = t.status.as_ref().and_then(|s| s.address_ip.clone()).expect("addressIp");
    let first = ha(&t).active.expect("an active exit server");
    eventually("both exit servers pass their checks", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        (ha(&t).servers.iter().filter(|s| s.healthy).count() == 2).then_some(())
    })
    .await;
    eventually("Service shows the reserved address", Duration::from_secs(20), || async {
        (ingress_ip(&services.get("web").await.ok()?)? == ip).then_some(())
    })
    .await;
    carries(&ip, 18480, None).await;

    let requests = Requests::start(ip.clone(), 18480);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    tunnels::kill_exit_server(&op, &first);
    let moved = eventually("the address on the standby", Duration::from_secs(30), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        ha(&t).active.filter(|a| *a != first).map(|_| t)
    })
    .await;
    let moved_after = killed.elapsed();
    eventually("requests through the same address again", Duration::from_secs(30), || async {
        let last = *requests.succeeded.lock().unwrap().last()?;
        (last > killed).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let gap = requests.longest_gap();
    let sent = requests.sent.load(std::sync::atomic::Ordering::Relaxed);
    let ok = requests.succeeded.lock().unwrap().len();
    drop(requests);
    // A benchmark figure, not an assertion of speed.
    println!(
        "failover (local provider, defaults: 3 failed checks over 2 s, 1 s probe): address moved {:.1} s after the kill; \
         longest gap without a successful request {:.1} s ({ok} of {sent} requests answered)",
        moved_after.as_secs_f64(),
        gap.as_secs_f64()
    );

    let status = ha(&moved);
    let last = status.last_failover.expect("lastFailover");
    assert_eq!(last.from, first);
    assert!(last.reason.contains("not running") || last.reason.contains("health checks"), "{last:?}");
    assert_eq!(status.failovers, Some(1));
    assert_eq!(ingress_ip(&services.get("web").await.unwrap()).as_deref(), Some(ip.as_str()), "the same address");
    let events = tunnels::events(&ns.client, &ns.name, "web-tunnel").await;
    assert!(events.iter().any(|(reason, note)| reason == "Failover" && note.contains(&first)), "{events:?}");
    carries(&ip, 18480, None).await;

    // The killed server's slot gets a new exit server, which becomes the passing standby.
    eventually("a new standby passing its check", Duration::from_secs(60), || async {
        let t = tunnels.get("web-tunnel").await.ok()?;
        let servers = ha(&t).servers;
        let fresh = servers.iter().all(|s| s.healthy && s.host_id.as_deref() != Some(first.as_str()));
        (servers.len() == 2 && fresh).then_some(())
    })
    .await;
    let uid = moved.metadata.uid.clone().unwrap();
    assert_eq!(op.local.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 2, "no leftover exit server");
    assert_eq!(op.local.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 1);
    finish_tunnels(op, ns).await;
}

//! Highly available Tunnels (`skyport.dev/high-availability: "true"`) on the test node, with the
//! local provider: two real exit servers with a client Pod each, the active one killed (or its
//! client Pod kept from running by the namespace's Pod quota) while a client sends a request
//! every 100 ms to the Service's address.

use crate::common;
use crate::common::tunnels;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use common::kubelet::tcp_echo;
use common::node_tunnels::{ACTIVE, NodeTunnel, set_pod_quota};
use common::{TestNs, node_tunnels};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
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

/// A highly available Tunnel for the Service `web` (TCP 18480), its two clients Pods on the
/// node, Active with both servers passing and bytes through the reserved address.
struct Pair {
    ns: TestNs,
    op: TunnelOperator,
    services: Api<Service>,
    tunnels: Api<Tunnel>,
    /// Held until the test ends: no install on the node meanwhile.
    _turn: tokio::sync::RwLockReadGuard<'static, ()>,
    /// The reserved address.
    ip: String,
    /// The exit server holding it.
    active: String,
}

const PORT: u16 = 18480;

impl Pair {
    async fn start(prefix: &str) -> Option<Self> {
        let annotations =
            serde_json::json!({"skyport.dev/address": "reserved", "skyport.dev/high-availability": "true"});
        let ports = serde_json::json!([{"name": "http", "port": PORT, "protocol": "TCP"}]);
        let web = service("web", Some("skyport.dev/tunnel"), annotations, ports);
        let backend = [format!("{PORT}/tcp"), format!("{}/tcp", PORT + 1)];
        let backend: Vec<&str> = backend.iter().map(String::as_str).collect();
        let NodeTunnel { ns, op, services, tunnels, turn, .. } =
            NodeTunnel::start_with(prefix, fast_tunnel_settings(), &backend, None, web).await?;
        let t = active(&tunnels, "web-tunnel", ACTIVE).await;
        let ip = t.status.as_ref().and_then(|s| s.address_ip.clone()).expect("addressIp");
        let active = ha(&t).active.expect("an active exit server");
        eventually("both exit servers pass their checks", Duration::from_secs(30), || async {
            let t = tunnels.get("web-tunnel").await.ok()?;
            (ha(&t).servers.iter().filter(|s| s.healthy).count() == 2).then_some(())
        })
        .await;
        eventually("Service shows the reserved address", Duration::from_secs(20), || async {
            (ingress_ip(&services.get("web").await.ok()?)? == ip).then_some(())
        })
        .await;
        carries(&ip, PORT, None).await;
        Some(Pair { ns, op, services, tunnels, _turn: turn, ip, active })
    }

    /// Slot `slot`'s client Pod deleted and, by the namespace's Pod quota, not started again: its
    /// node is gone.
    async fn stop_client(&self, slot: usize) {
        let pods: Api<Pod> = self.ns.api();
        let all = pods.list(&ListParams::default()).await.unwrap().items.len();
        set_pod_quota(&self.ns, Some(all as u32 - 1)).await;
        let deployment = format!("web-tunnel-client-{}", ["a", "b"][slot]);
        let selector = format!("app.kubernetes.io/instance={deployment}");
        let client = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
        let pod = client.items.first().expect("the client Pod").name_any();
        pods.delete(&pod, &DeleteParams::default().grace_period(0)).await.expect("delete the client Pod");
    }

    /// Runs `fault` while requests go to the reserved address; waits for the address to move
    /// off the active server and requests to be answered again. Returns the Tunnel then, how
    /// long the move took and the longest gap without an answer.
    async fn failover(&mut self, what: &str, fault: impl AsyncFnOnce(&mut Self)) -> (Tunnel, Duration, Duration) {
        let requests = Requests::start(self.ip.clone(), PORT);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        fault(self).await;
        let first = self.active.clone();
        let moved = eventually("the address on the standby", Duration::from_secs(30), || async {
            let t = self.tunnels.get("web-tunnel").await.ok()?;
            ha(&t).active.filter(|a| *a != first).map(|_| t)
        })
        .await;
        let moved_after = started.elapsed();
        eventually("requests through the same address again", Duration::from_secs(30), || async {
            let last = *requests.succeeded.lock().unwrap().last()?;
            (last > started).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let gap = requests.longest_gap();
        let sent = requests.sent.load(std::sync::atomic::Ordering::Relaxed);
        let ok = requests.succeeded.lock().unwrap().len();
        // A benchmark figure, not an assertion of speed.
        println!(
            "failover after {what} (local provider, defaults: 3 failed checks over 2 s, 1 s probe): address moved \
             {:.1} s after it; longest gap without a successful request {:.1} s ({ok} of {sent} requests answered)",
            moved_after.as_secs_f64(),
            gap.as_secs_f64()
        );
        let status = ha(&moved);
        let last = status.last_failover.clone().expect("lastFailover");
        assert_eq!(last.from, first);
        assert_eq!(status.failovers, Some(1));
        let service = self.services.get("web").await.unwrap();
        assert_eq!(ingress_ip(&service).as_deref(), Some(self.ip.as_str()), "the same address");
        let events = tunnels::events(&self.ns.client, &self.ns.name, "web-tunnel").await;
        assert!(events.iter().any(|(reason, note)| reason == "Failover" && note.contains(&first)), "{events:?}");
        carries(&self.ip, PORT, None).await;
        (moved, moved_after, gap)
    }

    fn slot_of(&self, t: &Tunnel, host: &str) -> usize {
        let slot = ha(t).servers.iter().find(|s| s.host_id.as_deref() == Some(host)).map(|s| s.slot.clone());
        ["a", "b"].iter().position(|s| Some(s.to_string()) == slot).expect("the host's slot")
    }
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_killed_active_exit_server_hands_the_address_to_the_standby() {
    let Some(mut pair) = Pair::start("tun-ha").await else { return };
    let first = pair.active.clone();
    let (moved, _, _) =
        pair.failover("the active exit server was killed", async |p| tunnels::kill_exit_server(&p.op, &p.active)).await;
    let last = ha(&moved).last_failover.unwrap();
    assert!(last.reason.contains("not running"), "{last:?}");

    // The killed server's slot gets a new exit server, which becomes the passing standby.
    eventually("a new standby passing its check", Duration::from_secs(60), || async {
        let t = pair.tunnels.get("web-tunnel").await.ok()?;
        let servers = ha(&t).servers;
        let fresh = servers.iter().all(|s| s.healthy && s.host_id.as_deref() != Some(first.as_str()));
        (servers.len() == 2 && fresh).then_some(())
    })
    .await;
    let uid = moved.metadata.uid.clone().unwrap();
    assert_eq!(pair.op.local.list_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 2, "no leftover exit server");
    assert_eq!(pair.op.local.list_addresses_by_tag(TAG_TUNNEL_UID, &uid).await.unwrap().len(), 1);
    finish_tunnels(pair.op, pair.ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_client_that_stays_down_hands_the_address_to_the_standby_after_the_hysteresis() {
    let Some(mut pair) = Pair::start("tun-ha-client").await else { return };
    let t = pair.tunnels.get("web-tunnel").await.unwrap();
    let slot = pair.slot_of(&t, &pair.active.clone());
    // Its node is gone: the client Pod is deleted and nothing starts it again.
    let (moved, moved_after, _) =
        pair.failover("the active server's client stopped", async |p| p.stop_client(slot).await).await;
    let last = ha(&moved).last_failover.unwrap();
    assert!(last.reason.contains("health checks in a row"), "{last:?}");
    assert!(moved_after >= Duration::from_secs(2), "no move before the hysteresis: {moved_after:?}");

    // The client comes back: the address stays where it is, both servers pass.
    set_pod_quota(&pair.ns, None).await;
    eventually("both exit servers pass again", node_tunnels::AFTER_QUOTA, || async {
        let t = pair.tunnels.get("web-tunnel").await.ok()?;
        (ha(&t).servers.iter().filter(|s| s.healthy).count() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = pair.tunnels.get("web-tunnel").await.unwrap();
    assert_eq!(ha(&t).active, ha(&moved).active, "no move back to a recovered server");
    assert_eq!(ha(&t).failovers, Some(1));
    finish_tunnels(pair.op, pair.ns).await;
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn a_config_change_rolls_the_clients_one_at_a_time_through_a_handover() {
    let Some(pair) = Pair::start("tun-ha-roll").await else { return };
    let first = pair.active.clone();
    let requests = Requests::start(pair.ip.clone(), PORT);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    // A port added to the Service: both clients need a new config, so both restart.
    let ports = serde_json::json!({"spec": {"ports": [
        {"name": "http", "port": PORT, "protocol": "TCP"},
        {"name": "extra", "port": PORT + 1, "protocol": "TCP"},
    ]}});
    pair.services.patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&ports)).await.unwrap();
    let handed = eventually("the address handed to the other server", Duration::from_secs(60), || async {
        let t = pair.tunnels.get("web-tunnel").await.ok()?;
        ha(&t).active.filter(|a| *a != first).map(|_| t)
    })
    .await;
    carries(&pair.ip, PORT + 1, None).await;
    eventually("both servers pass with their new clients", Duration::from_secs(60), || async {
        let t = pair.tunnels.get("web-tunnel").await.ok()?;
        (ha(&t).servers.iter().filter(|s| s.healthy).count() == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (gap, sent) = (requests.longest_gap(), requests.sent.load(std::sync::atomic::Ordering::Relaxed));
    let ok = requests.succeeded.lock().unwrap().len();
    println!(
        "client roll through a handover (local provider): done {:.1} s after the port change; longest gap without a \
         successful request {:.1} s ({ok} of {sent} requests answered)",
        started.elapsed().as_secs_f64(),
        gap.as_secs_f64()
    );
    assert_eq!(ha(&handed).failovers, None, "a planned handover is no failover");
    let events = tunnels::events(&pair.ns.client, &pair.ns.name, "web-tunnel").await;
    assert!(events.iter().any(|(reason, _)| reason == "Handover"), "{events:?}");
    finish_tunnels(pair.op, pair.ns).await;
}

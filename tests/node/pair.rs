//! A highly available Tunnel on the test node, for the failover tests and the failover benchmark:
//! Service `web` (TCP 18480) asking for a reserved address and two exit servers, its two client
//! Pods from skyport's image, an echo backend Pod.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use skyport::crd::Tunnel;
use skyport::crd::tunnel::HighAvailabilityStatus;
use tokio::sync::RwLockReadGuard;

use super::tunnels::{ACTIVE, NodeTunnel, set_pod_quota};
use crate::common::requests::Requests;
use crate::common::tunnels::{TunnelOperator, active, carries, fast_tunnel_settings, ingress_ip, service};
use crate::common::{TestNs, eventually};

/// The Service's port; the one a roll adds is the next.
pub const PORT: u16 = 18480;

pub struct Pair {
    pub ns: TestNs,
    pub op: TunnelOperator,
    pub services: Api<Service>,
    pub tunnels: Api<Tunnel>,
    /// Held until the pair is dropped: no install on the node meanwhile.
    pub _turn: RwLockReadGuard<'static, ()>,
    /// The reserved address.
    pub ip: String,
    /// The exit server holding it.
    pub active: String,
}

pub fn ha(t: &Tunnel) -> HighAvailabilityStatus {
    t.status.as_ref().and_then(|s| s.high_availability.clone()).expect("status.highAvailability")
}

/// What a client of the reserved address saw around a fault ([`Pair::measure`]).
pub struct Measured {
    /// The Tunnel once the address was on the other server.
    pub moved: Tunnel,
    /// From the fault to the address on the other server.
    pub moved_after: Duration,
    /// From the fault to the end of the measurement.
    pub settled_after: Duration,
    /// The longest time between two answered requests.
    pub gap: Duration,
    pub answered: usize,
    pub sent: usize,
}

impl Pair {
    /// Runs `fault` while a request goes to the reserved address every 100 ms; waits until the
    /// address is on the other server and requests are answered again (`planned`: and both servers
    /// pass, as after a roll), then 3 s more.
    pub async fn measure(&self, fault: impl AsyncFnOnce(&Pair), planned: bool) -> Measured {
        let requests = Requests::start(self.ip.clone(), PORT);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        fault(self).await;
        let moved = self.moved().await;
        let moved_after = started.elapsed();
        eventually("requests through the same address again", Duration::from_secs(120), || async {
            requests.last_answered().filter(|last| *last > started).map(drop)
        })
        .await;
        if planned {
            self.both_healthy(Duration::from_secs(120)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (answered, sent) = requests.tally();
        let (gap, settled_after) = (requests.longest_gap(), started.elapsed());
        Measured { moved, moved_after, settled_after, gap, answered, sent }
    }

    /// Active with both servers passing their checks and bytes through the reserved address;
    /// `None` when the environment runs without its node on purpose.
    pub async fn start(prefix: &str) -> Option<Self> {
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
        eventually("both exit servers pass their checks", ACTIVE, || async {
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
    pub async fn stop_client(&self, slot: usize) {
        let pods: Api<Pod> = self.ns.api();
        let all = pods.list(&ListParams::default()).await.unwrap().items.len();
        set_pod_quota(&self.ns, Some(all as u32 - 1)).await;
        let deployment = format!("web-tunnel-client-{}", ["a", "b"][slot]);
        let selector = format!("app.kubernetes.io/instance={deployment}");
        let client = pods.list(&ListParams::default().labels(&selector)).await.unwrap();
        let pod = client.items.first().expect("the client Pod").name_any();
        pods.delete(&pod, &DeleteParams::default().grace_period(0)).await.expect("delete the client Pod");
    }

    /// The slot (0 for a, 1 for b) of exit server `host`.
    pub fn slot_of(&self, t: &Tunnel, host: &str) -> usize {
        let slot = ha(t).servers.iter().find(|s| s.host_id.as_deref() == Some(host)).map(|s| s.slot.clone());
        ["a", "b"].iter().position(|s| Some(s.to_string()) == slot).expect("the host's slot")
    }

    /// The active server's slot now.
    pub async fn active_slot(&self) -> usize {
        let t = self.tunnels.get("web-tunnel").await.unwrap();
        self.slot_of(&t, &self.active)
    }

    /// A port added to the Service: both clients need a new config, so both roll.
    pub async fn add_port(&self) {
        let ports = serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": PORT, "protocol": "TCP"},
            {"name": "extra", "port": PORT + 1, "protocol": "TCP"},
        ]}});
        let patch = kube::api::Patch::Merge(&ports);
        self.services.patch("web", &kube::api::PatchParams::default(), &patch).await.unwrap();
    }

    /// Waits until the address is on an exit server other than the one active at the start.
    pub async fn moved(&self) -> Tunnel {
        let first = self.active.clone();
        eventually("the address on the other server", ACTIVE, || async {
            let t = self.tunnels.get("web-tunnel").await.ok()?;
            ha(&t).active.filter(|a| *a != first).map(|_| t)
        })
        .await
    }

    /// Waits until both exit servers pass their checks.
    pub async fn both_healthy(&self, within: Duration) {
        eventually("both exit servers pass", within, || async {
            let t = self.tunnels.get("web-tunnel").await.ok()?;
            (ha(&t).servers.iter().filter(|s| s.healthy).count() == 2).then_some(())
        })
        .await;
    }
}

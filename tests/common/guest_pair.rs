//! A highly available Tunnel (mode `ActiveStandby`) on booted guests, for tests/tunnel_guest_ha.rs
//! and benches/tunnel.rs `--guest --failover`: Service `web` (TCP [`PORT`]) asking for a reserved
//! address and two exit servers, the `guest` provider booting both (its guests trust a mirror of
//! the static binary with a CA of its own), each server's client run from its Deployment
//! (`common::kubelet`) to echo backends.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams};
use providers::guest::{GuestProvider, GuestSettings};
use skyport::crd::Tunnel;
use skyport::crd::tunnel::HighAvailabilityStatus;

use super::kubelet::{Backends, ClientRunner};
use super::mirror::{Mirror, https_mirror};
use super::requests::Requests;
use super::tunnels::{self, TunnelOperator, active, carries, service};
use super::{TestNs, eventually};

pub const PORT: u16 = 8080;

pub fn ha(t: &Tunnel) -> HighAvailabilityStatus {
    t.status.as_ref().and_then(|s| s.high_availability.clone()).expect("status.highAvailability")
}

pub struct GuestPair {
    pub ns: TestNs,
    pub op: TunnelOperator,
    pub guests: Arc<GuestProvider>,
    pub mirror: Mirror,
    pub services: Api<Service>,
    pub tunnels: Api<Tunnel>,
    /// The guest provider's state directory.
    pub state: std::path::PathBuf,
    /// The reserved address.
    pub ip: String,
    /// The guest holding it.
    pub active: String,
    /// From creating the Service to bytes through the reserved address.
    pub first_bytes: Duration,
    clients: [ClientRunner; 2],
    _guests: Removes,
}

/// Removes every guest of the provider, whatever happened to the test.
struct Removes(Arc<GuestProvider>, std::path::PathBuf);

impl Drop for Removes {
    fn drop(&mut self) {
        self.0.remove_all();
        let _ = std::fs::remove_dir(&self.1);
    }
}

/// What a client of the reserved address saw around the active guest's power-off.
pub struct PowerOff {
    /// The Tunnel once the address was on the other guest.
    pub moved: Tunnel,
    /// From the power-off to the address on the other guest.
    pub moved_after: Duration,
    /// The longest time between two answered requests.
    pub gap: Duration,
    pub answered: usize,
    pub sent: usize,
}

impl GuestPair {
    /// Active with bytes through the reserved address, both guests passing their checks.
    pub async fn start(prefix: &str, rootfs: &std::path::Path, exe: &std::path::Path) -> GuestPair {
        let mirror = https_mirror(std::fs::read(exe).unwrap()).await;
        let ns = TestNs::new(prefix).await;
        let state = std::env::temp_dir().join(format!("skyport-test-guests-{}", ns.name));
        let mut settings = GuestSettings::new(&state, rootfs);
        settings.ca_file = Some(mirror.ca_file.clone());
        let guests = Arc::new(GuestProvider::new(settings).expect("guest provider"));
        let settings = mirror.check_settings(skyport::config::TunnelArgs {
            provider: Some("guest".into()),
            exit_server_url: mirror.url_template.clone(),
            ..tunnels::fast_tunnel_settings()
        });
        let op = TunnelOperator::start_serving(&ns, settings, vec![guests.clone()], exe.to_path_buf()).await;
        let (services, tunnels): (Api<Service>, Api<Tunnel>) = (ns.api(), ns.api());
        let annotations =
            serde_json::json!({"skyport.dev/address": "reserved", "skyport.dev/high-availability": "true"});
        let ports = serde_json::json!([{"name": "http", "port": PORT, "protocol": "TCP"}]);
        let started = Instant::now();
        let web = service("web", Some("skyport.dev/tunnel"), annotations, ports);
        services.create(&Default::default(), &web).await.unwrap();
        let backends = Backends::default();
        let clients = ["a", "b"].map(|slot| {
            ClientRunner::start(ns.client.clone(), &ns.name, &format!("web-tunnel-client-{slot}"), backends.clone())
        });
        let first = active(&tunnels, "web-tunnel", Duration::from_secs(300)).await;
        let ip = first.status.as_ref().and_then(|s| s.address_ip.clone()).expect("addressIp");
        let holder = ha(&first).active.expect("an active exit server");
        carries(&ip, PORT, None).await;
        let first_bytes = started.elapsed();
        let pair = GuestPair {
            ns,
            op,
            guests: guests.clone(),
            mirror,
            services,
            tunnels,
            state: state.clone(),
            ip,
            active: holder,
            first_bytes,
            clients,
            _guests: Removes(guests, state),
        };
        pair.both_passing(None, Duration::from_secs(120)).await;
        pair
    }

    /// Waits until both servers of the pair pass their checks, neither of them `not`.
    pub async fn both_passing(&self, not: Option<&str>, within: Duration) -> Tunnel {
        eventually("both exit servers of the pair pass their checks", within, || async {
            let t = self.tunnels.get("web-tunnel").await.ok()?;
            let servers = ha(&t).servers;
            let fresh = servers.iter().all(|s| s.healthy && s.host_id.is_some() && s.host_id.as_deref() != not);
            (servers.len() == 2 && fresh).then_some(t)
        })
        .await
    }

    /// Powers guest `holder` (the one holding the address) off while a request goes to the
    /// reserved address every 100 ms; waits until the address is on the other guest and requests
    /// are answered again, then 3 s.
    pub async fn power_off(&self, holder: &str) -> PowerOff {
        self.stop(holder, Duration::from_secs(30)).await
    }

    /// Like [`GuestPair::power_off`], but guest `holder` is killed: every process of it gets
    /// SIGKILL at once, with no shutdown (its exit server never closes a connection), as when
    /// its host dies.
    pub async fn kill(&self, holder: &str) -> PowerOff {
        self.stop(holder, Duration::ZERO).await
    }

    /// Stops guest `holder`, in order for up to `grace`, then by SIGKILL.
    async fn stop(&self, holder: &str, grace: Duration) -> PowerOff {
        let machine = self.guests.machine(holder).expect("the active guest");
        // Powering off blocks until nspawn is gone: off the runtime's threads, so requests go on.
        let off = std::sync::Mutex::new(None);
        let m = self
            .measure(holder, async |_| {
                *off.lock().unwrap() = Some(tokio::task::spawn_blocking(move || machine.stop(grace)));
            })
            .await;
        if let Some(off) = off.into_inner().unwrap() {
            off.await.unwrap();
        }
        m
    }

    /// Runs `fault` while a request goes to the reserved address every 100 ms; waits until the
    /// address is on another guest than `holder` and requests are answered again, then 3 s.
    pub async fn measure(&self, holder: &str, fault: impl AsyncFnOnce(&GuestPair)) -> PowerOff {
        let requests = Requests::start(self.ip.clone(), PORT);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        fault(self).await;
        let moved = eventually("the address on the other guest", Duration::from_secs(120), || async {
            let t = self.tunnels.get("web-tunnel").await.ok()?;
            ha(&t).active.filter(|a| a != holder).map(|_| t)
        })
        .await;
        let moved_after = started.elapsed();
        eventually("requests through the same address again", Duration::from_secs(60), || async {
            requests.last_answered().filter(|last| *last > started).map(drop)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (answered, sent) = requests.tally();
        PowerOff { moved, moved_after, gap: requests.longest_gap(), answered, sent }
    }

    /// Sends `signal` (`kill -s` spelling) to the exit server running in guest `id`: `STOP`
    /// hangs it (its sockets stay open, nothing answers), `CONT` lets it go on.
    pub fn signal_server(&self, id: &str, signal: &str) {
        let machine = self.guests.machine(id).expect("the guest");
        let server = machine.processes().into_iter().find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("tunnel\0server")
        });
        let pid = server.expect("the guest's exit server process").to_string();
        assert!(std::process::Command::new("kill").args(["-s", signal, &pid]).status().unwrap().success());
    }

    /// The client of the server holding the address gone for good, as when its node dies.
    pub async fn stop_active_client(&self) {
        let t = self.tunnels.get("web-tunnel").await.unwrap();
        let slot = ha(&t).servers.iter().find(|s| s.host_id.as_deref() == Some(&self.active)).map(|s| s.slot.clone());
        let index = ["a", "b"].iter().position(|s| Some(s.to_string()) == slot).expect("the active server's slot");
        self.clients[index].stop();
    }

    /// Deletes the Service (if it is still there), waits for its Tunnel to go and stops the
    /// operator; whatever is left of the guests is removed.
    pub async fn finish(self) {
        let _ = self.services.delete("web", &DeleteParams::default()).await;
        tunnels::gone(&self.tunnels, "web-tunnel").await;
        tunnels::finish_tunnels(self.op, self.ns).await;
    }

    /// [`GuestPair::finish`] with `op` (a standby that took over) in place of the killed operator.
    pub async fn finish_with(self, op: TunnelOperator) {
        let _ = self.services.delete("web", &DeleteParams::default()).await;
        tunnels::gone(&self.tunnels, "web-tunnel").await;
        tunnels::finish_tunnels(op, self.ns).await;
        self.op.stop().await;
    }
}

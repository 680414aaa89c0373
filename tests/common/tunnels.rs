//! Tunnel harness: in-process Tunnel and Service controllers on a test namespace, and the checks
//! the Tunnel tests share.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Service};
use kube::Client;
use kube::api::{Api, DeleteParams};
use skyport::controllers::{Acting, Gate};
use skyport::crd::{ConditionStatus, Tunnel, TunnelPhase};
use tokio::sync::oneshot;

use crate::common::kubelet::{tcp_echo, udp_echo};
use crate::common::{TestNs, eventually, kubelet};

/// Tunnel and Service controllers running in-process for one namespace, with a local provider
/// of their own (its own state directory, so tests never see each other's exit servers).
pub struct TunnelOperator {
    pub ctx: Arc<skyport::controllers::tunnel::Context>,
    pub services: Arc<skyport::controllers::service::Context>,
    pub local: Arc<providers::local::LocalProvider>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    state: std::path::PathBuf,
}

impl Drop for TunnelOperator {
    /// A test that failed before [`finish_tunnels`] must not leave exit servers running: kill
    /// every server process of this operator's local provider (its state stays for inspection).
    fn drop(&mut self) {
        for dir in std::fs::read_dir(&self.state).into_iter().flatten().flatten() {
            if let Ok(pid) = std::fs::read_to_string(dir.path().join("pid")) {
                let _ = std::process::Command::new("kill").args(["-9", pid.trim()]).status();
            }
        }
    }
}

/// The state directory of the local provider [`TunnelOperator::start`] gives `ns`.
pub fn local_state_dir(ns: &TestNs) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("skyport-test-hosts-{}", ns.name))
}

/// The cluster id [`TunnelOperator::start`] tags hosts with unless the settings name one.
pub fn test_cluster_id(ns: &TestNs) -> String {
    format!("test-{}", ns.name)
}

/// A local provider on the state directory [`TunnelOperator::start`] will use for `ns`: hosts
/// made with it before the operator starts are there when it does (as a crash leaves them).
pub fn local_provider(ns: &TestNs) -> providers::local::LocalProvider {
    providers::local::LocalProvider::new(providers::local::LocalSettings::new(
        local_state_dir(ns),
        kubelet::skyport_exe(),
    ))
    .expect("local provider")
}

/// Tunnel settings for fast tests: local provider, 2 s resync, no orphan sweep, the address
/// withdrawn after 2 s of failed probes. The exit-server binary check is off: LocalStack's
/// instances download nothing and the default URL is a release this build is not
/// (tests/tunnel/artifact.rs checks the check).
pub fn fast_tunnel_settings() -> skyport::config::TunnelArgs {
    skyport::config::TunnelArgs {
        provider: Some("local".into()),
        skip_exit_server_check: true,
        resync: Duration::from_secs(2),
        orphan_sweep_interval: Duration::ZERO,
        withdraw_after: Duration::from_secs(2),
        ..Default::default()
    }
}

impl TunnelOperator {
    pub async fn start(ns: &TestNs, settings: skyport::config::TunnelArgs) -> Self {
        Self::start_as(ns.client.clone(), ns, settings).await
    }

    /// Like [`TunnelOperator::start`], talking to the API server as `client` (another identity).
    pub async fn start_as(client: kube::Client, ns: &TestNs, settings: skyport::config::TunnelArgs) -> Self {
        Self::start_full(client, ns, settings, Vec::new(), kubelet::skyport_exe(), (None, Acting::always())).await
    }

    /// Like [`TunnelOperator::start`], with more providers next to the local one.
    pub async fn start_with(
        ns: &TestNs,
        settings: skyport::config::TunnelArgs,
        extra: Vec<Arc<dyn providers::HostProvider>>,
    ) -> Self {
        Self::start_full(ns.client.clone(), ns, settings, extra, kubelet::skyport_exe(), (None, Acting::always())).await
    }

    /// Like [`TunnelOperator::start_with`], checking tunnels with `probe` instead of the real
    /// end-to-end check: a stand-in for exit servers that cannot run (LocalStack boots no VM).
    pub async fn start_with_probe(
        ns: &TestNs,
        settings: skyport::config::TunnelArgs,
        extra: Vec<Arc<dyn providers::HostProvider>>,
        probe: Arc<dyn skyport::controllers::tunnel::observe::Probe>,
    ) -> Self {
        Self::start_full(
            ns.client.clone(),
            ns,
            settings,
            extra,
            kubelet::skyport_exe(),
            (Some(probe), Acting::always()),
        )
        .await
    }

    /// Like [`TunnelOperator::start_with`], with `exe` as the operator's own executable: the
    /// binary whose digest exit servers check (the static build guests download).
    pub async fn start_serving(
        ns: &TestNs,
        settings: skyport::config::TunnelArgs,
        extra: Vec<Arc<dyn providers::HostProvider>>,
        exe: std::path::PathBuf,
    ) -> Self {
        Self::start_full(ns.client.clone(), ns, settings, extra, exe, (None, Acting::always())).await
    }

    async fn start_full(
        client: kube::Client,
        ns: &TestNs,
        settings: skyport::config::TunnelArgs,
        extra: Vec<Arc<dyn providers::HostProvider>>,
        own_exe: std::path::PathBuf,
        (probe, acting): (Option<Arc<dyn skyport::controllers::tunnel::observe::Probe>>, Acting),
    ) -> Self {
        use futures::FutureExt;
        if std::env::var_os("RUST_LOG").is_some() {
            skyport::telemetry::init(skyport::telemetry::LogFormat::Text);
        }
        let state = local_state_dir(ns);
        // The operator's "own executable" is the skyport binary of this build (a test binary
        // is not one). A test that names another one gives the local provider a broken binary
        // on purpose; the digest still comes from the real one.
        let mut settings = settings;
        let local_exe = if settings.self_exe.as_os_str() == "/proc/self/exe" {
            kubelet::skyport_exe()
        } else {
            settings.self_exe.clone()
        };
        settings.self_exe = own_exe;
        let mut local_settings = providers::local::LocalSettings::new(&state, local_exe);
        (local_settings.first_address, local_settings.last_address) = settings.local_addresses;
        let local = Arc::new(providers::local::LocalProvider::new(local_settings).expect("local provider"));
        let mut all: Vec<Arc<dyn providers::HostProvider>> = vec![local.clone()];
        all.extend(extra);
        let registry = skyport::controllers::tunnel::Providers::new(settings.provider.clone(), all);
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = rx.await;
        }
        .boxed()
        .shared();
        let backoff = skyport::controllers::Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        let cluster_id = settings.cluster_id.clone().unwrap_or_else(|| test_cluster_id(ns));
        let (ctx, tunnels) = skyport::controllers::tunnel::controller(
            client.clone(),
            registry,
            probe.unwrap_or_else(|| Arc::new(skyport::controllers::tunnel::observe::NetworkProbe)),
            settings.clone(),
            backoff,
            Some(ns.name.clone()),
            cluster_id,
            acting.clone(),
            shutdown.clone(),
        );
        let (services, svc_run) = skyport::controllers::service::controller(
            client,
            settings,
            ctx.tunnels.clone(),
            Some(ns.name.clone()),
            acting,
            shutdown,
        );
        let task = tokio::spawn(async move {
            tokio::join!(tunnels, svc_run);
        });
        TunnelOperator { ctx, services, local, stop: Some(tx), task, state }
    }

    /// A warm standby for `ns` with `settings` (an active operator's, `ctx.settings`) and the
    /// active one's `extra` providers: its
    /// controllers watch and keep their caches, and act only once the returned gate opens, as
    /// `skyport run --leader-elect` does while it waits for the Lease. It shares the active one's
    /// local provider state, as replicas share a cloud.
    pub async fn start_standby(
        ns: &TestNs,
        settings: skyport::config::TunnelArgs,
        extra: Vec<Arc<dyn providers::HostProvider>>,
    ) -> (Gate, Self) {
        let (gate, acting) = Gate::shut();
        let exe = settings.self_exe.clone();
        let op = Self::start_full(ns.client.clone(), ns, settings, extra, exe, (None, acting)).await;
        (gate, op)
    }

    /// Ends the controllers at once, as SIGKILL ends the operator's process: nothing in flight
    /// finishes. Its exit servers run on, as VMs outlive the operator that ordered them (and
    /// [`TunnelOperator::stop`] afterwards leaves them to the next operator).
    pub fn kill(&self) {
        self.task.abort();
    }

    /// Stops the controllers, letting reconciles in flight finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), &mut self.task).await;
        // Stopping a controller is not deleting its exit servers: keep them for the next one.
        self.state = std::path::PathBuf::new();
    }
}

/// Where most Tunnel tests start: an operator for `ns`, a LoadBalancer Service of skyport's
/// class, and its tunnel client running as a kubelet would run the client Deployment (a Tunnel
/// is Active only once its client connects).
pub struct WebTunnel {
    pub ns: TestNs,
    pub op: TunnelOperator,
    pub services: Api<Service>,
    pub tunnels: Api<Tunnel>,
    pub kubelet: kubelet::ClientRunner,
}

impl WebTunnel {
    /// With the Service [`web`]`("web")`.
    pub async fn start(ns: TestNs, settings: skyport::config::TunnelArgs) -> Self {
        Self::start_with(ns, settings, web("web")).await
    }

    /// With `service`, which must be named `web`: the client runner is for `web-tunnel`.
    pub async fn start_with(ns: TestNs, settings: skyport::config::TunnelArgs, service: Service) -> Self {
        let op = TunnelOperator::start(&ns, settings).await;
        let services: Api<Service> = ns.api();
        let tunnels: Api<Tunnel> = ns.api();
        services.create(&Default::default(), &service).await.unwrap();
        let kubelet = kubelet::ClientRunner::start(
            ns.client.clone(),
            &ns.name,
            "web-tunnel-client",
            kubelet::Backends::default(),
        );
        WebTunnel { ns, op, services, tunnels, kubelet }
    }
}

/// Ends a Tunnel test: deletes every Tunnel (and Service) while the controllers still run, so
/// their exit servers go too; checks none is left; stops the controllers; deletes the namespace.
pub async fn finish_tunnels(op: TunnelOperator, ns: TestNs) {
    use providers::HostProvider;
    let services: Api<k8s_openapi::api::core::v1::Service> = ns.api();
    let _ = services.delete_collection(&DeleteParams::default(), &Default::default()).await;
    let tunnels: Api<skyport::crd::Tunnel> = ns.api();
    let _ = tunnels.delete_collection(&DeleteParams::default(), &Default::default()).await;
    eventually("all Tunnels of the test deleted", Duration::from_secs(60), || async {
        tunnels.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    let left =
        op.local.list_by_tag(providers::hosts::TAG_MANAGED_BY, providers::hosts::MANAGED_BY_VALUE).await.unwrap();
    assert!(left.is_empty(), "exit servers leaked: {left:?}");
    op.stop().await;
    ns.cleanup().await;
}

pub fn service(name: &str, class: Option<&str>, annotations: serde_json::Value, ports: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": class, "ports": ports, "selector": {"app": name}},
    }))
    .unwrap()
}

pub fn web(name: &str) -> Service {
    service(
        name,
        Some("skyport.dev/tunnel"),
        serde_json::json!({}),
        serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
    )
}

/// Waits until the Tunnel is Active and returns it.
pub async fn active(api: &Api<Tunnel>, name: &str, timeout: Duration) -> Tunnel {
    let found = active_within(api, name, timeout).await;
    found.unwrap_or_else(|last| panic!("Tunnel {name} not Active after {timeout:?}; last status: {last:#?}"))
}

/// The Tunnel once it is Active within `timeout`; else the last Tunnel read, for a test to say
/// more about why before it fails.
pub async fn active_within(api: &Api<Tunnel>, name: &str, timeout: Duration) -> Result<Tunnel, Option<Tunnel>> {
    let mut last = None;
    let found = tokio::time::timeout(timeout, async {
        loop {
            if let Ok(t) = api.get(name).await {
                if t.status.as_ref().and_then(|s| s.phase) == Some(TunnelPhase::Active) {
                    return t;
                }
                last = Some(t);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    found.map_err(|_| last)
}

pub fn host_ip(t: &Tunnel) -> String {
    t.status.as_ref().and_then(|s| s.host_ip.clone()).expect("hostIp")
}

pub fn host_id(t: &Tunnel) -> String {
    t.status.as_ref().and_then(|s| s.host_id.clone()).expect("hostId")
}

pub fn ingress_ip(s: &Service) -> Option<String> {
    s.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()
}

pub async fn events(client: &Client, ns: &str, involved: &str) -> Vec<(String, String)> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(involved))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// [`events`] on `involved` once one of them has reason `reason`: an Event is published after the
/// change it reports, so a test that has just seen the change may list the Events before it is.
pub async fn events_with(client: &Client, ns: &str, involved: &str, reason: &str) -> Vec<(String, String)> {
    eventually(&format!("a {reason} Event on {involved}"), Duration::from_secs(30), || async {
        let all = events(client, ns, involved).await;
        all.iter().any(|(r, _)| r == reason).then_some(all)
    })
    .await
}

/// Real bytes through the real tunnel, 1 MiB over TCP (checked by content) and a datagram over
/// UDP, until they arrive (the client connects a moment after it starts).
pub async fn carries(ip: &str, tcp: u16, udp: Option<u16>) {
    let payload: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    eventually(&format!("TCP {ip}:{tcp} through the tunnel"), Duration::from_secs(30), || async {
        let (tag, echoed) = tcp_echo(ip, tcp, &payload).await?;
        assert_eq!(tag, tcp, "reached the backend of port {tag}, not {tcp}");
        assert!(echoed == payload, "bytes changed on the way");
        Some(())
    })
    .await;
    if let Some(udp) = udp {
        eventually(&format!("UDP {ip}:{udp} through the tunnel"), Duration::from_secs(30), || async {
            let reply = udp_echo(ip, udp, b"ping").await?;
            assert_eq!(reply, format!("{udp}:ping").into_bytes());
            Some(())
        })
        .await;
    }
}

/// TCP port `port` at `ip` reaches, within 30 s, the echo tagged `tag` (each echo tags its replies
/// with a port, so a reply says whose backend answered).
pub async fn reaches(ip: &str, port: u16, tag: u16) {
    eventually(&format!("{ip}:{port} reaching the backend tagged {tag}"), Duration::from_secs(30), || async {
        let (got, echoed) = tcp_echo(ip, port, b"hello").await?;
        (got == tag && echoed == b"hello").then_some(())
    })
    .await;
}

pub fn ready(t: &Tunnel) -> Option<(ConditionStatus, String, String)> {
    let c = t.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason.to_string(), c.message.to_string()))
}

/// Fast settings with an orphan sweep every 2 s.
pub fn sweeping_settings() -> skyport::config::TunnelArgs {
    skyport::config::TunnelArgs { orphan_sweep_interval: Duration::from_secs(2), ..fast_tunnel_settings() }
}

/// Waits for two more orphan sweep passes, so at least one whole pass saw what exists now.
pub async fn two_more_sweeps(op: &TunnelOperator) {
    use std::sync::atomic::Ordering::Relaxed;
    let passes = op.ctx.sweeps.load(Relaxed);
    eventually("two more sweep passes", Duration::from_secs(20), || async {
        (op.ctx.sweeps.load(Relaxed) >= passes + 2).then_some(())
    })
    .await;
}

/// Waits until the Tunnel `name` no longer exists (its finalizer ran).
pub async fn gone(tunnels: &Api<Tunnel>, name: &str) {
    eventually(&format!("Tunnel {name} gone"), Duration::from_secs(60), || async {
        tunnels.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Kills the local exit server `id`'s process behind skyport's back, as a cloud VM would die.
pub fn kill_exit_server(op: &TunnelOperator, id: &str) {
    signal_exit_server(op, id, "KILL");
}

/// Sends `signal` (`kill -s` spelling) to the local exit server `id`'s process: `STOP` hangs it
/// as a stalled VM hangs (its sockets stay open and the kernel completes handshakes on them, but
/// nothing answers), `CONT` lets it go on.
pub fn signal_exit_server(op: &TunnelOperator, id: &str, signal: &str) {
    let pid = std::fs::read_to_string(op.local.host_dir(id).join("pid")).unwrap().trim().to_string();
    assert!(std::process::Command::new("kill").args(["-s", signal, &pid]).status().unwrap().success());
}

/// Waits until the Tunnel `name` is Active on an exit server other than `old_host`.
pub async fn active_elsewhere(tunnels: &Api<Tunnel>, name: &str, old_host: &str) -> Tunnel {
    active_elsewhere_within(tunnels, name, old_host, Duration::from_secs(30)).await
}

/// [`active_elsewhere`], for exit servers that take `timeout` to boot.
pub async fn active_elsewhere_within(tunnels: &Api<Tunnel>, name: &str, old_host: &str, timeout: Duration) -> Tunnel {
    eventually("Tunnel Active on a new exit server", timeout, || async {
        let t = tunnels.get(name).await.ok()?;
        let s = t.status.as_ref()?;
        (s.host_id.as_deref() != Some(old_host) && s.phase == Some(TunnelPhase::Active)).then_some(t)
    })
    .await
}

/// A random UUID, as Kubernetes gives objects.
pub fn uuid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

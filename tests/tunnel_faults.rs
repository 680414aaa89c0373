//! Fault suite, a misbehaving cloud for Tunnels: the Tunnel controller talks to its exit-server
//! provider (the local one: real `skyport tunnel server` processes) through a layer that fails
//! half the calls (rate limited with a Retry-After, unavailable, answered after 1 s) while
//! LoadBalancer Services are created, edited (their port) and deleted. Then the faults stop.
//! Checks, from the layer's record of every call: no Tunnel is called again sooner than its
//! backoff (or the Retry-After) after a failed call, and the backlog drains: every live Tunnel
//! Active and carrying bytes to the Service's current port, every deleted one gone, exactly one
//! exit server per live Tunnel, none left without one.
//!
//! CI: 6 Services, 20 s of faults. Full run:
//! `SKYPORT_FAULTS_SERVICES=20 SKYPORT_FAULTS_SECONDS=90 cargo test --test integration tunnel_faults:: -- --include-ignored --nocapture`

use crate::common;
use crate::common::crash;
use crate::common::tunnels;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::kubelet::{AllClients, tcp_echo};
use common::private_env::setting;
use common::{TestNs, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use providers::hosts::TAG_TUNNEL_UID;
use providers::local::LocalProvider;
use providers::{ExitServer, Host, HostError, HostProvider, HostRequest, Limiter};
use rand::Rng;
use skyport::crd::{Tunnel, TunnelPhase};
use tunnels::{TunnelOperator, fast_tunnel_settings, finish_tunnels, service};

/// What the cloud answers when it refuses a call for being too fast.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The harness's Tunnel backoff starts at 200 ms; its jitter takes up to a quarter off.
const SHORTEST_RETRY: Duration = Duration::from_millis(150);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    RateLimited,
    Unavailable,
    Slow,
}

#[derive(Debug, Clone)]
struct Call {
    at: Instant,
    operation: &'static str,
    /// The Tunnel's UID, where the call names it or a host known to carry it.
    tunnel: String,
    fault: Option<Fault>,
}

/// The local provider behind a layer that fails half the calls while `faulty`.
struct Faulty {
    inner: LocalProvider,
    faulty: AtomicBool,
    calls: Mutex<Vec<Call>>,
    /// Host id → the Tunnel UID it carries, as calls revealed it.
    owners: Mutex<BTreeMap<String, String>>,
}

impl Faulty {
    fn learn(&self, hosts: &[Host]) {
        let mut owners = self.owners.lock().unwrap();
        for h in hosts {
            if let Some(uid) = h.tags.get(TAG_TUNNEL_UID) {
                owners.insert(h.id.clone(), uid.clone());
            }
        }
    }

    fn owner(&self, id: &str) -> String {
        self.owners.lock().unwrap().get(id).cloned().unwrap_or_default()
    }

    /// Records the call and decides its fault.
    async fn enter(&self, operation: &'static str, tunnel: String) -> Result<(), HostError> {
        let fault = if self.faulty.load(Ordering::Relaxed) && rand::rng().random_bool(0.5) {
            Some([Fault::RateLimited, Fault::Unavailable, Fault::Slow][rand::rng().random_range(0..3)])
        } else {
            None
        };
        self.calls.lock().unwrap().push(Call { at: Instant::now(), operation, tunnel, fault });
        match fault {
            Some(Fault::RateLimited) => {
                Err(HostError::RateLimited { provider: "local", retry_after: Some(RETRY_AFTER) })
            }
            Some(Fault::Unavailable) => {
                Err(HostError::Unavailable { provider: "local", message: "HTTP 503 Service Unavailable".into() })
            }
            Some(Fault::Slow) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[async_trait]
impl HostProvider for Faulty {
    async fn create(&self, request: &HostRequest) -> Result<Host, HostError> {
        self.enter("create", request.tags.get(TAG_TUNNEL_UID).cloned().unwrap_or_default()).await?;
        let host = self.inner.create(request).await?;
        self.learn(std::slice::from_ref(&host));
        Ok(host)
    }

    async fn get(&self, id: &str) -> Result<Option<Host>, HostError> {
        self.enter("get", self.owner(id)).await?;
        self.inner.get(id).await
    }

    async fn delete(&self, id: &str) -> Result<(), HostError> {
        self.enter("delete", self.owner(id)).await?;
        self.inner.delete(id).await
    }

    async fn list_by_tag(&self, key: &str, value: &str) -> Result<Vec<Host>, HostError> {
        let tunnel = if key == TAG_TUNNEL_UID { value.to_string() } else { String::new() };
        self.enter("list", tunnel).await?;
        let hosts = self.inner.list_by_tag(key, value).await?;
        self.learn(&hosts);
        Ok(hosts)
    }

    async fn reconfigure(&self, id: &str, server: &ExitServer) -> Result<bool, HostError> {
        self.enter("reconfigure", self.owner(id)).await?;
        self.inner.reconfigure(id, server).await
    }

    fn name(&self) -> &'static str {
        // Takes the local provider's place in the operator's registry.
        "local"
    }

    fn limiter(&self) -> &Limiter {
        self.inner.limiter()
    }
}

fn web(name: &str, port: u16) -> Service {
    service(
        name,
        Some("skyport.dev/tunnel"),
        serde_json::json!({}),
        serde_json::json!([{"name": "http", "port": port}]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn under_rate_limits_outages_and_slow_answers_tunnels_back_off_and_all_converge() {
    let count = setting("SKYPORT_FAULTS_SERVICES", 6) as usize;
    let fault_time = Duration::from_secs(setting("SKYPORT_FAULTS_SECONDS", 20));
    let ns = TestNs::new("tun-faults").await;
    let faulty = Arc::new(Faulty {
        inner: tunnels::local_provider(&ns),
        faulty: AtomicBool::new(true),
        calls: Mutex::default(),
        owners: Mutex::default(),
    });
    let op = TunnelOperator::start_with(&ns, fast_tunnel_settings(), vec![faulty.clone()]).await;
    let services: Api<Service> = ns.api();
    let tunnels: Api<Tunnel> = ns.api();
    let _clients = AllClients::start(ns.client.clone(), &ns.name);

    let faults_on = Instant::now();
    let mut live: BTreeMap<String, u16> = BTreeMap::new();
    for i in 0..count {
        let name = format!("web{i}");
        services.create(&PostParams::default(), &web(&name, 8080)).await.unwrap();
        live.insert(name, 8080);
    }
    // Some change their port and some go while the cloud misbehaves.
    tokio::time::sleep(fault_time / 3).await;
    let mut deleted = BTreeSet::new();
    for i in (0..count).step_by(3) {
        let name = format!("web{i}");
        services.delete(&name, &DeleteParams::default()).await.unwrap();
        live.remove(&name);
        deleted.insert(name);
    }
    for i in (1..count).step_by(3) {
        let name = format!("web{i}");
        let patch = serde_json::json!({"spec": {"ports": [{"name": "http", "port": 9090}]}});
        services.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        live.insert(name, 9090);
    }
    // A user's edit or deletion goes ahead at once, backoff or not: count from a little after.
    let settled = Instant::now() + Duration::from_secs(3);
    tokio::time::sleep(fault_time.saturating_sub(faults_on.elapsed())).await;
    faulty.faulty.store(false, Ordering::Relaxed);
    let faults_off = Instant::now();

    let drained = eventually("the backlog drains", Duration::from_secs(120), || async {
        let list = tunnels.list(&ListParams::default()).await.ok()?;
        let by_name: BTreeMap<String, &Tunnel> =
            list.items.iter().map(|t| (t.metadata.name.clone().unwrap_or_default(), t)).collect();
        if deleted.iter().any(|s| by_name.contains_key(&format!("{s}-tunnel"))) {
            return None;
        }
        for (svc, port) in &live {
            let status = by_name.get(&format!("{svc}-tunnel"))?.status.as_ref()?;
            (status.phase == Some(TunnelPhase::Active)).then_some(())?;
            let ip = services.get(svc).await.ok()?.status?.load_balancer?.ingress?.first()?.ip.clone()?;
            let (tag, echoed) = tcp_echo(&ip, *port, b"faults").await?;
            (tag == *port && echoed == b"faults").then_some(())?;
        }
        Some(faults_off.elapsed())
    })
    .await;

    let audit = crash::exit_servers_by_owner(&tunnels, &op.local, &op.ctx.cluster_id).await;
    let calls = faulty.calls.lock().unwrap().clone();
    let too_soon = retried_too_soon(&calls, settled);
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for c in &calls {
        *faults.entry(c.fault.map_or("none".into(), |f| format!("{f:?}"))).or_default() += 1;
    }
    println!(
        "misbehaving cloud, Tunnels: {fault_time:?} of faults at 50% ({faults:?}), provider calls {}, Services created {count} / \
         edited {} / deleted {}, backlog drained {drained:?} after the faults stopped, exit servers {} for {} live Tunnels, \
         leaks {}, duplicates {}, retries sooner than the backoff or Retry-After {too_soon}",
        calls.len(),
        (1..count).step_by(3).count(),
        deleted.len(),
        audit.hosts,
        live.len(),
        audit.leaks,
        audit.duplicates,
    );
    assert_eq!((audit.leaks, audit.duplicates, too_soon), (0, 0, 0), "exit servers per Tunnel: {:?}", audit.per_owner);
    finish_tunnels(op, ns).await;
}

/// Calls for a Tunnel that came sooner after a failed call for it than the backoff allows (the
/// Retry-After for a rate-limited one), counted after `settled` (the test's own edits and
/// deletions wake a Tunnel at once).
fn retried_too_soon(calls: &[Call], settled: Instant) -> usize {
    let mut last_failure: BTreeMap<&str, &Call> = BTreeMap::new();
    let mut too_soon = 0;
    for c in calls {
        if c.tunnel.is_empty() {
            continue;
        }
        if let Some(failed) = last_failure.remove(c.tunnel.as_str()) {
            let wait = if failed.fault == Some(Fault::RateLimited) { RETRY_AFTER } else { SHORTEST_RETRY };
            let gap = c.at.duration_since(failed.at);
            if gap < wait && c.at > settled {
                println!(
                    "retried too soon: {} {} {:?}, then {} after {gap:?}",
                    c.tunnel, failed.operation, failed.fault, c.operation
                );
                too_soon += 1;
            }
        }
        if matches!(c.fault, Some(Fault::RateLimited | Fault::Unavailable)) {
            last_failure.insert(&c.tunnel, c);
        }
    }
    too_soon
}

#[test]
fn the_early_retry_count_sees_a_retry_inside_the_backoff_or_the_retry_after() {
    let t0 = Instant::now();
    let call = |ms: u64, fault: Option<Fault>| Call {
        at: t0 + Duration::from_millis(ms),
        operation: "list",
        tunnel: "uid-1".into(),
        fault,
    };
    let settled = t0;
    assert_eq!(retried_too_soon(&[call(1, Some(Fault::Unavailable)), call(11, None)], settled), 1);
    assert_eq!(retried_too_soon(&[call(1, Some(Fault::Unavailable)), call(301, None)], settled), 0);
    assert_eq!(retried_too_soon(&[call(1, Some(Fault::RateLimited)), call(501, None)], settled), 1, "Retry-After");
    assert_eq!(retried_too_soon(&[call(1, Some(Fault::Slow)), call(2, None)], settled), 0, "slow is not a failure");
    let before_settled = t0 + Duration::from_secs(10);
    assert_eq!(retried_too_soon(&[call(1, Some(Fault::Unavailable)), call(11, None)], before_settled), 0);
}

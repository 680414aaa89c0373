//! The crash test's two workloads, used by tests/crash.rs and tests/tunnel_faults.rs: random creates,
//! edits and deletes of Queues, and of LoadBalancer Services (each with its Tunnel), each with
//! what its end state must be once the last operator process has converged.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use providers::HostProvider;
use providers::hosts::{TAG_CLUSTER, TAG_TUNNEL_UID};
use providers::local::LocalProvider;
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use skyport::crd::{ConditionStatus, Queue, Tunnel, TunnelPhase};

use crate::common::bait::{Attempt, Bait};
use crate::common::kubelet::{Backends, ClientRunner, tcp_echo};
use crate::common::{attributes, eventually, queue, ready, sqs};

/// How many objects a workload created, edited and deleted.
#[derive(Debug, Default)]
pub struct Counts {
    pub created: u64,
    pub edited: u64,
    pub deleted: u64,
    next: u64,
}

/// What a random step does: half creates (always while fewer than `min_live` exist), 30 %
/// edits, 20 % deletes; returns the new object's number for a create.
fn pick<T>(rng: &mut StdRng, live: &BTreeMap<String, T>, min_live: usize, counts: &mut Counts) -> Step {
    let choice = rng.random_range(0..10);
    if live.len() < min_live || choice < 5 {
        counts.next += 1;
        counts.created += 1;
        Step::Create(counts.next - 1)
    } else {
        let name = live.keys().nth(rng.random_range(0..live.len())).unwrap().clone();
        if choice < 8 {
            counts.edited += 1;
            Step::Edit(name)
        } else {
            counts.deleted += 1;
            Step::Delete(name)
        }
    }
}

enum Step {
    Create(u64),
    Edit(String),
    Delete(String),
}

/// Objects in `api` that wait on a finalizer.
async fn stuck<K>(api: &Api<K>) -> usize
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|o| o.meta().deletion_timestamp.is_some())
        .count()
}

/// Queues, each with a visibility timeout the end state must show in SQS, and Queues aimed at
/// another tenant's queues (adopting them, or sending them dead letters) that must stay refused.
pub struct Queues {
    api: Api<Queue>,
    /// Name → the visibility timeout last written to its spec.
    pub live: BTreeMap<String, i32>,
    pub gone: BTreeSet<String>,
    pub counts: Counts,
    bait: Option<Bait>,
    /// Queues aimed at bait: name → the reason each must be refused with.
    pub refused: BTreeMap<String, &'static str>,
}

/// The end state of the Queues: (leaked SQS queues, duplicates, live Queues missing their queue
/// or their latest spec, stuck finalizers, bait queues changed by anyone: steals).
#[derive(Debug, PartialEq, Eq)]
pub struct QueueAudit {
    pub leaks: usize,
    pub duplicates: usize,
    pub missing: usize,
    pub stuck: usize,
    pub steals: usize,
}

impl Queues {
    pub fn new(api: Api<Queue>) -> Self {
        Queues {
            api,
            live: BTreeMap::new(),
            gone: BTreeSet::new(),
            counts: Counts::default(),
            bait: None,
            refused: BTreeMap::new(),
        }
    }

    /// One create in four aims at one of `bait`'s queues instead.
    pub fn with_bait(self, bait: Bait) -> Self {
        Queues { bait: Some(bait), ..self }
    }

    pub async fn step(&mut self, rng: &mut StdRng) {
        let timeout = rng.random_range(10..100);
        match pick(rng, &self.live, 3, &mut self.counts) {
            Step::Create(n) if self.bait.is_some() && rng.random_range(0..4) == 0 => {
                let attempt = if rng.random_bool(0.5) { Attempt::Adopt } else { Attempt::DeadLetter };
                let bait = self.bait.as_ref().expect("bait");
                let (spec, reason) = bait.spec(rng.random_range(0..bait.queues.len()), attempt);
                let name = format!("steal{n}");
                self.api.create(&PostParams::default(), &queue(&name, spec)).await.unwrap();
                self.refused.insert(name, reason);
            }
            Step::Create(n) => {
                let name = format!("q{n}");
                let spec = json!({"visibilityTimeoutSeconds": timeout});
                self.api.create(&PostParams::default(), &queue(&name, spec)).await.unwrap();
                self.live.insert(name, timeout);
            }
            Step::Edit(name) => {
                // Exports come and go with the edits: more writes per reconcile to interrupt.
                let exports = if rng.random_bool(0.5) {
                    json!([{"kind": "ConfigMap", "name": format!("{name}-export"), "keys": {"url": "URL"}}])
                } else {
                    json!([])
                };
                let patch = json!({"spec": {"visibilityTimeoutSeconds": timeout, "exports": exports}});
                self.api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
                self.live.insert(name, timeout);
            }
            Step::Delete(name) => {
                self.api.delete(&name, &DeleteParams::default()).await.unwrap();
                self.live.remove(&name);
                self.gone.insert(name);
            }
        }
    }

    /// Waits until every live Queue is Ready at its generation and every deleted one is gone.
    pub async fn converge(&self, timeout: Duration) -> Duration {
        let since = Instant::now();
        eventually("every live Queue Ready at its generation, every deleted one gone", timeout, || async {
            let list = self.api.list(&ListParams::default()).await.ok()?;
            let by_name: BTreeMap<String, &Queue> =
                list.items.iter().map(|q| (q.metadata.name.clone().unwrap(), q)).collect();
            let all_ready = self.live.keys().all(|n| {
                by_name.get(n).is_some_and(|q| {
                    ready(q) == Some((ConditionStatus::True, "Available".into()))
                        && q.status.as_ref().and_then(|s| s.observed_generation) == q.metadata.generation
                })
            });
            let all_gone = self.gone.iter().all(|n| !by_name.contains_key(n));
            let all_refused = self.refused.iter().all(|(n, reason)| {
                by_name.get(n).is_some_and(|q| ready(q) == Some((ConditionStatus::False, reason.to_string())))
            });
            (all_ready && all_gone && all_refused).then_some(())
        })
        .await;
        since.elapsed()
    }

    /// SQS queues of namespace `ns` by owner, against the Queues that live.
    pub async fn audit(&self, ns: &str) -> QueueAudit {
        let sqs = sqs().await;
        let owners: BTreeMap<String, usize> = crate::common::private_env::queues_by_owner(&sqs, ns)
            .await
            .into_iter()
            .map(|(uid, urls)| (uid, urls.len()))
            .collect();
        let mut live_uids = BTreeSet::new();
        let mut missing = 0;
        for (name, timeout) in &self.live {
            let q = self.api.get(name).await.unwrap();
            let uid = q.metadata.uid.clone().unwrap();
            let url = q.status.and_then(|s| s.queue_url).unwrap_or_default();
            let current =
                if url.is_empty() { None } else { attributes(&sqs, &url).await.get("VisibilityTimeout").cloned() };
            if owners.get(&uid).copied().unwrap_or_default() == 0 || current != Some(timeout.to_string()) {
                missing += 1;
            }
            live_uids.insert(uid);
        }
        let leaks = owners.iter().filter(|(uid, _)| !live_uids.contains(*uid)).map(|(_, n)| n).sum();
        let duplicates = owners.iter().filter(|(uid, _)| live_uids.contains(*uid)).map(|(_, n)| n - 1).sum();
        let steals = match &self.bait {
            Some(bait) => bait.steals().await,
            None => 0,
        };
        QueueAudit { leaks, duplicates, missing, stuck: stuck(&self.api).await, steals }
    }

    /// Deletes every Queue and waits until they are gone (an operator must run).
    pub async fn remove_all(&self) {
        let _ = self.api.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
        eventually("all Queues deleted", Duration::from_secs(60), || async {
            self.api.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await;
    }

    /// After [`Queues::remove_all`]: deleting the Queues aimed at the bait left it as it was too.
    /// Then the bait goes.
    pub async fn remove_bait(&self) {
        let Some(bait) = &self.bait else { return };
        assert_eq!(bait.steals().await, 0, "deleting the Queues that aimed at another tenant's queues changed them");
        bait.remove().await;
    }
}

/// LoadBalancer Services served by skyport, each with one port the end state must carry bytes on.
pub struct Tunnels {
    services: Api<Service>,
    tunnels: Api<Tunnel>,
    /// Service name → its current port.
    pub live: BTreeMap<String, u16>,
    pub gone: BTreeSet<String>,
    pub counts: Counts,
}

/// The end state of the Tunnels: exit servers of the cluster, leaked (no live Tunnel), duplicates
/// (more than one per Tunnel), stuck finalizers, and the exit servers per owner for a failure.
#[derive(Debug)]
pub struct TunnelAudit {
    pub hosts: usize,
    pub leaks: usize,
    pub duplicates: usize,
    pub stuck: usize,
    pub per_owner: BTreeMap<String, usize>,
}

/// Exit servers tagged with `cluster` by the Tunnel UID they carry, against the Tunnels in `api`.
pub async fn exit_servers_by_owner(api: &Api<Tunnel>, local: &LocalProvider, cluster: &str) -> TunnelAudit {
    let live: BTreeSet<String> =
        api.list(&ListParams::default()).await.unwrap().items.iter().filter_map(|t| t.metadata.uid.clone()).collect();
    let hosts = local.list_by_tag(TAG_CLUSTER, cluster).await.unwrap();
    let mut per_owner: BTreeMap<String, usize> = BTreeMap::new();
    for h in &hosts {
        *per_owner.entry(h.tags.get(TAG_TUNNEL_UID).cloned().unwrap_or_default()).or_default() += 1;
    }
    let leaks = per_owner.iter().filter(|(uid, _)| !live.contains(*uid)).map(|(_, n)| n).sum();
    let duplicates = per_owner.iter().filter(|(uid, _)| live.contains(*uid)).map(|(_, n)| n - 1).sum();
    TunnelAudit { hosts: hosts.len(), leaks, duplicates, stuck: stuck(api).await, per_owner }
}

fn service(name: &str, port: u16) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": [{"port": port}]},
    }))
    .unwrap()
}

impl Tunnels {
    pub fn new(services: Api<Service>, tunnels: Api<Tunnel>) -> Self {
        Tunnels { services, tunnels, live: BTreeMap::new(), gone: BTreeSet::new(), counts: Counts::default() }
    }

    pub async fn step(&mut self, rng: &mut StdRng) {
        let port = rng.random_range(20000..30000);
        match pick(rng, &self.live, 2, &mut self.counts) {
            Step::Create(n) => {
                let name = format!("web{n}");
                self.services.create(&PostParams::default(), &service(&name, port)).await.unwrap();
                self.live.insert(name, port);
            }
            Step::Edit(name) => {
                let patch = json!({"spec": {"ports": [{"port": port}]}});
                self.services.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
                self.live.insert(name, port);
            }
            Step::Delete(name) => {
                self.services.delete(&name, &DeleteParams::default()).await.unwrap();
                self.live.remove(&name);
                self.gone.insert(name);
            }
        }
    }

    /// Runs every live Service's tunnel client (as the kubelet would have all along) and waits
    /// until every live Tunnel is Active and its ingress carries bytes to the Service's current
    /// port, and every deleted one is gone. Returns the clients (they stop when dropped), how
    /// many Tunnels carried bytes, and how long it took.
    pub async fn converge(&self, client: &Client, ns: &str, timeout: Duration) -> (Vec<ClientRunner>, usize, Duration) {
        let backends = Backends::default();
        let clients: Vec<ClientRunner> = self
            .live
            .keys()
            .map(|s| ClientRunner::start(client.clone(), ns, &format!("{s}-tunnel-client"), backends.clone()))
            .collect();
        let since = Instant::now();
        let carried =
            eventually("every live Tunnel Active and carrying bytes, every deleted one gone", timeout, || async {
                let list = self.tunnels.list(&ListParams::default()).await.ok()?;
                let by_name: BTreeMap<String, &Tunnel> =
                    list.items.iter().map(|t| (t.metadata.name.clone().unwrap(), t)).collect();
                if self.gone.iter().any(|s| by_name.contains_key(&format!("{s}-tunnel"))) {
                    return None;
                }
                let mut carried = 0;
                for (svc, port) in &self.live {
                    let status = by_name.get(&format!("{svc}-tunnel"))?.status.as_ref()?;
                    if status.phase != Some(TunnelPhase::Active) {
                        return None;
                    }
                    let ip = self.services.get(svc).await.ok()?.status?.load_balancer?.ingress?.first()?.ip.clone()?;
                    let (tag, echoed) = tcp_echo(&ip, *port, b"crash").await?;
                    (tag == *port && echoed == b"crash").then_some(())?;
                    carried += 1;
                }
                Some(carried)
            })
            .await;
        (clients, carried, since.elapsed())
    }

    /// Exit servers tagged with `cluster` by owner, against the Tunnels that live.
    pub async fn audit(&self, local: &LocalProvider, cluster: &str) -> TunnelAudit {
        exit_servers_by_owner(&self.tunnels, local, cluster).await
    }

    /// Deletes every Service, waits until their Tunnels are gone (an operator must run), and
    /// returns the exit servers still tagged with `cluster` after deleting them.
    pub async fn remove_all(&self, local: &LocalProvider, cluster: &str) -> Vec<providers::Host> {
        let _ = self.services.delete_collection(&DeleteParams::default(), &ListParams::default()).await;
        eventually("all Tunnels deleted", Duration::from_secs(60), || async {
            self.tunnels.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await;
        let left = local.list_by_tag(TAG_CLUSTER, cluster).await.unwrap();
        for h in &left {
            let _ = local.delete(&h.id).await;
        }
        left
    }
}

//! Several active replicas: shards, each held through its own `coordination.k8s.io/v1` Lease.
//!
//! Every object belongs to a shard ([`crate::controllers::Sharded`]: Queues by AwsAccount,
//! Tunnels as one). Which replicas are alive is read from Leases only: each replica renews a
//! replica Lease of its own. Every round (a quarter of the Lease duration) a replica lists the
//! Leases of its group, renews what it holds, takes free or expired shard Leases while it holds
//! fewer than its fair share (the shards over the live replicas, rounded up), and gives up
//! shards beyond its share or of shards that no longer exist ([`plan`]).
//!
//! It acts on a shard's objects only until half a Lease duration after the start of the round
//! that last renewed it ([`crate::controllers::Gate::hold`]), so it stops before the Lease could
//! expire at another replica, and reconciles in flight have that half to end. A shard it gives
//! up is first closed at the gate and renewed for that half, then released. A shard that could
//! not be renewed in time ends the process, as the single leader Lease does: its reconciles in
//! flight end with it, and a restart starts clean. Lease takeovers compare renewal times with the
//! local clock: clock skew between nodes beyond the margin is not covered.

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::controllers::Gate;
use crate::controllers::acting::Held;
use crate::leader::renew_margin;
use crate::metrics::ShardMetrics;
use plan::{Holding, View, lease_name, live_replicas};

/// Label naming the group (`--lease-name`) of every shard and replica Lease.
pub const LABEL_GROUP: &str = "skyport.dev/lease-group";
/// Label saying whether a Lease is a `shard` or a `replica`.
pub const LABEL_ROLE: &str = "skyport.dev/lease-role";
/// Annotation carrying the shard's name (Lease names may be cut and hashed).
pub const ANNOTATION_SHARD: &str = "skyport.dev/shard";

/// What the shards exist: read each round from the controllers' caches.
pub type Existing = Box<dyn Fn() -> BTreeSet<String> + Send + Sync>;

/// Where the Leases of one group live and how long they last.
#[derive(Debug, Clone)]
pub struct Group {
    pub namespace: String,
    /// The prefix of every Lease name, and the value of [`LABEL_GROUP`].
    pub name: String,
    pub duration: Duration,
    /// This replica's `holderIdentity`.
    pub identity: String,
}

/// One replica's part in sharding.
pub struct Shards {
    api: Api<Lease>,
    group: String,
    pub identity: String,
    duration: Duration,
    gate: Gate,
    existing: Existing,
    metrics: ShardMetrics,
    /// Shards acted on, each until a deadline.
    held: Held,
    /// Shards closed at the gate, each released at its moment.
    draining: BTreeMap<String, Instant>,
}

impl Shards {
    /// The shards of the Lease group `group`. `client` must time requests out after
    /// [`crate::leader::request_timeout`], as the leader Lease's does.
    pub fn new(client: Client, group: Group, gate: Gate, existing: Existing, metrics: ShardMetrics) -> Self {
        let api = Api::namespaced(client, &group.namespace);
        let (held, draining) = (Held::new(), BTreeMap::new());
        let Group { name, duration, identity, .. } = group;
        Shards { api, group: name, identity, duration, gate, existing, metrics, held, draining }
    }

    /// Takes, renews and gives up shard Leases until `done` (the controllers ended). From
    /// `shutdown` on it takes no more shards and reconciles waiting for one end, while what it
    /// holds is still renewed for the reconciles in flight. Returns why it must end the process
    /// when a shard Lease was lost (not renewed in time, or held by another replica while this
    /// one acted on it).
    pub async fn run(
        &mut self,
        shutdown: impl std::future::Future<Output = ()>,
        done: impl std::future::Future<Output = ()>,
    ) -> Result<(), String> {
        info!(identity = %self.identity, group = %self.group, "sharding: holding shard Leases");
        let period = renew_margin(self.duration) / 2;
        let (shutdown, done) = (shutdown.fuse(), done.fuse());
        tokio::pin!(shutdown, done);
        let mut stopping = false;
        loop {
            let started = Instant::now();
            self.round(started, stopping).await?;
            tokio::select! {
                _ = tokio::time::sleep_until(started + period) => {}
                _ = &mut shutdown, if !stopping => {
                    stopping = true;
                    self.gate.stop();
                }
                _ = &mut done => return Ok(()),
            }
        }
    }

    /// After the controllers stopped: every shard Lease and the replica Lease given up, so the
    /// other replicas take over at once.
    pub async fn release_all(mut self) {
        self.gate.hold(Held::new());
        let listed = self.list().await.unwrap_or_default();
        let mine: Vec<&Lease> = listed.iter().filter(|l| holder(l) == Some(self.identity.as_str())).collect();
        for lease in mine {
            match lease.annotations().get(ANNOTATION_SHARD) {
                Some(shard) => self.write(lease, None).await.map_or((), |_| info!(%shard, "released shard lease")),
                None => {
                    let _ = self.api.delete(&lease.name_any(), &DeleteParams::default()).await;
                }
            }
        }
        self.held.clear();
        self.draining.clear();
        self.metrics.held.set(0);
    }

    /// One round: list, renew the replica Lease, plan, write, and open the gate accordingly.
    async fn round(&mut self, started: Instant, stopping: bool) -> Result<(), String> {
        let listed = match self.list().await {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e, "listing the shard Leases failed; retrying");
                return self.check_deadlines();
            }
        };
        let now = Timestamp::now();
        let (mut shards, mut replicas) = (BTreeMap::new(), Vec::new());
        for lease in &listed {
            match lease.annotations().get(ANNOTATION_SHARD) {
                Some(shard) => {
                    shards.insert(shard.clone(), lease);
                }
                None => replicas.push(lease),
            }
        }
        self.renew_replica(&replicas).await;
        self.forget_dead_replicas(&replicas, now).await;
        for (shard, lease) in &shards {
            if self.held.contains_key(shard) && holder(lease) != Some(self.identity.as_str()) {
                return Err(format!("shard {shard} is held by {:?} while this replica acted on it", holder(lease)));
            }
        }
        let holdings: BTreeMap<String, Holding> = shards.iter().map(|(s, l)| (s.clone(), holding(l))).collect();
        let live = live_replicas(&self.identity, replicas.iter().map(|l| holding(l)).collect::<Vec<_>>().iter(), now);
        let existing = (self.existing)();
        let draining: BTreeSet<String> = self.draining.keys().cloned().collect();
        let view =
            View { me: &self.identity, now, shards: &existing, leases: &holdings, replicas: live, draining: &draining };
        let mut steps = plan::plan(&view);
        if stopping {
            steps.take.clear();
        }
        let margin = renew_margin(self.duration);
        let until = started + self.duration - margin;
        for shard in &steps.drain {
            info!(%shard, "giving up shard: over this replica's share, or no longer used");
            self.held.remove(shard);
            self.draining.insert(shard.clone(), started + margin);
        }
        self.gate.hold(self.held.clone());
        // Draining shards due for release are released from the Lease as listed, not renewed
        // first (a renewal would change its resourceVersion).
        let due: BTreeSet<String> =
            self.draining.iter().filter(|(_, at)| **at <= Instant::now()).map(|(s, _)| s.clone()).collect();
        let (this, listed) = (&*self, &shards);
        let renewals = steps.renew.iter().filter(|s| !due.contains(*s)).filter_map(|s| Some((s, *listed.get(s)?)));
        let renewals = renewals.map(|(s, l)| async move { (s, this.write(l, Some(now)).await.map(|_| ())) });
        let takes = steps.take.iter().map(|s| async move { (s, this.take(s, listed.get(s).copied(), now).await) });
        let (renewed, taken) = futures::join!(join_all(renewals), join_all(takes));
        for (shard, result) in renewed {
            match result {
                Ok(_) if !self.draining.contains_key(shard) => {
                    self.held.insert(shard.clone(), until);
                }
                Ok(_) => {}
                Err(e) => warn!(%shard, error = %e, "renewing the shard Lease failed; retrying"),
            }
        }
        for (shard, result) in taken {
            match result {
                Ok(()) => {
                    info!(%shard, identity = %self.identity, "acquired shard lease");
                    self.metrics.takeovers.inc();
                    self.held.insert(shard.clone(), until);
                }
                Err(e) => debug!(%shard, error = %e, "shard Lease not taken (another replica was first)"),
            }
        }
        self.release(due, &shards).await;
        self.gate.hold(self.held.clone());
        self.metrics.held.set(self.held.len() as i64);
        self.check_deadlines()
    }

    /// A shard acted on whose deadline passed: it could not be renewed before it may expire.
    fn check_deadlines(&self) -> Result<(), String> {
        let now = Instant::now();
        match self.held.iter().find(|(_, until)| **until <= now) {
            Some((shard, _)) => Err(format!("could not renew the Lease of shard {shard} before it may expire")),
            None => Ok(()),
        }
    }

    /// Releases the draining shards `due`: their in-flight reconciles had their time.
    async fn release(&mut self, due: BTreeSet<String>, shards: &BTreeMap<String, &Lease>) {
        for shard in due {
            let released = match shards.get(&shard) {
                Some(lease) => self.write(lease, None).await.is_ok(),
                None => true,
            };
            if released {
                info!(%shard, "released shard lease");
                self.draining.remove(&shard);
            }
        }
    }

    async fn list(&self) -> Result<Vec<Lease>, kube::Error> {
        let selector = format!("{LABEL_GROUP}={}", self.group);
        Ok(self.api.list(&ListParams::default().labels(&selector)).await?.items)
    }

    /// Takes the free or expired shard Lease `listed` (or creates it), conditional on its
    /// resourceVersion, so of two replicas taking it at once one fails.
    async fn take(&self, shard: &str, listed: Option<&Lease>, now: Timestamp) -> Result<(), kube::Error> {
        match listed {
            Some(lease) => {
                let mut lease = lease.clone();
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                self.write(&lease, Some(now)).await.map(|_| ())
            }
            None => {
                let lease = self.new_lease("shard", shard, Some(shard), now);
                self.api.create(&PostParams::default(), &lease).await.map(|_| ())
            }
        }
    }

    /// Writes `lease` held by this replica and renewed at `now`, or released (`None`).
    async fn write(&self, lease: &Lease, now: Option<Timestamp>) -> Result<Lease, kube::Error> {
        let mut lease = lease.clone();
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = now.map(|_| self.identity.clone());
        spec.renew_time = now.map(MicroTime);
        spec.lease_duration_seconds = Some(self.duration.as_secs() as i32);
        self.api.replace(&lease.name_any(), &PostParams::default(), &lease).await
    }

    fn new_lease(&self, role: &str, key: &str, shard: Option<&str>, now: Timestamp) -> Lease {
        let labels = [(LABEL_GROUP, self.group.as_str()), (LABEL_ROLE, role)];
        Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(&self.group, role, key)),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                annotations: shard.map(|s| [(ANNOTATION_SHARD.to_string(), s.to_string())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(self.duration.as_secs() as i32),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        }
    }

    /// Renews (or creates) this replica's own Lease: what the others count live replicas by.
    async fn renew_replica(&self, replicas: &[&Lease]) {
        let mine = replicas.iter().find(|l| holder(l) == Some(self.identity.as_str()));
        let result = match mine {
            Some(lease) => self.write(lease, Some(Timestamp::now())).await.map(|_| ()),
            None => {
                let lease = self.new_lease("replica", &self.identity, None, Timestamp::now());
                self.api.create(&PostParams::default(), &lease).await.map(|_| ())
            }
        };
        if let Err(e) = result {
            warn!(error = %e, "renewing this replica's Lease failed; retrying");
        }
    }

    /// Deletes replica Leases not renewed for ten durations (replicas that died), conditional on
    /// their resourceVersion so a late renewal is kept.
    async fn forget_dead_replicas(&self, replicas: &[&Lease], now: Timestamp) {
        let long = Holding { duration: self.duration * 10, ..Default::default() };
        for lease in replicas {
            let h = Holding { duration: long.duration, ..holding(lease) };
            if h.live(now) || h.holder.as_deref() == Some(self.identity.as_str()) {
                continue;
            }
            let pre = Preconditions { resource_version: lease.resource_version(), uid: lease.uid() };
            let params = DeleteParams { preconditions: Some(pre), ..Default::default() };
            let _ = self.api.delete(&lease.name_any(), &params).await;
        }
    }
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref().filter(|h| !h.is_empty())
}

fn holding(lease: &Lease) -> Holding {
    let spec = lease.spec.clone().unwrap_or_default();
    Holding {
        holder: spec.holder_identity,
        renewed: spec.renew_time.map(|t| t.0),
        duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
    }
}

/// The shards that exist, read from the caches: `default`, each AwsAccount and each account a
/// Queue names (a missing one too: its Queues are reported on), and `tunnels` when the Tunnel
/// controllers run.
pub fn existing(ctx: &std::sync::Arc<crate::controllers::queue::Context>, with_tunnels: bool) -> Existing {
    use crate::controllers::{Sharded, acting};
    let ctx = ctx.clone();
    Box::new(move || {
        let mut shards: std::collections::BTreeSet<String> = ctx.queues.state().iter().map(|q| q.shard()).collect();
        shards.extend(ctx.accounts.store.state().iter().map(|a| a.shard()));
        shards.insert(acting::DEFAULT_SHARD.to_string());
        if with_tunnels {
            shards.insert(acting::TUNNELS_SHARD.to_string());
        }
        shards
    })
}

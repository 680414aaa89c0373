//! The Tunnel controller: one exit server per `Tunnel`, a tunnel client in the cluster, and the
//! exit server's address on the Service.
//!
//! Each reconcile is the shared one ([`crate::controllers::reconciler`]): the finalizer first
//! (the exit server must never outlive its Tunnel unnoticed), then [`cleanup`] for a deleted
//! Tunnel, or the spine, [`phases`]: the Service and its ports, the credentials Secret, the exit
//! server (found by [`observe::find_host`], stepped by [`plan::host_step`]; a created host's id
//! is recorded at once, so a crash never makes a second one), its reserved address, the client,
//! and the end-to-end check that decides Ready and the Service's ingress.
//!
//! Periodic resync re-reads the host, so one deleted or stopped outside skyport is replaced.
//! Deleting the Tunnel deletes its host (and any other host tagged with its UID): [`cleanup`];
//! hosts whose Tunnel vanished without that are found by the [`sweep`].

pub mod act;
#[cfg(test)]
mod address_tests;
#[cfg(test)]
mod both_tests;
#[cfg(test)]
mod budget_tests;
pub mod cleanup;
pub mod desired;
#[cfg(test)]
mod handover_tests;
pub mod health;
#[cfg(test)]
mod health_tests;
pub mod hourly;
pub mod observe;
#[cfg(test)]
mod pair_cloud_tests;
#[cfg(test)]
mod pair_tests;
pub mod phases;
pub mod placement;
#[cfg(test)]
mod placement_tests;
pub mod plan;
#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod pool_translated_tests;
pub mod ranges;
#[cfg(test)]
mod reservation_tests;
#[cfg(test)]
mod roll_tests;
pub mod status;
#[cfg(test)]
mod status_tests;
pub mod sweep;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};

pub use crate::clouds::Providers;
use crate::config::TunnelArgs;
use crate::controllers::primary_stream;
use crate::controllers::{
    Backoff, Reconciler, api_beside, error_policy, hash_of, managed_selector, scoped_api, slim, spec_trigger,
};
use crate::crd::pool::ExitServerPool;
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelStatus};
use crate::error::{Error, Result};

#[cfg(test)]
use phases::BOOT_POLL;
use phases::Pass;

/// Finalizer guarding the exit server's deletion.
pub const FINALIZER: &str = "tunnels.skyport.dev/cleanup";

/// The Tunnel controller's context: the shared one, with [`State`] and, per Tunnel, the status
/// last written ([`status::Writer`]).
pub type Context = crate::controllers::Context<State, TunnelStatus>;

/// What only the Tunnel controller holds.
pub struct State {
    pub providers: Providers,
    pub settings: TunnelArgs,
    /// The value of every host's `TAG_CLUSTER` tag.
    pub cluster_id: String,
    /// The namespace watched, if only one: the orphan sweep stays inside it.
    pub namespace: Option<String>,
    pub tunnels: Store<Tunnel>,
    pub services: Store<Service>,
    /// Every ExitServerPool; empty when one namespace is watched (pools are cluster-scoped).
    pub pools: Store<ExitServerPool>,
    /// Tunnels to reconcile now: a pool's shared server when a member joins, changes or leaves,
    /// and the members whose entry on it changed.
    pub wakes: UnboundedSender<ObjectRef<Tunnel>>,
    /// Exit servers the orphan sweep deleted.
    pub orphans_deleted: std::sync::atomic::AtomicU64,
    /// Reserved addresses the orphan sweep released.
    pub orphan_addresses_released: std::sync::atomic::AtomicU64,
    /// Orphan sweep passes completed (with or without deletions): lets a test know a pass ran.
    pub sweeps: std::sync::atomic::AtomicU64,
    /// Failed health checks in a row, and since when, of every exit server.
    pub health: health::HealthTracker,
    /// Exit servers this process may still create this hour, for all Tunnels together.
    pub creations: hourly::HourlyBudget,
    /// Failovers of highly available Tunnels: the reserved address moved to the standby.
    pub failovers: health::PerTunnel,
    /// Time highly available Tunnels spent without a server passing behind their address.
    pub unserved: health::Unserved,
    /// Highly available Tunnels' provider reads, kept while their pairs are quiet.
    pub pair_views: observe::PairViews,
    /// Since when each highly available Tunnel's client roll has been halted.
    pub halted_rolls: health::HaltedRolls,
    /// The end-to-end health check ([`observe::NetworkProbe`]; a fake in reconcile tests, a
    /// stand-in for the exit servers LocalStack's instances cannot run in integration tests).
    pub probe: Arc<dyn observe::Probe>,
}

impl State {
    /// Whether the cache a reconcile waits for has listed once. Asked at shutdown
    /// ([`crate::controllers::shutdown`]).
    pub fn caches_synced(&self) -> bool {
        crate::controllers::has_synced(&self.tunnels)
    }
}

/// Builds the controller and its orphan sweep, checking tunnels with `probe`
/// ([`observe::NetworkProbe`]; a stand-in where no exit server can run, as on LocalStack's
/// instances), acting only when `acting` permits. Returns the context and the future running
/// both until `shutdown` resolves.
#[allow(clippy::too_many_arguments)]
pub fn controller(
    client: Client,
    providers: Providers,
    probe: Arc<dyn observe::Probe>,
    settings: TunnelArgs,
    backoff: Backoff,
    namespace: Option<String>,
    cluster_id: String,
    acting: crate::controllers::Acting,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) -> (Arc<Context>, impl std::future::Future<Output = ()> + Send) {
    let scope = namespace.as_deref();
    let (tunnel_reader, tunnel_writer) = reflector::store();
    let tunnel_stream = primary_stream(scoped_api::<Tunnel>(&client, scope), tunnel_writer, slim, spec_trigger);
    let (service_reader, service_writer) = reflector::store();
    // Our own status writes to Services must not wake Tunnels: only spec and existence matter.
    let service_stream = watcher(scoped_api::<Service>(&client, scope), watcher::Config::default())
        .default_backoff()
        .modify(slim)
        .reflect(service_writer)
        .touched_objects()
        .predicate_filter(service_hash, Default::default());
    // A deleted or edited client Deployment is put back; its status churn is ignored. In the
    // clients' namespace only, when clients live there (no Deployment is read elsewhere).
    let deployments = match settings.client_namespace.as_deref().filter(|ns| !ns.is_empty()) {
        Some(ns) => Api::<Deployment>::namespaced(client.clone(), ns),
        None => scoped_api::<Deployment>(&client, scope),
    };
    let deployment_stream = watcher(deployments, watcher::Config::default().labels(&managed_selector()))
        .default_backoff()
        .touched_objects()
        .predicate_filter(deployment_hash, Default::default());
    // Pools are cluster-scoped: an install that watches one namespace serves none.
    let (pool_reader, pool_writer) = reflector::store();
    // A test serving one namespace serves pools whose shared servers live there too.
    let pool_scope =
        if settings.pool_namespace.is_some() && settings.pool_namespace.as_deref() == scope { None } else { scope };
    let pool_stream = match pool_scope {
        None => watcher(Api::<ExitServerPool>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(pool_writer)
            .touched_objects()
            .predicate_filter(predicates::generation, Default::default())
            .left_stream(),
        Some(_) => futures::stream::empty().right_stream(),
    };
    let concurrency = settings.concurrency;
    let (wakes, woken) = unbounded();
    let state = State {
        creations: match settings.creations_file.as_deref() {
            Some(path) => hourly::HourlyBudget::recorded(settings.max_hosts_per_hour, path),
            None => hourly::HourlyBudget::new(settings.max_hosts_per_hour),
        },
        providers,
        cluster_id,
        namespace,
        settings,
        tunnels: tunnel_reader.clone(),
        services: service_reader,
        pools: pool_reader,
        wakes,
        orphans_deleted: Default::default(),
        orphan_addresses_released: Default::default(),
        sweeps: Default::default(),
        health: Default::default(),
        failovers: Default::default(),
        unserved: Default::default(),
        pair_views: Default::default(),
        halted_rolls: Default::default(),
        probe,
    };
    let ctx = Arc::new(Context::new(client, backoff, state).with_acting(acting));
    let (by_service, by_client, by_pool) = (tunnel_reader.clone(), tunnel_reader.clone(), tunnel_reader.clone());
    let run = Controller::for_stream(tunnel_stream, tunnel_reader)
        .watches_stream(deployment_stream, move |d: Deployment| client_of(&d, &by_client))
        // A pool's change reaches its shared server and its members: one waiting for the pool to
        // exist or to allow its namespace has no shared server to wake it.
        .watches_stream(pool_stream, move |pool: ExitServerPool| {
            let name = pool.name_any();
            by_pool
                .state()
                .into_iter()
                .filter(|t| t.spec.pool.as_ref().is_some_and(|p| p.name == name))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .watches_stream(service_stream, move |service: Service| {
            let (ns, name) = (service.namespace(), service.name_any());
            by_service
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns && t.spec.service_name() == Some(name.as_str()))
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .reconcile_on(woken)
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(crate::log_result!(tunnel));
    let sweep = sweep::run(ctx.clone(), shutdown);
    let both = async move {
        tokio::join!(run, sweep);
    };
    (ctx, both)
}

fn service_hash(s: &Service) -> Option<u64> {
    let spec = serde_json::to_string(&s.spec).unwrap_or_default();
    Some(hash_of((&s.metadata.uid, s.metadata.deletion_timestamp.is_some(), spec)))
}

/// The Tunnel a client Deployment serves: its controller beside it, its UID label elsewhere.
fn client_of(d: &Deployment, tunnels: &Store<Tunnel>) -> Option<ObjectRef<Tunnel>> {
    if let Some(owner) = d.owner_references().iter().find(|r| r.controller == Some(true) && r.kind == "Tunnel") {
        return Some(ObjectRef::new(&owner.name).within(&d.namespace()?));
    }
    let uid = d.labels().get(placement::LABEL_TUNNEL_UID)?;
    let tunnel = tunnels.state().into_iter().find(|t| t.uid().as_ref() == Some(uid))?;
    Some(ObjectRef::from_obj(&*tunnel))
}

fn deployment_hash(d: &Deployment) -> Option<u64> {
    Some(hash_of((&d.metadata.uid, d.metadata.generation, d.metadata.deletion_timestamp.is_some())))
}

/// Entry point per object: the shared reconcile ([`crate::controllers::reconciler`]) around
/// [`State`]'s [`Reconciler`] steps.
pub async fn reconcile(tunnel: Arc<Tunnel>, ctx: Arc<Context>) -> Result<Action> {
    crate::controllers::reconciler::reconcile(tunnel, ctx).await
}

impl Reconciler for State {
    type Object = Tunnel;
    type Memory = TunnelStatus;
    const FINALIZER: &'static str = FINALIZER;
    const PERMANENT_HINT: &'static str =
        "fix the cause, then edit or re-create the Tunnel (nothing is retried until it changes)";

    async fn apply(tunnel: Arc<Tunnel>, ctx: Arc<Context>, _added: bool) -> Result<Action> {
        let api: Api<Tunnel> = api_beside(&ctx.client, &*tunnel)?;
        Pass::new(&tunnel, &api, &ctx).run().await
    }

    async fn cleanup(tunnel: Arc<Tunnel>, ctx: Arc<Context>) -> Result<Action> {
        cleanup::cleanup(&tunnel, &api_beside(&ctx.client, &*tunnel)?, &ctx).await
    }

    /// A permanent failure leaves the Tunnel Failed; a transient one keeps its phase.
    async fn report_failure(tunnel: &Tunnel, ctx: &Context, error: &Error, message: &str) -> Result<()> {
        let api: Api<Tunnel> = api_beside(&ctx.client, tunnel)?;
        let mut pass = Pass::new(tunnel, &api, ctx);
        let phase = match error.is_permanent() {
            true => TunnelPhase::Failed,
            false => pass.status().phase.unwrap_or(TunnelPhase::Pending),
        };
        pass.report(phase, error.reason(), message).await
    }
}

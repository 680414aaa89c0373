//! The Tunnel controller: one exit server per `Tunnel`, a tunnel client in the cluster, and the
//! exit server's address on the Service.
//!
//! Each reconcile:
//! 1. finalizer first (the exit server must never outlive its Tunnel unnoticed);
//! 2. the Service's ports ([`desired::service_ports`]) and the credentials Secret (created once);
//! 3. [`observe::find_host`]: of the hosts tagged with the Tunnel's UID (and the recorded one), the lowest id;
//! 4. [`act::host`] steps it by [`plan::host_step`]: create / wait / replace / reconfigure /
//!    ready. A created host's id is written to status at once, before waiting for it, so a crash
//!    never makes a second one; waiting is a short requeue, never a blocked worker. With a
//!    reserved address, [`act::address`] reserves it (before the host or with it, per provider)
//!    and puts it on the running host by [`plan::address::address_step`];
//! 5. [`act`]: the client config, the client Deployment, the Service's ingress; [`status`]: the
//!    status, each written only when it differs.
//!
//! Periodic resync re-reads the host, so one deleted or stopped outside skyport is replaced.
//! Deleting the Tunnel deletes its host (and any other host tagged with its UID): [`cleanup`];
//! hosts whose Tunnel vanished without that are found by the [`sweep`].

pub mod act;
#[cfg(test)]
mod address_tests;
pub mod cleanup;
pub mod desired;
#[cfg(test)]
mod health_tests;
pub mod observe;
pub mod plan;
pub mod ranges;
pub mod status;
pub mod sweep;
#[cfg(test)]
mod tests;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use providers::userdata::render_client_toml;
use tracing::debug;

pub use crate::clouds::Providers;
use crate::config::TunnelArgs;
use crate::controllers::context::namespace_of;
use crate::controllers::primary_stream;
use crate::controllers::{
    Backoff, api_beside, error_policy, has_finalizer, jittered, managed_selector, object_key, reconcile_with,
    scoped_api, slim, spec_trigger,
};
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelStatus};
use crate::error::{Error, Result};

use act::address::AddressReached;
use act::host::{Reached, Want};
use observe::SecretState;
use plan::{Blocked, TrafficStep};
use status::{Writer, describe};

/// Finalizer guarding the exit server's deletion.
pub const FINALIZER: &str = "tunnels.skyport.dev/cleanup";
/// How often a booting exit server is looked at again.
const BOOT_POLL: Duration = Duration::from_secs(3);
/// How often a running exit server whose tunnel is not through yet is probed again.
const HEALTH_POLL: Duration = Duration::from_secs(5);

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
    /// Exit servers the orphan sweep deleted.
    pub orphans_deleted: std::sync::atomic::AtomicU64,
    /// Reserved addresses the orphan sweep released.
    pub orphan_addresses_released: std::sync::atomic::AtomicU64,
    /// Orphan sweep passes completed (with or without deletions): lets a test know a pass ran.
    pub sweeps: std::sync::atomic::AtomicU64,
    /// Since when each host fails the health check.
    pub failing: observe::FailingClocks,
    /// The end-to-end health check ([`observe::NetworkProbe`]; a fake in reconcile tests).
    pub probe: Arc<dyn observe::Probe>,
}

impl State {
    /// Whether the cache a reconcile waits for has listed once. Asked at shutdown
    /// ([`crate::controllers::shutdown`]).
    pub fn caches_synced(&self) -> bool {
        crate::controllers::has_synced(&self.tunnels)
    }
}

/// Builds the controller and its orphan sweep. Returns the context and the future running both
/// until `shutdown` resolves.
#[allow(clippy::too_many_arguments)]
pub fn controller(
    client: Client,
    providers: Providers,
    settings: TunnelArgs,
    backoff: Backoff,
    namespace: Option<String>,
    cluster_id: String,
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
    // A deleted or edited client Deployment is put back; its status churn is ignored.
    let deployments = scoped_api::<Deployment>(&client, scope);
    let deployment_stream = watcher(deployments, watcher::Config::default().labels(&managed_selector()))
        .default_backoff()
        .touched_objects()
        .predicate_filter(deployment_hash, Default::default());
    let concurrency = settings.concurrency;
    let state = State {
        providers,
        cluster_id,
        namespace,
        settings,
        tunnels: tunnel_reader.clone(),
        services: service_reader,
        orphans_deleted: Default::default(),
        orphan_addresses_released: Default::default(),
        sweeps: Default::default(),
        failing: Default::default(),
        probe: Arc::new(observe::NetworkProbe),
    };
    let ctx = Arc::new(Context::new(client, backoff, state));
    let by_service = tunnel_reader.clone();
    let run = Controller::for_stream(tunnel_stream, tunnel_reader)
        .owns_stream(deployment_stream)
        .watches_stream(service_stream, move |service: Service| {
            let (ns, name) = (service.namespace(), service.name_any());
            by_service
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns && t.spec.service_ref.name == name)
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
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
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.metadata.uid.hash(&mut h);
    s.metadata.deletion_timestamp.is_some().hash(&mut h);
    serde_json::to_string(&s.spec).unwrap_or_default().hash(&mut h);
    Some(h.finish())
}

fn deployment_hash(d: &Deployment) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    d.metadata.uid.hash(&mut h);
    predicates::generation(d).hash(&mut h);
    d.metadata.deletion_timestamp.is_some().hash(&mut h);
    Some(h.finish())
}

/// Entry point per object: [`reconcile_inner`] in a span naming the Tunnel.
pub async fn reconcile(tunnel: Arc<Tunnel>, ctx: Arc<Context>) -> Result<Action> {
    reconcile_with(tunnel, ctx, reconcile_inner).await
}

async fn reconcile_inner(tunnel: Arc<Tunnel>, ctx: Arc<Context>) -> Result<Action> {
    let api: Api<Tunnel> = api_beside(&ctx.client, &*tunnel)?;
    let mut status = status::writer(&tunnel, &api, &ctx);
    if tunnel.meta().deletion_timestamp.is_some() {
        return cleanup::cleanup(&tunnel, &api, &ctx, &mut status).await;
    }
    let tunnel = if has_finalizer(&*tunnel, FINALIZER) {
        tunnel
    } else {
        ctx.api_writes.inc();
        Arc::new(crate::controllers::add_finalizer(&api, &tunnel, FINALIZER).await?)
    };
    let service = ctx.services.get(&ObjectRef::new(&tunnel.spec.service_ref.name).within(&namespace_of(&*tunnel)?));
    let (failure, phase) = match converge(&tunnel, service.as_deref(), &ctx, &mut status).await {
        Ok(action) => {
            ctx.backoff.reset(&object_key(&*tunnel));
            return Ok(action);
        }
        Err(Failure::Blocked(Blocked(phase, reason, message))) => {
            status::report(&tunnel, service.as_deref(), &ctx, &mut status, phase, reason, &message).await?;
            ctx.backoff.reset(&object_key(&*tunnel));
            return Ok(Action::await_change());
        }
        Err(Failure::Error(e)) if e.is_permanent() => (e, TunnelPhase::Failed),
        Err(Failure::Error(e)) => {
            let phase = status.current().phase.unwrap_or(TunnelPhase::Pending);
            (e, phase)
        }
    };
    let permanent = failure.is_permanent();
    let message = if permanent {
        format!("{failure}; fix the cause, then edit or re-create the Tunnel (nothing is retried until it changes)")
    } else {
        format!("{failure}; retrying with backoff")
    };
    let reason = failure.reason();
    if let Err(status_err) =
        status::report(&tunnel, service.as_deref(), &ctx, &mut status, phase, reason, &message).await
    {
        debug!(error = %status_err, "could not record the failure in status");
    }
    if permanent {
        return Ok(Action::await_change());
    }
    Err(failure)
}

/// Why a converge stopped: waiting for a change ([`Blocked`]) or an error.
enum Failure {
    Blocked(Blocked),
    Error(Error),
}

impl<E: Into<Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Error(e.into())
    }
}

/// Observe, plan and act: credentials, exit server, client, the Service's ingress, status.
async fn converge(
    tunnel: &Tunnel,
    service: Option<&Service>,
    ctx: &Context,
    status: &mut Writer<'_>,
) -> Result<Action, Failure> {
    let ns = namespace_of(tunnel)?;
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let svc_name = &tunnel.spec.service_ref.name;
    let Some(service) = service else {
        return Err(Failure::Blocked(Blocked(
            TunnelPhase::Pending,
            "ServiceNotFound",
            format!("Service {ns}/{svc_name} does not exist; the Tunnel waits for it"),
        )));
    };
    // A hand-written Tunnel gets no more than a Service would: skyport publishes only the
    // Services it serves (a ClusterIP Service, or one that opted out, stays private).
    if let Err(why) = crate::controllers::service::desired::served(service, &ctx.settings) {
        return Err(Failure::Blocked(Blocked(
            TunnelPhase::Failed,
            "ServiceNotServed",
            format!("Service {svc_name} is not one skyport serves ({why}); a Tunnel only publishes such Services"),
        )));
    }
    let ports = desired::service_ports(service, ctx.settings.control_port, ctx.settings.health_port).map_err(|p| {
        Failure::Blocked(Blocked(TunnelPhase::Failed, "InvalidService", format!("Service {svc_name}: {p}")))
    })?;
    // Checked before any cloud call; an exit server made before the lists were narrowed keeps
    // serving (a policy change must not cut traffic), only new ones are held to them.
    if status.current().host_id.is_none() {
        plan::allowed(tunnel, &ctx.settings.allowed_sizes, &ctx.settings.allowed_regions).map_err(Failure::Blocked)?;
    }
    let provider = plan::provider_for(tunnel, status.current(), &ctx.providers).map_err(Failure::Blocked)?;

    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret = observe::credentials(&ctx.client, tunnel).await?;
    if let SecretState::Stale { secret_uid } = &secret {
        act::delete_stale_secret(tunnel, &secrets, secret_uid.as_deref(), ctx).await?;
    }
    let (credentials, stored_client, fresh) = match secret {
        SecretState::Stored(stored) => (stored.credentials, stored.client_toml, false),
        SecretState::Missing | SecretState::Stale { .. } => match act::create_secret(tunnel, &secrets, ctx).await? {
            Some(created) => (created, None, true),
            // Another run made it meanwhile: use what it stored.
            None => match observe::credentials(&ctx.client, tunnel).await? {
                SecretState::Stored(stored) => (stored.credentials, stored.client_toml, false),
                _ => return Err(Error::MissingObjectKey("Secret").into()),
            },
        },
    };
    let server = desired::exit_server(&ports, &credentials, ctx.settings.control_port, ctx.settings.health_port);
    let (server, source_ranges) = ranges::restrict(server, &tunnel.spec.source_ranges).map_err(Failure::Blocked)?;

    let found = observe::find_host(provider.as_ref(), status.current(), &uid).await?;
    let publishes = desired::controls_service_status(tunnel, service).then_some(service);
    act::host::delete_extras(provider.as_ref(), &found.extras, publishes, ctx).await?;
    let address = act::address::prepare(tunnel, &provider, &uid, publishes, ctx, status).await?;
    // New keys (the Secret was re-created, now or in a reconcile that failed after) mean the
    // running server must get the new configuration: status remembers the host's keys' digest.
    let digest = plan::credentials_digest(&credentials);
    let configured = plan::configured_ports(status.current(), fresh, &digest);
    let want = Want {
        provider: &provider,
        server: &server,
        ports: &ports,
        configured,
        publishes,
        digest: &digest,
        address: address.as_ref().map(|a| a.id.as_str()),
    };
    let (ip, host_id) = match act::host::converge(tunnel, found.host, want, ctx, status).await? {
        Reached::Ready { ip, id } => (ip, id),
        Reached::Waiting => return Ok(Action::requeue(BOOT_POLL)),
    };
    // With a reserved address, the Tunnel's address is that one, and only once the host holds it.
    let on = (host_id.as_deref().unwrap_or_default(), ip);
    let ip = match act::address::converge(tunnel, &provider, address, on, publishes, ctx, status).await? {
        AddressReached::Ready { ip } => ip,
        AddressReached::HostReplaced => return Ok(Action::requeue(BOOT_POLL)),
    };
    let on = (&server, source_ranges.as_slice());
    let enforced = ranges::converge(tunnel, &provider, host_id.as_deref(), on, ctx, status).await?;

    let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.clone()).filter(|ip| ip != "None");
    let Some(cluster_ip) = cluster_ip else {
        return Err(Failure::Blocked(Blocked(
            TunnelPhase::Failed,
            "InvalidService",
            format!("Service {svc_name} has no cluster IP (headless); the tunnel client forwards to it"),
        )));
    };
    let client =
        desired::client(&ports, &credentials, &ip, (ctx.settings.control_port, ctx.settings.health_port), &cluster_ip);
    let client_toml = render_client_toml(&client).map_err(|e| Error::InvalidSpec(e.to_string()))?;
    if stored_client.as_deref() != Some(client_toml.as_str()) {
        act::write_client_config(tunnel, &secrets, &client_toml, ctx).await?;
    }
    act::ensure_deployment(tunnel, &ns, &ctx.settings.client_image, &desired::checksum(&client_toml), ctx).await?;

    // Ready means traffic can flow: only a tunnel that passed the end-to-end check gets the
    // address published; any other state takes it off the Service first.
    let probed = ctx.probe.check(&ip, ctx.settings.health_port, &credentials.token).await;
    let clock = host_id.clone().unwrap_or_else(|| ip.clone());
    let failing_for = ctx.failing.failing_for(&clock, probed.is_ok());
    let settings = &ctx.settings;
    let step = plan::traffic_step(probed, failing_for, settings.boot_timeout, settings.replace_after);
    let controls = publishes.is_some();
    if controls && plan::withdraws(&step, failing_for, settings.withdraw_after) {
        act::set_ingress(service, None, ctx).await?;
    }
    let provider_name = provider.name().to_string();
    let record = |s: &mut TunnelStatus| {
        s.provider = Some(provider_name.clone());
        s.host_id = host_id.clone();
        s.host_ip = Some(ip.clone());
        s.ports = ports.clone();
        // Reached means the host runs with these credentials (created or reconfigured with them).
        s.credentials_digest = Some(digest.clone());
    };
    match step {
        TrafficStep::Ready => {}
        TrafficStep::Waiting { message } => {
            status
                .write(|s| {
                    record(s);
                    s.phase = Some(TunnelPhase::Provisioning);
                    s.conditions = status::not_ready("WaitingForTunnel", &message);
                })
                .await?;
            return Ok(Action::requeue(jittered(plan::health_poll(failing_for, HEALTH_POLL))));
        }
        TrafficStep::NotEstablished { message } => {
            status.write(record).await?;
            let phase = TunnelPhase::Provisioning;
            status::report(tunnel, Some(service), ctx, status, phase, "TunnelNotEstablished", &message).await?;
            return Ok(Action::requeue(jittered(HEALTH_POLL)));
        }
        TrafficStep::Replace { why } => {
            let id = host_id.as_deref();
            act::host::replace_unhealthy(tunnel, service, controls, provider.as_ref(), id, &why, ctx).await?;
            ctx.failing.forget(&clock);
            status
                .write(|s| {
                    s.phase = Some(TunnelPhase::Provisioning);
                    s.host_id = None;
                    s.host_ip = None;
                    s.conditions = status::not_ready("Replacing", &format!("{why}; provisioning a new exit server"));
                })
                .await?;
            return Ok(Action::requeue(BOOT_POLL));
        }
    }
    if controls {
        act::set_ingress(service, Some(desired::ingress(&ip, &ports)), ctx).await?;
    }
    let generation = tunnel.metadata.generation;
    status
        .write(|s| {
            record(s);
            s.phase = Some(TunnelPhase::Active);
            s.observed_generation = generation;
            s.conditions = vec![Condition::new(
                "Ready",
                ConditionStatus::True,
                "Active",
                format!(
                    "exit server {ip} forwards {} to Service {svc_name}; the tunnel passed its health check{}",
                    describe(&ports),
                    ranges::note(enforced, &source_ranges, &provider_name),
                ),
            )];
        })
        .await?;
    Ok(Action::requeue(jittered(ctx.settings.resync)))
}

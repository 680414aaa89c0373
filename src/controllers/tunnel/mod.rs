//! The Tunnel controller: one exit server per `Tunnel`, a tunnel client in the cluster, and the
//! exit server's address on the Service.
//!
//! Each reconcile:
//! 1. finalizer first (the exit server must never outlive its Tunnel unnoticed);
//! 2. the Service's ports ([`desired::service_ports`]) and the credentials Secret (created once);
//! 3. [`observe::find_host`]: the recorded host, else one tagged with the Tunnel's UID;
//! 4. [`plan::host_step`]: create / wait / replace / reconfigure / ready. A created host's id is
//!    written to status at once, before waiting for it, so a crash never makes a second one;
//!    waiting is a short requeue, never a blocked worker;
//! 5. [`act`]: the client config, the client Deployment, the Service's ingress and the status,
//!    each written only when it differs.
//!
//! Periodic resync re-reads the host, so one deleted or stopped outside skyport is replaced.
//! Deleting the Tunnel deletes its host (and any other host tagged with its UID).

pub mod act;
pub mod desired;
pub mod observe;
pub mod plan;
pub mod sweep;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use providers::hosts::{TAG_CLUSTER, owner_tags};
use providers::userdata::{render_client_toml, render_cloud_config};
use providers::{HostProvider, HostRequest};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::config::TunnelArgs;
use crate::controllers::queue::MANAGED_BY;
use crate::controllers::{ApiWrites, Backoff, instrumented, jittered, object_key, remove_finalizer, spec_trigger};
use crate::crd::condition::{self, Condition, ConditionStatus};
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelPort, TunnelStatus};
use crate::error::{Error, Result};
use crate::metrics::ReconcileMetrics;

use plan::HostStep;

/// Finalizer guarding the exit server's deletion.
pub const FINALIZER: &str = "tunnels.skyport.dev/cleanup";
/// How often a booting exit server is looked at again.
const BOOT_POLL: Duration = Duration::from_secs(3);

/// The configured host providers, by name, and the default for Tunnels that name none.
#[derive(Clone, Default)]
pub struct Providers {
    pub default: Option<String>,
    by_name: BTreeMap<&'static str, Arc<dyn HostProvider>>,
}

impl Providers {
    pub fn new(default: Option<String>, providers: Vec<Arc<dyn HostProvider>>) -> Self {
        Providers { default, by_name: providers.into_iter().map(|p| (p.name(), p)).collect() }
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn HostProvider>> {
        self.by_name.get(name).cloned()
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn HostProvider>> {
        self.by_name.values()
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.by_name.keys().copied().collect()
    }
}

/// Shared state of the Tunnel controller.
pub struct Context {
    pub client: Client,
    pub providers: Providers,
    pub settings: TunnelArgs,
    /// The value of every host's [`TAG_CLUSTER`] tag.
    pub cluster_id: String,
    /// The namespace watched, if only one: the orphan sweep stays inside it.
    pub namespace: Option<String>,
    recorder: Recorder,
    pub tunnels: Store<Tunnel>,
    pub services: Store<Service>,
    pub backoff: Backoff,
    pub api_writes: ApiWrites,
    pub metrics: Arc<ReconcileMetrics>,
    /// Exit servers the orphan sweep deleted.
    pub orphans_deleted: std::sync::atomic::AtomicU64,
    /// The status each Tunnel was last given, by UID. Only skyport writes a Tunnel's status, so
    /// this is never older than the cache, which can lag our own writes: a reconcile woken by
    /// the client Deployment we just made must not see a Tunnel without the host it recorded.
    statuses: std::sync::Mutex<std::collections::HashMap<String, TunnelStatus>>,
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
    let (tunnels, services, deployments): (Api<Tunnel>, Api<Service>, Api<Deployment>) = match namespace.as_deref() {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone()), Api::all(client.clone())),
    };
    let (tunnel_reader, tunnel_writer) = reflector::store();
    let tunnel_stream = watcher(tunnels, watcher::Config::default())
        .default_backoff()
        .modify(crate::controllers::slim)
        .reflect(tunnel_writer)
        .applied_objects()
        .predicate_filter(spec_trigger, Default::default());
    let (service_reader, service_writer) = reflector::store();
    // Our own status writes to Services must not wake Tunnels: only spec and existence matter.
    let service_stream = watcher(services, watcher::Config::default())
        .default_backoff()
        .modify(crate::controllers::slim)
        .reflect(service_writer)
        .touched_objects()
        .predicate_filter(service_hash, Default::default());
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    // A deleted or edited client Deployment is put back; its status churn is ignored.
    let deployment_stream = watcher(deployments, watcher::Config::default().labels(&selector))
        .default_backoff()
        .touched_objects()
        .predicate_filter(deployment_hash, Default::default());
    let reporter = Reporter { controller: "skyport".into(), instance: std::env::var("POD_NAME").ok() };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        providers,
        backoff,
        cluster_id,
        namespace,
        settings,
        tunnels: tunnel_reader.clone(),
        services: service_reader,
        api_writes: ApiWrites::default(),
        metrics: Arc::default(),
        orphans_deleted: Default::default(),
        statuses: Default::default(),
    });
    let by_service = tunnel_reader.clone();
    let config = ControllerConfig::default().concurrency(ctx.settings.concurrency);
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
        .with_config(config)
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            match result {
                Ok((obj, action)) => debug!(tunnel = %obj, ?action, "reconciled"),
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    warn!(tunnel = %obj, reason = e.reason(), error = %e, "reconcile failed")
                }
                Err(e) => debug!(error = %e, "controller event"),
            }
            futures::future::ready(())
        });
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

fn key(tunnel: &Tunnel) -> String {
    object_key(tunnel)
}

/// Entry point per object: [`reconcile_inner`] in a span naming the Tunnel.
pub async fn reconcile(tunnel: Arc<Tunnel>, ctx: Arc<Context>) -> Result<Action> {
    let metrics = ctx.metrics.clone();
    instrumented("Tunnel", &*tunnel.clone(), &metrics, reconcile_inner(tunnel, ctx)).await
}

/// Why a Tunnel cannot progress without something changing, as (phase, reason, message).
struct Blocked(TunnelPhase, &'static str, String);

async fn reconcile_inner(tunnel: Arc<Tunnel>, ctx: Arc<Context>) -> Result<Action> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let api: Api<Tunnel> = Api::namespaced(ctx.client.clone(), &ns);
    let mut status = StatusWriter::new(&tunnel, &ctx);
    if tunnel.meta().deletion_timestamp.is_some() {
        return cleanup(&tunnel, &api, &ctx, &mut status).await;
    }
    let tunnel = if tunnel.finalizers().iter().any(|f| f == FINALIZER) {
        tunnel
    } else {
        ctx.api_writes.inc();
        Arc::new(crate::controllers::add_finalizer(&api, &tunnel, FINALIZER).await?)
    };
    let service = ctx.services.get(&ObjectRef::new(&tunnel.spec.service_ref.name).within(&ns));
    match converge(&tunnel, service.as_deref(), &api, &ctx, &mut status).await {
        Ok(action) => {
            ctx.backoff.reset(&key(&tunnel));
            Ok(action)
        }
        Err(Failure::Blocked(Blocked(phase, reason, message))) => {
            report(&tunnel, service.as_deref(), &api, &ctx, &mut status, phase, reason, &message).await?;
            ctx.backoff.reset(&key(&tunnel));
            Ok(Action::await_change())
        }
        Err(Failure::Error(e)) => {
            let permanent = e.is_permanent();
            let message = if permanent {
                format!("{e}; fix the cause, then edit or re-create the Tunnel (nothing is retried until it changes)")
            } else {
                format!("{e}; retrying with backoff")
            };
            let phase =
                if permanent { TunnelPhase::Failed } else { status.current().phase.unwrap_or(TunnelPhase::Pending) };
            if let Err(status_err) =
                report(&tunnel, service.as_deref(), &api, &ctx, &mut status, phase, e.reason(), &message).await
            {
                debug!(error = %status_err, "could not record the failure in status");
            }
            if permanent {
                return Ok(Action::await_change());
            }
            Err(e)
        }
    }
}

enum Failure {
    Blocked(Blocked),
    Error(Error),
}

impl<E: Into<Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Error(e.into())
    }
}

async fn converge(
    tunnel: &Tunnel,
    service: Option<&Service>,
    api: &Api<Tunnel>,
    ctx: &Context,
    status: &mut StatusWriter,
) -> Result<Action, Failure> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let svc_name = &tunnel.spec.service_ref.name;
    let Some(service) = service else {
        return Err(Failure::Blocked(Blocked(
            TunnelPhase::Pending,
            "ServiceNotFound",
            format!("Service {ns}/{svc_name} does not exist; the Tunnel waits for it"),
        )));
    };
    let ports = desired::service_ports(service, ctx.settings.control_port).map_err(|p| {
        Failure::Blocked(Blocked(TunnelPhase::Failed, "InvalidService", format!("Service {svc_name}: {p}")))
    })?;
    let provider = provider_for(tunnel, status.current(), ctx).map_err(Failure::Blocked)?;

    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let secret_name = desired::secret_name(tunnel);
    let (credentials, stored_client, fresh) = match observe::credentials(&secrets, &secret_name).await? {
        Some(stored) => (stored.credentials, stored.client_toml, false),
        None => match act::create_secret(tunnel, &secrets, ctx).await? {
            Some(created) => (created, None, true),
            None => {
                let stored =
                    observe::credentials(&secrets, &secret_name).await?.ok_or(Error::MissingObjectKey("Secret"))?;
                (stored.credentials, stored.client_toml, false)
            }
        },
    };
    let server = desired::exit_server(&ports, &credentials, ctx.settings.control_port);

    let mut host = observe::find_host(provider.as_ref(), status.current(), &uid).await?;
    // New keys (the Secret was lost) mean the running server must get the new configuration.
    let mut configured: Vec<TunnelPort> = if fresh { Vec::new() } else { status.current().ports.clone() };
    let mut steps = 0;
    let (ip, host_id) = loop {
        steps += 1;
        if steps > 4 {
            // A provider handing back hosts that are stopped at once: do not spin.
            return Err(Error::Host(providers::HostError::Unavailable {
                provider: provider.name(),
                message: "the exit server did not reach a usable state".into(),
            })
            .into());
        }
        match plan::host_step(host.as_ref(), &configured, &ports) {
            HostStep::Ready { ip } => break (ip, host.as_ref().map(|h| h.id.clone())),
            HostStep::Wait { why } => {
                let id = host.as_ref().map(|h| h.id.clone());
                status
                    .write(api, ctx, |s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.provider = Some(provider.name().to_string());
                        s.host_id = id;
                        s.conditions = not_ready("Provisioning", &why);
                    })
                    .await?;
                return Ok(Action::requeue(BOOT_POLL));
            }
            HostStep::Create => {
                let user_data = render_cloud_config(&server).map_err(|e| Error::InvalidSpec(e.to_string()))?;
                let mut tags = owner_tags(&uid, &ns, &tunnel.name_any());
                tags.insert(TAG_CLUSTER.to_string(), ctx.cluster_id.clone());
                let request = HostRequest {
                    name: desired::host_name(&ns, &tunnel.name_any()),
                    region: tunnel.spec.region.clone(),
                    size: tunnel.spec.size.clone(),
                    user_data,
                    server: server.clone(),
                    tags,
                };
                let created = provider.create(&request).await?;
                info!(host = %created.id, provider = provider.name(), "created exit server");
                // Recorded before anything else can fail: a restart finds this host, not a new one.
                status
                    .write(api, ctx, |s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.provider = Some(provider.name().to_string());
                        s.host_id = Some(created.id.clone());
                        s.host_ip = created.public_ipv4.clone();
                        s.ports = ports.clone();
                        s.conditions = not_ready("Provisioning", &format!("created exit server {}", created.id));
                    })
                    .await?;
                publish(
                    ctx,
                    tunnel,
                    EventType::Normal,
                    "Provisioning",
                    format!("created exit server {} at {}", created.id, provider.name()),
                )
                .await;
                configured = ports.clone();
                host = Some(created);
            }
            HostStep::Replace { id, why } => {
                warn!(host = %id, why, "replacing exit server");
                publish(ctx, tunnel, EventType::Warning, "ExitServerLost", format!("{why}; provisioning a new one"))
                    .await;
                provider.delete(&id).await?;
                host = None;
            }
            HostStep::Reconfigure { id, ip: _ } => {
                if provider.reconfigure(&id, &server).await? {
                    info!(host = %id, ?ports, "reconfigured exit server");
                    publish(
                        ctx,
                        tunnel,
                        EventType::Normal,
                        "PortsChanged",
                        format!("exit server {id} now exposes {}", describe(&ports)),
                    )
                    .await;
                    status.write(api, ctx, |s| s.ports = ports.clone()).await?;
                    configured = ports.clone();
                } else {
                    let why = format!(
                        "the Service's ports changed to {} and {} cannot change a running exit server",
                        describe(&ports),
                        provider.name()
                    );
                    publish(ctx, tunnel, EventType::Normal, "Replacing", format!("{why}; replacing it")).await;
                    provider.delete(&id).await?;
                    host = None;
                }
            }
        }
    };

    let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.clone()).filter(|ip| ip != "None");
    let Some(cluster_ip) = cluster_ip else {
        return Err(Failure::Blocked(Blocked(
            TunnelPhase::Failed,
            "InvalidService",
            format!("Service {svc_name} has no cluster IP (headless); the tunnel client forwards to it"),
        )));
    };
    let client = desired::client(&ports, &credentials, &ip, ctx.settings.control_port, &cluster_ip);
    let client_toml = render_client_toml(&client).map_err(|e| Error::InvalidSpec(e.to_string()))?;
    if stored_client.as_deref() != Some(client_toml.as_str()) {
        act::write_client_config(tunnel, &secrets, &client_toml, ctx).await?;
    }
    act::ensure_deployment(tunnel, &ns, &ctx.settings.client_image, &desired::checksum(&client_toml), ctx).await?;
    if desired::controls_service_status(tunnel, service) {
        act::set_ingress(service, Some(desired::ingress(&ip, &ports)), ctx).await?;
    }
    let generation = tunnel.metadata.generation;
    status
        .write(api, ctx, |s| {
            s.phase = Some(TunnelPhase::Active);
            s.provider = Some(provider.name().to_string());
            s.host_id = host_id;
            s.host_ip = Some(ip.clone());
            s.ports = ports.clone();
            s.observed_generation = generation;
            s.conditions = vec![Condition::new(
                "Ready",
                ConditionStatus::True,
                "Active",
                format!("exit server {ip} forwards {} to Service {svc_name}", describe(&ports)),
            )];
        })
        .await?;
    Ok(Action::requeue(jittered(ctx.settings.resync)))
}

fn describe(ports: &[TunnelPort]) -> String {
    ports.iter().map(|p| format!("{}/{}", p.port, p.protocol)).collect::<Vec<_>>().join(", ")
}

fn not_ready(reason: &str, message: &str) -> Vec<Condition> {
    vec![Condition::new("Ready", ConditionStatus::False, reason, message)]
}

/// The provider of the Tunnel's host: where it was created, else spec.provider, else the
/// operator's default.
fn provider_for(tunnel: &Tunnel, status: &TunnelStatus, ctx: &Context) -> Result<Arc<dyn HostProvider>, Blocked> {
    let recorded = status.provider.clone().filter(|_| status.host_id.is_some());
    let name = recorded.or_else(|| tunnel.spec.provider.clone()).or_else(|| ctx.providers.default.clone());
    let Some(name) = name else {
        return Err(Blocked(
            TunnelPhase::Failed,
            "ProviderNotConfigured",
            "the Tunnel names no provider and skyport runs without --provider".into(),
        ));
    };
    ctx.providers.get(&name).ok_or_else(|| {
        Blocked(
            TunnelPhase::Failed,
            "ProviderNotConfigured",
            format!(
                "provider {name:?} is not configured in skyport (configured: {}); set its credentials or pick another",
                ctx.providers.names().join(", ")
            ),
        )
    })
}

/// Ready=False with `reason`; a Warning Event on the Tunnel (and on its Service for provider
/// failures) when the reason is new.
#[allow(clippy::too_many_arguments)]
async fn report(
    tunnel: &Tunnel,
    service: Option<&Service>,
    api: &Api<Tunnel>,
    ctx: &Context,
    status: &mut StatusWriter,
    phase: TunnelPhase,
    reason: &str,
    message: &str,
) -> Result<()> {
    let previous = status
        .current()
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == ConditionStatus::False)
        .map(|c| c.reason.clone());
    if previous.as_deref() != Some(reason) {
        warn!(reason, message, "tunnel not ready");
        publish(ctx, tunnel, EventType::Warning, reason, message.to_string()).await;
        if let (Some(service), true) = (service, reason.starts_with("Provider")) {
            publish_on(ctx, &service.object_ref(&()), EventType::Warning, reason, message.to_string()).await;
        }
    }
    status
        .write(api, ctx, |s| {
            s.phase = Some(phase);
            s.conditions = not_ready(reason, message);
        })
        .await
}

/// Keeps the status last written during one reconcile, and writes a new one only when it differs.
struct StatusWriter {
    key: String,
    name: String,
    generation: Option<i64>,
    last: TunnelStatus,
    /// The object's resourceVersion after our last write, for a conditional patch after it.
    resource_version: Option<String>,
}

impl StatusWriter {
    fn new(tunnel: &Tunnel, ctx: &Context) -> Self {
        let remembered = ctx.statuses.lock().unwrap_or_else(|p| p.into_inner()).get(&key(tunnel)).cloned();
        StatusWriter {
            key: key(tunnel),
            name: tunnel.name_any(),
            generation: tunnel.metadata.generation,
            last: remembered.or_else(|| tunnel.status.clone()).unwrap_or_default(),
            resource_version: tunnel.metadata.resource_version.clone(),
        }
    }

    fn current(&self) -> &TunnelStatus {
        &self.last
    }

    async fn write(&mut self, api: &Api<Tunnel>, ctx: &Context, change: impl FnOnce(&mut TunnelStatus)) -> Result<()> {
        let mut new = self.last.clone();
        change(&mut new);
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let generation = self.generation;
        let conditions = new.conditions.into_iter().map(|mut c| {
            c.observed_generation = generation;
            c
        });
        new.conditions = condition::merge(&self.last.conditions, conditions.collect(), &now);
        if new == self.last {
            return Ok(());
        }
        // A merge patch leaves out absent fields; cleared fields must be sent as null.
        let mut body = serde_json::to_value(&new).map_err(|e| Error::InvalidSpec(e.to_string()))?;
        if let Some(map) = body.as_object_mut() {
            for field in ["phase", "provider", "hostId", "hostIp", "ports", "observedGeneration"] {
                map.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        ctx.api_writes.inc();
        let patched =
            api.patch_status(&self.name, &PatchParams::default(), &Patch::Merge(json!({ "status": body }))).await?;
        self.resource_version = patched.metadata.resource_version;
        ctx.statuses.lock().unwrap_or_else(|p| p.into_inner()).insert(self.key.clone(), new.clone());
        self.last = new;
        Ok(())
    }
}

async fn publish(ctx: &Context, tunnel: &Tunnel, type_: EventType, reason: &str, note: String) {
    publish_on(ctx, &tunnel.object_ref(&()), type_, reason, note).await
}

async fn publish_on(
    ctx: &Context,
    object: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    ctx.api_writes.inc();
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, object).await {
        warn!(error = %e, "could not publish event");
    }
}

/// Deletes the exit server (the recorded one and any other carrying the Tunnel's UID), clears the
/// Service's ingress if this Tunnel set it, and releases the finalizer. A host already gone counts
/// as deleted; a provider that is not configured keeps the finalizer (deleting the Tunnel then
/// would leak the host), with the reason in status.
async fn cleanup(tunnel: &Tunnel, api: &Api<Tunnel>, ctx: &Context, status: &mut StatusWriter) -> Result<Action> {
    if !tunnel.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let recorded_host = status.current().host_id.clone();
    let provider = match provider_for(tunnel, status.current(), ctx) {
        Ok(p) => Some(p),
        // Never created a host: nothing to delete.
        Err(_) if recorded_host.is_none() => None,
        Err(Blocked(_, reason, message)) => {
            let message = format!("{message}; the exit server cannot be deleted, so the Tunnel is kept");
            status
                .write(api, ctx, |s| {
                    s.phase = Some(TunnelPhase::Deleting);
                    s.conditions = not_ready(reason, &message);
                })
                .await?;
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
    };
    status
        .write(api, ctx, |s| {
            s.phase = Some(TunnelPhase::Deleting);
            s.conditions = not_ready("Deleting", "deleting the exit server");
        })
        .await?;
    if let Some(provider) = provider {
        let mut ids: Vec<String> = recorded_host.into_iter().collect();
        for host in provider.list_by_tag(providers::hosts::TAG_TUNNEL_UID, &uid).await? {
            if !ids.contains(&host.id) {
                ids.push(host.id);
            }
        }
        for id in &ids {
            provider.delete(id).await?;
            info!(host = %id, provider = provider.name(), "deleted exit server");
        }
        if !ids.is_empty() {
            publish(ctx, tunnel, EventType::Normal, "Deleted", format!("deleted exit server {}", ids.join(", "))).await;
        }
    }
    if let Some(service) = ctx.services.get(&ObjectRef::new(&tunnel.spec.service_ref.name).within(&ns))
        && desired::controls_service_status(tunnel, &service)
    {
        act::set_ingress(&service, None, ctx).await?;
    }
    // Conditional on the version our own status write produced, not the one we were handed.
    let mut current = tunnel.clone();
    current.metadata.resource_version = status.resource_version.clone();
    ctx.api_writes.inc();
    remove_finalizer(api, &current, FINALIZER).await?;
    ctx.backoff.reset(&key(tunnel));
    ctx.statuses.lock().unwrap_or_else(|p| p.into_inner()).remove(&key(tunnel));
    Ok(Action::await_change())
}

/// Transient failures: retry after the provider's Retry-After if it gave one, else the object's
/// own exponential backoff.
pub fn error_policy(tunnel: Arc<Tunnel>, error: &Error, ctx: Arc<Context>) -> Action {
    let backoff = ctx.backoff.next_delay(&key(&tunnel));
    let delay = error.retry_after().map_or(backoff, |d| d.max(backoff));
    warn!(namespace = %tunnel.namespace().unwrap_or_default(), name = %tunnel.name_any(), reason = error.reason(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

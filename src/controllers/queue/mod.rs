//! The Queue controller: keeps one SQS queue per `Queue` object in line with its spec.
//!
//! Each reconcile runs the same pipeline:
//! 1. finalizer (so the SQS queue can never outlive its object unnoticed),
//! 2. [`observe`]: dead-letter reference from the local cache, then SQS (one GetQueueAttributes
//!    for a converged queue; tags only when due),
//! 3. [`plan`]: pure comparison of [`desired`] state with what was observed,
//! 4. [`act`]: the planned SQS writes, the owned ConfigMap, and the status (each written only
//!    when it differs, so a converged Queue costs no writes at all).

pub mod act;
pub mod desired;
pub mod observe;
pub mod plan;
mod recent;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource, ResourceExt};
use providers::QueueBackend;
use serde_json::json;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::config::QueueArgs;
use crate::controllers::{ApiWrites, Backoff, jittered, remove_finalizer};
use crate::crd::condition::{self, Condition, ConditionStatus};
use crate::crd::queue::{DeletionPolicy, Queue, QueueStatus};
use crate::error::{Error, Result};
use crate::metrics::ReconcileMetrics;

use act::Ready;

/// Finalizer guarding the SQS queue's deletion.
pub const FINALIZER: &str = "queues.skyport.dev/cleanup";
/// Label on every object skyport creates in the cluster (and the selector of its watches).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "skyport");

/// Shared state of the Queue controller.
pub struct Context {
    pub client: Client,
    pub sqs: Arc<dyn QueueBackend>,
    pub settings: QueueArgs,
    recorder: Recorder,
    /// All Queues in scope (for dead-letter references), kept by the controller's reflector.
    pub queues: Store<Queue>,
    /// ConfigMaps skyport manages, to skip writes that would change nothing.
    pub configmaps: Store<ConfigMap>,
    pub backoff: Backoff,
    /// Writes made to the API server (finalizers, status, ConfigMaps, Events).
    pub api_writes: ApiWrites,
    /// Reconcile counts, failures by reason and durations, for `/metrics`.
    pub metrics: Arc<ReconcileMetrics>,
    /// When each queue's tags were last found converged, and at which generation.
    tags_checked: Mutex<HashMap<String, (Instant, Option<i64>)>>,
    /// Converges that changed something, to answer the follow-ups they trigger ([`recent`]).
    recent: recent::Recent,
    /// Wakes Queues that use a queue as their dead-letter queue when it changes.
    dependents: UnboundedSender<ObjectRef<Queue>>,
}

/// Outcome of one converge pass, before status is written.
#[derive(Debug)]
pub enum Outcome {
    Ready(Ready),
    Wait { reason: &'static str, message: String, retry: Option<std::time::Duration> },
}

/// Builds the controller. Returns its context (counters, stores) and the future that runs it
/// until `shutdown` resolves, finishing the reconciles in flight.
pub fn controller(
    client: Client,
    sqs: Arc<dyn QueueBackend>,
    settings: QueueArgs,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> (Arc<Context>, impl std::future::Future<Output = ()> + Send) {
    let (queues, configmaps): (Api<Queue>, Api<ConfigMap>) = match namespace.as_deref() {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let (queue_reader, queue_writer) = reflector::store();
    // Status writes (ours) must not trigger reconciles: only spec (generation), finalizers and
    // deletion do. Periodic resync comes from the requeue each reconcile returns.
    let queue_stream = watcher(queues, watcher::Config::default())
        .default_backoff()
        .modify(crate::controllers::slim)
        .reflect(queue_writer)
        .applied_objects()
        .predicate_filter(trigger_hash, Default::default());
    let (cm_reader, cm_writer) = reflector::store();
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let cm_stream = watcher(configmaps, watcher::Config::default().labels(&selector))
        .default_backoff()
        .modify(crate::controllers::slim)
        .reflect(cm_writer)
        .touched_objects();
    let (tx, rx) = unbounded();
    let reporter = Reporter { controller: "skyport".into(), instance: std::env::var("POD_NAME").ok() };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        sqs,
        backoff: Backoff::new(settings.backoff_min, settings.backoff_max),
        settings,
        queues: queue_reader.clone(),
        configmaps: cm_reader,
        api_writes: ApiWrites::default(),
        metrics: Arc::default(),
        tags_checked: Mutex::default(),
        recent: recent::Recent::default(),
        dependents: tx,
    });
    let config = ControllerConfig::default().concurrency(ctx.settings.concurrency);
    let run = Controller::for_stream(queue_stream, queue_reader)
        .owns_stream(cm_stream)
        .reconcile_on(rx)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            match result {
                Ok((obj, action)) => debug!(queue = %obj, ?action, "reconciled"),
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    warn!(queue = %obj, reason = e.reason(), error = %e, "reconcile failed")
                }
                Err(e) => warn!(error = %e, "controller event"),
            }
            futures::future::ready(())
        });
    (ctx, run)
}

fn trigger_hash(q: &Queue) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    q.metadata.uid.hash(&mut h);
    q.metadata.generation.hash(&mut h);
    q.metadata.deletion_timestamp.is_some().hash(&mut h);
    q.finalizers().hash(&mut h);
    // The generation predicate alone would miss a recreated object with the same generation.
    predicates::generation(q).hash(&mut h);
    Some(h.finish())
}

fn key(queue: &Queue) -> String {
    queue.uid().unwrap_or_else(|| format!("{}/{}", queue.namespace().unwrap_or_default(), queue.name_any()))
}

/// Entry point per object: a span with kind, namespace and name around [`reconcile_inner`].
pub async fn reconcile(queue: Arc<Queue>, ctx: Arc<Context>) -> Result<Action> {
    let span = info_span!("reconcile", kind = "Queue", namespace = %queue.namespace().unwrap_or_default(), name = %queue.name_any());
    let started = Instant::now();
    let result = reconcile_inner(queue, ctx.clone()).instrument(span).await;
    ctx.metrics.record(started.elapsed(), result.as_ref().err().map(Error::reason));
    result
}

async fn reconcile_inner(queue: Arc<Queue>, ctx: Arc<Context>) -> Result<Action> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let api: Api<Queue> = Api::namespaced(ctx.client.clone(), &ns);
    if queue.meta().deletion_timestamp.is_some() {
        return cleanup(&queue, &api, &ctx).await;
    }
    let added_finalizer = !queue.finalizers().iter().any(|f| f == FINALIZER);
    let queue = if added_finalizer {
        ctx.api_writes.inc();
        Arc::new(crate::controllers::add_finalizer(&api, &queue, FINALIZER).await?)
    } else {
        queue
    };
    let fingerprint = recent::fingerprint(&queue, &ctx.queues);
    if let Some((ready, age)) = ctx.recent.get(&key(&queue), fingerprint, ctx.settings.resync / 2) {
        // A follow-up of our own writes: SQS was just converged and the status written.
        act::ensure_configmap(&queue, &ready, &ctx).await?;
        return Ok(Action::requeue(jittered(ctx.settings.resync).saturating_sub(age)));
    }

    match converge(&queue, &ctx).await {
        Ok(Outcome::Ready(ready)) => {
            act::ensure_configmap(&queue, &ready, &ctx).await?;
            for (reason, note) in &ready.events {
                publish(&ctx, &queue, EventType::Normal, reason, note.clone()).await;
            }
            let was =
                ready_condition(&queue).map(|c| (c.status, queue.status.as_ref().and_then(|s| s.queue_arn.clone())));
            let arn = ready.arn.clone();
            write_status(
                &queue,
                &api,
                &ctx,
                Some(&ready),
                vec![
                    Condition::new(
                        "Ready",
                        ConditionStatus::True,
                        "Available",
                        "the SQS queue exists and matches the spec",
                    ),
                    Condition::new("Synced", ConditionStatus::True, "ReconcileSuccess", ""),
                ],
            )
            .await?;
            let became_ready = was != Some((ConditionStatus::True, Some(arn)));
            if became_ready {
                wake_dependents(&queue, &ctx);
            }
            if became_ready || added_finalizer {
                ctx.recent.record(key(&queue), fingerprint, &ready);
            }
            ctx.backoff.reset(&key(&queue));
            Ok(Action::requeue(jittered(ctx.settings.resync)))
        }
        Ok(Outcome::Wait { reason, message, retry }) => {
            report_problem(&queue, &api, &ctx, reason, &message).await?;
            ctx.backoff.reset(&key(&queue));
            Ok(retry.map(Action::requeue).unwrap_or_else(Action::await_change))
        }
        Err(e) if e.is_permanent() => {
            report_problem(
                &queue,
                &api,
                &ctx,
                e.reason(),
                &format!("{e}; fix the spec, nothing is retried until it changes"),
            )
            .await?;
            Ok(Action::await_change())
        }
        Err(e) => {
            // Best effort: the API server may be what is failing.
            if let Err(status_err) =
                report_problem(&queue, &api, &ctx, e.reason(), &format!("{e}; retrying with backoff")).await
            {
                debug!(error = %status_err, "could not record the failure in status");
            }
            Err(e)
        }
    }
}

/// Observe, plan and act against SQS.
async fn converge(queue: &Queue, ctx: &Context) -> Result<Outcome> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let uid = queue.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let owner = desired::Owner { namespace: &ns, name: &queue.name_any(), uid: &uid };
    let dead_letter_arn = match observe::dead_letter_arn(queue, &ctx.queues) {
        Ok(arn) => arn,
        Err(wait) => return Ok(wait.into_outcome(ctx.settings.resync)),
    };
    let desired = desired::desired(&queue.spec, &owner, dead_letter_arn.as_deref());
    let tags_due = tags_due(ctx, &uid, queue.metadata.generation);
    let observed = observe::observe(queue, &desired, ctx.sqs.as_ref(), tags_due).await?;
    let plan = plan::plan(&desired, queue.spec.fifo, &uid, queue.spec.adopt, &observed);
    debug!(?plan, "planned");
    let outcome = act::apply(queue, &desired, &observed, plan, ctx).await?;
    if let (Outcome::Ready(_), true) = (&outcome, tags_due) {
        ctx.tags_checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid, (Instant::now(), queue.metadata.generation));
    }
    Ok(outcome)
}

fn tags_due(ctx: &Context, uid: &str, generation: Option<i64>) -> bool {
    match ctx.tags_checked.lock().unwrap_or_else(|p| p.into_inner()).get(uid) {
        Some((at, seen)) => *seen != generation || at.elapsed() >= ctx.settings.tag_resync,
        None => true,
    }
}

fn ready_condition(queue: &Queue) -> Option<&Condition> {
    queue.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")
}

/// Ready=False with `reason`, plus a Warning Event when the reason is new.
async fn report_problem(queue: &Queue, api: &Api<Queue>, ctx: &Context, reason: &str, message: &str) -> Result<()> {
    let previous = ready_condition(queue).filter(|c| c.status == ConditionStatus::False).map(|c| c.reason.clone());
    if previous.as_deref() != Some(reason) {
        warn!(reason, message, "queue not ready");
        publish(ctx, queue, EventType::Warning, reason, message.to_string()).await;
    }
    write_status(
        queue,
        api,
        ctx,
        None,
        vec![
            Condition::new("Ready", ConditionStatus::False, reason, message),
            Condition::new("Synced", ConditionStatus::False, reason, message),
        ],
    )
    .await
}

/// Writes status when (and only when) it differs from what the object already says.
async fn write_status(
    queue: &Queue,
    api: &Api<Queue>,
    ctx: &Context,
    ready: Option<&Ready>,
    conditions: Vec<Condition>,
) -> Result<()> {
    let old = queue.status.clone().unwrap_or_default();
    let generation = queue.metadata.generation;
    let conditions = conditions.into_iter().map(|mut c| {
        c.observed_generation = generation;
        c
    });
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut new =
        QueueStatus { conditions: condition::merge(&old.conditions, conditions.collect(), &now), ..old.clone() };
    if let Some(r) = ready {
        new.queue_url = Some(r.url.clone());
        new.queue_arn = Some(r.arn.clone());
        new.queue_name = Some(r.name.clone());
        new.observed_generation = generation;
    }
    if new == old {
        return Ok(());
    }
    ctx.api_writes.inc();
    api.patch_status(&queue.name_any(), &PatchParams::default(), &Patch::Merge(json!({ "status": new }))).await?;
    Ok(())
}

/// Queues in the same namespace whose deadLetter.queueRef names `queue` are reconciled now
/// instead of at their next resync.
fn wake_dependents(queue: &Queue, ctx: &Context) {
    let (ns, name) = (queue.namespace(), queue.name_any());
    for q in ctx.queues.state() {
        let refers = q.namespace() == ns
            && q.spec.dead_letter.as_ref().and_then(|d| d.queue_ref.as_ref()).is_some_and(|r| r.name == name);
        if refers {
            let _ = ctx.dependents.unbounded_send(ObjectRef::from_obj(&*q));
        }
    }
}

async fn publish(ctx: &Context, queue: &Queue, type_: EventType, reason: &str, note: String) {
    ctx.api_writes.inc();
    let event = Event {
        type_,
        reason: reason.to_string(),
        // Events are capped at 1 kB; AWS messages can be long.
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &queue.object_ref(&())).await {
        warn!(error = %e, "could not publish event");
    }
}

/// Deletes the SQS queue (unless Retain) and releases the finalizer. Needs no valid spec: only
/// the recorded URL, or the queue name plus the owner tag proving the queue is ours.
async fn cleanup(queue: &Queue, api: &Api<Queue>, ctx: &Context) -> Result<Action> {
    if !queue.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    match queue.spec.deletion_policy {
        DeletionPolicy::Delete => {
            if let Some(url) = observe::owned_queue_url(queue, ctx.sqs.as_ref()).await? {
                ctx.sqs.delete_queue(&url).await?;
                info!(url, "deleted SQS queue");
                publish(ctx, queue, EventType::Normal, "Deleted", format!("deleted SQS queue {url}")).await;
            }
        }
        DeletionPolicy::Retain => {
            let url = queue.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap_or_default();
            info!(url, "deletionPolicy Retain: SQS queue kept");
            publish(ctx, queue, EventType::Normal, "Retained", format!("deletionPolicy Retain: SQS queue {url} kept"))
                .await;
        }
    }
    ctx.api_writes.inc();
    remove_finalizer(api, queue, FINALIZER).await?;
    ctx.backoff.reset(&key(queue));
    if let Some(uid) = queue.uid() {
        ctx.tags_checked.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
    }
    ctx.recent.forget(&key(queue));
    Ok(Action::await_change())
}

/// Transient failures: retry after the object's own exponential backoff.
pub fn error_policy(queue: Arc<Queue>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next_delay(&key(&queue));
    warn!(namespace = %queue.namespace().unwrap_or_default(), name = %queue.name_any(), reason = error.reason(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

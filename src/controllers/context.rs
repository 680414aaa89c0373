//! The state every controller carries, and what each does the same way: Events, the scoped
//! `Api`, logging a reconcile's result, retrying failures with backoff.

use std::ops::Deref;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, warn};

use super::acting::{Acting, Gate};
use super::backoff::Backoff;
use super::events::Events;
use super::memory::OwnWrites;
use super::{ApiWrites, CONTROLLER_NAME, object_key};
use crate::error::Error;
use crate::metrics::ReconcileMetrics;
use crate::reasons::{Reason, Severity};

/// Longest Event note: Events are capped at 1 kB, and cloud error messages can be long.
const NOTE_MAX_CHARS: usize = 1000;

/// A controller's context: what all controllers share, plus `S`, what is this controller's own
/// (reached through `Deref`), and the memory of its own writes, holding `M` per object.
pub struct Context<S, M = ()> {
    pub client: Client,
    events: Events,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Writes made to the API server (finalizers, status, owned objects, Events).
    pub api_writes: ApiWrites,
    /// Reconcile counts, failures by reason and durations, for `/metrics`.
    pub metrics: Arc<ReconcileMetrics>,
    /// What this controller last wrote per object ([`OwnWrites`]).
    pub written: OwnWrites<M>,
    /// Whether this replica may act ([`Acting`]): shut while a standby waits for the Lease.
    pub acting: Acting,
    state: S,
}

impl<S, M> Deref for Context<S, M> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.state
    }
}

impl<S, M> Context<S, M> {
    pub fn new(client: Client, backoff: Backoff, state: S) -> Self {
        Context {
            events: Events::new(client.clone(), CONTROLLER_NAME, std::env::var("POD_NAME").ok()),
            client,
            backoff,
            api_writes: ApiWrites::default(),
            metrics: Arc::default(),
            written: OwnWrites::default(),
            acting: Acting::always(),
            state,
        }
    }

    /// The context acting only when `acting` permits (a standby's controllers).
    pub fn with_acting(mut self, acting: Acting) -> Self {
        self.acting = acting;
        self
    }

    /// Publishes an Event on `obj`, a Warning or Normal one as the reasons table says.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: Reason, note: String) {
        self.publish_on(&obj.object_ref(&()), reason, note).await
    }

    /// Publishes an Event on the object `reference` names. A failure is logged, never returned:
    /// an Event is worth less than the reconcile it reports on.
    pub async fn publish_on(&self, reference: &ObjectReference, reason: Reason, note: String) {
        self.api_writes.inc();
        let note: String = note.chars().take(NOTE_MAX_CHARS).collect();
        let type_ = match reason.severity() {
            Severity::Warning => EventType::Warning,
            Severity::Normal | Severity::Ready => EventType::Normal,
        };
        if let Err(e) = self.events.publish(reference, type_, reason.as_str(), "Reconcile", &note).await {
            warn!(error = %e, "could not publish event");
        }
    }
}

/// `K`s in `namespace`, or in all namespaces.
pub fn scoped_api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The namespace of a namespaced object, which every object these controllers reconcile is.
pub fn namespace_of<K: Resource>(obj: &K) -> crate::Result<String> {
    obj.namespace().ok_or(Error::MissingObjectKey("namespace"))
}

/// `T`s in the namespace of `obj`.
pub fn api_beside<T, K>(client: &Client, obj: &K) -> crate::Result<Api<T>>
where
    T: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
    K: Resource,
{
    Ok(Api::namespaced(client.clone(), &namespace_of(obj)?))
}

/// The entry point every controller hands to kube-runtime: `inner` for `obj`, inside a span
/// naming the object (kind, namespace, name), its duration and failure reason recorded.
/// Nothing happens until this replica may act on `obj` ([`Acting`]); a reconcile that had to
/// wait returns at once, requeued, so that it acts on the object as the cache holds it then.
pub async fn reconcile_with<K, S, M, F, Fut>(obj: Arc<K>, ctx: Arc<Context<S, M>>, inner: F) -> crate::Result<Action>
where
    K: Resource<DynamicType = ()> + super::Sharded,
    F: FnOnce(Arc<K>, Arc<Context<S, M>>) -> Fut,
    Fut: std::future::Future<Output = crate::Result<Action>>,
{
    let kind = K::kind(&());
    if !ctx.acting.permits(&*obj) && !K::ONE_SHARD && ctx.acting.sharded() {
        // Not now: waiting here would hold a worker this replica's shards need.
        return Ok(ctx.acting.turned_away(&obj.shard()));
    }
    if !ctx.acting.permits(&*obj) {
        debug!(kind = %kind, namespace = %obj.namespace().unwrap_or_default(), name = %obj.name_any(), "standby: waiting for the Lease");
        return Ok(match ctx.acting.until_permits(&*obj).await {
            true => Gate::parked(),
            false => Action::await_change(),
        });
    }
    let metrics = ctx.metrics.clone();
    if let Some(left) = ctx.backoff.held(&object_key(&*obj), owner_change(&*obj)) {
        debug!(kind = %kind, namespace = %obj.namespace().unwrap_or_default(), name = %obj.name_any(), retry_in = ?left, "still backing off");
        return Ok(Action::requeue(left));
    }
    super::instrumented(&kind, &*obj.clone(), &metrics, inner(obj, ctx)).await
}

/// What the object's owner changes that must end a backoff at once: its generation (an edit)
/// and its deletion. Not finalizers, status or owned objects: those are our own writes.
pub fn owner_change<K: Resource>(obj: &K) -> u64 {
    let meta = obj.meta();
    super::hash_of((&meta.uid, meta.generation, meta.deletion_timestamp.is_some()))
}

/// Transient failures: retry after the cloud's Retry-After if it gave one, else the object's own
/// exponential backoff; failures that heal slowly (refused credentials) no faster than the
/// backoff's slow floor. This is where every failed reconcile is logged (once).
pub fn error_policy<K, S, M>(obj: Arc<K>, error: &Error, ctx: Arc<Context<S, M>>) -> Action
where
    K: Resource<DynamicType = ()>,
{
    let backoff = ctx.backoff.next_delay(&object_key(&*obj));
    let mut delay = error.retry_after().map_or(backoff, |d| d.max(backoff));
    if error.heals_slowly() {
        delay = ctx.backoff.slow(delay);
    }
    warn!(kind = %K::kind(&()), namespace = %obj.namespace().unwrap_or_default(), name = %obj.name_any(), reason = %error.reason(), error = %error, retry_in = ?delay, "reconcile failed");
    ctx.backoff.hold(&object_key(&*obj), delay, owner_change(&*obj));
    Action::requeue(delay)
}

//! The Queue controller: keeps one SQS queue per `Queue` object in line with its spec.
//!
//! Each reconcile runs the same pipeline:
//! 1. finalizer (so the SQS queue can never outlive its object unnoticed),
//! 2. [`observe`]: dead-letter reference from the local cache, then SQS (one GetQueueAttributes
//!    for a converged queue; tags only when due, and before every write),
//! 3. [`plan`]: pure comparison of [`desired`] state with what was observed (the order of the
//!    three, and the create-first path of a new Queue, live in [`converge`]),
//! 4. [`act`]: the planned SQS writes and the owned ConfigMap; [`status`]: the status (each
//!    written only when it differs, so a converged Queue costs no writes at all);
//! 5. [`cleanup`] when the Queue is being deleted.
//!
//! A converge that changed something is remembered for half a resync (`Context::written`): the
//! follow-up reconciles our own writes trigger (finalizer, ConfigMap) usually start before the
//! Queue cache shows the status just written, and would otherwise look the queue up again and
//! write the same status twice (`benches/queues.rs` measured 5.3 SQS calls and 1.7 status
//! patches per new Queue instead of 3 and 1). Periodic resyncs come at least 0.9 × resync after
//! a converge, so they always look at SQS. A converged Queue waits for its resync in
//! [`State::resyncs`] (`crate::controllers::resyncs`), not in kube-runtime's scheduler, which
//! keeps only what is retried soon.

pub mod account_use;
pub mod accounts;
pub mod act;
pub mod cleanup;
pub mod configmaps;
mod converge;
pub mod dead_letter;
pub mod desired;
pub mod exports;
pub mod fair;
pub mod observe;
pub mod pace;
pub mod plan;
pub mod refs;
pub mod sealed;
pub mod secret_exports;
pub mod status;
pub mod tenancy;
#[cfg(test)]
mod tests;
pub mod unsettled;

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use providers::{QueueBackend, SqsSettings};

use crate::config::QueueArgs;
use crate::controllers::resyncs::{self, Resyncs};
use crate::controllers::{
    Backoff, Reconciler, api_beside, error_policy, has_synced, jittered, managed_selector, object_key, primary_stream,
    scoped_api, slim, spec_trigger,
};
use crate::crd::account::AwsAccount;
use crate::crd::queue::Queue;
use crate::error::{Error, Result};
use crate::reasons::Reason;

use plan::{Outcome, Ready};

/// Finalizer guarding the SQS queue's deletion.
pub const FINALIZER: &str = "queues.skyport.dev/cleanup";

/// The Queue controller's context: the shared one, with [`State`] and, per Queue, its last
/// converge that changed something (fingerprint, outcome).
pub type Context = crate::controllers::Context<State, (u64, Arc<Ready>)>;

/// What only the Queue controller holds.
pub struct State {
    /// SQS as the operator's own identity (Queues without an accountRef).
    pub sqs: Arc<dyn QueueBackend>,
    /// AwsAccounts in scope, their SQS clients and budgets.
    pub accounts: accounts::Accounts,
    pub settings: QueueArgs,
    /// All Queues in scope (for dead-letter references), kept by the controller's reflector.
    pub queues: Store<Queue>,
    /// ConfigMaps skyport manages (what it decides with, see [`configmaps`]), to skip writes that
    /// would change nothing.
    pub configmaps: Store<configmaps::CachedConfigMap>,
    /// The ConfigMaps each Queue controls besides its own, by the Queue's UID.
    pub exported: Arc<configmaps::Exported>,
    /// Per Queue and export Secret: the UID and a hash of the data last written (Secrets are
    /// never read, see [`secret_exports`]).
    pub secrets: crate::controllers::memory::OwnWrites<secret_exports::Written>,
    /// Per Queue: the queue its owner tag last proved ours, when, and at which generation.
    verified: observe::Proofs,
    /// Per Queue: a CreateQueue whose outcome is unknown, which its cleanup waits out.
    pub unsettled: unsettled::Unsettled,
    /// Per Queue: the dead-letter target its owner tags last proved this namespace's, and when.
    redrives: dead_letter::Proven,
    /// When each converged Queue is checked again (its periodic resync).
    pub resyncs: Arc<Resyncs>,
    /// Queues per SQS budget, which pace each budget's checks ([`pace`]).
    pacing: pace::Tally,
    /// Reconciles in flight per SQS budget: one account cannot hold every worker ([`fair`]).
    pub gate: fair::Gate,
    /// The Queues that name a dead-letter target or an AwsAccount, by what they name ([`refs`]).
    pub refs: Arc<refs::Refs>,
    /// Which Queues still hold which AwsAccounts ([`account_use`]).
    pub usage: account_use::Usage,
    /// Wakes Queues that use a queue as their dead-letter queue when it changes.
    dependents: UnboundedSender<ObjectRef<Queue>>,
    /// The not-Ready reason last reported per Queue: the follow-up of a new Queue's finalizer
    /// write can start before the cache shows the status, and must not warn a second time.
    pub reported: crate::controllers::memory::OwnWrites<crate::reasons::Reason>,
}

impl State {
    /// Whether every cache a reconcile waits for has listed once: its own, the ConfigMaps it
    /// publishes through and the AwsAccounts (for Queues with an accountRef). Asked at shutdown
    /// ([`crate::controllers::shutdown`]).
    pub fn caches_synced(&self) -> bool {
        has_synced(&self.queues) && has_synced(&self.configmaps) && self.accounts.synced()
    }

    /// A converged Queue's next check, after `delay`: kept in [`Resyncs`] (32 bytes) rather than
    /// in kube-runtime's scheduler (about 440), where every Ready Queue would wait for it.
    pub fn resync_after(&self, key: &str, delay: Duration) -> Action {
        self.resyncs.after(key, delay);
        Action::await_change()
    }
}

/// Builds the controller, acting only when `acting` permits. Returns its context (counters,
/// stores) and the future that runs it until `shutdown` resolves, finishing the reconciles in
/// flight.
pub fn controller(
    client: Client,
    sqs: Arc<dyn QueueBackend>,
    aws: SqsSettings,
    settings: QueueArgs,
    namespace: Option<String>,
    acting: crate::controllers::Acting,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> (Arc<Context>, impl std::future::Future<Output = ()> + Send) {
    let (queue_reader, queue_writer) = reflector::store();
    // Status writes (ours) must not trigger reconciles: only spec (generation), finalizers and
    // deletion do. Periodic resync comes from the requeue each reconcile returns.
    let refs = Arc::new(refs::Refs::default());
    let queue_feed = refs::feed(queue_writer, refs.clone());
    let queue_stream =
        primary_stream(scoped_api::<Queue>(&client, namespace.as_deref()), queue_feed, trim, spec_trigger);
    let (cm_reader, cm_writer) = reflector::store();
    let exported = Arc::new(configmaps::Exported::default());
    let cm_feed = configmaps::feed(cm_writer, exported.clone());
    // A ConfigMap's change wakes its controlling Queue, as `owns` would.
    let cm_changes =
        configmaps::watch(scoped_api::<ConfigMap>(&client, namespace.as_deref()), &managed_selector(), cm_feed);
    // AwsAccounts have a reconciler of their own (account_use), which wakes the Queues that use
    // one when it changes.
    let (account_reader, account_writer) = reflector::store();
    let account_stream = watcher(scoped_api::<AwsAccount>(&client, namespace.as_deref()), watcher::Config::default())
        .default_backoff()
        .modify(slim)
        .reflect(account_writer)
        .touched_objects();
    let (usage, account_wakes) = account_use::Usage::new();
    let (tx, rx) = unbounded();
    // Refused credentials heal with a token refresh or key rotation: retried once per resync.
    let backoff = Backoff::new(settings.backoff_min, settings.backoff_max).with_slow_floor(settings.resync);
    let concurrency = settings.concurrency;
    let resyncs = Arc::new(Resyncs::default());
    let due = resyncs::sweep(resyncs.clone(), queue_reader.clone(), resyncs::tick(settings.resync));
    let written = crate::controllers::memory::OwnWrites::expiring(follow_up_window(settings.resync));
    // Entries of Queues that are gone are swept; live ones are rewritten every tag resync.
    let secrets = crate::controllers::memory::OwnWrites::expiring(settings.tag_resync * 2);
    let state = State {
        sqs,
        accounts: accounts::Accounts::new(account_reader.clone(), aws).within(settings.cluster_id.clone()),
        usage,
        settings,
        queues: queue_reader.clone(),
        configmaps: cm_reader,
        exported,
        refs,
        secrets,
        verified: Default::default(),
        unsettled: Default::default(),
        redrives: Default::default(),
        resyncs: resyncs.clone(),
        pacing: Default::default(),
        gate: fair::Gate::new(concurrency, tx.clone()),
        reported: Default::default(),
        dependents: tx,
    };
    let mut ctx = Context::new(client, backoff, state).with_acting(acting);
    ctx.written = written;
    let ctx = Arc::new(ctx);
    let shutdown = shutdown.shared();
    let queues = Controller::for_stream(queue_stream, queue_reader)
        .reconcile_on(futures::stream::select(futures::stream::select(cm_changes, rx), due))
        .reconcile_all_on(ctx.acting.takeovers())
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(crate::log_result!(queue));
    let accounts = account_use::controller(account_stream, account_reader, account_wakes, shutdown, ctx.clone());
    let run = async move {
        futures::join!(queues, accounts);
    };
    (ctx, run)
}

/// What the Queue cache keeps: [`slim`], without labels and annotations as well. Nothing in this
/// controller reads them, and each map costs a B-tree node of eleven slots per Queue (Helm alone
/// adds four labels).
fn trim(q: &mut Queue) {
    slim(q);
    q.metadata.labels = None;
    q.metadata.annotations = None;
}

/// How long after a converge its follow-ups are answered from memory (`Context::written`); the
/// memory sweeps entries older than this.
fn follow_up_window(resync: Duration) -> Duration {
    resync / 2
}

/// Entry point per object: the shared reconcile ([`crate::controllers::reconciler`]) around
/// [`State`]'s [`Reconciler`] steps.
pub async fn reconcile(queue: Arc<Queue>, ctx: Arc<Context>) -> Result<Action> {
    crate::controllers::reconciler::reconcile(queue, ctx).await
}

impl Reconciler for State {
    type Object = Queue;
    type Memory = (u64, Arc<Ready>);
    const FINALIZER: &'static str = FINALIZER;
    const PERMANENT_HINT: &'static str = "fix the spec, nothing is retried until it changes";

    fn begin(queue: &Queue, ctx: &Context) {
        // Reconciled now: the next resync is whatever this pass decides.
        ctx.resyncs.forget(&object_key(queue));
    }

    async fn apply(queue: Arc<Queue>, ctx: Arc<Context>, added_finalizer: bool) -> Result<Action> {
        apply(queue, &ctx, added_finalizer).await
    }

    async fn cleanup(queue: Arc<Queue>, ctx: Arc<Context>) -> Result<Action> {
        cleanup::cleanup(&queue, &api_beside(&ctx.client, &*queue)?, &ctx).await
    }

    async fn report_failure(queue: &Queue, ctx: &Context, error: &Error, message: &str) -> Result<()> {
        status::report_problem(queue, &api_beside(&ctx.client, queue)?, ctx, error.reason(), message).await
    }
}

/// Converges a live Queue: its account, SQS, the published ConfigMaps and exports, status.
async fn apply(queue: Arc<Queue>, ctx: &Context, added_finalizer: bool) -> Result<Action> {
    let api: Api<Queue> = api_beside(&ctx.client, &*queue)?;
    let key = object_key(&*queue);
    let placement = match ctx.accounts.place(&queue, &ctx.sqs).await {
        Ok(placement) => {
            account_use::hold(&placement, ctx).await?;
            placement
        }
        Err((reason, message)) => {
            // Waits for the AwsAccount to change (its watch wakes this Queue); the resync is a net.
            status::report_problem(&queue, &api, ctx, reason, &message).await?;
            ctx.written.forget(&key);
            return Ok(Action::requeue(jittered(ctx.settings.resync)));
        }
    };
    // A slow or throttled account holds at most its share of the workers: refused, this Queue
    // waits for a wake from the gate (the resync is a net), its worker free for other accounts.
    let Some(_turn) = ctx.gate.enter(&placement.budget, ObjectRef::from_obj(&*queue)) else {
        return Ok(ctx.resync_after(&key, jittered(ctx.resync(&queue))));
    };
    let fingerprint = observe::fingerprint(&queue, &ctx.queues, &placement);
    let window = follow_up_window(ctx.settings.resync);
    if let Some(((_, ready), age)) = ctx.written.get(&key, |(seen, _), age| *seen == fingerprint && age < window) {
        // A follow-up of our own writes: SQS was just converged and the status written.
        let published = exports::publish(&queue, &ready, ctx).await?;
        if let Some((reason, conflict)) = &published.conflict {
            status::report_conflict(&queue, &api, ctx, *reason, conflict, &published.owned).await?;
            ctx.written.forget(&key);
            return Ok(Action::requeue(jittered(ctx.resync(&queue))));
        }
        return Ok(ctx.resync_after(&key, jittered(ctx.resync(&queue)).saturating_sub(age)));
    }

    match converge::converge(&queue, ctx, placement.sqs.as_ref(), added_finalizer).await? {
        Outcome::Ready(ready) => {
            let published = exports::publish(&queue, &ready, ctx).await?;
            if let Some((reason, conflict)) = &published.conflict {
                // The queue is fine, but apps would read someone else's object: not Ready.
                status::report_conflict(&queue, &api, ctx, *reason, conflict, &published.owned).await?;
                return Ok(Action::requeue(jittered(ctx.resync(&queue))));
            }
            // Events are not part of Ready: sent alongside the status write, not before it.
            let events = async {
                for (reason, note) in &ready.events {
                    ctx.publish(&*queue, *reason, note.clone()).await;
                }
            };
            let status = status::ready(&queue, &api, ctx, &ready, &published.owned, &placement);
            let ((), became_ready) = tokio::join!(events, status);
            let became_ready = match became_ready {
                // Deleted, its finalizer released, while this pass created its queue: that queue
                // belongs to no Queue, and nothing else would ever delete it.
                Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 && made_now(&ready) => {
                    cleanup::orphaned(&queue, placement.sqs.as_ref()).await?;
                    return Ok(Action::await_change());
                }
                became_ready => became_ready?,
            };
            // A queue made again under its ARN is a dead-letter target again: the Queues whose
            // redrive waited for it to exist look now, not at their next resync.
            let recreated = ready.events.iter().any(|(reason, _)| *reason == Reason::Recreated);
            if became_ready || recreated {
                refs::wake_sources(&queue, ctx);
            }
            ctx.reported.forget(&key);
            if became_ready || added_finalizer {
                // Events are not replayed from memory.
                // Boxed behind an `Arc`: a slot of this memory's table takes 48 bytes instead of
                // 168, and during a storm of new Queues the table holds thousands of them.
                ctx.written.record(&key, (fingerprint, Arc::new(Ready { events: Vec::new(), ..ready })));
            }
            Ok(ctx.resync_after(&key, jittered(ctx.resync(&queue))))
        }
        Outcome::Wait { reason, message, retry } => {
            status::report_problem(&queue, &api, ctx, reason, &message).await?;
            Ok(retry.map(Action::requeue).unwrap_or_else(Action::await_change))
        }
        // The watch brings the deletion (or the new Queue of that name) and wakes this key; the
        // resync is the net should it not.
        Outcome::Behind => Ok(Action::requeue(jittered(ctx.resync(&queue)))),
    }
}

/// Whether this pass created the queue `ready` describes (first made, or made again).
fn made_now(ready: &Ready) -> bool {
    ready.events.iter().any(|(reason, _)| matches!(reason, Reason::Created | Reason::Recreated))
}

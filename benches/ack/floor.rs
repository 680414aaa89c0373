//! The floor arm: the least any Queue controller can do, run as a process like the other arms, so
//! that the side-by-side shows which targets leave room for anything more. Per new Queue it makes
//! the three calls of `benches/queues.rs`'s minimal baseline ([`crate::minimal`]) through
//! kube-runtime's controller and skyport's SQS adapter, at skyport's concurrency and with no
//! budget (LocalStack enforces none). It proves no ownership, writes no ConfigMap
//! and no Event, and never checks a queue again: it is a yardstick, not an operator.
//!
//! The benchmark starts it as `<this benchmark's binary> --floor-operator <namespace>`.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use providers::{QueueBackend, SqsProvider, SqsSettings};
use skyport::controllers::queue::FINALIZER;
use skyport::controllers::{has_finalizer, remove_finalizer};
use skyport::crd::Queue;

use crate::minimal::{MinimalError, make_ready};

/// The argument that makes this benchmark's binary the floor operator.
pub(crate) const FLAG: &str = "--floor-operator";
/// Reconciles in parallel: skyport's default.
const CONCURRENCY: u16 = crate::SKYPORT_CONCURRENCY as u16;
/// High enough that skyport's limiter never waits: the floor spends no budget.
const OPEN: u32 = 100_000;

struct Ctx {
    api: Api<Queue>,
    sqs: SqsProvider,
    /// UID and generation of each Queue made Ready. The status write's watch event can come after
    /// the finalizer patch's, whose reconcile would otherwise make the queue again from a cache
    /// that does not show the status yet: the least memory a controller needs to do the work once.
    done: Mutex<HashSet<(String, i64)>>,
}

/// The process's entry point; runs until SIGTERM.
pub(crate) fn main(ns: &str) -> ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(run(ns)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(ns: &str) -> anyhow::Result<()> {
    let client = Client::try_default().await?;
    let open = NonZeroU32::new(OPEN).expect("non-zero");
    let settings = SqsSettings { rate_per_second: open, burst: open, tag_rate_per_second: open, ..Default::default() };
    let api: Api<Queue> = Api::namespaced(client, ns);
    let ctx = Arc::new(Ctx { api: api.clone(), sqs: SqsProvider::from_env(&settings).await, done: Mutex::default() });
    Controller::new(api, watcher::Config::default())
        .with_config(Config::default().concurrency(CONCURRENCY))
        .shutdown_on_signal()
        .run(
            reconcile,
            |_, e, _| {
                eprintln!("floor operator: {e:#}");
                Action::requeue(Duration::from_millis(500))
            },
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

async fn reconcile(q: Arc<Queue>, ctx: Arc<Ctx>) -> Result<Action, MinimalError> {
    let status = q.status.as_ref();
    if q.metadata.deletion_timestamp.is_some() {
        if has_finalizer(q.as_ref(), FINALIZER) {
            if let Some(url) = status.and_then(|s| s.queue_url.as_deref()) {
                ctx.sqs.delete_queue(url).await?;
            }
            remove_finalizer(&ctx.api, q.as_ref(), FINALIZER).await?;
        }
        ctx.done.lock().unwrap_or_else(|p| p.into_inner()).retain(|(uid, _)| Some(uid) != q.uid().as_ref());
        return Ok(Action::await_change());
    }
    let key = (q.uid().unwrap_or_default(), q.metadata.generation.unwrap_or_default());
    let seen = status.is_some_and(|s| s.queue_url.is_some() && s.observed_generation == q.metadata.generation);
    if seen || ctx.done.lock().unwrap_or_else(|p| p.into_inner()).contains(&key) {
        return Ok(Action::await_change());
    }
    make_ready(&ctx.api, &ctx.sqs, &q, &AtomicU64::new(0)).await?;
    ctx.done.lock().unwrap_or_else(|p| p.into_inner()).insert(key);
    Ok(Action::await_change())
}

//! Deleting a Queue: the SQS queue goes too (unless kept, see [`deletion_policy`]), then the
//! finalizer.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tracing::info;

use providers::QueueBackend;

use super::{Context, FINALIZER, observe};
use crate::controllers::{has_finalizer, object_key, remove_finalizer};
use crate::crd::queue::{DeletionPolicy, ManagementPolicy, Queue};
use crate::error::Result;
use crate::reasons::Reason;

/// What deleting this Queue does to its SQS queue: Observe never deletes; an explicit
/// deletionPolicy wins; unset means Delete for a queue skyport created and Retain for an adopted
/// one.
pub fn deletion_policy(queue: &Queue) -> DeletionPolicy {
    if queue.spec.management_policy == ManagementPolicy::Observe {
        return DeletionPolicy::Retain;
    }
    let adopted = queue.status.as_ref().is_some_and(|s| s.adopted);
    queue.spec.deletion_policy.unwrap_or(if adopted { DeletionPolicy::Retain } else { DeletionPolicy::Delete })
}

/// Deletes the SQS queue (unless kept, see [`deletion_policy`]) and releases the finalizer.
/// Needs no valid spec. Deletes only a queue whose owner tag names this Queue at this moment.
pub async fn cleanup(queue: &Queue, api: &Api<Queue>, ctx: &Context) -> Result<Action> {
    if !has_finalizer(queue, FINALIZER) {
        return Ok(Action::await_change());
    }
    let url = queue.status.as_ref().and_then(|s| s.queue_url.clone()).unwrap_or_default();
    match deletion_policy(queue) {
        DeletionPolicy::Delete => {
            if let Some(left) = delete(queue, ctx, &url).await? {
                info!(?left, "no SQS queue found, but a create of unknown outcome may still make one: looking again");
                return Ok(Action::requeue(left));
            }
        }
        DeletionPolicy::Retain => retained(queue, ctx, &url).await,
    }
    ctx.api_writes.inc();
    remove_finalizer(api, queue, FINALIZER).await?;
    super::account_use::released(queue, ctx);
    let key = object_key(queue);
    ctx.backoff.reset(&key);
    if let Some(uid) = queue.uid() {
        ctx.verified.forget(&uid);
        ctx.redrives.forget(&uid);
        ctx.unsettled.forget(&uid);
    }
    // Queues sending their dead letters here prove their redrive again now (its target may be
    // gone), not at the next owner-tag cadence: a proof made before this deletion is void.
    for q in super::refs::sources(queue, ctx) {
        ctx.redrives.forget(&q.uid().unwrap_or_default());
        let _ = ctx.dependents.unbounded_send(kube::runtime::reflector::ObjectRef::from_obj(&*q));
    }
    ctx.written.forget(&key);
    ctx.reported.forget(&key);
    Ok(Action::await_change())
}

/// Deletes the queue whose owner tag names `queue`, looked for through what its AwsAccount names
/// now (`url`: the one status records, for the Event when nothing is deleted). `Some(wait)`: none
/// found while a create of unknown outcome may still make one ([`super::unsettled`]); look again
/// after `wait`.
async fn delete(queue: &Queue, ctx: &Context, url: &str) -> Result<Option<Duration>> {
    let sqs = match ctx.accounts.for_cleanup(queue, &ctx.sqs).await {
        Ok(sqs) => sqs,
        Err(why) => {
            info!(why, "SQS queue not looked for: no AwsAccount this namespace may use");
            let note = format!("no SQS queue deleted: {why}; a queue created before, if any, is left where it is");
            ctx.publish(queue, Reason::NotDeleted, note).await;
            return Ok(None);
        }
    };
    let owned = observe::owned_queue(queue, sqs.as_ref()).await;
    match super::account_use::unless_never_trusted(queue, owned, ctx).await? {
        // Adopted, by the marker on the queue, though status never said so (the status write
        // after the adoption was lost): kept unless deletionPolicy says Delete.
        Some((url, true)) if queue.spec.deletion_policy.is_none() => retained(queue, ctx, &url).await,
        Some((url, _)) => {
            sqs.delete_queue(&url).await?;
            info!(url, "deleted SQS queue");
            ctx.publish(queue, Reason::Deleted, format!("deleted SQS queue {url}")).await;
        }
        None => {
            let since = ctx.acting.acting_since(&crate::controllers::Sharded::shard(queue));
            let took_over = super::unsettled::after_takeover(since, queue.metadata.creation_timestamp.as_ref());
            if let Some(wait) = ctx.unsettled.wait(queue.uid().as_deref().unwrap_or_default()).or(took_over) {
                return Ok(Some(wait));
            }
            if url.is_empty() {
                return Ok(None);
            }
            info!(url, "SQS queue not deleted: it is gone or its owner tag names someone else");
            let note = format!("SQS queue {url} left alone: it no longer exists or belongs to someone else");
            ctx.publish(queue, Reason::NotOwned, note).await;
        }
    }
    Ok(None)
}

/// Deletes the queue this pass created for `queue`, found deleted since (unless it asked to keep
/// its queue): only while the queue's owner tag still names it ([`observe::owned_queue`]).
pub async fn orphaned(queue: &Queue, sqs: &dyn QueueBackend) -> Result<()> {
    if deletion_policy(queue) == DeletionPolicy::Retain {
        info!("SQS queue kept: its Queue was deleted while it was created, and asked to keep it");
        return Ok(());
    }
    if let Some((url, _)) = observe::owned_queue(queue, sqs).await? {
        sqs.delete_queue(&url).await?;
        info!(url, "deleted the SQS queue just created: its Queue was deleted meanwhile");
    }
    Ok(())
}

async fn retained(queue: &Queue, ctx: &Context, url: &str) {
    info!(url, "SQS queue kept");
    let note = format!("SQS queue {url} kept (deletionPolicy Retain, adopted or observe-only)");
    ctx.publish(queue, Reason::Retained, note).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::queue::{QueueSpec, QueueStatus};

    #[test]
    fn adopted_queues_are_kept_unless_delete_is_explicit_and_observed_ones_always() {
        let mut q = Queue::new("q", QueueSpec::default());
        assert_eq!(deletion_policy(&q), DeletionPolicy::Delete);
        q.status = Some(QueueStatus { adopted: true, ..Default::default() });
        assert_eq!(deletion_policy(&q), DeletionPolicy::Retain);
        q.spec.deletion_policy = Some(DeletionPolicy::Delete);
        assert_eq!(deletion_policy(&q), DeletionPolicy::Delete);
        q.spec.management_policy = ManagementPolicy::Observe;
        assert_eq!(deletion_policy(&q), DeletionPolicy::Retain);
    }
}

//! What a Queue reports: `Ready` and `Synced`, the queue's URL, ARN and name, whether it was
//! adopted, and a Warning Event when a new problem appears.

use kube::api::Api;
use tracing::warn;

use super::Context;
use super::accounts::Placement;
use super::plan::Ready;
use crate::controllers::object_key;
use crate::controllers::status::{ObjectStatus, StatusWriter, WithStatus};
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::export::ExportRef;
use crate::crd::queue::Queue;
use crate::error::Result;
use crate::reasons::Reason;

/// Ready=True with the queue's coordinates. Returns whether the Queue just became Ready (or
/// its ARN changed), which is when Queues using it as their dead-letter queue must look again.
pub async fn ready(
    queue: &Queue,
    api: &Api<Queue>,
    ctx: &Context,
    ready: &Ready,
    exports: &[ExportRef],
    placement: &Placement,
) -> Result<bool> {
    let was = queue.status().and_then(|s| s.ready().map(|c| (c.status, s.queue_arn.clone())));
    let generation = queue.metadata.generation;
    StatusWriter::new(queue, api, &ctx.api_writes, None)
        .write(|s| {
            s.conditions = vec![
                Condition::new(
                    "Ready",
                    ConditionStatus::True,
                    Reason::Available.as_str(),
                    "the SQS queue exists and matches the spec",
                ),
                Condition::new("Synced", ConditionStatus::True, Reason::ReconcileSuccess.as_str(), ""),
            ];
            s.queue_url = Some(ready.url.clone());
            s.queue_arn = Some(ready.arn.clone());
            s.queue_name = Some(ready.name.as_str().into());
            s.adopted = ready.adopted;
            s.exports = exports.to_vec();
            s.account = Some(placement.account.as_str().into());
            s.region = placement.region.as_deref().map(Into::into);
            s.role_arn = placement.role_arn.clone().map(Box::new);
            s.endpoint_url = placement.endpoint_url.clone().map(Box::new);
            s.observed_generation = generation;
            s.ownership_proof = ready.proof.clone();
        })
        .await?;
    Ok(was != Some((ConditionStatus::True, Some(ready.arn.clone()))))
}

/// Ready=False with `reason`, plus a Warning Event when the reason is new.
pub async fn report_problem(
    queue: &Queue,
    api: &Api<Queue>,
    ctx: &Context,
    reason: Reason,
    message: &str,
) -> Result<()> {
    problem(queue, api, ctx, reason, message, None).await
}

/// [`report_problem`] for an object skyport may not write, recording the exports it did write.
pub async fn report_conflict(
    queue: &Queue,
    api: &Api<Queue>,
    ctx: &Context,
    reason: Reason,
    message: &str,
    exports: &[ExportRef],
) -> Result<()> {
    problem(queue, api, ctx, reason, message, Some(exports)).await
}

async fn problem(
    queue: &Queue,
    api: &Api<Queue>,
    ctx: &Context,
    reason: Reason,
    message: &str,
    exports: Option<&[ExportRef]>,
) -> Result<()> {
    let key = object_key(queue);
    let ours = ctx.reported.get(&key, |_, age| age < ctx.settings.resync).map(|(r, _)| r);
    if queue.status().and_then(|s| s.not_ready_reason()) != Some(reason.as_str()) && ours != Some(reason) {
        warn!(%reason, message, "queue not ready");
        ctx.publish(queue, reason, message.to_string()).await;
    }
    ctx.reported.record(key, reason);
    StatusWriter::new(queue, api, &ctx.api_writes, None)
        .write(|s| {
            s.conditions = vec![
                Condition::new("Ready", ConditionStatus::False, reason.as_str(), message),
                Condition::new("Synced", ConditionStatus::False, reason.as_str(), message),
            ];
            if let Some(exports) = exports {
                s.exports = exports.to_vec();
            }
        })
        .await
}

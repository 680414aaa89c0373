//! One pass against SQS: observe, plan and act, in the order ownership needs. A Queue never
//! seen in SQS creates first; any other write is preceded by a fresh read of the owner tag.
//!
//! A create is made only for a Queue the API server has live at that moment: read with the
//! finalizer this pass added, or else read again. A Queue read from a cache that is behind (a
//! standby taking over before its watch resumed) may already be deleted, its finalizer released;
//! a queue created for it then would belong to no Queue, and nothing would ever delete it.

use std::time::Instant;

use kube::ResourceExt;
use kube::api::Api;
use providers::QueueBackend;
use tracing::debug;

use super::plan::{Observed, Outcome, Plan, Ready, Step};
use super::{Context, act, dead_letter, desired, observe, plan, sealed, tenancy};
use crate::controllers::context::{api_beside, namespace_of};
use crate::controllers::jittered;
use crate::crd::queue::{ManagementPolicy, OwnershipProof, Queue, QueueStatus};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Observe, plan and act against SQS. `fresh`: `queue` is the API server's answer to this pass's
/// finalizer write, not the cache's copy.
pub async fn converge(queue: &Queue, ctx: &Context, sqs: &dyn QueueBackend, fresh: bool) -> Result<Outcome> {
    let ns = namespace_of(queue)?;
    let uid = queue.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let status = queue.status.as_ref();
    let recorded_name = status.and_then(|s| s.queue_name.as_deref());
    let cluster = ctx.settings.cluster_id.as_str();
    let owner = desired::Owner { namespace: &ns, name: &queue.name_any(), uid: &uid, cluster, recorded_name };
    if let Some(problem) = queue.spec.problem() {
        return Ok(Outcome::Wait { reason: Reason::InvalidSpec, message: problem, retry: None });
    }
    let grants = ctx.settings.name_grants.as_slice();
    if let Some(name) = &queue.spec.queue_name
        && let Some((reason, message)) = tenancy::name_refusal(&ns, name, grants)
    {
        // queueName is immutable: nothing but a new Queue changes this.
        return Ok(Outcome::Wait { reason, message, retry: None });
    }
    let dead_letter_arn = match observe::dead_letter_arn(queue, &ctx.queues) {
        Ok(arn) => arn,
        Err(wait) => {
            // The redrive already on the queue has no spec to vouch for it now: proven or taken off.
            let desired = desired::desired(&queue.spec, &owner, None);
            return dead_letter::unresolved(queue, wait.into_outcome(ctx.settings.resync), &desired, ctx, sqs).await;
        }
    };
    let desired = desired::desired(&queue.spec, &owner, dead_letter_arn.as_deref());
    if queue.spec.management_policy == ManagementPolicy::Observe {
        return observe_only(queue, &desired, ctx, sqs).await;
    }
    let adopted = status.is_some_and(|s| s.adopted);
    let intent = plan::Intent {
        fifo: queue.spec.fifo,
        uid: &uid,
        namespace: &ns,
        cluster,
        grants,
        adopt: queue.spec.adopt,
        adopted,
        recheck: jittered(ctx.resync(queue)),
    };
    let verified = sealed::proof(ctx, queue, &uid);
    let tags_due = verified
        .as_ref()
        .is_none_or(|v| v.generation != queue.metadata.generation || v.at.elapsed() >= ctx.tag_resync(queue));
    // A Queue never seen in SQS creates first (CreateQueue with its owner tag, then one
    // ListQueueTags proves the queue is ours) instead of looking the name up first.
    let known_foreign = |s: &QueueStatus| {
        s.conditions.iter().any(|c| {
            c.type_ == "Ready"
                && [Reason::AlreadyExists, Reason::OwnedByAnotherQueue].iter().any(|r| c.reason == r.as_str())
        })
    };
    let first_look = status.is_none_or(|s| s.queue_url.is_none() && !known_foreign(s)) && !queue.spec.adopt;
    let mut observed = if first_look {
        Observed::Absent
    } else {
        observe::observe(queue, &desired, sqs, &ctx.client, cluster, verified.as_ref(), tags_due).await?
    };
    let mut tags_read = matches!(&observed, Observed::Present(e) if e.tags.is_some());
    let mut plan = plan::plan(&desired, &intent, &observed);
    let mut live = fresh;
    for _ in 0..2 {
        if plan == Plan::NeedTags {
            observed = observe::observe(queue, &desired, sqs, &ctx.client, cluster, None, true).await?;
            tags_read = true;
            plan = plan::plan(&desired, &intent, &observed);
        }
        debug!(?plan, "planned");
        if let Some(refusal) = dead_letter::guard(queue, &plan, &observed, true, ctx, sqs).await? {
            return Ok(refusal);
        }
        if plan_created(&plan) && !live {
            if !still_live(queue, ctx).await? {
                debug!("a create was due, but the API server no longer has this Queue live");
                return Ok(Outcome::Behind);
            }
            live = true;
        }
        match act::apply(queue, &desired, &observed, plan.clone(), adopted, ctx, sqs).await? {
            act::Applied::Done(mut outcome) => {
                if let Outcome::Ready(ready) = &mut outcome {
                    let proven = tags_read || plan_created(&plan);
                    ready.proof = remember(ctx, &uid, queue.metadata.generation, ready, proven, verified);
                }
                return Ok(outcome);
            }
            // CreateQueue met an existing queue that is not ours: look at it like any other.
            act::Applied::NotOurs => plan = Plan::NeedTags,
        }
    }
    Err(Error::Queue(providers::QueueError::Unavailable(format!(
        "the SQS queue {:?} appeared and disappeared while it was being created; retrying",
        desired.name
    ))))
}

/// Whether the API server has `queue` live now: the same UID, not being deleted. A read without
/// a resourceVersion is a consistent read, never the API server's cache.
async fn still_live(queue: &Queue, ctx: &Context) -> Result<bool> {
    let api: Api<Queue> = api_beside(&ctx.client, queue)?;
    let current = api.get_opt(&queue.name_any()).await?;
    Ok(current.is_some_and(|q| q.uid() == queue.uid() && q.metadata.deletion_timestamp.is_none()))
}

fn plan_created(plan: &Plan) -> bool {
    matches!(plan, Plan::Apply { steps, .. } if steps.iter().any(|s| matches!(s, Step::Create { .. })))
}

/// Records that `ready` is ours: proven now when `proven`, else as proven before. Returns the
/// sealed record for status when the operator has an ownership key.
fn remember(
    ctx: &Context,
    uid: &str,
    generation: Option<i64>,
    ready: &Ready,
    proven: bool,
    before: Option<observe::Verified>,
) -> Option<Box<OwnershipProof>> {
    let at = match before {
        Some(v) if !proven => v.at,
        _ => Instant::now(),
    };
    let entry = observe::Verified::new(&ready.url, ready.created.as_deref(), at, generation);
    ctx.verified.remember(uid, entry);
    let key = ctx.settings.ownership_key.as_ref()?;
    Some(Box::new(sealed::seal(key, uid, &ready.url, ready.created.as_deref(), at, generation)))
}

/// managementPolicy Observe: publish an existing queue, never write to SQS. A queue another
/// namespace's (or cluster's) Queue owns is not published: its URL is that tenant's.
async fn observe_only(
    queue: &Queue,
    desired: &desired::Desired,
    ctx: &Context,
    sqs: &dyn QueueBackend,
) -> Result<Outcome> {
    let Some((url, attributes)) = observe::observe_only(queue, desired, sqs).await? else {
        return Ok(Outcome::Wait {
            reason: Reason::NotFound,
            message: format!(
                "managementPolicy Observe: no SQS queue named {:?} exists; skyport does not create it (looking again every resync)",
                desired.name
            ),
            retry: Some(jittered(ctx.resync(queue))),
        });
    };
    let uid = queue.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let created = attributes.get("CreatedTimestamp").cloned();
    // Whose queue it is was read once for this very queue (same URL and creation time).
    if !sealed::proof(ctx, queue, &uid).is_some_and(|v| v.covers(&url, &attributes)) {
        let ns = namespace_of(queue)?;
        match tenancy::holder(&sqs.tags(&url).await?, &ns, &ctx.settings.cluster_id) {
            tenancy::Holder::Untagged | tenancy::Holder::SameNamespace { .. } => {}
            _ => {
                return Ok(Outcome::Wait {
                    reason: Reason::OwnedByAnotherNamespace,
                    message: format!(
                        "managementPolicy Observe: the SQS queue {:?} belongs to a Queue of another namespace or cluster; skyport publishes only queues of this namespace or made outside skyport",
                        desired.name
                    ),
                    retry: Some(jittered(ctx.resync(queue))),
                });
            }
        }
        ctx.verified.remember(&uid, observe::Verified::new(&url, created.as_deref(), Instant::now(), None));
    }
    let arn = attributes.get("QueueArn").cloned().unwrap_or_default();
    Ok(Outcome::Ready(Ready {
        url,
        arn,
        name: desired.name.clone(),
        adopted: false,
        created,
        events: Vec::new(),
        proof: None,
    }))
}

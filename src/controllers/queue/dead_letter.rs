//! Dead-letter targets proven this namespace's by their owner tags ([`plan::redrive`] decides
//! which and when): before a redrive policy is written, and again while one stays on the queue,
//! at the owner tags' re-read cadence (`--queue-tag-resync`) and whenever the spec's target stops
//! resolving (its Queue deleted or not Ready). A queue name is free once its queue is deleted, and
//! whoever creates a queue of that name next would receive this Queue's failed messages: a redrive
//! whose target is gone or belongs to someone else is taken off the queue, never left.
//!
//! [`plan::redrive`]: super::plan::redrive

use kube::ResourceExt;
use providers::QueueBackend;
use tracing::info;

use super::desired::{Desired, TAG_OWNER_UID};
use super::plan::redrive::{self, Proof};
use super::plan::{Observed, Outcome, Plan};
use super::{Context, observe, tenancy};
use crate::controllers::{hash_of, jittered};
use crate::crd::queue::{ManagementPolicy, Queue};
use crate::error::Result;

/// The proof last made per Queue (by UID): a hash of the target's ARN and whether the spec's
/// target resolved then, and when. One entry per Queue with a dead-letter target; cleanup forgets it.
pub type Proven = crate::controllers::memory::OwnWrites<u64>;

fn proof_key(arn: &str, resolved: bool) -> u64 {
    hash_of((arn, resolved))
}

/// Whether the redrive to `arn` must be proven again: no proof of it in this state (`resolved`:
/// the spec's target resolves), or one older than the owner tags' re-read cadence.
fn due(ctx: &Context, queue: &Queue, uid: &str, arn: &str, resolved: bool) -> bool {
    let key = proof_key(arn, resolved);
    ctx.redrives.get(uid, |proven, age| *proven == key && age < ctx.tag_resync(queue)).is_none()
}

/// Why this pass stops here, if the dead-letter target `plan` writes, or the one in place on the
/// queue, is not proven this namespace's; one in place is taken off the queue first (the plan
/// writes only to a queue that is ours, so this may too). `resolved`: the spec's target resolved.
pub async fn guard(
    queue: &Queue,
    plan: &Plan,
    observed: &Observed,
    resolved: bool,
    ctx: &Context,
    sqs: &dyn QueueBackend,
) -> Result<Option<Outcome>> {
    let uid = queue.uid().unwrap_or_default();
    let Some(proof) = redrive::to_prove(plan, observed, |arn| due(ctx, queue, &uid, arn, resolved)) else {
        return Ok(None);
    };
    let ns = queue.namespace().unwrap_or_default();
    let Some((reason, mut message)) = refusal(proof.arn(), &ns, ctx, sqs).await? else {
        ctx.redrives.record(&uid, proof_key(proof.arn(), resolved));
        return Ok(None);
    };
    ctx.redrives.forget(&uid);
    if let (Proof::InPlace(_), Observed::Present(existing)) = (&proof, observed) {
        sqs.set_attributes(&existing.url, &[("RedrivePolicy".to_string(), String::new())].into()).await?;
        info!(
            url = existing.url,
            %reason, "took the redrive policy off the SQS queue: its target is not this namespace's"
        );
        message = format!(
            "{message}. The redrive policy was taken off the SQS queue: failed messages stay in it until the dead-letter target is this namespace's again"
        );
    }
    Ok(Some(Outcome::Wait { reason, message, retry: Some(jittered(ctx.resync(queue))) }))
}

/// Why the queue `arn` may not receive this namespace's dead letters, from its owner tags.
async fn refusal(arn: &str, ns: &str, ctx: &Context, sqs: &dyn QueueBackend) -> Result<Option<tenancy::Refusal>> {
    Ok(match observe::dead_letter_holder(arn, ns, &ctx.settings.cluster_id, sqs).await? {
        Err(refusal) => Some(refusal),
        Ok((name, holder)) => tenancy::dead_letter_refusal(&holder, ns, &name, &ctx.settings.name_grants),
    })
}

/// `wait`, for a Queue whose dead-letter target does not resolve now, once the redrive on its
/// SQS queue (if the queue exists, is ours, and has one) is proven this namespace's, or taken off.
pub async fn unresolved(
    queue: &Queue,
    wait: Outcome,
    desired: &Desired,
    ctx: &Context,
    sqs: &dyn QueueBackend,
) -> Result<Outcome> {
    let created = queue.status.as_ref().is_some_and(|s| s.queue_url.is_some());
    if !created || queue.spec.management_policy == ManagementPolicy::Observe {
        return Ok(wait);
    }
    let uid = queue.uid().unwrap_or_default();
    let verified = super::sealed::proof(ctx, queue, &uid);
    let cluster = ctx.settings.cluster_id.as_str();
    let observed = observe::observe(queue, desired, sqs, &ctx.client, cluster, verified.as_ref(), false).await?;
    let Observed::Present(existing) = &observed else { return Ok(wait) };
    let ours = match &existing.tags {
        Some(tags) => tags.get(TAG_OWNER_UID) == Some(&uid),
        None => existing.verified,
    };
    if !ours {
        return Ok(wait);
    }
    let nothing = Plan::Apply { steps: Vec::new(), adopting: false };
    Ok(guard(queue, &nothing, &observed, false, ctx, sqs).await?.unwrap_or(wait))
}

//! Writes: the planned SQS steps and the owned ConfigMaps.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use providers::{QueueBackend, QueueError};
use tracing::info;

use super::desired::{Desired, TAG_OWNER_UID, configmap, configmap_name};
use super::plan::{Observed, Outcome, Plan, Ready, Step};
use super::{Context, configmaps};
use crate::controllers::{MANAGED_BY, owned};
use crate::crd::queue::Queue;
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// How running a plan ended.
#[derive(Debug)]
pub enum Applied {
    Done(Outcome),
    /// CreateQueue found a queue of that name already there that is not ours (SQS returns the
    /// URL of an existing queue with the same attributes): look at it as an existing queue.
    NotOurs,
}

/// Runs the plan's steps against SQS. `adopted`: the queue was adopted in an earlier pass.
pub async fn apply(
    queue: &Queue,
    desired: &Desired,
    observed: &Observed,
    plan: Plan,
    adopted: bool,
    ctx: &Context,
    sqs: &dyn QueueBackend,
) -> Result<Applied> {
    let (steps, adopting) = match plan {
        Plan::Wait { reason, message, retry } => return Ok(Applied::Done(Outcome::Wait { reason, message, retry })),
        Plan::NeedTags => {
            return Err(Error::Queue(QueueError::Unavailable("planned writes without reading the owner tag".into())));
        }
        Plan::Apply { steps, adopting } => (steps, adopting),
    };
    let (mut url, mut arn, mut created) = match observed {
        Observed::Present(e) => (
            e.url.clone(),
            e.attributes.get("QueueArn").cloned().unwrap_or_default(),
            e.attributes.get("CreatedTimestamp").cloned(),
        ),
        Observed::Absent => (String::new(), String::new(), None),
    };
    let marked = matches!(observed, Observed::Present(e) if e.marked_adopted());
    let mut adopted = adopted || adopting || marked;
    let mut events = Vec::new();
    if adopting {
        events.push((Reason::Adopted, format!("adopted existing SQS queue {url}")));
    }
    let mut changed = Vec::new();
    for step in steps {
        match step {
            Step::Create { name, attributes, tags } => {
                let made = sqs.create_queue(&name, &attributes, &tags).await;
                ctx.unsettled.created(queue.uid().as_deref().unwrap_or_default(), &made);
                url = match made {
                    Ok(url) => url,
                    Err(QueueError::AlreadyExists(_)) => return Ok(Applied::NotOurs),
                    Err(QueueError::DeletedRecently(_)) => {
                        let retry = ctx.settings.recently_deleted_retry;
                        return Ok(Applied::Done(Outcome::Wait {
                            reason: Reason::RecentlyDeleted,
                            message: format!(
                                "SQS refuses to recreate {name:?} until 60 s after it was deleted; retrying every {}s",
                                retry.as_secs()
                            ),
                            retry: Some(retry),
                        }));
                    }
                    Err(e) => return Err(e.into()),
                };
                // The URL may be of a queue that was already there (another Queue racing for the
                // name, or anyone's): it is ours only if our owner tag is on it.
                let owner = sqs.tags(&url).await?.remove(TAG_OWNER_UID);
                if owner.as_deref() != tags.get(TAG_OWNER_UID).map(String::as_str) {
                    return Ok(Applied::NotOurs);
                }
                created = None;
                adopted = false;
                // The ARN follows from the URL and the region; read it only when it does not.
                arn = match sqs.region().and_then(|region| super::desired::queue_arn(&url, &region)) {
                    Some(arn) => arn,
                    None => sqs.attributes(&url).await?.and_then(|a| a.get("QueueArn").cloned()).unwrap_or_default(),
                };
                let recreated = queue.status.as_ref().and_then(|s| s.queue_url.as_ref()).is_some();
                info!(url, recreated, "created SQS queue");
                events.push(if recreated {
                    (
                        Reason::Recreated,
                        format!("SQS queue {name} was missing (deleted outside skyport?) and was created again"),
                    )
                } else {
                    (Reason::Created, format!("created SQS queue {name}"))
                });
            }
            Step::SetAttributes(attributes) => {
                sqs.set_attributes(&url, &attributes).await?;
                changed.extend(attributes.into_keys());
            }
            Step::Tag(tags) => {
                sqs.tag(&url, &tags).await?;
                changed.push(format!("tags {}", tags.into_keys().collect::<Vec<_>>().join(",")));
            }
            Step::Untag(keys) => {
                sqs.untag(&url, &keys).await?;
                changed.push(format!("removed tags {}", keys.join(",")));
            }
        }
    }
    if !changed.is_empty() {
        info!(url, changed = ?changed, "updated SQS queue");
        events.push((Reason::Updated, format!("updated {}", changed.join("; "))));
    }
    if url.is_empty() || arn.is_empty() {
        return Err(Error::Queue(QueueError::Unavailable("SQS returned no queue URL or ARN".into())));
    }
    Ok(Applied::Done(Outcome::Ready(Ready {
        url,
        arn,
        name: desired.name.clone(),
        adopted,
        created,
        events,
        proof: None,
    })))
}

/// Whether `obj` is controlled by `queue` (its controller owner reference has the Queue's UID).
pub fn controlled_by<K: Resource>(obj: &K, queue: &Queue) -> bool {
    obj.meta().owner_references.as_ref().is_some_and(|refs| {
        refs.iter().any(|r| r.controller == Some(true) && Some(&r.uid) == queue.metadata.uid.as_ref())
    })
}

/// Writes the ConfigMap `<name>-sqs`; `Ok(Some(message))` when someone else holds the name.
pub async fn ensure_configmap(queue: &Queue, ready: &Ready, ctx: &Context) -> Result<Option<String>> {
    let want = configmap(queue, &ready.url, &ready.arn, &ready.name)?;
    let name = configmap_name(queue);
    Ok((!ensure_owned_configmap(queue, want, ctx).await?).then(|| {
        format!(
            "ConfigMap {name} exists and does not belong to this Queue; skyport leaves it alone. Rename or delete it, then skyport writes the queue's URL there"
        )
    }))
}

/// Writes `want` unless the cached copy already says the same. A ConfigMap of that name that
/// this Queue does not control is never written (that would take over the user's data, and the
/// owner reference would have it garbage-collected with the Queue): `Ok(false)`.
pub async fn ensure_owned_configmap(queue: &Queue, want: ConfigMap, ctx: &Context) -> Result<bool> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let name = want.name_any();
    crate::controllers::store_synced(&ctx.configmaps).await;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = match ctx.configmaps.get(&configmaps::key(&name, &ns)) {
        Some(cached) if !cached.controlled_by(queue) => return Ok(false),
        Some(cached) if cached.holds(&want.data) => return Ok(true),
        // The cache keeps a hash of the data: the patch is built from the object itself.
        Some(_) => api.get(&name).await?,
        // Not ours as far as the cache knows: create it, which fails if anything holds the name.
        None if owned::create(&api, &want, &ctx.api_writes).await? => return Ok(true),
        None => api.get(&name).await?,
    };
    if !controlled_by(&existing, queue) {
        return Ok(false);
    }
    if existing.data != want.data {
        ctx.api_writes.inc();
        api.patch(&name, &PatchParams::default(), &Patch::Merge(data_patch(&existing, &existing.data, &want.data)))
            .await?;
    }
    Ok(true)
}

/// A merge patch turning `have` into `want` (removed keys become null) on the very object that
/// was checked: its resourceVersion makes the API refuse it if the object changed since. (Not
/// server-side apply: keys written by the create belong to another field manager and would
/// survive a renamed key.)
pub fn data_patch<K: Resource, V: serde::Serialize>(
    existing: &K,
    have: &Option<BTreeMap<String, V>>,
    want: &Option<BTreeMap<String, V>>,
) -> serde_json::Value {
    let mut data = serde_json::Map::new();
    for key in have.iter().flatten().map(|(k, _)| k) {
        data.insert(key.clone(), serde_json::Value::Null);
    }
    for (key, value) in want.iter().flatten() {
        data.insert(key.clone(), serde_json::to_value(value).unwrap_or_default());
    }
    let labels = BTreeMap::from([(MANAGED_BY.0, MANAGED_BY.1)]);
    serde_json::json!({
        "metadata": {"resourceVersion": existing.meta().resource_version, "labels": labels},
        "data": data,
    })
}

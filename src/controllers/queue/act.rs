//! Writes: the planned SQS steps and the owned ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use providers::QueueError;
use tracing::info;

use super::desired::Desired;
use super::plan::{Observed, Plan, Step};
use super::{Context, MANAGED_BY, Outcome};
use crate::controllers::FIELD_MANAGER;
use crate::crd::queue::Queue;
use crate::error::{Error, Result};

/// A queue that exists and matches the spec.
#[derive(Debug, Clone)]
pub struct Ready {
    pub url: String,
    pub arn: String,
    pub name: String,
    /// Normal Events to publish: (reason, note).
    pub events: Vec<(&'static str, String)>,
}

/// Runs the plan's steps against SQS.
pub async fn apply(
    queue: &Queue,
    desired: &Desired,
    observed: &Observed,
    plan: Plan,
    ctx: &Context,
) -> Result<Outcome> {
    let (steps, adopting) = match plan {
        Plan::Wait { reason, message, retry } => return Ok(Outcome::Wait { reason, message, retry }),
        Plan::Apply { steps, adopting } => (steps, adopting),
    };
    let (mut url, mut arn) = match observed {
        Observed::Present(e) => (e.url.clone(), e.attributes.get("QueueArn").cloned().unwrap_or_default()),
        Observed::Absent => (String::new(), String::new()),
    };
    let mut events = Vec::new();
    if adopting {
        events.push(("Adopted", format!("adopted existing SQS queue {url}")));
    }
    let mut changed = Vec::new();
    for step in steps {
        match step {
            Step::Create { name, attributes, tags } => {
                url = match ctx.sqs.create_queue(&name, &attributes, &tags).await {
                    Ok(url) => url,
                    Err(QueueError::DeletedRecently(_)) => {
                        let retry = ctx.settings.recently_deleted_retry;
                        return Ok(Outcome::Wait {
                            reason: "RecentlyDeleted",
                            message: format!(
                                "SQS refuses to recreate {name:?} until 60 s after it was deleted; retrying every {}s",
                                retry.as_secs()
                            ),
                            retry: Some(retry),
                        });
                    }
                    Err(e) => return Err(e.into()),
                };
                // The ARN follows from the URL and the region; read it only when it does not.
                arn = match ctx.sqs.region().and_then(|region| super::desired::queue_arn(&url, &region)) {
                    Some(arn) => arn,
                    None => {
                        ctx.sqs.attributes(&url).await?.and_then(|a| a.get("QueueArn").cloned()).unwrap_or_default()
                    }
                };
                let recreated = queue.status.as_ref().and_then(|s| s.queue_url.as_ref()).is_some();
                info!(url, recreated, "created SQS queue");
                events.push(if recreated {
                    (
                        "Recreated",
                        format!("SQS queue {name} was missing (deleted outside skyport?) and was created again"),
                    )
                } else {
                    ("Created", format!("created SQS queue {name}"))
                });
            }
            Step::SetAttributes(attributes) => {
                ctx.sqs.set_attributes(&url, &attributes).await?;
                changed.extend(attributes.into_keys());
            }
            Step::Tag(tags) => {
                ctx.sqs.tag(&url, &tags).await?;
                changed.push(format!("tags {}", tags.into_keys().collect::<Vec<_>>().join(",")));
            }
            Step::Untag(keys) => {
                ctx.sqs.untag(&url, &keys).await?;
                changed.push(format!("removed tags {}", keys.join(",")));
            }
        }
    }
    if !changed.is_empty() {
        info!(url, changed = ?changed, "updated SQS queue");
        events.push(("Updated", format!("updated {}", changed.join("; "))));
    }
    if url.is_empty() || arn.is_empty() {
        return Err(Error::Queue(QueueError::Unavailable("SQS returned no queue URL or ARN".into())));
    }
    Ok(Outcome::Ready(Ready { url, arn, name: desired.name.clone(), events }))
}

/// Name of the ConfigMap apps load with `envFrom`.
pub fn configmap_name(queue: &Queue) -> String {
    format!("{}-sqs", queue.name_any())
}

/// Desired ConfigMap for `ready`.
pub fn configmap(queue: &Queue, ready: &Ready) -> Result<ConfigMap> {
    let owner = queue.controller_owner_ref(&()).ok_or(Error::MissingObjectKey("uid"))?;
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(configmap_name(queue)),
            namespace: queue.namespace(),
            labels: Some(BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("QUEUE_URL".to_string(), ready.url.clone()),
            ("QUEUE_ARN".to_string(), ready.arn.clone()),
            ("QUEUE_NAME".to_string(), ready.name.clone()),
        ])),
        ..Default::default()
    })
}

/// Applies the ConfigMap unless the cached copy already says the same.
pub async fn ensure_configmap(queue: &Queue, ready: &Ready, ctx: &Context) -> Result<()> {
    let want = configmap(queue, ready)?;
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    crate::controllers::store_synced(&ctx.configmaps).await;
    let cached = ctx.configmaps.get(&ObjectRef::new(&configmap_name(queue)).within(&ns));
    let current = cached.as_ref().is_some_and(|cm| {
        cm.data == want.data
            && cm
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|refs| refs.iter().any(|r| Some(&r.uid) == queue.metadata.uid.as_ref()))
    });
    if current {
        return Ok(());
    }
    ctx.api_writes.inc();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch(&configmap_name(queue), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&want)).await?;
    Ok(())
}

//! The minimal work to make one new Queue Ready, shared by the yardsticks of `benches/queues.rs`
//! (the baseline of time to Ready) and `benches/ack.rs` (the floor arm): finalizer patch,
//! CreateQueue, status patch. No ownership proof, no ConfigMap, no Event.

use std::sync::atomic::{AtomicU64, Ordering};

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use providers::{QueueBackend, QueueError};
use serde_json::json;
use skyport::controllers::add_finalizer;
use skyport::controllers::queue::FINALIZER;
use skyport::controllers::queue::desired::{Owner, desired};
use skyport::crd::{Condition, ConditionStatus, Queue, QueueStatus};

#[derive(Debug, thiserror::Error)]
pub enum MinimalError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Sqs(#[from] QueueError),
}

/// Makes `q` Ready with the three calls; `writes` counts the API writes among them.
pub async fn make_ready(
    api: &Api<Queue>,
    sqs: &dyn QueueBackend,
    q: &Queue,
    writes: &AtomicU64,
) -> Result<(), MinimalError> {
    let q = if q.finalizers().iter().any(|f| f == FINALIZER) {
        q.clone()
    } else {
        writes.fetch_add(1, Ordering::Relaxed);
        add_finalizer(api, q, FINALIZER).await?
    };
    let ns = q.namespace().unwrap_or_default();
    let uid = q.uid().unwrap_or_default();
    let name = q.name_any();
    let d = desired(&q.spec, &Owner { namespace: &ns, name: &name, uid: &uid, cluster: "", recorded_name: None }, None);
    let url = sqs.create_queue(&d.name, &d.create_attributes(q.spec.fifo), &d.tags).await?;
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let conditions = [("Ready", "Available", "the SQS queue exists"), ("Synced", "ReconcileSuccess", "")]
        .into_iter()
        .map(|(t, reason, message)| Condition {
            observed_generation: q.metadata.generation,
            last_transition_time: now.as_str().into(),
            ..Condition::new(t, ConditionStatus::True, reason, message)
        })
        .collect();
    let status = QueueStatus {
        queue_url: Some(url),
        queue_arn: None,
        queue_name: Some(d.name.into()),
        adopted: false,
        observed_generation: q.metadata.generation,
        conditions,
        ..Default::default()
    };
    writes.fetch_add(1, Ordering::Relaxed);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await?;
    Ok(())
}

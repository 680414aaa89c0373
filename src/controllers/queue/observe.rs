//! Reads: the dead-letter reference from the local cache, the queue from SQS.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use providers::QueueBackend;

use super::Outcome;
use super::desired::{Desired, TAG_OWNER_UID, queue_name};
use super::plan::{Existing, Observed};
use crate::crd::ConditionStatus;
use crate::crd::queue::Queue;
use crate::error::{Error, Result};

/// Why the dead-letter target cannot be used yet.
#[derive(Debug, PartialEq)]
pub enum DeadLetterWait {
    NotReady(String),
    Mismatch(String),
    Invalid(String),
}

impl DeadLetterWait {
    pub fn into_outcome(self, resync: Duration) -> Outcome {
        match self {
            // The referenced Queue wakes us when it becomes Ready; the retry is a safety net.
            DeadLetterWait::NotReady(message) => {
                Outcome::Wait { reason: "DeadLetterQueueNotReady", message, retry: Some(resync) }
            }
            DeadLetterWait::Mismatch(message) => {
                Outcome::Wait { reason: "InvalidDeadLetterQueue", message, retry: Some(resync) }
            }
            DeadLetterWait::Invalid(message) => Outcome::Wait { reason: "InvalidSpec", message, retry: None },
        }
    }
}

/// The ARN `spec.deadLetter` points at, resolving a queueRef through the Queue cache.
pub fn dead_letter_arn(queue: &Queue, queues: &Store<Queue>) -> Result<Option<String>, DeadLetterWait> {
    let Some(dl) = &queue.spec.dead_letter else { return Ok(None) };
    if let Some(arn) = &dl.target_arn {
        return Ok(Some(arn.clone()));
    }
    let Some(r) = &dl.queue_ref else {
        return Err(DeadLetterWait::Invalid("deadLetter needs queueRef or targetArn".into()));
    };
    if r.name == queue.name_any() {
        return Err(DeadLetterWait::Invalid("deadLetter.queueRef names this Queue itself".into()));
    }
    let ns = queue.namespace().unwrap_or_default();
    let Some(target) = queues.get(&ObjectRef::new(&r.name).within(&ns)) else {
        return Err(DeadLetterWait::NotReady(format!("dead-letter Queue {ns}/{} does not exist yet", r.name)));
    };
    if target.spec.fifo != queue.spec.fifo {
        let kind = |fifo: bool| if fifo { "FIFO" } else { "standard" };
        return Err(DeadLetterWait::Mismatch(format!(
            "dead-letter Queue {} is a {} queue but this is a {} queue; SQS requires both to be of the same kind",
            r.name,
            kind(target.spec.fifo),
            kind(queue.spec.fifo)
        )));
    }
    let status = target.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == ConditionStatus::True);
    match status.and_then(|s| s.queue_arn.clone()) {
        Some(arn) if ready => Ok(Some(arn)),
        _ => Err(DeadLetterWait::NotReady(format!("waiting for dead-letter Queue {} to become Ready", r.name))),
    }
}

/// Finds the queue: through the URL recorded in status when it is for the desired name (no
/// lookup call), else by name. Tags are read only when `tags_due` or ownership is unproven.
pub async fn observe(queue: &Queue, desired: &Desired, sqs: &dyn QueueBackend, tags_due: bool) -> Result<Observed> {
    let status = queue.status.as_ref();
    let recorded_url =
        status.filter(|s| s.queue_name.as_deref() == Some(desired.name.as_str())).and_then(|s| s.queue_url.clone());
    let url = match &recorded_url {
        Some(url) => Some(url.clone()),
        None => sqs.queue_url(&desired.name).await?,
    };
    let Some(url) = url else { return Ok(Observed::Absent) };
    let Some(attributes) = sqs.attributes(&url).await? else { return Ok(Observed::Absent) };
    let recorded = recorded_url.as_deref() == Some(url.as_str())
        || status.and_then(|s| s.queue_url.as_deref()) == Some(url.as_str());
    let tags = if tags_due || !recorded { Some(sqs.tags(&url).await?) } else { None };
    Ok(Observed::Present(Existing { url, attributes, tags, recorded }))
}

/// The URL of this Queue's SQS queue for deletion: the recorded one, or the queue of the
/// expected name if its owner tag carries this object's UID. Never a queue skyport does not own.
pub async fn owned_queue_url(queue: &Queue, sqs: &dyn QueueBackend) -> Result<Option<String>> {
    if let Some(url) = queue.status.as_ref().and_then(|s| s.queue_url.clone()) {
        return Ok(Some(url));
    }
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let name = queue_name(&ns, &queue.name_any(), &queue.spec);
    let Some(url) = sqs.queue_url(&name).await? else { return Ok(None) };
    let ours = sqs.tags(&url).await?.get(TAG_OWNER_UID).map(String::as_str) == queue.uid().as_deref();
    Ok(ours.then_some(url))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::queue::{DeadLetter, LocalQueueRef, QueueSpec, QueueStatus};
    use crate::crd::{Condition, ConditionStatus};
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;

    fn queue(name: &str, spec: QueueSpec, status: Option<QueueStatus>) -> Queue {
        let mut q = Queue::new(name, spec);
        q.metadata.namespace = Some("ns".into());
        q.status = status;
        q
    }

    fn with_dlq(target: &str) -> QueueSpec {
        QueueSpec {
            dead_letter: Some(DeadLetter {
                queue_ref: Some(LocalQueueRef { name: target.into() }),
                target_arn: None,
                max_receive_count: 5,
            }),
            ..Default::default()
        }
    }

    fn store(objs: Vec<Queue>) -> Store<Queue> {
        let mut w: Writer<Queue> = Default::default();
        w.apply_watcher_event(&Event::Init);
        for o in objs {
            w.apply_watcher_event(&Event::InitApply(o));
        }
        w.apply_watcher_event(&Event::InitDone);
        w.as_reader()
    }

    fn ready_status(arn: &str) -> QueueStatus {
        QueueStatus {
            queue_arn: Some(arn.into()),
            conditions: vec![Condition::new("Ready", ConditionStatus::True, "Available", "")],
            ..Default::default()
        }
    }

    #[test]
    fn missing_dead_letter_queue_waits() {
        let q = queue("app", with_dlq("dlq"), None);
        assert!(matches!(dead_letter_arn(&q, &store(vec![])), Err(DeadLetterWait::NotReady(_))));
    }

    #[test]
    fn unready_dead_letter_queue_waits_and_ready_one_resolves() {
        let q = queue("app", with_dlq("dlq"), None);
        let pending = queue("dlq", QueueSpec::default(), None);
        assert!(matches!(dead_letter_arn(&q, &store(vec![pending])), Err(DeadLetterWait::NotReady(_))));
        let ready = queue("dlq", QueueSpec::default(), Some(ready_status("arn:aws:sqs:r:000000000000:dlq")));
        assert_eq!(dead_letter_arn(&q, &store(vec![ready])), Ok(Some("arn:aws:sqs:r:000000000000:dlq".into())));
    }

    #[test]
    fn fifo_queue_cannot_use_a_standard_dead_letter_queue() {
        let q = queue("app", QueueSpec { fifo: true, ..with_dlq("dlq") }, None);
        let dlq = queue("dlq", QueueSpec::default(), Some(ready_status("arn")));
        assert!(matches!(dead_letter_arn(&q, &store(vec![dlq])), Err(DeadLetterWait::Mismatch(_))));
    }

    #[test]
    fn a_queue_cannot_be_its_own_dead_letter_queue() {
        let q = queue("app", with_dlq("app"), None);
        assert!(matches!(dead_letter_arn(&q, &store(vec![])), Err(DeadLetterWait::Invalid(_))));
    }
}

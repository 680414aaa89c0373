//! Reads: the dead-letter reference from the local cache, the queue from SQS.

use crate::controllers::hash_of;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use providers::sqs::Attributes;
use providers::{QueueBackend, QueueError};
use tracing::debug;

use super::desired::{Desired, TAG_ADOPTED, TAG_OWNER_UID, queue_name};
use super::plan::{Existing, Observed, Outcome};
use super::tenancy::{self, Holder};
use crate::controllers::memory::compact_key;
use crate::controllers::status::ObjectStatus;
use crate::crd::ConditionStatus;
use crate::crd::queue::Queue;
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Why the dead-letter target cannot be used yet.
#[derive(Debug, PartialEq)]
pub enum DeadLetterWait {
    NotReady(String),
    Mismatch(String),
    Invalid(String),
    Cycle(String),
}

impl DeadLetterWait {
    pub fn into_outcome(self, resync: Duration) -> Outcome {
        match self {
            // The referenced Queue wakes us when it becomes Ready; the retry is a safety net.
            DeadLetterWait::NotReady(message) => {
                Outcome::Wait { reason: Reason::DeadLetterQueueNotReady, message, retry: Some(resync) }
            }
            DeadLetterWait::Mismatch(message) => {
                Outcome::Wait { reason: Reason::InvalidDeadLetterQueue, message, retry: Some(resync) }
            }
            DeadLetterWait::Invalid(message) => Outcome::Wait { reason: Reason::InvalidSpec, message, retry: None },
            // Edits to the other Queues of the cycle do not wake this one: look again each resync.
            DeadLetterWait::Cycle(message) => {
                Outcome::Wait { reason: Reason::DeadLetterCycle, message, retry: Some(resync) }
            }
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
    if let Some(chain) = dead_letter_cycle(queue, queues) {
        return Err(DeadLetterWait::Cycle(format!(
            "dead-letter cycle {}: each Queue waits for the next to become Ready; remove deadLetter from one of them",
            chain.join(" -> ")
        )));
    }
    let ns = queue.namespace().unwrap_or_default();
    let Some(target) = queues.get(&ObjectRef::new(&r.name).within(&ns)) else {
        return Err(DeadLetterWait::NotReady(format!("dead-letter Queue {ns}/{} does not exist yet", r.name)));
    };
    if target.metadata.deletion_timestamp.is_some() {
        return Err(DeadLetterWait::NotReady(format!("dead-letter Queue {ns}/{} is being deleted", r.name)));
    }
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
    let ready = status.and_then(|s| s.ready()).is_some_and(|c| c.status == ConditionStatus::True);
    match status.and_then(|s| s.queue_arn.clone()) {
        Some(arn) if ready => Ok(Some(arn)),
        _ => Err(DeadLetterWait::NotReady(format!("waiting for dead-letter Queue {} to become Ready", r.name))),
    }
}

/// What a converge depends on besides SQS: the spec's generation, the account, and the
/// dead-letter target resolved from the Queue cache. A follow-up of our own writes with the same fingerprint is
/// answered from memory (see `Context::written`).
pub fn fingerprint(queue: &Queue, queues: &Store<Queue>, placement: &super::accounts::Placement) -> u64 {
    let account = (&placement.account, &placement.region, &placement.role_arn);
    hash_of((queue.metadata.generation, account, dead_letter_arn(queue, queues).ok()))
}

/// The dead-letter chain from `queue` when it leads back to `queue`: `[a, b, a]`. SQS would
/// accept it, but no Queue of the chain can ever become Ready first, so it is reported instead
/// of waited on forever.
pub fn dead_letter_cycle(queue: &Queue, queues: &Store<Queue>) -> Option<Vec<String>> {
    let ns = queue.namespace().unwrap_or_default();
    let start = queue.name_any();
    let mut chain = vec![start.clone()];
    let mut next = queue.spec.dead_letter.as_ref()?.queue_ref.as_ref()?.name.clone();
    // A chain cannot be longer than the Queues in the cache.
    for _ in 0..=queues.len() {
        chain.push(next.clone());
        if next == start {
            return Some(chain);
        }
        let target = queues.get(&ObjectRef::new(&next).within(&ns))?;
        next = target.spec.dead_letter.as_ref()?.queue_ref.as_ref()?.name.clone();
        if chain[1..].contains(&next) {
            // A loop further down the chain that does not include this Queue.
            return None;
        }
    }
    None
}

/// What an earlier pass proved from the owner tag: this URL, with this `CreatedTimestamp`, is
/// ours. A queue deleted and recreated under the same name (by anyone) has the same URL but a
/// new timestamp, so it has to prove itself again. Both are kept as 64-bit hashes: they are
/// only compared, and one proof is kept per Queue for as long as the Queue exists.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    url: u64,
    created: Option<u64>,
    pub at: Instant,
    pub generation: Option<i64>,
}

fn digest(value: &str) -> u64 {
    hash_of(value)
}

/// How much later than the proof (by this host's clock) a queue proven right after CreateQueue
/// may say it was made. SQS refuses a deleted queue's name for 60 s, so a queue made again
/// under the same URL is at least 60 s younger than the proof; the rest absorbs clock skew.
const CREATED_SKEW_SECS: u64 = 30;

impl Verified {
    /// `url` proven ours at `at`, made at `created` if that was read.
    pub fn new(url: &str, created: Option<&str>, at: Instant, generation: Option<i64>) -> Self {
        Verified { url: digest(url), created: created.map(digest), at, generation }
    }

    /// Whether the queue found now is the one proven.
    pub fn covers(&self, url: &str, attributes: &Attributes) -> bool {
        if self.url != digest(url) {
            return false;
        }
        let found = attributes.get("CreatedTimestamp");
        match self.created {
            Some(created) => found.is_some_and(|found| digest(found) == created),
            // CreateQueue does not say when the queue was made: the queue found now is the one
            // proven if it was made no later than the proof. Without this every new Queue read
            // its tags twice, and tagging has the tightest SQS quota.
            None => {
                let proved = std::time::SystemTime::now() - self.at.elapsed();
                let proved = proved.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                found.and_then(|c| c.parse::<u64>().ok()).is_some_and(|c| c <= proved + CREATED_SKEW_SECS)
            }
        }
    }
}

/// The latest [`Verified`] per Queue, by UID. One per Queue for as long as it exists: cleanup
/// forgets it.
#[derive(Debug, Default)]
pub struct Proofs(Mutex<HashMap<u128, Verified>>);

impl Proofs {
    pub fn get(&self, uid: &str) -> Option<Verified> {
        self.lock().get(&compact_key(uid)).cloned()
    }

    pub fn remember(&self, uid: &str, proof: Verified) {
        self.lock().insert(compact_key(uid), proof);
    }

    pub fn forget(&self, uid: &str) {
        self.lock().remove(&compact_key(uid));
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u128, Verified>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The queue's URL: the one recorded in status when it is for the desired name (no lookup
/// call), else by name.
async fn find(queue: &Queue, name: &str, sqs: &dyn QueueBackend) -> Result<Option<String>> {
    let status = queue.status.as_ref();
    let recorded = status.filter(|s| s.queue_name.as_deref() == Some(name)).and_then(|s| s.queue_url.clone());
    Ok(match recorded {
        Some(url) => Some(url),
        None => sqs.queue_url(name).await?,
    })
}

/// Finds the queue and reads its attributes. Tags (the owner) are read when `tags_due`, or
/// unless `verified` proves this very queue ours; when the Queue asks to adopt a queue another
/// Queue of its own namespace owns, whether that Queue still exists (other namespaces' queues are
/// never adopted, so their Queues are never looked up).
pub async fn observe(
    queue: &Queue,
    desired: &Desired,
    sqs: &dyn QueueBackend,
    client: &Client,
    cluster: &str,
    verified: Option<&Verified>,
    tags_due: bool,
) -> Result<Observed> {
    let Some(url) = find(queue, &desired.name, sqs).await? else { return Ok(Observed::Absent) };
    let Some(attributes) = sqs.attributes(&url).await? else { return Ok(Observed::Absent) };
    let verified = verified.is_some_and(|v| v.covers(&url, &attributes));
    let tags = if tags_due || !verified { Some(sqs.tags(&url).await?) } else { None };
    let mut existing = Existing { url, attributes, tags, verified, owner_live: None };
    let (uid, ns) = (queue.uid().unwrap_or_default(), queue.namespace().unwrap_or_default());
    if queue.spec.adopt
        && let Some(tags) = &existing.tags
        && let Holder::SameNamespace { uid: owner_uid, name } = tenancy::holder(tags, &ns, cluster)
        && owner_uid != uid
    {
        existing.owner_live = owner_live(client, &ns, &name, &owner_uid).await;
    }
    Ok(Observed::Present(existing))
}

/// Whether the Queue `namespace/name` an owner tag names still exists (the same object: same
/// UID). `None` when it cannot be told (the API refused the read).
async fn owner_live(client: &Client, namespace: &str, name: &str, owner_uid: &str) -> Option<bool> {
    let api: Api<Queue> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(found) => Some(found.and_then(|q| q.uid()).as_deref() == Some(owner_uid)),
        Err(e) => {
            debug!(error = %e, "could not look up the Queue named by an owner tag");
            None
        }
    }
}

/// Whose queue `deadLetter.targetArn` names, read from its owner tags in this Queue's account.
/// Err((reason, message)) when it is not in this account and region, or does not exist.
pub async fn dead_letter_holder(
    arn: &str,
    namespace: &str,
    cluster: &str,
    sqs: &dyn QueueBackend,
) -> Result<Result<(String, Holder), tenancy::Refusal>> {
    let name = arn.rsplit(':').next().unwrap_or_default().to_string();
    let Some(url) = sqs.queue_url(&name).await? else {
        let message =
            format!("the dead-letter target {name:?} does not exist in this Queue's account; create it first");
        return Ok(Err((Reason::DeadLetterQueueNotFound, message)));
    };
    // SQS moves dead letters only within one account and region: a queue of that name here is
    // the target only if its ARN is the one given.
    let here = sqs.region().and_then(|region| super::desired::queue_arn(&url, &region));
    if here.as_deref().is_some_and(|here| here != arn) {
        let message = format!(
            "deadLetter.targetArn {arn:?} is not in this Queue's account and region; SQS requires the dead-letter queue beside the source queue"
        );
        return Ok(Err((Reason::DeadLetterNotAllowed, message)));
    }
    let tags = match sqs.tags(&url).await {
        Ok(tags) => tags,
        Err(QueueError::NotFound) => {
            let message =
                format!("the dead-letter target {name:?} does not exist in this Queue's account; create it first");
            return Ok(Err((Reason::DeadLetterQueueNotFound, message)));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Ok((name, tenancy::holder(&tags, namespace, cluster))))
}

/// Observe-only: the queue of that name and its attributes, never its tags and never a write.
pub async fn observe_only(
    queue: &Queue,
    desired: &Desired,
    sqs: &dyn QueueBackend,
) -> Result<Option<(String, Attributes)>> {
    let Some(url) = find(queue, &desired.name, sqs).await? else { return Ok(None) };
    Ok(sqs.attributes(&url).await?.map(|a| (url, a)))
}

/// This Queue's SQS queue, for deletion, only if its owner tag names this Queue now (a recorded
/// URL is not proof: the name may have been reused): its URL, and whether it carries the
/// adoption marker. `None` when there is no such queue or it belongs to someone else.
pub async fn owned_queue(queue: &Queue, sqs: &dyn QueueBackend) -> Result<Option<(String, bool)>> {
    let ns = queue.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let recorded_name = queue.status.as_ref().and_then(|s| s.queue_name.as_deref());
    let name = queue_name(&ns, &queue.name_any(), &queue.spec, recorded_name);
    let Some(url) = find(queue, &name, sqs).await? else { return Ok(None) };
    let tags = match sqs.tags(&url).await {
        Ok(tags) => tags,
        Err(QueueError::NotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let ours = tags.get(TAG_OWNER_UID).map(String::as_str) == queue.uid().as_deref();
    let adopted = tags.get(TAG_ADOPTED).is_some_and(|v| v == "true");
    Ok(ours.then_some((url, adopted)))
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
            dead_letter: Some(Box::new(DeadLetter {
                queue_ref: Some(LocalQueueRef { name: target.into() }),
                target_arn: None,
                max_receive_count: 5,
            })),
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
    fn a_dead_letter_cycle_is_reported_with_its_chain() {
        let a = queue("a", with_dlq("b"), None);
        let b = queue("b", with_dlq("c"), None);
        let c = queue("c", with_dlq("a"), None);
        let all = store(vec![a.clone(), b.clone(), c]);
        let Err(DeadLetterWait::Cycle(message)) = dead_letter_arn(&a, &all) else { panic!("a cycle") };
        assert!(message.contains("a -> b -> c -> a"), "{message}");
        // Leading into a cycle is waiting on it, not being in it.
        let x = queue("x", with_dlq("d"), None);
        let d = queue("d", with_dlq("e"), None);
        let e = queue("e", with_dlq("d"), None);
        let tail = store(vec![x.clone(), d, e]);
        assert_eq!(dead_letter_cycle(&x, &tail), None);
        assert!(matches!(dead_letter_arn(&b, &store(vec![b.clone()])), Err(DeadLetterWait::NotReady(_))));
    }

    #[test]
    fn a_queue_cannot_be_its_own_dead_letter_queue() {
        let q = queue("app", with_dlq("app"), None);
        assert!(matches!(dead_letter_arn(&q, &store(vec![])), Err(DeadLetterWait::Invalid(_))));
    }

    #[test]
    fn a_proof_made_at_create_covers_the_queue_made_then_but_not_one_made_again_later() {
        let url = "http://sqs/000000000000/ns-orders";
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let made = |secs: u64| Attributes::from([("CreatedTimestamp".to_string(), secs.to_string())]);
        let at_create = Verified::new(url, None, Instant::now(), Some(1));
        assert!(at_create.covers(url, &made(now)), "the queue CreateQueue made");
        assert!(at_create.covers(url, &made(now - 3600)), "a queue CreateQueue found, made long before");
        assert!(!at_create.covers(url, &made(now + 61)), "made again after SQS's 60 s, by anyone");
        assert!(!at_create.covers("http://sqs/000000000000/other", &made(now)), "another URL");
        assert!(!at_create.covers(url, &Attributes::new()), "no timestamp, no proof");
        let exact = Verified::new(url, Some(&now.to_string()), Instant::now(), Some(1));
        assert!(exact.covers(url, &made(now)));
        assert!(!exact.covers(url, &made(now - 1)), "a known timestamp must match exactly");
    }
}

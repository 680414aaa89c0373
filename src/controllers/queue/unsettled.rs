//! CreateQueue calls whose outcome is unknown. A call that timed out or lost its connection may
//! still be carried out by SQS after the reconcile gave up on it. Were the Queue deleted
//! meanwhile, its cleanup would find no queue, release the finalizer, and the late create would
//! leave a queue nobody owns. So the cleanup of a Queue with such a call waits [`SETTLE`] after
//! it before it concludes that nothing was made, and looks again then. Such a call by the replica
//! or process that acted on the Queue before this one is in no memory here: the cleanup of a
//! Queue older than this replica's takeover of it waits [`SETTLE`] after the takeover too.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use providers::QueueError;
use tokio::time::Instant;

use crate::controllers::memory::OwnWrites;

/// How long after a CreateQueue of unknown outcome SQS may still carry it out: more than twice the
/// SDK's whole-call timeout (`SqsSettings::operation_timeout`, 20 s, retries included), during
/// which an abandoned attempt is at most waiting in a server's queue.
pub const SETTLE: Duration = Duration::from_secs(45);

/// Per Queue UID: when its last CreateQueue of unknown outcome ended (the memory's own age).
pub struct Unsettled(OwnWrites<()>);

impl Default for Unsettled {
    fn default() -> Self {
        Unsettled(OwnWrites::expiring(SETTLE))
    }
}

impl Unsettled {
    /// Notes how Queue `uid`'s CreateQueue ended: a timeout, a lost connection or a server error
    /// leave it unknown whether SQS made the queue; any answer settles it.
    pub fn created<T>(&self, uid: &str, result: &Result<T, QueueError>) {
        match result {
            Err(QueueError::Unavailable(_) | QueueError::Other { .. }) => self.0.record(uid, ()),
            _ => self.0.forget(uid),
        }
    }

    /// How long Queue `uid`'s cleanup still waits for a create of unknown outcome; `None` when
    /// there is none (any longer).
    pub fn wait(&self, uid: &str) -> Option<Duration> {
        let (_, age) = self.0.get(uid, |_, age| age < SETTLE)?;
        Some(SETTLE - age)
    }

    /// Forgets Queue `uid` (its cleanup is done).
    pub fn forget(&self, uid: &str) {
        self.0.forget(uid);
    }
}

/// How long the cleanup of a Queue made at `created` still waits because this replica has acted
/// on it only `since` then ([`crate::controllers::Acting::acting_since`]): the replica or process
/// that acted before may have left a CreateQueue of unknown outcome, which is in no memory here.
/// A Queue made after the takeover was never acted on before it, and waits for nothing.
pub fn after_takeover(since: Option<Instant>, created: Option<&Time>) -> Option<Duration> {
    let acting_for = since?.elapsed();
    let left = SETTLE.checked_sub(acting_for).filter(|left| !left.is_zero())?;
    // A creation timestamp is whole seconds: one in the takeover's second counts as made since.
    let took_over = k8s_openapi::jiff::Timestamp::now().checked_sub(acting_for + Duration::from_secs(1)).ok()?;
    (created?.0 < took_over).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_queue_older_than_the_takeover_waits_out_the_settle_time_after_it() {
        let made = |ago: u64| Time(k8s_openapi::jiff::Timestamp::now() - Duration::from_secs(ago));
        let since = Instant::now();
        // Paused time moves the monotonic clock only: date the Queues against the wall clock.
        assert_eq!(after_takeover(Some(since), Some(&made(600))), Some(SETTLE), "made long before");
        assert_eq!(after_takeover(None, Some(&made(600))), None, "not acting: its reconcile does not run");
        tokio::time::advance(Duration::from_secs(30)).await;
        let left = after_takeover(Some(since), Some(&made(600)));
        assert_eq!(left, Some(SETTLE - Duration::from_secs(30)));
        assert_eq!(after_takeover(Some(since), Some(&made(0))), None, "made since the takeover");
        tokio::time::advance(SETTLE).await;
        assert_eq!(after_takeover(Some(since), Some(&made(600))), None, "settled");
    }

    #[test]
    fn the_wait_outlasts_two_whole_sqs_calls() {
        assert!(SETTLE > 2 * providers::SqsSettings::default().operation_timeout);
    }

    #[test]
    fn only_a_create_without_an_answer_is_waited_for() {
        let u = Unsettled::default();
        u.created::<()>("a", &Err(QueueError::Unavailable("timeout".into())));
        u.created::<()>("b", &Err(QueueError::Invalid { code: "x".into(), message: "y".into() }));
        u.created("c", &Ok(()));
        assert!(u.wait("a").is_some_and(|left| left > Duration::from_secs(40)));
        assert_eq!((u.wait("b"), u.wait("c")), (None, None));
        u.created("a", &Ok(()));
        assert_eq!(u.wait("a"), None, "answered since");
    }
}

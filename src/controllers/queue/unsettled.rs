//! CreateQueue calls whose outcome is unknown. A call that timed out or lost its connection may
//! still be carried out by SQS after the reconcile gave up on it. Were the Queue deleted
//! meanwhile, its cleanup would find no queue, release the finalizer, and the late create would
//! leave a queue nobody owns. So the cleanup of a Queue with such a call waits [`SETTLE`] after
//! it before it concludes that nothing was made, and looks again then.

use std::time::Duration;

use providers::QueueError;

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

#[cfg(test)]
mod tests {
    use super::*;

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

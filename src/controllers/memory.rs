//! What a controller wrote last, per object: the watch cache lags skyport's own writes.
//!
//! A write (finalizer, status, an owned object) wakes the object again, and that follow-up
//! reconcile usually starts before the cache shows the write. Each controller remembers what it
//! needs to answer it: the Queue controller its last converge (so the follow-up does not ask
//! SQS again, see `queue::observe::fingerprint`), the Tunnel controller the status it last
//! wrote (so it never sees a Tunnel without the host it recorded).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Per-object memory of our own writes: key → (when, value).
#[derive(Debug)]
pub struct OwnWrites<V>(Mutex<HashMap<String, (Instant, V)>>);

impl<V> Default for OwnWrites<V> {
    fn default() -> Self {
        OwnWrites(Mutex::default())
    }
}

impl<V: Clone> OwnWrites<V> {
    pub fn record(&self, key: String, value: V) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(key, (Instant::now(), value));
    }

    /// The value recorded for `key` and its age, if `usable` accepts them; an entry it refuses is
    /// forgotten, so the memory holds only entries still worth asking for.
    pub fn get(&self, key: &str, usable: impl FnOnce(&V, Duration) -> bool) -> Option<(V, Duration)> {
        let mut entries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (at, value) = entries.get(key)?;
        let age = at.elapsed();
        if usable(value, age) {
            return Some((value.clone(), age));
        }
        entries.remove(key);
        None
    }

    pub fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(window: Duration, fingerprint: u64) -> impl FnOnce(&(u64, &'static str), Duration) -> bool {
        move |(recorded, _), age| *recorded == fingerprint && age < window
    }

    #[test]
    fn an_entry_answers_only_its_fingerprint_within_the_window() {
        let memory = OwnWrites::default();
        memory.record("uid".into(), (1, "u"));
        let ((_, got), age) = memory.get("uid", within(Duration::from_secs(60), 1)).expect("fresh entry");
        assert_eq!(got, "u");
        assert!(age < Duration::from_secs(60));
        assert!(memory.get("other", within(Duration::from_secs(60), 1)).is_none());
        assert!(memory.get("uid", within(Duration::from_secs(60), 2)).is_none(), "a new generation converges");
        assert!(memory.get("uid", within(Duration::from_secs(60), 1)).is_none(), "and the old entry is gone");
    }

    #[test]
    fn an_expired_entry_is_dropped() {
        let memory = OwnWrites::default();
        memory.record("uid".into(), (1, "u"));
        assert!(memory.get("uid", within(Duration::ZERO, 1)).is_none());
        assert!(memory.is_empty());
        memory.record("uid".into(), (1, "u"));
        memory.forget("uid");
        assert!(memory.get("uid", within(Duration::from_secs(60), 1)).is_none());
    }
}

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
pub struct OwnWrites<V> {
    entries: Mutex<Entries<V>>,
    /// Entries older than this are never asked for again; `None`: kept until asked for.
    max_age: Option<Duration>,
}

#[derive(Debug)]
struct Entries<V> {
    map: HashMap<String, (Instant, V)>,
    /// How many entries the last sweep left.
    swept_to: usize,
}

impl<V> Default for OwnWrites<V> {
    fn default() -> Self {
        OwnWrites { entries: Mutex::new(Entries { map: HashMap::new(), swept_to: 0 }), max_age: None }
    }
}

impl<V> OwnWrites<V> {
    /// A memory whose entries are useless after `max_age`. An entry is only dropped when asked for
    /// otherwise, and a storm of new objects records one each that nobody asks for until their
    /// resync: these are swept instead, whenever the memory has doubled since the last sweep (so
    /// a sweep costs O(1) per record).
    pub fn expiring(max_age: Duration) -> Self {
        OwnWrites { max_age: Some(max_age), ..Self::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<V>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Below this many entries a memory is never swept.
const SWEEP_FLOOR: usize = 256;

impl<V: Clone> OwnWrites<V> {
    pub fn record(&self, key: String, value: V) {
        let mut entries = self.lock();
        entries.map.insert(key, (Instant::now(), value));
        if let Some(max_age) = self.max_age
            && entries.map.len() >= (2 * entries.swept_to).max(SWEEP_FLOOR)
        {
            entries.map.retain(|_, (at, _)| at.elapsed() < max_age);
            entries.swept_to = entries.map.len();
        }
    }

    /// The value recorded for `key` and its age, if `usable` accepts them; an entry it refuses is
    /// forgotten, so the memory holds only entries still worth asking for.
    pub fn get(&self, key: &str, usable: impl FnOnce(&V, Duration) -> bool) -> Option<(V, Duration)> {
        let mut entries = self.lock();
        let (at, value) = entries.map.get(key)?;
        let age = at.elapsed();
        if usable(value, age) {
            return Some((value.clone(), age));
        }
        entries.map.remove(key);
        None
    }

    pub fn forget(&self, key: &str) {
        self.lock().map.remove(key);
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
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

    #[test]
    fn a_storm_of_entries_nobody_asks_for_is_swept_once_expired() {
        let memory = OwnWrites::expiring(Duration::from_millis(50));
        for i in 0..SWEEP_FLOOR {
            memory.record(format!("old-{i}"), (1, "u"));
        }
        // The sweep that filling the floor started found nothing expired yet.
        assert_eq!(memory.len(), SWEEP_FLOOR);
        std::thread::sleep(Duration::from_millis(60));
        for i in 0..SWEEP_FLOOR {
            memory.record(format!("new-{i}"), (1, "u"));
        }
        // At twice the last sweep's size, the expired half went; the fresh entries stay.
        assert_eq!(memory.len(), SWEEP_FLOOR);
        assert!(memory.get("new-0", within(Duration::from_secs(60), 1)).is_some());

        let kept = OwnWrites::default();
        for i in 0..2 * SWEEP_FLOOR {
            kept.record(format!("k-{i}"), (1, "u"));
        }
        std::thread::sleep(Duration::from_millis(10));
        kept.record("last".into(), (1, "u"));
        assert_eq!(kept.len(), 2 * SWEEP_FLOOR + 1, "a memory without max age is never swept");
    }
}

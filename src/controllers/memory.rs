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

/// What a per-object memory keys its entries by: the UID as the 128-bit number it spells, or a
/// 128-bit hash of any other key (`namespace/name`). 16 bytes and no allocation, where a UID
/// kept as a `String` takes 24 bytes and a 48-byte allocation in every memory that holds it
/// (three per Queue).
pub fn compact_key(key: &str) -> u128 {
    let mut digits = 0u32;
    let mut uid = 0u128;
    for (i, b) in key.bytes().enumerate() {
        let nibble = match b {
            b'-' if matches!(i, 8 | 13 | 18 | 23) => continue,
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => {
                digits = 0;
                break;
            }
        };
        uid = uid << 4 | u128::from(nibble);
        digits += 1;
    }
    if digits == 32 && key.len() == 36 {
        return uid;
    }
    // Two independent 64-bit hashes: a collision between two keys of one memory is as unlikely
    // as between two UIDs.
    let half = |salt: u8| super::hash_of((salt, key));
    u128::from(half(1)) << 64 | u128::from(half(2))
}

/// Per-object memory of our own writes: key → (when, value).
#[derive(Debug)]
pub struct OwnWrites<V> {
    entries: Mutex<Entries<V>>,
    /// Entries older than this are never asked for again; `None`: kept until asked for.
    max_age: Option<Duration>,
}

#[derive(Debug)]
struct Entries<V> {
    map: HashMap<u128, (Instant, V)>,
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
    pub fn record(&self, key: impl AsRef<str>, value: V) {
        let mut entries = self.lock();
        entries.map.insert(compact_key(key.as_ref()), (Instant::now(), value));
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
        let key = compact_key(key);
        let mut entries = self.lock();
        let (at, value) = entries.map.get(&key)?;
        let age = at.elapsed();
        if usable(value, age) {
            return Some((value.clone(), age));
        }
        entries.map.remove(&key);
        None
    }

    pub fn forget(&self, key: &str) {
        self.lock().map.remove(&compact_key(key));
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
    fn a_uid_is_its_own_number_and_other_keys_are_hashed() {
        let uid = "dd598ba2-a35c-4c96-9245-4dc1e850c16a";
        assert_eq!(compact_key(uid), 0xdd598ba2_a35c_4c96_9245_4dc1e850c16a);
        assert_eq!(compact_key("dd598ba2-a35c-4c96-9245-4dc1e850c16b") - compact_key(uid), 1);
        // Not UIDs: hashed, each to its own value and never to what its hex digits spell.
        let keys = ["ns/q", "ns/r", "dd598ba2a35c4c9692454dc1e850c16a", "DD598BA2-A35C-4C96-9245-4DC1E850C16A", ""];
        let hashed: std::collections::HashSet<u128> = keys.iter().map(|k| compact_key(k)).collect();
        assert_eq!(hashed.len(), keys.len());
        assert!(!hashed.contains(&compact_key(uid)));
        assert_eq!(compact_key("ns/q"), compact_key("ns/q"), "the same key every time");
    }

    #[test]
    fn an_entry_answers_only_its_fingerprint_within_the_window() {
        let memory = OwnWrites::default();
        memory.record("uid", (1, "u"));
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
        memory.record("uid", (1, "u"));
        assert!(memory.get("uid", within(Duration::ZERO, 1)).is_none());
        assert!(memory.is_empty());
        memory.record("uid", (1, "u"));
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
        kept.record("last", (1, "u"));
        assert_eq!(kept.len(), 2 * SWEEP_FLOOR + 1, "a memory without max age is never swept");
    }
}

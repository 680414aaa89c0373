//! Events on the objects skyport reconciles (events.k8s.io/v1), a repeat within six minutes
//! folded into the first one's series as kubectl shows it (`x3 over 2m`).
//!
//! A repeat replaces the first Event whole (`update`), made again from what names it, rather than
//! patching it: `patch` on Events would be a read of every Event in the cluster (a JSON patch
//! copying the note into the name is answered with the note before any admission policy runs),
//! while an update's answer is the object sent. So skyport holds `create` and `update` on Events.
//!
//! kube-runtime's `Recorder` does the same, but keeps a full copy of every Event it published in
//! the last six minutes (about 4 KiB each) and scans all of them on every publish: a create storm
//! of 10,000 Queues held ~40 MiB of Events (BENCHMARKS.md). This keeps, per key, the time that
//! names the Event (its name is the object's name and that time) and the count, and expires
//! entries oldest first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
pub use kube::runtime::events::EventType;

/// How long a repeat still counts as one: the same window as kube-runtime's Recorder and
/// client-go's event correlator.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Publishes Events and remembers the recent ones to fold repeats into a series.
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

impl Events {
    /// `instance`: the reporting instance (the pod's name); the controller's name without one.
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Events {
            client,
            controller: controller.to_string(),
            instance: instance.unwrap_or_else(|| controller.to_string()),
            recent: Mutex::default(),
        }
    }

    /// Creates the Event, or counts it once more if the same one was published on the same
    /// object within [`SERIES_WINDOW`].
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let key = key(regarding, type_, reason, action, note);
        let now = Instant::now();
        let repeat = self.lock().repeat_of(key, now);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        // Whole microseconds, as the API server keeps them, so a repeat names the same eventTime.
        let stamp = micro_time(nanos(&MicroTime(k8s_openapi::jiff::Timestamp::now())));
        if let Some((first, count)) = repeat {
            let mut event = self.event(regarding, type_, reason, action, note, micro_time(first));
            event.series = Some(EventSeries { count: count + 1, last_observed_time: stamp.clone() });
            match api.replace(&self.name(regarding, first), &PostParams::default(), &event).await {
                Ok(_) => {
                    self.lock().remember(key, first, count + 1, now);
                    return Ok(());
                }
                // Deleted meanwhile (its TTL, or by hand): start a new one.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let first = nanos(&stamp);
        let event = self.event(regarding, type_, reason, action, note, stamp);
        api.create(&PostParams::default(), &event).await?;
        self.lock().remember(key, first, 1, now);
        Ok(())
    }

    /// The name of the Event first published on `regarding` at `first` (nanoseconds): made again
    /// for each repeat rather than kept.
    fn name(&self, regarding: &ObjectReference, first: u64) -> String {
        format!("{}.{first:x}", regarding.name.as_deref().unwrap_or(&self.controller))
    }

    fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
        stamp: MicroTime,
    ) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(self.name(regarding, nanos(&stamp))),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            event_time: Some(stamp),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            reason: Some(reason.to_string()),
            action: Some(action.to_string()),
            note: Some(note.to_string()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many Events are remembered for series (for tests and memory checks).
    pub fn remembered(&self) -> usize {
        self.lock().by_key.len()
    }
}

/// Nanoseconds since 1970 (they fit 64 bits until 2554).
fn nanos(stamp: &MicroTime) -> u64 {
    u64::try_from(stamp.0.as_nanosecond()).unwrap_or_default()
}

/// The time `nanos` named, for the first Event of a series made again (its eventTime cannot
/// change; the API server keeps microseconds, so that is all that must round-trip).
fn micro_time(nanos: u64) -> MicroTime {
    let micros = i64::try_from(nanos / 1_000).unwrap_or_default();
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// One hash of everything that makes two Events the same one.
fn key(regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: &str) -> u64 {
    let object = (&regarding.uid, &regarding.kind, &regarding.namespace, &regarding.name);
    super::hash_of((object, (matches!(type_, EventType::Warning), reason, action, note)))
}

/// The Events published within the window: name and count by key, and keys in the order they
/// were last published, so expiry pops from the front instead of scanning everything.
#[derive(Default)]
struct Recent {
    by_key: HashMap<u64, Entry>,
    order: VecDeque<(Instant, u64)>,
}

struct Entry {
    /// When the series' Event was first published, in nanoseconds: its name's suffix.
    first: u64,
    count: i32,
    last: Instant,
}

impl Recent {
    /// The Event `key` to count again, after forgetting those older than the window.
    fn repeat_of(&mut self, key: u64, now: Instant) -> Option<(u64, i32)> {
        while let Some(&(at, old)) = self.order.front() {
            if now.duration_since(at) < SERIES_WINDOW {
                break;
            }
            self.order.pop_front();
            // A key published again since sits later in the queue as well; keep it for that.
            if self.by_key.get(&old).is_some_and(|e| e.last == at) {
                self.by_key.remove(&old);
            }
        }
        self.by_key.get(&key).map(|e| (e.first, e.count))
    }

    fn remember(&mut self, key: u64, first: u64, count: i32, now: Instant) {
        self.by_key.insert(key, Entry { first, count, last: now });
        self.order.push_back((now, key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_events_time_is_made_again_exactly_from_the_name() {
        let stamp = micro_time(nanos(&MicroTime(k8s_openapi::jiff::Timestamp::now())));
        let again = micro_time(nanos(&stamp));
        assert_eq!(serde_json::to_value(&again).unwrap(), serde_json::to_value(&stamp).unwrap());
        assert_eq!(nanos(&stamp) % 1_000, 0, "whole microseconds");
    }

    #[test]
    fn a_repeat_within_the_window_counts_on_and_an_old_one_starts_anew() {
        let mut recent = Recent::default();
        let t0 = Instant::now();
        assert_eq!(recent.repeat_of(1, t0), None);
        recent.remember(1, 7, 1, t0);
        let t1 = t0 + Duration::from_secs(60);
        assert_eq!(recent.repeat_of(1, t1), Some((7, 1)));
        recent.remember(1, 7, 2, t1);
        // Six minutes after the first, but not after the repeat: still the same series.
        let t2 = t0 + SERIES_WINDOW + Duration::from_secs(1);
        assert_eq!(recent.repeat_of(1, t2), Some((7, 2)));
        // Six minutes after the last repeat: forgotten, and nothing is left behind.
        let t3 = t1 + SERIES_WINDOW;
        assert_eq!(recent.repeat_of(1, t3), None);
        assert!(recent.by_key.is_empty() && recent.order.is_empty());
    }

    #[test]
    fn expiry_forgets_only_what_is_old() {
        let mut recent = Recent::default();
        let t0 = Instant::now();
        for k in 0..1000 {
            recent.remember(k, k, 1, t0 + Duration::from_millis(k));
        }
        let later = t0 + SERIES_WINDOW + Duration::from_millis(500);
        assert_eq!(recent.repeat_of(999, later), Some((999, 1)));
        assert_eq!(recent.by_key.len(), 499, "the 501 published more than six minutes ago are gone");
    }

    #[test]
    fn events_differ_by_object_reason_and_note() {
        let on = |uid: &str| ObjectReference { uid: Some(uid.into()), name: Some("q".into()), ..Default::default() };
        let base = key(&on("a"), EventType::Warning, "Failed", "Reconcile", "boom");
        assert_eq!(base, key(&on("a"), EventType::Warning, "Failed", "Reconcile", "boom"));
        assert_ne!(base, key(&on("b"), EventType::Warning, "Failed", "Reconcile", "boom"), "another object");
        assert_ne!(base, key(&on("a"), EventType::Warning, "Failed", "Reconcile", "bang"), "another note");
        assert_ne!(base, key(&on("a"), EventType::Normal, "Failed", "Reconcile", "boom"), "another type");
        assert_ne!(base, key(&on("a"), EventType::Warning, "Created", "Reconcile", "boom"), "another reason");
    }
}

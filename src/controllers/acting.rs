//! Whether this replica may act: the gate between a warm standby and a leader, and, with
//! sharding, between the shards this replica holds and the others.
//!
//! A replica with leader election builds every controller at start, so its watches list and
//! keep their caches while it waits for the Lease; a takeover then acts at once instead of
//! listing everything cold. What it must not do before it holds the Lease is act: every
//! reconcile ([`super::reconcile_with`]) and every background task that writes (the orphan
//! sweep) asks the gate first and, while it is shut, waits.
//!
//! With sharding ([`crate::shards`]) every object belongs to a shard ([`Sharded`]) and each
//! shard has its own Lease; the gate then permits an object only while this replica holds its
//! shard's Lease, and only until a deadline that ends before that Lease could expire elsewhere.
//!
//! A reconcile parked at the gate holds the object as it was when it started. When the gate
//! opens it does not act on that snapshot: it returns at once, requeued, and kube-runtime starts
//! it again with the object as the cache holds it then ([`Gate::parked`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use tokio::sync::watch;
use tokio::time::Instant;

pub use super::shard_of::{DEFAULT_SHARD, Sharded, TUNNELS_SHARD, account_shard};

/// How soon a reconcile turned away from a held shard past its deadline tries again: about a
/// renewal round.
const LAPSED_RETRY: Duration = Duration::from_secs(1);

/// The shards this replica holds, each with the moment it must stop acting on it.
pub type Held = BTreeMap<String, Instant>;

/// Where the replica stands.
#[derive(Debug, Clone, Default)]
struct Turn {
    /// Holds the Lease, runs without leader election, or runs sharded.
    open: bool,
    /// Since when it is open: the Lease taken, or the process started without one (unsharded).
    opened: Option<Instant>,
    /// Stopped: reconciles waiting for a Lease end without acting.
    stopped: bool,
    /// With sharding: what it holds; `None` when one Lease (or none) covers everything.
    shards: Option<Arc<Held>>,
    /// With sharding: since when it has held each shard it holds now.
    gained: Arc<BTreeMap<String, Instant>>,
}

impl Turn {
    fn permits(&self, shard: &str) -> bool {
        self.open && self.shards.as_ref().is_none_or(|held| held.get(shard).is_some_and(|end| Instant::now() < *end))
    }
}

/// The side that opens the gate: held by whoever holds the Lease (or the shard Leases).
#[derive(Debug)]
pub struct Gate(watch::Sender<Turn>);

/// The side the controllers ask: whether they may act, and waiting until they may.
#[derive(Debug, Clone)]
pub struct Acting(watch::Receiver<Turn>);

impl Gate {
    /// A shut gate (a standby) and what the controllers ask it through.
    pub fn shut() -> (Gate, Acting) {
        let (tx, rx) = watch::channel(Turn::default());
        (Gate(tx), Acting(rx))
    }

    /// A gate for a sharded replica: open, permitting nothing until [`Gate::hold`] names shards.
    pub fn sharded() -> (Gate, Acting) {
        let (tx, rx) = watch::channel(Turn { open: true, shards: Some(Arc::default()), ..Turn::default() });
        (Gate(tx), Acting(rx))
    }

    /// This replica holds the Lease: parked reconciles go on, new ones act at once.
    pub fn open(&self) {
        self.0.send_modify(|turn| {
            if !turn.open {
                turn.opened = Some(Instant::now());
            }
            turn.open = true;
        });
    }

    /// The shards this replica holds now, each acted on until its deadline (sharded gates only).
    pub fn hold(&self, held: Held) {
        self.0.send_modify(|turn| {
            let now = Instant::now();
            let since = |shard: &String| turn.gained.get(shard).copied().unwrap_or(now);
            turn.gained = Arc::new(held.keys().map(|shard| (shard.clone(), since(shard))).collect());
            turn.shards = Some(Arc::new(held));
        });
    }

    /// Stopping: reconciles waiting for a Lease end without acting; what this replica holds
    /// stays permitted for the reconciles in flight.
    pub fn stop(&self) {
        self.0.send_if_modified(|turn| !std::mem::replace(&mut turn.stopped, true));
    }

    /// What a reconcile that was parked at the gate returns once it opens: run again at once,
    /// from the cache, rather than act on the object as it was when it parked.
    pub fn parked() -> Action {
        Action::requeue(Duration::ZERO)
    }
}

impl Acting {
    /// Always acting: a replica without leader election, and tests.
    pub fn always() -> Acting {
        let (gate, acting) = Gate::shut();
        gate.open();
        acting
    }

    /// Whether the gate permits shards, not everything.
    pub fn sharded(&self) -> bool {
        self.0.borrow().shards.is_some()
    }

    /// Yields each time this replica starts holding a shard it did not hold: the controllers of
    /// kinds spread over several shards reconcile everything again then (those of other shards
    /// return at once).
    pub fn takeovers(&self) -> impl futures::Stream<Item = ()> + Send + Sync + 'static {
        let shards = |turn: &Turn| -> BTreeSet<String> {
            turn.shards.as_ref().map(|held| held.keys().cloned().collect()).unwrap_or_default()
        };
        let before = shards(&self.0.borrow());
        futures::stream::unfold((self.0.clone(), before), move |(mut rx, mut before)| async move {
            loop {
                rx.changed().await.ok()?;
                let now = shards(&rx.borrow_and_update());
                let gained = now.iter().any(|s| !before.contains(s));
                before = now;
                if gained {
                    return Some(((), (rx, before)));
                }
            }
        })
    }

    /// What a reconcile of `obj` returns when a sharded gate turned it away. Another replica's
    /// shard: nothing until the object changes (a takeover of the shard here reconciles
    /// everything again). A shard this replica still holds whose deadline passed while its
    /// renewal was late: soon again, since the renewal either lands (and no takeover follows to
    /// wake the object) or the process ends.
    pub fn turned_away(&self, shard: &str) -> Action {
        let held = self.0.borrow().shards.as_ref().is_some_and(|held| held.contains_key(shard));
        if held { Action::requeue(LAPSED_RETRY) } else { Action::await_change() }
    }

    /// Since when this replica has acted on the objects of `shard` without a break: since it took
    /// that shard's Lease, or the one Lease, or started without one; `None` while it may not. What
    /// the replica (or process) before it left in flight is in no memory of this one's.
    pub fn acting_since(&self, shard: &str) -> Option<Instant> {
        let turn = self.0.borrow();
        if !turn.permits(shard) {
            return None;
        }
        match &turn.shards {
            Some(_) => turn.gained.get(shard).copied(),
            None => turn.opened,
        }
    }

    /// Whether this replica may act on `obj` now.
    pub fn permits<K: Sharded>(&self, obj: &K) -> bool {
        self.permits_shard(&obj.shard())
    }

    /// Whether this replica may act on the objects of `shard` now.
    pub fn permits_shard(&self, shard: &str) -> bool {
        self.0.borrow().permits(shard)
    }

    /// Waits until this replica may act on `obj`: `true`, or `false` when it stopped first.
    pub async fn until_permits<K: Sharded>(&self, obj: &K) -> bool {
        self.until_permits_shard(&obj.shard()).await
    }

    /// Waits until this replica may act on the objects of `shard` (a sweep over them): `true`,
    /// or `false` when it stopped first.
    pub async fn until_permits_shard(&self, shard: &str) -> bool {
        let mut rx = self.0.clone();
        // An error is a dropped Gate: the process is ending, nothing may act any more.
        match rx.wait_for(|turn| turn.permits(shard) || turn.stopped).await {
            Ok(turn) => turn.permits(shard),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Queue;

    fn object() -> Queue {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "q", "namespace": "ns"}, "spec": {}})).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_shut_gate_holds_until_it_opens() {
        let (gate, acting) = Gate::shut();
        assert!(!acting.permits(&object()));
        let waiting = tokio::spawn({
            let acting = acting.clone();
            async move { acting.until_permits(&object()).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "went past a shut gate");
        gate.open();
        assert!(waiting.await.unwrap(), "opened: may act");
        assert!(acting.permits(&object()));
        assert!(acting.until_permits_shard(TUNNELS_SHARD).await);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_a_standby_ends_the_wait_without_acting() {
        let (gate, acting) = Gate::shut();
        let waiting = tokio::spawn({
            let acting = acting.clone();
            async move { acting.until_permits_shard(TUNNELS_SHARD).await }
        });
        tokio::task::yield_now().await;
        gate.stop();
        assert!(!waiting.await.unwrap(), "a stopped standby must not act");
        assert!(!acting.permits(&object()));
        // Dropped (the process ends): nothing waits forever, nothing acts.
        let (gate, acting) = Gate::shut();
        drop(gate);
        assert!(!acting.until_permits(&object()).await);
    }

    #[tokio::test]
    async fn stopping_a_leader_keeps_it_acting_for_the_reconciles_in_flight() {
        let (gate, acting) = Gate::shut();
        gate.open();
        gate.stop();
        assert!(acting.permits(&object()));
        assert!(Acting::always().permits(&object()));
        // Its Gate is gone, but it opened first: a sweep goes on.
        assert!(Acting::always().until_permits_shard(TUNNELS_SHARD).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sharded_gate_permits_only_held_shards_and_only_until_their_deadline() {
        let (gate, acting) = Gate::sharded();
        assert!(!acting.permits(&object()), "holds nothing yet");
        let waiting = tokio::spawn({
            let acting = acting.clone();
            async move { acting.until_permits(&object()).await }
        });
        gate.hold(Held::from([(TUNNELS_SHARD.to_string(), Instant::now() + Duration::from_secs(5))]));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "another shard opened, not this Queue's");
        assert!(acting.permits_shard(TUNNELS_SHARD));
        gate.hold(Held::from([(DEFAULT_SHARD.to_string(), Instant::now() + Duration::from_secs(5))]));
        assert!(waiting.await.unwrap());
        assert!(acting.permits(&object()) && !acting.permits_shard(TUNNELS_SHARD));
        assert_eq!(acting.turned_away(TUNNELS_SHARD), Action::await_change(), "another replica's shard");
        // Not renewed in time: it stops acting at the deadline, with nothing else said; what it
        // turns away meanwhile comes back once a renewal could have landed (no takeover follows
        // a renewal to wake it).
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!acting.permits(&object()));
        assert_eq!(acting.turned_away(DEFAULT_SHARD), Action::requeue(LAPSED_RETRY));
        // Holding a shard it did not hold is a takeover; renewing what it holds is not. (The
        // expired shard is still listed until the next round: give it up first.)
        gate.hold(Held::new());
        let mut takeovers = Box::pin(acting.takeovers());
        let end = Instant::now() + Duration::from_secs(5);
        gate.hold(Held::from([(DEFAULT_SHARD.to_string(), end)]));
        assert_eq!(futures::StreamExt::next(&mut takeovers).await, Some(()));
        gate.hold(Held::from([(DEFAULT_SHARD.to_string(), end + Duration::from_secs(1))]));
        gate.hold(Held::new());
        gate.hold(Held::from([(TUNNELS_SHARD.to_string(), end)]));
        assert_eq!(futures::StreamExt::next(&mut takeovers).await, Some(()), "the tunnels shard is new");
        // Stopping ends a wait for a shard it does not hold.
        gate.hold(Held::new());
        let waiting = tokio::spawn({
            let acting = acting.clone();
            async move { acting.until_permits_shard(TUNNELS_SHARD).await }
        });
        tokio::task::yield_now().await;
        gate.stop();
        assert!(!waiting.await.unwrap());
    }

    /// What a replica acts on since it took over is dated from the takeover: a shard from when it
    /// was gained (renewals keep the date; lost and taken again, a new one), everything from when
    /// the one Lease was taken; nothing while it may not act.
    #[tokio::test(start_paused = true)]
    async fn acting_is_dated_from_the_takeover() {
        let (gate, acting) = Gate::sharded();
        assert_eq!(acting.acting_since(DEFAULT_SHARD), None);
        let (start, held) = (Instant::now(), |end| Held::from([(DEFAULT_SHARD.to_string(), end)]));
        gate.hold(held(start + Duration::from_secs(15)));
        tokio::time::sleep(Duration::from_secs(10)).await;
        gate.hold(held(Instant::now() + Duration::from_secs(15)));
        assert_eq!(acting.acting_since(DEFAULT_SHARD), Some(start), "a renewal is no takeover");
        assert_eq!(acting.acting_since(TUNNELS_SHARD), None, "not held");
        gate.hold(Held::new());
        gate.hold(held(Instant::now() + Duration::from_secs(15)));
        assert_eq!(acting.acting_since(DEFAULT_SHARD), Some(Instant::now()), "taken again");

        let (gate, acting) = Gate::shut();
        assert_eq!(acting.acting_since(DEFAULT_SHARD), None, "a standby");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let opened = Instant::now();
        gate.open();
        tokio::time::sleep(Duration::from_secs(3)).await;
        gate.open();
        assert_eq!(acting.acting_since(DEFAULT_SHARD), Some(opened));
    }
}

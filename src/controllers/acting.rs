//! Whether this replica may act: the gate between a warm standby and a leader.
//!
//! A replica with leader election builds every controller at start, so its watches list and
//! keep their caches while it waits for the Lease; a takeover then acts at once instead of
//! listing everything cold. What it must not do before it holds the Lease is act: every
//! reconcile ([`super::reconcile_with`]) and every background task that writes (the orphan
//! sweep) asks the gate first and, while it is shut, waits.
//!
//! A reconcile parked at the gate holds the object as it was when it started. When the gate
//! opens it does not act on that snapshot: it returns at once, requeued, and kube-runtime starts
//! it again with the object as the cache holds it then ([`Gate::parked`]).
//!
//! The questions take the object ([`Acting::permits`]) so that the answer can later depend on
//! it (a Lease per shard) without changing the callers; today one Lease covers everything.

use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;
use tokio::sync::watch;

/// Where the replica stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// Watching, not acting: waits for the Lease.
    Standby,
    /// Holds the Lease (or runs without leader election): acts.
    Acting,
    /// Stopped before it held the Lease: parked reconciles end without acting.
    Stopped,
}

/// The side that opens the gate: held by whoever holds the Lease.
#[derive(Debug)]
pub struct Gate(watch::Sender<Turn>);

/// The side the controllers ask: whether they may act, and waiting until they may.
#[derive(Debug, Clone)]
pub struct Acting(watch::Receiver<Turn>);

impl Gate {
    /// A shut gate (a standby) and what the controllers ask it through.
    pub fn shut() -> (Gate, Acting) {
        let (tx, rx) = watch::channel(Turn::Standby);
        (Gate(tx), Acting(rx))
    }

    /// This replica holds the Lease: parked reconciles go on, new ones act at once.
    pub fn open(&self) {
        self.0.send_replace(Turn::Acting);
    }

    /// Stopped before holding the Lease: parked reconciles end without acting.
    pub fn stop(&self) {
        self.0.send_if_modified(|turn| {
            let shut = *turn == Turn::Standby;
            if shut {
                *turn = Turn::Stopped;
            }
            shut
        });
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

    /// Whether this replica may act on `obj` now.
    pub fn permits<K: Resource>(&self, _obj: &K) -> bool {
        *self.0.borrow() == Turn::Acting
    }

    /// Waits until this replica may act on `obj`: `true`, or `false` when it stopped first.
    pub async fn until_permits<K: Resource>(&self, obj: &K) -> bool {
        if self.permits(obj) {
            return true;
        }
        self.until_acting().await
    }

    /// Waits until this replica may act on everything (a sweep over all objects): `true`, or
    /// `false` when it stopped first.
    pub async fn until_permits_all(&self) -> bool {
        self.until_acting().await
    }

    async fn until_acting(&self) -> bool {
        let mut rx = self.0.clone();
        // An error is a dropped Gate: the process is ending, nothing may act any more.
        match rx.wait_for(|turn| *turn != Turn::Standby).await {
            Ok(turn) => *turn == Turn::Acting,
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    fn object() -> ConfigMap {
        ConfigMap::default()
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
        assert!(acting.until_permits_all().await);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_a_standby_ends_the_wait_without_acting() {
        let (gate, acting) = Gate::shut();
        let waiting = tokio::spawn({
            let acting = acting.clone();
            async move { acting.until_permits_all().await }
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
        assert!(Acting::always().until_permits_all().await);
    }
}

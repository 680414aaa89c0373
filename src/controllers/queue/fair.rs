//! Fairness between accounts: one throttled or slow AWS account cannot hold every reconcile
//! worker (`--queue-concurrency`), so other accounts' Queues keep converging.
//!
//! A Queue's reconcile enters the [`Gate`] of its budget (AWS account and region, `default` for
//! the operator's own identity) once it knows where its calls go, and leaves it when it returns.
//! [`admits`] decides who may start: an account with nothing in flight always may; the others
//! never take the last worker, and above their fair share only while another worker stays free.
//! A Queue refused is parked, its worker freed at once; the gate wakes it when its account may
//! start again (a resync is the net under that wake). Calls still wait for the account's rate
//! limiter inside the reconcile: the gate bounds how many workers that wait can hold.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use futures::channel::mpsc::UnboundedSender;
use kube::runtime::reflector::ObjectRef;

use super::accounts::Budget;
use crate::crd::queue::Queue;

/// Whether an account with `mine` reconciles in flight may start one more, with `total` in
/// flight over all accounts, `active` accounts with work in flight or waiting (this one among
/// them) and `workers` in the pool (pure).
pub fn admits(workers: usize, active: usize, mine: usize, total: usize) -> bool {
    let share = (workers / active.max(1)).max(1);
    let keeps_one_free = total + 1 < workers;
    mine == 0 || (mine + 1 < workers && (mine < share || keeps_one_free))
}

/// Queues waiting for a turn, in the order they came, each once.
type Parked = (VecDeque<ObjectRef<Queue>>, HashSet<ObjectRef<Queue>>);

#[derive(Default)]
struct Lanes {
    in_flight: HashMap<Budget, usize>,
    parked: HashMap<Budget, Parked>,
}

impl Lanes {
    fn total(&self) -> usize {
        self.in_flight.values().sum()
    }

    /// Accounts with work in flight or waiting, and `budget`.
    fn active(&self, budget: &Budget) -> usize {
        let busy = |b: &Budget| {
            self.in_flight.get(b).is_some_and(|n| *n > 0) || self.parked.get(b).is_some_and(|p| !p.0.is_empty())
        };
        let others = self.in_flight.keys().chain(self.parked.keys()).collect::<HashSet<_>>();
        others.into_iter().filter(|b| *b != budget && busy(b)).count() + 1
    }

    fn admits(&self, workers: usize, budget: &Budget) -> bool {
        let mine = self.in_flight.get(budget).copied().unwrap_or(0);
        admits(workers, self.active(budget), mine, self.total())
    }
}

/// The reconciles in flight per account, and the Queues waiting for a turn.
pub struct Gate {
    workers: usize,
    lanes: Mutex<Lanes>,
    /// Reconciles a parked Queue when its turn comes.
    wake: UnboundedSender<ObjectRef<Queue>>,
}

/// A turn of one account: its reconcile is counted in flight until this is dropped.
pub struct Turn<'a> {
    gate: &'a Gate,
    budget: Budget,
}

impl Gate {
    /// A gate for `workers` reconcile workers, waking parked Queues through `wake`. `0` is
    /// kube-runtime's "no limit": no worker to share, every reconcile starts.
    pub fn new(workers: u16, wake: UnboundedSender<ObjectRef<Queue>>) -> Self {
        let workers = if workers == 0 { usize::MAX } else { usize::from(workers) };
        Gate { workers, lanes: Mutex::default(), wake }
    }

    /// A turn for `queue`, whose calls spend `budget`; `None`: parked until its account may start
    /// again.
    pub fn enter(&self, budget: &Budget, queue: ObjectRef<Queue>) -> Option<Turn<'_>> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if lanes.admits(self.workers, budget) {
            *lanes.in_flight.entry(budget.clone()).or_default() += 1;
            return Some(Turn { gate: self, budget: budget.clone() });
        }
        let (order, parked) = lanes.parked.entry(budget.clone()).or_default();
        if parked.insert(queue.clone()) {
            order.push_back(queue);
        }
        None
    }

    /// Reconciles in flight and Queues parked, of `budget`.
    pub fn load(&self, budget: &Budget) -> (usize, usize) {
        let lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let parked = lanes.parked.get(budget).map_or(0, |p| p.0.len());
        (lanes.in_flight.get(budget).copied().unwrap_or(0), parked)
    }

    fn leave(&self, budget: &Budget) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = lanes.in_flight.get_mut(budget) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                lanes.in_flight.remove(budget);
            }
        }
        // One Queue of each account that may start now: more wakes than free workers only
        // park the extra ones again.
        let waiting: Vec<Budget> = lanes.parked.keys().cloned().collect();
        for b in waiting {
            if !lanes.admits(self.workers, &b) {
                continue;
            }
            let Some((order, parked)) = lanes.parked.get_mut(&b) else { continue };
            if let Some(queue) = order.pop_front() {
                parked.remove(&queue);
                let _ = self.wake.unbounded_send(queue);
            }
            if order.is_empty() {
                lanes.parked.remove(&b);
            }
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.gate.leave(&self.budget);
    }
}

#[cfg(test)]
mod tests {
    use futures::channel::mpsc::unbounded;

    use super::*;

    #[test]
    fn an_account_alone_keeps_one_worker_free_for_others() {
        assert!(admits(8, 1, 0, 0));
        assert!(admits(8, 1, 6, 6));
        assert!(!admits(8, 1, 7, 7), "the last worker stays free");
        assert!(admits(1, 1, 0, 0), "one worker: whoever has none in flight");
        assert!(!admits(1, 1, 1, 1));
    }

    #[test]
    fn without_a_worker_limit_every_reconcile_starts() {
        let (tx, _rx) = unbounded();
        let gate = Gate::new(0, tx);
        let b = budget("000000000002");
        let turns: Vec<_> =
            (0..100).filter_map(|i| gate.enter(&b, ObjectRef::new(&format!("q{i}")).within("ns"))).collect();
        assert_eq!(turns.len(), 100);
    }

    #[test]
    fn an_account_with_nothing_in_flight_always_starts() {
        assert!(admits(8, 2, 0, 7), "the slow account holds 7: the other takes the 8th");
        assert!(admits(8, 10, 0, 7));
    }

    #[test]
    fn busy_accounts_converge_to_their_share() {
        // Two accounts, 8 workers: each may have 4; above that only while a worker stays free.
        assert!(admits(8, 2, 3, 7), "below its share");
        assert!(!admits(8, 2, 4, 7), "at its share, the last free worker is the other's");
        assert!(admits(8, 2, 4, 5), "at its share, borrowing while two are free");
        assert!(!admits(8, 2, 6, 7));
    }

    fn budget(account: &str) -> Budget {
        (account.to_string(), "eu-west-1".to_string())
    }

    #[test]
    fn a_parked_queue_is_woken_when_its_account_may_start_again() {
        let (tx, mut rx) = unbounded();
        let gate = Gate::new(4, tx);
        let (slow, fast) = (budget("000000000002"), budget("000000000003"));
        let q = |n: &str| ObjectRef::<Queue>::new(n).within("ns");
        let mut held: Vec<_> = (0..3).map(|i| gate.enter(&slow, q(&format!("s{i}"))).expect("a turn")).collect();
        assert!(gate.enter(&slow, q("s3")).is_none(), "the fourth worker stays free");
        assert!(gate.enter(&slow, q("s3")).is_none(), "parked once");
        assert_eq!(gate.load(&slow), (3, 1));
        let other = gate.enter(&fast, q("f0")).expect("another account starts at once");
        held.pop();
        assert!(rx.try_recv().is_err(), "above its share while the other account works: not woken");
        drop(other);
        assert_eq!(rx.try_recv().ok(), Some(q("s3")), "alone again: its turn");
        assert_eq!(gate.load(&slow), (2, 0));
        drop(held);
        assert_eq!(gate.load(&slow), (0, 0));
    }
}

//! The governor's budget, checked from outside: samples of the limiter's call counter, and the
//! largest excess over `burst + rate × t` in any window between two samples.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use providers::QueueBackend;
use tokio::sync::oneshot;

use crate::harness::Bench;
use crate::stats::secs;

/// Samples the limiter's call total every 20 ms.
pub(crate) struct Sampler {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub(crate) fn start(sqs: Arc<dyn QueueBackend>) -> Self {
        let samples: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
        let (tx, mut rx) = oneshot::channel();
        let s = samples.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let total = sqs.limiter().counters.total();
                        s.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), total));
                    }
                    _ = &mut rx => break,
                }
            }
        });
        Sampler { samples, stop: Some(tx), task }
    }

    pub(crate) async fn finish(mut self) -> Vec<(Instant, u64)> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The governor's promise: in any window of length t at most `burst + rate × t` calls start.
pub(crate) struct Budget {
    calls: u64,
    window: Duration,
    /// Largest (calls in a window − budget of that window) over all sampled windows; ≤ 0 when
    /// the budget held (sampling adds up to one call of slack).
    max_excess: f64,
    /// Most calls in any window of about one second.
    peak_1s: u64,
}

pub(crate) fn budget(samples: &[(Instant, u64)], rate: f64, burst: f64) -> Budget {
    let mut max_excess = f64::NEG_INFINITY;
    let mut peak_1s = 0;
    for (i, (ti, ci)) in samples.iter().enumerate() {
        for (tj, cj) in &samples[i + 1..] {
            let t = secs(*tj - *ti);
            let calls = (cj - ci) as f64;
            max_excess = max_excess.max(calls - (burst + rate * t));
            if t <= 1.0 {
                peak_1s = peak_1s.max(cj - ci);
            }
        }
    }
    let (first, last) = (samples.first().copied(), samples.last().copied());
    let (calls, window) = match (first, last) {
        (Some(f), Some(l)) => (l.1 - f.1, l.0 - f.0),
        _ => (0, Duration::ZERO),
    };
    Budget { calls, window, max_excess, peak_1s }
}

impl Bench {
    pub(crate) fn print_budget(&self, b: &Budget, rate: u32, burst: u32) {
        let avg = b.calls as f64 / secs(b.window).max(1e-9);
        println!(
            "   governor budget {rate}/s + burst {burst}: {} calls in {:.1} s = {:.1}/s; peak in any 1 s: {} (budget {}); largest excess over rate x t + burst in any window: {:+.1} calls -> {}",
            b.calls,
            secs(b.window),
            avg,
            b.peak_1s,
            rate + burst,
            b.max_excess,
            if b.max_excess <= 1.0 { "never exceeded" } else { "EXCEEDED" }
        );
        if b.max_excess > 1.0 {
            self.fail(format!("SQS calls exceeded the governor budget by {:.1}", b.max_excess));
        }
    }
}

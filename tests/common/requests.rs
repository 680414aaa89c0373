//! A steady stream of requests to a Tunnel's address, for what a user sees during a failover or a
//! roll: which requests were answered and how long the longest silence was.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::kubelet::tcp_echo;

/// Sends a request (a fresh TCP connection, `ping` echoed) to `ip:port` every 100 ms, each given
/// 1 s (or the patience given); records when each answered one was sent. Stops when dropped.
pub struct Requests {
    answered: Arc<Mutex<Vec<Instant>>>,
    sent: Arc<Mutex<Vec<Instant>>>,
    patience: Duration,
    task: tokio::task::JoinHandle<()>,
}

/// How long each request may take: a user's patience, for the figures.
const PATIENCE: Duration = Duration::from_secs(1);

impl Requests {
    pub fn start(ip: String, port: u16) -> Self {
        Self::with_patience(ip, port, PATIENCE)
    }

    /// Each request given `patience`: for tests that ask whether every request is answered at
    /// all, on a machine whose load can make one slower than a user would wait.
    pub fn with_patience(ip: String, port: u16, patience: Duration) -> Self {
        let answered = Arc::new(Mutex::new(Vec::new()));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let (log, sends) = (answered.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let (ip, log) = (ip.clone(), log.clone());
                let at = Instant::now();
                sends.lock().unwrap().push(at);
                tokio::spawn(async move {
                    let answer = tokio::time::timeout(patience, tcp_echo(&ip, port, b"ping")).await;
                    if matches!(answer, Ok(Some((_, echoed))) if echoed == b"ping") {
                        log.lock().unwrap().push(at);
                    }
                });
            }
        });
        Requests { answered, sent, patience, task }
    }

    /// The longest time between two answered requests (by when they were sent).
    pub fn longest_gap(&self) -> Duration {
        let mut times = self.answered.lock().unwrap().clone();
        times.sort();
        times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
    }

    /// When the last answered request was sent.
    pub fn last_answered(&self) -> Option<Instant> {
        self.answered.lock().unwrap().iter().max().copied()
    }

    /// (answered, sent) of the requests whose answer is due by now: the ones still within their
    /// patience are neither.
    pub fn tally(&self) -> (usize, usize) {
        let due = Instant::now() - self.patience;
        let sent = self.sent.lock().unwrap().iter().filter(|t| **t <= due).count();
        let answered = self.answered.lock().unwrap().iter().filter(|t| **t <= due).count();
        (answered, sent)
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! A watch on one namespace's Queues recording every change of their Ready condition: when all
//! are Ready (time to Ready) and when one went un-Ready and back (drift).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use skyport::crd::{ConditionStatus, Queue};
use tokio::sync::oneshot;

use crate::common;

type Transitions = HashMap<String, Vec<(Instant, ConditionStatus, String)>>;

/// Records, per Queue, every change of its Ready condition with the time it was seen.
pub(crate) struct ReadyWatch {
    transitions: Arc<Mutex<Transitions>>,
    ready: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    /// Starts watching and returns once the initial list is in.
    pub(crate) async fn start(api: Api<Queue>) -> anyhow::Result<Self> {
        let transitions: Arc<Mutex<Transitions>> = Arc::default();
        let (ready_tx, ready) = tokio::sync::watch::channel(0usize);
        let (synced_tx, synced_rx) = oneshot::channel();
        let t = transitions.clone();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
            let mut ready_names = 0usize;
            while let Some(event) = stream.next().await {
                let q = match event {
                    Ok(watcher::Event::Apply(q) | watcher::Event::InitApply(q)) => q,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(s) = synced.take() {
                            let _ = s.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let now = Instant::now();
                let Some((status, reason)) = common::ready(&q) else { continue };
                let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
                let history = t.entry(q.name_any()).or_default();
                let was_ready = history.last().is_some_and(|(_, s, _)| *s == ConditionStatus::True);
                if history.last().is_none_or(|(_, s, r)| *s != status || *r != reason) {
                    history.push((now, status, reason));
                }
                let is_ready = status == ConditionStatus::True;
                if is_ready != was_ready {
                    ready_names = if is_ready { ready_names + 1 } else { ready_names - 1 };
                    let _ = ready_tx.send(ready_names);
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), synced_rx)
            .await
            .context("the benchmark's Queue watch did not sync in 60 s")?
            .context("the benchmark's Queue watch ended")?;
        Ok(ReadyWatch { transitions, ready, task })
    }

    /// Waits until `n` Queues are Ready; returns when the last of them was first seen Ready.
    pub(crate) async fn all_ready(&mut self, n: usize, timeout: Duration) -> anyhow::Result<Instant> {
        let reached = tokio::time::timeout(timeout, self.ready.wait_for(|c| *c >= n)).await.is_ok_and(|r| r.is_ok());
        if !reached {
            bail!("only {} of {n} Queues Ready after {timeout:?}", *self.ready.borrow());
        }
        let t = self.transitions.lock().unwrap_or_else(|p| p.into_inner());
        t.values()
            .filter_map(|h| h.iter().find(|(_, s, _)| *s == ConditionStatus::True).map(|(at, _, _)| *at))
            .max()
            .ok_or_else(|| anyhow!("no Ready Queue"))
    }

    pub(crate) fn history(&self, name: &str) -> Vec<(Instant, ConditionStatus, String)> {
        self.transitions.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned().unwrap_or_default()
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

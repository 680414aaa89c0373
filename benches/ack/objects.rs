//! Queue objects of either kind (skyport's and ACK's CRD) as untyped objects, what Ready means
//! for each, and a watch recording when each Queue was first Ready.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::operators::Kind;

pub(crate) fn resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::Skyport | Kind::Floor => {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("skyport.dev", "v1alpha1", "Queue"), "queues")
        }
        Kind::Ack => ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("sqs.services.k8s.aws", "v1alpha1", "Queue"),
            "queues",
        ),
    }
}

/// The same queue for both: visibility 45 s, retention 1 h, one user tag. skyport names the SQS
/// queue `<namespace>_<name>`; ACK's is given the same name.
pub(crate) fn object(kind: Kind, ar: &ApiResource, ns: &str, name: &str) -> DynamicObject {
    let spec = match kind {
        Kind::Skyport | Kind::Floor => {
            json!({"visibilityTimeoutSeconds": 45, "messageRetentionSeconds": 3600, "tags": {"bench": "queues"}})
        }
        Kind::Ack => json!({"queueName": format!("{ns}_{name}"), "visibilityTimeout": "45",
                             "messageRetentionPeriod": "3600", "tags": {"bench": "queues"}}),
    };
    DynamicObject::new(name, ar).within(ns).data(json!({ "spec": spec }))
}

fn condition_true(o: &DynamicObject, type_: &str) -> bool {
    o.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

fn is_ready(kind: Kind, o: &DynamicObject) -> bool {
    match kind {
        Kind::Skyport | Kind::Floor => condition_true(o, "Ready"),
        Kind::Ack => {
            condition_true(o, "ACK.ResourceSynced")
                && o.data["status"]["queueURL"].as_str().is_some_and(|u| !u.is_empty())
        }
    }
}

/// Watches one namespace's Queues and records when each was first seen Ready.
pub(crate) struct ReadyWatch {
    first_ready: Arc<Mutex<HashMap<String, Instant>>>,
    count: tokio::sync::watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    pub(crate) async fn start(api: Api<DynamicObject>, kind: Kind) -> anyhow::Result<Self> {
        let first_ready: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let (tx, count) = tokio::sync::watch::channel(0usize);
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let fr = first_ready.clone();
        let task = tokio::spawn(async move {
            let mut synced = Some(synced_tx);
            let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let o = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(s) = synced.take() {
                            let _ = s.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                if is_ready(kind, &o) {
                    let mut m = fr.lock().unwrap_or_else(|p| p.into_inner());
                    m.entry(o.name_any()).or_insert_with(Instant::now);
                    let _ = tx.send(m.len());
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), synced_rx).await.context("watch did not sync")??;
        Ok(ReadyWatch { first_ready, count, task })
    }

    /// When the last of `n` Queues was first seen Ready.
    pub(crate) async fn all_ready(&mut self, n: usize, timeout: Duration) -> anyhow::Result<Instant> {
        if tokio::time::timeout(timeout, self.count.wait_for(|c| *c >= n)).await.is_err() {
            bail!("only {} of {n} Queues Ready after {timeout:?}", *self.count.borrow());
        }
        let m = self.first_ready.lock().unwrap_or_else(|p| p.into_inner());
        m.values().max().copied().ok_or_else(|| anyhow!("no Ready Queue"))
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

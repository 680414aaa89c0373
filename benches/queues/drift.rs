//! Scenario 3, drift repair: queues changed and deleted behind skyport's back, and how long until
//! they are as the spec says again. Runs inside the steady state, on its Queues.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, ListParams};
use skyport::config::QueueArgs;
use skyport::crd::{ConditionStatus, Queue};

use crate::common;
use crate::harness::{Bench, SPEC_VISIBILITY};
use crate::options::Opts;
use crate::ready_watch::ReadyWatch;
use crate::stats::{median, percentile, secs};

impl Bench {
    /// Attribute drift (SetQueueAttributes behind skyport's back) and deletion drift
    /// (DeleteQueue), each on `drift_k` Queues. Deletions go first, because SQS refuses to
    /// recreate a name for 60 s: the attribute rounds run while that wait is on.
    pub(crate) async fn drift(&self, o: &Opts, ns: &str, watch: &ReadyWatch) -> anyhow::Result<()> {
        let k = o.drift_k.min(o.steady_n / 2).max(1);
        let queues: Api<Queue> = Api::namespaced(self.driver.clone(), ns);
        let urls: BTreeMap<String, String> = queues
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|q| Some((q.name_any(), q.status?.queue_url?)))
            .collect();
        let names: Vec<String> = urls.keys().cloned().collect();
        let (deleted, changed) = (&names[..k], &names[k..2 * k]);
        let retry = QueueArgs::default().recently_deleted_retry;
        println!(
            "\n== 3. drift repair: {k} queues deleted and {} changed out of band, resync {:?}",
            changed.len(),
            o.resync
        );

        // Deletion.
        let t_del = Instant::now();
        futures::future::try_join_all(deleted.iter().map(|n| self.oob.delete_queue().queue_url(&urls[n]).send()))
            .await?;
        let del_polls = futures::future::join_all(deleted.iter().map(|n| {
            let sqs_name = format!("{ns}_{n}");
            async move {
                let deadline = t_del + Duration::from_secs(300) + o.resync * 2;
                loop {
                    if common::queue_exists(&self.oob, &sqs_name).await {
                        return Some(Instant::now());
                    }
                    if Instant::now() > deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }));
        let attr_rounds = async {
            let mut latencies = vec![];
            for round in 0..2 {
                if round > 0 {
                    // Start the second round at another phase of the resync cycle.
                    tokio::time::sleep(o.resync.mul_f64(0.37)).await;
                }
                let results = futures::future::join_all(changed.iter().map(|n| async {
                    let url = &urls[n];
                    self.oob
                        .set_queue_attributes()
                        .queue_url(url)
                        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "7")
                        .send()
                        .await
                        .ok()?;
                    let t = Instant::now();
                    let deadline = t + o.resync * 3 + Duration::from_secs(60);
                    loop {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if visibility(&self.oob, url).await.as_deref() == Some(SPEC_VISIBILITY) {
                            return Some(Instant::now() - t);
                        }
                        if Instant::now() > deadline {
                            return None;
                        }
                    }
                }))
                .await;
                latencies.extend(results);
            }
            latencies
        };
        let (del_back, attr) = tokio::join!(del_polls, attr_rounds);

        let r = secs(o.resync);
        let attr_ok: Vec<f64> = attr.iter().flatten().map(|d| secs(*d)).collect();
        if attr_ok.len() < attr.len() {
            self.fail(format!("{} attribute changes were never reverted", attr.len() - attr_ok.len()));
        }
        let max = percentile(&attr_ok, 1.0);
        println!(
            "   attribute drift ({} samples, 2 rounds): repaired after median {:.2} s, p90 {:.2} s, max {:.2} s = {:.2} x resync -> target <= 1.10 x resync: {}",
            attr_ok.len(),
            median(&attr_ok),
            percentile(&attr_ok, 0.9),
            max,
            max / r,
            if max <= 1.1 * r { "met" } else { "MISSED" }
        );

        let mut detect = vec![];
        let mut ready_again = vec![];
        let mut exists = vec![];
        for (n, back) in deleted.iter().zip(&del_back) {
            let h = watch.history(n);
            let after: Vec<_> = h.into_iter().filter(|(t, _, _)| *t >= t_del).collect();
            if let Some((t, _, _)) = after.iter().find(|(_, s, _)| *s == ConditionStatus::False) {
                detect.push(secs(*t - t_del));
                if let Some((t2, _, _)) = after.iter().find(|(t2, s, _)| t2 > t && *s == ConditionStatus::True) {
                    ready_again.push(secs(*t2 - t_del));
                }
            }
            match back {
                Some(t) => exists.push(secs(*t - t_del)),
                None => self.fail(format!("deleted queue of {n} never came back")),
            }
        }
        println!(
            "   deletion ({} queues): noticed (Ready=False, RecentlyDeleted) after median {:.2} s, max {:.2} s = {:.2} x resync",
            deleted.len(),
            median(&detect),
            percentile(&detect, 1.0),
            percentile(&detect, 1.0) / r
        );
        println!(
            "   queue exists again after median {:.1} s, max {:.1} s; Ready again after median {:.1} s, max {:.1} s",
            median(&exists),
            percentile(&exists, 1.0),
            median(&ready_again),
            percentile(&ready_again, 1.0)
        );
        println!(
            "   (SQS refuses the name for 60 s after a deletion; skyport retries every {:?}, so the floor is 60 s and the expected worst case 60 s + {:?} + a resync; beyond the 60 s: median {:.1} s, max {:.1} s)",
            retry,
            retry,
            median(&exists) - 60.0,
            percentile(&exists, 1.0) - 60.0
        );
        Ok(())
    }
}

/// The queue's VisibilityTimeout, read behind skyport's back; `None` on any error.
async fn visibility(oob: &aws_sdk_sqs::Client, url: &str) -> Option<String> {
    let out = oob
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
        .send()
        .await
        .ok()?;
    out.attributes?.get(&aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout).cloned()
}

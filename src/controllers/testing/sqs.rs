//! An in-memory SQS with failure injection, counting calls.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Mutex;

use async_trait::async_trait;
use providers::sqs::{Attributes, Tags};
use providers::{Limiter, QueueBackend, QueueError};

#[derive(Default)]
struct Queues {
    /// name → (attributes, tags)
    by_name: BTreeMap<String, (Attributes, Tags)>,
    /// Calls by operation name, in order.
    calls: Vec<&'static str>,
    /// Operation → the error its next call returns.
    failures: BTreeMap<&'static str, QueueError>,
    /// Operation → what happens elsewhere while its next call is under way.
    meanwhile: BTreeMap<&'static str, Box<dyn FnOnce() + Send>>,
}

pub struct FakeSqs {
    queues: Mutex<Queues>,
    limiter: Limiter,
}

impl Default for FakeSqs {
    fn default() -> Self {
        let n = NonZeroU32::new(1000).expect("non-zero");
        FakeSqs::with_limiter(Limiter::new(n, n))
    }
}

pub const URL_PREFIX: &str = "https://sqs.fake/000000000000/";

fn name_of(url: &str) -> &str {
    url.strip_prefix(URL_PREFIX).unwrap_or(url)
}

impl FakeSqs {
    /// A fake SQS behind `limiter` (the controller paces its resyncs by its client's budget).
    pub fn with_limiter(limiter: Limiter) -> Self {
        FakeSqs { queues: Mutex::default(), limiter }
    }

    fn call(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Queues>, QueueError> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        q.calls.push(op);
        if let Some(happen) = q.meanwhile.remove(op) {
            happen();
        }
        match q.failures.remove(op) {
            Some(e) => Err(e),
            None => Ok(q),
        }
    }

    /// The next call of `op` (`"create_queue"`, `"delete_queue"`, …) fails with `error`.
    pub fn fail_next(&self, op: &'static str, error: QueueError) {
        self.queues.lock().unwrap().failures.insert(op, error);
    }

    /// While the next call of `op` is under way, `happen` runs (another actor's write).
    pub fn meanwhile(&self, op: &'static str, happen: impl FnOnce() + Send + 'static) {
        self.queues.lock().unwrap().meanwhile.insert(op, Box::new(happen));
    }

    pub fn calls(&self) -> Vec<&'static str> {
        self.queues.lock().unwrap().calls.clone()
    }

    pub fn exists(&self, name: &str) -> bool {
        self.queues.lock().unwrap().by_name.contains_key(name)
    }

    /// The tags of the queue `name` (empty when there is none).
    pub fn tags_of(&self, name: &str) -> Tags {
        self.queues.lock().unwrap().by_name.get(name).map(|(_, t)| t.clone()).unwrap_or_default()
    }

    /// Adds a queue as if made outside skyport.
    pub fn insert(&self, name: &str, tags: Tags) {
        let attributes = Attributes::from([
            ("QueueArn".to_string(), format!("arn:aws:sqs:fake:000000000000:{name}")),
            ("CreatedTimestamp".to_string(), "1700000000".to_string()),
        ]);
        self.queues.lock().unwrap().by_name.insert(name.to_string(), (attributes, tags));
    }
}

#[async_trait]
impl QueueBackend for FakeSqs {
    async fn queue_url(&self, name: &str) -> Result<Option<String>, QueueError> {
        let q = self.call("queue_url")?;
        Ok(q.by_name.contains_key(name).then(|| format!("{URL_PREFIX}{name}")))
    }
    async fn create_queue(&self, name: &str, attributes: &Attributes, tags: &Tags) -> Result<String, QueueError> {
        let mut q = self.call("create_queue")?;
        let mut attributes = attributes.clone();
        attributes.insert("QueueArn".into(), format!("arn:aws:sqs:fake:000000000000:{name}"));
        // SQS stamps every queue; skyport compares it to notice a queue recreated under its name.
        attributes.insert("CreatedTimestamp".into(), "1700000001".into());
        q.by_name.entry(name.to_string()).or_insert((attributes, tags.clone()));
        Ok(format!("{URL_PREFIX}{name}"))
    }
    async fn attributes(&self, url: &str) -> Result<Option<Attributes>, QueueError> {
        let q = self.call("attributes")?;
        Ok(q.by_name.get(name_of(url)).map(|(a, _)| a.clone()))
    }
    async fn set_attributes(&self, url: &str, attributes: &Attributes) -> Result<(), QueueError> {
        let mut q = self.call("set_attributes")?;
        let (a, _) = q.by_name.get_mut(name_of(url)).ok_or(QueueError::NotFound)?;
        a.extend(attributes.clone());
        Ok(())
    }
    async fn tags(&self, url: &str) -> Result<Tags, QueueError> {
        let q = self.call("tags")?;
        q.by_name.get(name_of(url)).map(|(_, t)| t.clone()).ok_or(QueueError::NotFound)
    }
    async fn tag(&self, url: &str, tags: &Tags) -> Result<(), QueueError> {
        let mut q = self.call("tag")?;
        let (_, t) = q.by_name.get_mut(name_of(url)).ok_or(QueueError::NotFound)?;
        t.extend(tags.clone());
        Ok(())
    }
    async fn untag(&self, url: &str, keys: &[String]) -> Result<(), QueueError> {
        let mut q = self.call("untag")?;
        let (_, t) = q.by_name.get_mut(name_of(url)).ok_or(QueueError::NotFound)?;
        t.retain(|k, _| !keys.contains(k));
        Ok(())
    }
    async fn delete_queue(&self, url: &str) -> Result<(), QueueError> {
        let mut q = self.call("delete_queue")?;
        q.by_name.remove(name_of(url));
        Ok(())
    }
    fn limiter(&self) -> &Limiter {
        &self.limiter
    }
    /// Unknown, as for an endpoint without a region: ARNs are read from the attributes.
    fn region(&self) -> Option<String> {
        None
    }
}

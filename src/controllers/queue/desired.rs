//! From a Queue's spec to the SQS name, attributes and tags it asks for (pure).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use providers::sqs::{Attributes, Tags};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::controllers::owned;
use crate::crd::queue::{DeduplicationScope, FifoThroughputLimit, Queue, QueueSpec, RedrivePermission};
use crate::error::Result;

pub const TAG_MANAGED_BY: &str = "skyport.dev/managed-by";
pub const TAG_OWNER_UID: &str = "skyport.dev/owner-uid";
pub const TAG_OWNER_NAMESPACE: &str = "skyport.dev/owner-namespace";
pub const TAG_OWNER_NAME: &str = "skyport.dev/owner-name";
/// The cluster of the owning Queue: clusters sharing an AWS account never take each other's
/// queues, even between namespaces of the same name.
pub const TAG_CLUSTER: &str = "skyport.dev/cluster";
/// `true` on a queue that existed before skyport took it over. Written in the same TagQueue call
/// as the owner tag, so a queue skyport claimed is never without it, whatever interrupts the
/// adoption: what the spec does not declare stays, and the queue is kept on delete by default.
pub const TAG_ADOPTED: &str = "skyport.dev/adopted";

/// SQS's limit on queue names, `.fifo` included.
pub const MAX_QUEUE_NAME: usize = 80;

/// The SQS queue name for a Queue: `spec.queueName`, else the name already recorded in
/// `status.queueName` (Queues made under the old `<namespace>-<name>` default keep their
/// queue), else [`default_queue_name`].
pub fn queue_name(namespace: &str, name: &str, spec: &QueueSpec, recorded: Option<&str>) -> String {
    match (&spec.queue_name, recorded) {
        (Some(n), _) => n.clone(),
        (None, Some(r)) if !r.is_empty() => r.to_string(),
        _ => default_queue_name(namespace, name, spec.fifo),
    }
}

/// `<namespace>_<name>` made valid for SQS.
///
/// Namespaces are DNS labels (`[a-z0-9-]`), so the first `_` always ends the namespace: no two
/// Queues share a default (with `-` as separator, `team`/`a-orders` and `team-a`/`orders` did).
/// Object names may contain `.`, which SQS does not allow; it becomes `_`, which object names
/// cannot contain, so that mapping is one-to-one too. A name that is too long is cut and
/// suffixed with a hash of the full `namespace/name`, so the result is stable and distinct.
pub fn default_queue_name(namespace: &str, name: &str, fifo: bool) -> String {
    let suffix = if fifo { ".fifo" } else { "" };
    let base: String = format!("{namespace}_{name}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    let room = MAX_QUEUE_NAME - suffix.len();
    if base.len() <= room {
        return format!("{base}{suffix}");
    }
    let hash = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hex: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}-{hex}{suffix}", &base[..room - hex.len() - 1])
}

/// What the spec asks of SQS. `attributes` holds only managed attributes; an empty string means
/// "must be absent" (a removed policy).
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    pub name: String,
    pub attributes: Attributes,
    pub tags: Tags,
}

impl Desired {
    /// Attributes for CreateQueue: the managed ones that have a value, plus the immutable kind.
    pub fn create_attributes(&self, fifo: bool) -> Attributes {
        let mut attrs: Attributes =
            self.attributes.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect();
        if fifo {
            attrs.insert("FifoQueue".into(), "true".into());
        }
        attrs
    }
}

/// The identity of the Queue object, written into tags so every queue skyport creates can be
/// traced back to its owner (and found for clean-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// This cluster's id (`--cluster-id`); empty: not tagged.
    pub cluster: &'a str,
    /// `status.queueName`, the name this Queue's queue was given before.
    pub recorded_name: Option<&'a str>,
}

/// Builds the desired state. `dead_letter_arn` is the resolved ARN of `spec.deadLetter`
/// (from queueRef or targetArn); `None` when the spec has no dead-letter target.
pub fn desired(spec: &QueueSpec, owner: &Owner<'_>, dead_letter_arn: Option<&str>) -> Desired {
    let mut a = BTreeMap::new();
    let mut int = |key: &str, v: Option<i32>| {
        if let Some(v) = v {
            a.insert(key.to_string(), v.to_string());
        }
    };
    int("VisibilityTimeout", spec.visibility_timeout_seconds);
    int("MessageRetentionPeriod", spec.message_retention_seconds);
    int("DelaySeconds", spec.delay_seconds);
    int("MaximumMessageSize", spec.maximum_message_size_bytes);
    int("ReceiveMessageWaitTimeSeconds", spec.receive_wait_time_seconds);
    int("KmsDataKeyReusePeriodSeconds", spec.kms_data_key_reuse_period_seconds);
    if let Some(v) = spec.content_based_deduplication {
        a.insert("ContentBasedDeduplication".into(), v.to_string());
    }
    if let Some(v) = spec.deduplication_scope {
        let s = match v {
            DeduplicationScope::Queue => "queue",
            DeduplicationScope::MessageGroup => "messageGroup",
        };
        a.insert("DeduplicationScope".into(), s.into());
    }
    if let Some(v) = spec.fifo_throughput_limit {
        let s = match v {
            FifoThroughputLimit::PerQueue => "perQueue",
            FifoThroughputLimit::PerMessageGroupId => "perMessageGroupId",
        };
        a.insert("FifoThroughputLimit".into(), s.into());
    }
    if let Some(v) = spec.sqs_managed_encryption {
        a.insert("SqsManagedSseEnabled".into(), v.to_string());
    }
    if let Some(v) = &spec.kms_key_id {
        a.insert("KmsMasterKeyId".into(), v.to_string());
    }
    let redrive = match (&spec.dead_letter, dead_letter_arn) {
        (Some(dl), Some(arn)) => {
            json!({"deadLetterTargetArn": arn, "maxReceiveCount": dl.max_receive_count}).to_string()
        }
        _ => String::new(),
    };
    a.insert("RedrivePolicy".into(), redrive);
    let allow = match &spec.redrive_allow_policy {
        Some(p) => {
            let permission = match p.redrive_permission {
                RedrivePermission::AllowAll => "allowAll",
                RedrivePermission::DenyAll => "denyAll",
                RedrivePermission::ByQueue => "byQueue",
            };
            let mut doc = json!({ "redrivePermission": permission });
            if let Some(arns) = &p.source_queue_arns {
                doc["sourceQueueArns"] = json!(arns);
            }
            doc.to_string()
        }
        None => String::new(),
    };
    a.insert("RedriveAllowPolicy".into(), allow);
    a.insert("Policy".into(), spec.policy.as_ref().map(|p| p.to_string()).unwrap_or_default());

    let mut tags: Tags = spec.tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    tags.insert(TAG_MANAGED_BY.into(), "skyport".into());
    tags.insert(TAG_OWNER_UID.into(), owner.uid.into());
    tags.insert(TAG_OWNER_NAMESPACE.into(), owner.namespace.into());
    tags.insert(TAG_OWNER_NAME.into(), owner.name.into());
    if !owner.cluster.is_empty() {
        tags.insert(TAG_CLUSTER.into(), owner.cluster.into());
    }

    Desired { name: queue_name(owner.namespace, owner.name, spec, owner.recorded_name), attributes: a, tags }
}

/// The ARN of the queue at `url` in `region`, as SQS reports it in `QueueArn`
/// (`arn:<partition>:sqs:<region>:<account>:<name>`), from the URL's `/<account>/<name>` path.
/// `None` when the URL does not have that shape (then the ARN is read from SQS instead).
pub fn queue_arn(url: &str, region: &str) -> Option<String> {
    let mut segments = url.trim_end_matches('/').rsplit('/');
    let name = segments.next()?;
    let account = segments.next()?;
    let valid_name =
        !name.is_empty() && name.len() <= 80 && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) || !valid_name || region.is_empty() {
        return None;
    }
    let partition = if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else if region.starts_with("us-isob-") {
        "aws-iso-b"
    } else if region.starts_with("us-iso-") {
        "aws-iso"
    } else {
        "aws"
    };
    Some(format!("arn:{partition}:sqs:{region}:{account}:{name}"))
}

/// Name of the ConfigMap apps load with `envFrom`.
pub fn configmap_name(queue: &Queue) -> String {
    configmap_name_of(&queue.name_any())
}

/// Name of the ConfigMap of the Queue named `queue`.
pub fn configmap_name_of(queue: &str) -> String {
    format!("{queue}-sqs")
}

/// The ConfigMap publishing the queue's `url`, `arn` and `name`, owned by the Queue.
pub fn configmap(queue: &Queue, url: &str, arn: &str, name: &str) -> Result<ConfigMap> {
    Ok(ConfigMap {
        metadata: owned::meta(queue, &configmap_name(queue), [])?,
        data: Some(BTreeMap::from([
            ("QUEUE_URL".to_string(), url.to_string()),
            ("QUEUE_ARN".to_string(), arn.to_string()),
            ("QUEUE_NAME".to_string(), name.to_string()),
        ])),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::queue::{DeadLetter, LocalQueueRef, RedriveAllowPolicy};

    fn owner() -> Owner<'static> {
        Owner { namespace: "shop", name: "orders", uid: "u-1", cluster: "c-1", recorded_name: None }
    }

    fn name(namespace: &str, name: &str, spec: &QueueSpec) -> String {
        queue_name(namespace, name, spec, None)
    }

    #[test]
    fn default_name_joins_namespace_and_name() {
        assert_eq!(name("shop", "orders", &QueueSpec::default()), "shop_orders");
    }

    #[test]
    fn default_names_of_different_queues_never_collide() {
        let d = QueueSpec::default();
        assert_ne!(name("team", "a-orders", &d), name("team-a", "orders", &d));
        assert_ne!(name("team", "a.orders", &d), name("team-a", "orders", &d));
        assert_ne!(name("team", "a.b", &d), name("team", "a-b", &d));
    }

    #[test]
    fn a_recorded_name_is_kept_and_an_explicit_one_wins() {
        let d = QueueSpec::default();
        assert_eq!(queue_name("shop", "orders", &d, Some("shop-orders")), "shop-orders");
        let explicit = QueueSpec { queue_name: Some("x".into()), ..Default::default() };
        assert_eq!(queue_name("shop", "orders", &explicit, Some("shop-orders")), "x");
    }

    #[test]
    fn default_fifo_name_gets_the_suffix() {
        let spec = QueueSpec { fifo: true, ..Default::default() };
        assert_eq!(name("shop", "orders", &spec), "shop_orders.fifo");
    }

    #[test]
    fn dots_in_kubernetes_names_become_underscores() {
        assert_eq!(name("ab", "c.d", &QueueSpec::default()), "ab_c_d");
    }

    #[test]
    fn long_names_are_cut_to_eighty_with_a_distinguishing_hash() {
        let long = "x".repeat(200);
        let spec = QueueSpec { fifo: true, ..Default::default() };
        let a = name("ns", &long, &spec);
        let b = name("ns", &format!("{long}y"), &spec);
        assert_eq!(a.len(), 80);
        assert!(a.ends_with(".fifo"));
        assert_ne!(a, b, "names differing past the cut stay distinct");
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        assert_eq!(name("ns", &long, &QueueSpec::default()).len(), 80);
    }

    #[test]
    fn explicit_name_wins() {
        let spec = QueueSpec { queue_name: Some("legacy_q".into()), ..Default::default() };
        assert_eq!(name("shop", "orders", &spec), "legacy_q");
    }

    #[test]
    fn unset_scalars_are_unmanaged_and_removed_documents_are_empty() {
        let d = desired(&QueueSpec { visibility_timeout_seconds: Some(45), ..Default::default() }, &owner(), None);
        assert_eq!(d.attributes.get("VisibilityTimeout").map(String::as_str), Some("45"));
        assert!(!d.attributes.contains_key("DelaySeconds"));
        assert_eq!(d.attributes["RedrivePolicy"], "");
        assert_eq!(d.attributes["Policy"], "");
        assert!(!d.create_attributes(false).contains_key("Policy"), "absent documents are not sent at create");
    }

    #[test]
    fn dead_letter_becomes_a_redrive_policy_with_the_resolved_arn() {
        let spec = QueueSpec {
            dead_letter: Some(Box::new(DeadLetter {
                queue_ref: Some(LocalQueueRef { name: "dlq".into() }),
                target_arn: None,
                max_receive_count: 3,
            })),
            ..Default::default()
        };
        let d = desired(&spec, &owner(), Some("arn:aws:sqs:us-east-1:000000000000:shop-dlq"));
        let doc: serde_json::Value = serde_json::from_str(&d.attributes["RedrivePolicy"]).unwrap();
        assert_eq!(doc["deadLetterTargetArn"], "arn:aws:sqs:us-east-1:000000000000:shop-dlq");
        assert_eq!(doc["maxReceiveCount"], 3);
    }

    #[test]
    fn redrive_allow_policy_and_fifo_flag() {
        let spec = QueueSpec {
            fifo: true,
            redrive_allow_policy: Some(Box::new(RedriveAllowPolicy {
                redrive_permission: RedrivePermission::ByQueue,
                source_queue_arns: Some(vec!["arn:aws:sqs:us-east-1:000000000000:a.fifo".into()]),
            })),
            ..Default::default()
        };
        let d = desired(&spec, &owner(), None);
        assert!(d.attributes["RedriveAllowPolicy"].contains("byQueue"));
        assert_eq!(d.create_attributes(true)["FifoQueue"], "true");
    }

    #[test]
    fn skyport_tags_identify_the_owner_and_user_tags_are_kept() {
        let spec = QueueSpec { tags: [("team".to_string(), "shop".to_string())].into(), ..Default::default() };
        let d = desired(&spec, &owner(), None);
        assert_eq!(d.tags[TAG_OWNER_UID], "u-1");
        assert_eq!(d.tags[TAG_OWNER_NAMESPACE], "shop");
        assert_eq!(d.tags[TAG_OWNER_NAME], "orders");
        assert_eq!(d.tags[TAG_CLUSTER], "c-1");
        assert_eq!(d.tags["team"], "shop");
    }

    #[test]
    fn the_arn_follows_from_the_url_and_region() {
        assert_eq!(
            queue_arn("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", "eu-west-1").as_deref(),
            Some("arn:aws:sqs:eu-west-1:123456789012:orders.fifo")
        );
        assert_eq!(
            queue_arn("http://127.0.0.1:4566/000000000000/default-orders", "us-east-1").as_deref(),
            Some("arn:aws:sqs:us-east-1:000000000000:default-orders")
        );
        assert_eq!(
            queue_arn("https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q", "cn-north-1").as_deref(),
            Some("arn:aws-cn:sqs:cn-north-1:123456789012:q")
        );
        assert!(
            queue_arn("https://sqs.us-gov-west-1.amazonaws.com/123456789012/q", "us-gov-west-1")
                .unwrap()
                .starts_with("arn:aws-us-gov:")
        );
        assert_eq!(queue_arn("http://localhost:9324/queue/q", "us-east-1"), None, "not /<account>/<name>");
        assert_eq!(queue_arn("https://sqs.eu-west-1.amazonaws.com/123456789012/q", ""), None);
    }
}

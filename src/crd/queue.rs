//! `Queue`: an AWS SQS queue declared in Kubernetes.
//!
//! Field names and bounds follow the SQS API reference (CreateQueue / SetQueueAttributes). Every
//! rule the API server can check is expressed here as schema or CEL so that mistakes are refused
//! at `kubectl apply` time rather than discovered by the controller.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;
use super::account::AccountRef;
use super::export::{Export, ExportRef};
use super::tags::TagMap;
use compact_str::CompactString;

/// Desired state of an SQS queue.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "skyport.dev",
    version = "v1alpha1",
    kind = "Queue",
    namespaced,
    status = "QueueStatus",
    shortname = "sq",
    category = "skyport",
    doc = "An AWS SQS queue managed by skyport. Apps read its URL and ARN from `status` or from the ConfigMap `<name>-sqs`.",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".status.queueName"}"#,
    printcolumn = r#"{"name":"Account","type":"string","jsonPath":".status.account"}"#,
    printcolumn = r#"{"name":"Region","type":"string","jsonPath":".status.region"}"#,
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".status.queueUrl","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.queueName) || self.queueName.endsWith('.fifo') == self.fifo").message("queueName must end in '.fifo' exactly when fifo is true"),
    validation = Rule::new("has(self.queueName) == has(oldSelf.queueName) && (!has(self.queueName) || self.queueName == oldSelf.queueName)").message("queueName is immutable: create a new Queue to rename"),
    validation = Rule::new("has(self.accountRef) == has(oldSelf.accountRef) && (!has(self.accountRef) || self.accountRef == oldSelf.accountRef)").message("accountRef is immutable: the SQS queue lives in that account; create a new Queue to use another"),
    validation = Rule::new("self.fifo == oldSelf.fifo").message("fifo is immutable: SQS cannot convert between standard and FIFO queues"),
    validation = Rule::new("self.fifo || (!has(self.contentBasedDeduplication) && !has(self.deduplicationScope) && !has(self.fifoThroughputLimit))").message("contentBasedDeduplication, deduplicationScope and fifoThroughputLimit apply only to FIFO queues (set fifo: true)"),
    validation = Rule::new("!has(self.fifoThroughputLimit) || self.fifoThroughputLimit != 'perMessageGroupId' || (has(self.deduplicationScope) && self.deduplicationScope == 'messageGroup')").message("fifoThroughputLimit perMessageGroupId requires deduplicationScope messageGroup (high-throughput FIFO)"),
    validation = Rule::new("!(has(self.sqsManagedEncryption) && self.sqsManagedEncryption && has(self.kmsKeyId))").message("choose one kind of encryption: sqsManagedEncryption or kmsKeyId, not both"),
    validation = Rule::new("!has(self.kmsDataKeyReusePeriodSeconds) || has(self.kmsKeyId)").message("kmsDataKeyReusePeriodSeconds only applies with kmsKeyId"),
    validation = Rule::new("!has(self.managementPolicy) || self.managementPolicy != 'Observe' || !has(self.deletionPolicy) || self.deletionPolicy != 'Delete'").message("managementPolicy Observe never deletes the queue: remove deletionPolicy Delete")
)]
pub struct QueueSpec {
    /// Name of the SQS queue. Optional and immutable. Another namespace's default form
    /// (`<other-namespace>_...`) and names the platform granted only to other namespaces are
    /// refused (QueueNameReserved). Defaults to `<namespace>_<name>` made
    /// valid for SQS (dots become `_`; at most 80 characters of letters, digits, `-` and `_`,
    /// shortened with a hash when too long), plus `.fifo` for FIFO queues. The `_` cannot occur
    /// in a namespace, so two Queues never get the same default (`team`/`a-orders` and
    /// `team-a`/`orders` give `team_a-orders` and `team-a_orders`). Queues created before this
    /// default keep the name recorded in `status.queueName`. A FIFO queue's name must end in
    /// `.fifo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 80), regex(pattern = r"^[A-Za-z0-9_-]+(\.fifo)?$"))]
    pub queue_name: Option<String>,

    /// Create a FIFO queue (exactly-once, ordered per message group). Immutable.
    #[serde(default)]
    pub fifo: bool,

    /// FIFO only: use a SHA-256 hash of the body as the deduplication ID when the sender gives
    /// none. Unset leaves the SQS default (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_based_deduplication: Option<bool>,

    /// FIFO only: whether deduplication happens per `queue` or per `messageGroup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deduplication_scope: Option<DeduplicationScope>,

    /// FIFO only: whether the throughput quota applies `perQueue` or `perMessageGroupId`
    /// (the latter requires deduplicationScope messageGroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fifo_throughput_limit: Option<FifoThroughputLimit>,

    /// Seconds a received message stays invisible to other consumers (0-43200). Unset fields
    /// are not managed: SQS's value at creation (30) stays, and later changes made outside
    /// skyport are left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 43200))]
    pub visibility_timeout_seconds: Option<i32>,

    /// Seconds SQS keeps a message (60-1209600, i.e. 1 minute to 14 days). Unset: not managed
    /// (SQS default 345600, 4 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 1209600))]
    pub message_retention_seconds: Option<i32>,

    /// Seconds every message is delayed before it becomes visible (0-900). Unset: not managed
    /// (SQS default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 900))]
    pub delay_seconds: Option<i32>,

    /// Largest accepted message in bytes (1024-1048576). Unset: not managed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 1048576))]
    pub maximum_message_size_bytes: Option<i32>,

    /// Long-polling wait of ReceiveMessage in seconds (0-20). Unset: not managed (SQS default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 20))]
    pub receive_wait_time_seconds: Option<i32>,

    /// Where messages go after `maxReceiveCount` failed receives (the redrive policy). Removing
    /// this field removes the redrive policy from the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<Box<DeadLetter>>,

    /// Which source queues may use this queue as their dead-letter queue. Removing this field
    /// removes the policy (SQS then allows all queues of the account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive_allow_policy: Option<Box<RedriveAllowPolicy>>,

    /// The queue's access policy, an IAM policy document written as YAML (not a JSON string).
    /// Compared by meaning, not by text. Removing this field removes the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "policy_schema")]
    pub policy: Option<Box<serde_json::Value>>,

    /// Server-side encryption with SQS-owned keys (SSE-SQS). Unset: not managed (SQS enables it
    /// by default). Mutually exclusive with kmsKeyId.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs_managed_encryption: Option<bool>,

    /// KMS key (ID, alias such as `alias/aws/sqs`, or ARN) for SSE-KMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    // A thin pointer: most Queues leave it unset, and the cache keeps every Queue.
    pub kms_key_id: Option<Box<CompactString>>,

    /// Seconds SQS may reuse a KMS data key (60-86400). Only with kmsKeyId.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 86400))]
    pub kms_data_key_reuse_period_seconds: Option<i32>,

    /// Tags on the SQS queue. skyport adds its own `skyport.dev/*` tags (owner UID, namespace,
    /// name, cluster, and `adopted` on an adopted queue) and removes tags that are in neither set.
    /// At most 44: SQS allows 50 tags per queue and skyport's take the rest.
    #[serde(default, skip_serializing_if = "TagMap::is_empty")]
    #[schemars(extend("maxProperties" = 44))]
    #[x_kube(validation = Rule::new("self.all(k, !k.startsWith('skyport.dev/') && !k.startsWith('aws:'))").message("tag keys starting with 'skyport.dev/' are reserved for skyport and 'aws:' for AWS"))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) <= 128 && size(self[k]) <= 256)").message("tag keys are at most 128 characters and values at most 256"))]
    pub tags: TagMap,

    /// What happens to the SQS queue when this Queue is deleted: `Delete` or `Retain`. Unset:
    /// `Delete` for a queue skyport created, `Retain` for an adopted one (`status.adopted`), so
    /// adopting never puts an existing queue at risk unless `Delete` is written here. Either way
    /// only a queue whose owner tag names this Queue is ever deleted, and a Queue with
    /// managementPolicy `Observe` never deletes anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,

    /// Take over an existing SQS queue of the same name that this Queue did not create. Without
    /// it such a queue is never touched and the Queue reports Ready=False, reason AlreadyExists.
    /// Only queues this namespace may take are adopted: one made outside skyport whose name the
    /// platform granted this namespace (`--queue-name-grant`; else AdoptionNotAllowed), or one
    /// whose owner tag names a Queue of this namespace and cluster that no longer exists (a
    /// retained queue; while that Queue exists, OwnedByAnotherQueue). Queues of other namespaces
    /// or clusters are never taken (OwnedByAnotherNamespace, OwnedByAnotherCluster). Adopting
    /// tags the queue `skyport.dev/adopted` first, then writes only the fields this spec sets: an
    /// access policy, redrive settings and tags that the spec does not mention are kept.
    #[serde(default)]
    pub adopt: bool,

    /// `Manage` (default): skyport creates, updates and deletes the queue. `Observe`: skyport
    /// only reads an existing queue of that name and publishes its URL and ARN in `status` and
    /// the ConfigMap; it never writes to SQS and never deletes the queue. A queue owned by a
    /// Queue of another namespace or cluster is not published (OwnedByAnotherNamespace).
    #[serde(default)]
    pub management_policy: ManagementPolicy,

    /// More places for the queue's URL, ARN and name, with the object names and keys the user
    /// chooses (e.g. a Secret `orders` with key `ORDERS_QUEUE_URL`), besides the ConfigMap
    /// `<name>-sqs`. Each object is created and owned by this Queue and deleted when its entry
    /// is removed; an existing object of that name that this Queue does not own is never
    /// written (Ready=False, reason ExportConflict). At most 8, each (kind, name) once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(validation = Rule::new(super::export::UNIQUE_RULE).message("each exports entry needs its own kind and name"))]
    pub exports: Vec<Export>,

    /// `Write` (default): skyport writes the ConfigMap `<name>-sqs` with the queue's `url`, `arn`
    /// and `name`, for apps that load it with `envFrom`. `Skip`: no such ConfigMap (one this
    /// Queue wrote is deleted); apps read `status` or `spec.exports`. Skipping saves the
    /// operator 0.5 to 0.9 KiB of memory per Queue (deploy/README.md, *Sizing*).
    #[serde(default)]
    pub config_map: ConfigMapPolicy,

    /// The AwsAccount (an IAM role to assume, and a region) the SQS queue lives in. Unset: the
    /// operator's own identity and region. An AwsAccount of another namespace (`namespace`
    /// set) must list this namespace in its `allowedNamespaces`. Immutable: a queue is never
    /// moved between accounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_ref: Option<Box<AccountRef>>,
}

/// How much of the SQS queue skyport may change.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ManagementPolicy {
    /// Create, update and delete the queue.
    #[default]
    Manage,
    /// Read only: publish an existing queue's URL and ARN, never write to or delete it.
    Observe,
}

/// Whether skyport writes the Queue's own ConfigMap `<name>-sqs`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ConfigMapPolicy {
    /// Write `<name>-sqs` with the queue's `url`, `arn` and `name`.
    #[default]
    Write,
    /// Write no `<name>-sqs`, and delete the one this Queue wrote.
    Skip,
}

/// Rules on the whole object (they need `metadata.name`), as (CEL rule, message); added to the
/// CRD's root schema by [`super::all`].
pub const ROOT_RULES: &[(&str, &str)] = &[
    (
        "size(self.metadata.name) <= 249",
        "a Queue's name is at most 249 characters: its ConfigMap is named <name>-sqs and Kubernetes names are at most 253",
    ),
    (
        "!has(self.spec.deadLetter) || !has(self.spec.deadLetter.queueRef) || self.spec.deadLetter.queueRef.name != self.metadata.name",
        "deadLetter.queueRef names this Queue itself: point it at another Queue (SQS moves failed messages to a different queue)",
    ),
    (
        super::export::NOT_DEFAULT_RULE,
        "an export cannot be the ConfigMap <name>-sqs, which skyport always writes: choose another name",
    ),
];

/// The largest access policy SQS accepts, in bytes (Amazon SQS policy quotas).
pub const MAX_POLICY_BYTES: usize = 8192;

impl QueueSpec {
    /// What the API server cannot check before SQS does (CEL cannot measure a free-form object):
    /// the message says what to do.
    pub fn problem(&self) -> Option<String> {
        let bytes = self.policy.as_ref().map(|p| p.to_string().len()).unwrap_or_default();
        (bytes > MAX_POLICY_BYTES).then(|| {
            format!(
                "spec.policy is {bytes} bytes as JSON and SQS accepts at most {MAX_POLICY_BYTES}: shorten it (fewer statements, wildcards in Resource) or split the access between queues"
            )
        })
    }
}

fn policy_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "The queue's access policy, an IAM policy document written as YAML (not a JSON string). Compared by meaning, not by text. Removing this field removes the policy.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// FIFO deduplication scope.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeduplicationScope {
    #[serde(rename = "queue")]
    Queue,
    #[serde(rename = "messageGroup")]
    MessageGroup,
}

/// FIFO throughput quota scope.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FifoThroughputLimit {
    #[serde(rename = "perQueue")]
    PerQueue,
    #[serde(rename = "perMessageGroupId")]
    PerMessageGroupId,
}

/// What deleting the Queue does to the SQS queue.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete the SQS queue (only if its owner tag names this Queue), then let the Queue go.
    Delete,
    /// Keep the SQS queue (and its messages); only the Kubernetes object goes.
    Retain,
}

/// The dead-letter target: another Queue in this namespace, or an SQS queue of this namespace by
/// ARN.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.queueRef) != has(self.targetArn)").message("deadLetter needs exactly one of queueRef and targetArn"))]
pub struct DeadLetter {
    /// A Queue in the same namespace; skyport waits until it is Ready and follows its ARN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_ref: Option<LocalQueueRef>,
    /// ARN of an existing SQS queue in the same account and region, e.g.
    /// `arn:aws:sqs:eu-west-1:123456789012:orders-dlq`. It must belong to a Queue of this
    /// namespace and cluster, or be a queue made outside skyport whose name the platform granted
    /// this namespace (`--queue-name-grant`): SQS moves dead letters without asking the target's
    /// access policy. Otherwise Ready=False, reason DeadLetterNotAllowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^arn:aws[a-zA-Z-]*:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,80}(\.fifo)?$"))]
    pub target_arn: Option<String>,
    /// Receives after which a message moves to the dead-letter queue (1-1000).
    #[schemars(range(min = 1, max = 1000))]
    pub max_receive_count: i32,
}

/// Reference to a Queue in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalQueueRef {
    /// `metadata.name` of the Queue.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Who may use this queue as a dead-letter queue.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(self.redrivePermission == 'byQueue') == (has(self.sourceQueueArns) && size(self.sourceQueueArns) > 0)").message("sourceQueueArns is required with redrivePermission byQueue and not allowed otherwise"))]
pub struct RedriveAllowPolicy {
    /// `allowAll`, `denyAll`, or `byQueue` (only the queues in sourceQueueArns).
    pub redrive_permission: RedrivePermission,
    /// With byQueue: the ARNs of the source queues allowed (at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 10))]
    pub source_queue_arns: Option<Vec<String>>,
}

/// Redrive permission values as SQS spells them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RedrivePermission {
    #[serde(rename = "allowAll")]
    AllowAll,
    #[serde(rename = "denyAll")]
    DenyAll,
    #[serde(rename = "byQueue")]
    ByQueue,
}

/// Observed state of the SQS queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// The queue's URL, for SQS SDK calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_url: Option<String>,
    /// The queue's ARN, for IAM policies and redrive policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_arn: Option<String>,
    /// The SQS queue name in use (spec.queueName or the derived default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<CompactString>,
    /// True when the queue existed before and was taken over with `adopt: true` (then it is
    /// kept when the Queue is deleted unless deletionPolicy says `Delete`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
    /// The AwsAccount the queue lives in (its name; `namespace/name` from another namespace),
    /// or `default` for the operator's own identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<CompactString>,
    /// The AWS region the queue lives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<CompactString>,
    /// The IAM role the queue was created and is managed as (unset for the operator's own
    /// identity). Shown, never trusted: deletion assumes only the role the AwsAccount names now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<Box<String>>,
    /// The AwsAccount's own SQS endpoint the queue was created at, if it named one. Shown, never
    /// trusted: deletion goes only through the endpoint the AwsAccount names now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<Box<String>>,
    /// The ConfigMaps and Secrets of `spec.exports` this Queue has written and owns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exports: Vec<ExportRef>,
    /// The `metadata.generation` of the spec last applied to SQS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last proof, by the queue's owner tag, that the SQS queue is this Queue's, sealed with
    /// the operator's ownership key so that a restarted operator need not read the tags again
    /// before their next check. Written only when the operator has an ownership key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ownership_proof: Option<Box<OwnershipProof>>,
    /// `Ready`: the queue exists and matches the spec. `Synced`: the last reconcile succeeded.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// When and for which queue the owner tag was last read and named this Queue, sealed with a key
/// only the operator's Pod holds (HMAC-SHA256 over this Queue's UID, `queueUrl` and the fields
/// here). A record whose seal does not verify is ignored: the tags are read again.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnershipProof {
    /// The queue's `CreatedTimestamp` (seconds since 1970), when it was read: a queue deleted
    /// and made again under the same URL is another queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<Box<str>>,
    /// When the owner tag was read, in seconds since 1970.
    pub proven_at: i64,
    /// The Queue's `metadata.generation` then: a changed spec reads the tags again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The seal: hex of the first 16 bytes of the HMAC-SHA256.
    pub seal: Box<str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_above_the_sqs_quota_is_a_problem_with_its_size() {
        let statement =
            serde_json::json!({"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"});
        let mut spec =
            QueueSpec { policy: Some(Box::new(serde_json::json!({"Statement": [statement]}))), ..Default::default() };
        assert_eq!(spec.problem(), None);
        spec.policy = Some(Box::new(serde_json::json!({"Statement": vec![statement; 200]})));
        let message = spec.problem().expect("too large");
        assert!(message.contains("8192") && message.contains("spec.policy is"), "{message}");
        assert_eq!(QueueSpec::default().problem(), None);
    }

    /// Every Queue lives in the controller's cache as an `Arc<Queue>`: 16 bytes of counts plus
    /// the struct, in jemalloc's 768-byte size class. One more inline field would move all of
    /// them to the 896-byte class (1.25 MB more at 10,000 Queues): box fields most Queues leave
    /// unset, as `deadLetter`, `policy` and `accountRef` are (`spec.kmsKeyId`, `status.roleArn`,
    /// `status.endpointUrl` and `status.ownershipProof` behind thin pointers).
    #[test]
    fn a_cached_queue_fits_the_768_byte_class() {
        let arc = 16 + std::mem::size_of::<Queue>();
        assert!(arc <= 768, "Arc<Queue> takes {arc} bytes");
    }

    /// What every cached Queue carries besides its URL and ARN is short: kept inline, not
    /// allocated (seven allocations fewer per Queue).
    #[test]
    fn a_cached_queues_short_strings_are_not_allocated() {
        let q: Queue = serde_json::from_value(serde_json::json!({
            "apiVersion": "skyport.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "q"},
            "spec": {"tags": {"team": "payments"}},
            "status": {"queueName": "payments_orders-dlq", "account": "default", "region": "ap-southeast-2",
                "conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                    "message": "the SQS queue exists and matches the spec", "lastTransitionTime": "2026-11-26T05:28:25Z"}]}
        }))
        .unwrap();
        let status = q.status.as_ref().unwrap();
        let c = &status.conditions[0];
        let short = [&c.type_, &c.reason, &c.last_transition_time];
        let names = [&status.queue_name, &status.account, &status.region].map(|s| s.as_ref().unwrap());
        for s in short.into_iter().chain(names) {
            assert!(!s.is_heap_allocated(), "{s} is allocated");
        }
        assert!(c.message.is_heap_allocated(), "longer than 24 bytes");
        assert_eq!(q.spec.tags.get("team"), Some("payments"));
    }
}

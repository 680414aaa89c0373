//! `AwsAccount`: the AWS identity and region a namespace's Queues use instead of the operator's
//! own (STS AssumeRole into another account, possibly another region).
//!
//! The role's trust policy tells namespaces apart by what skyport sends with every AssumeRole
//! and derives itself, never from the spec: the external id `skyport:<cluster>:<namespace>` and
//! the session name `skyport-<namespace>`. A tenant who names another team's role therefore
//! gets AccessDenied from AWS (the confused-deputy fix AWS documents for services acting for
//! many customers).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// An IAM role skyport assumes for the SQS calls of the Queues that name this account.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[kube(
    group = "skyport.dev",
    version = "v1alpha1",
    kind = "AwsAccount",
    namespaced,
    status = "AwsAccountStatus",
    shortname = "awsacct",
    category = "skyport",
    doc = "An AWS identity and region for Queues: skyport assumes `roleArn` (STS AssumeRole) for every SQS call of a Queue whose `spec.accountRef` names this object, sending the external id shown in `status.externalId` (derived from the cluster and this namespace) and the session name in `status.roleSessionName`. The role's trust policy must require that external id (docs/aws-access.md). Usable from its own namespace, and from `allowedNamespaces`; while Queues use it, it keeps a finalizer so their cleanup can still assume the role.",
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.roleArn"}"#,
    printcolumn = r#"{"name":"Region","type":"string","jsonPath":".spec.region"}"#,
    printcolumn = r#"{"name":"External ID","type":"string","jsonPath":".status.externalId"}"#,
    printcolumn = r#"{"name":"Drift Check","type":"string","jsonPath":".status.driftCheckPeriod"}"#,
    printcolumn = r#"{"name":"Tag Check","type":"string","jsonPath":".status.tagCheckPeriod","priority":1}"#,
    printcolumn = r#"{"name":"Queues","type":"integer","jsonPath":".status.budgetQueues","priority":1}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.externalId)").message("externalId is derived by skyport (status.externalId): write it into the role's trust policy")
)]
pub struct AwsAccountSpec {
    /// ARN of the IAM role to assume, e.g. `arn:aws:iam::123456789012:role/team-b-queues`. Its
    /// trust policy must allow the operator's identity `sts:AssumeRole` on the condition
    /// `sts:ExternalId` = `status.externalId` (see docs/aws-access.md). Changing it does not move
    /// existing queues: Queues created under another role report `AccountChanged`.
    #[schemars(regex(pattern = r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$"))]
    pub role_arn: String,

    /// Not settable: skyport derives the external id from the cluster and this namespace and
    /// shows it in `status.externalId` (a tenant choosing it could name another team's role).
    /// Kept in the schema only so that a manifest setting it is refused with that explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1224))]
    pub external_id: Option<String>,

    /// Region of the SQS queues, e.g. `eu-west-1`. Changing it does not move existing queues
    /// (`AccountChanged`).
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"))]
    pub region: String,

    /// SQS endpoint to use instead of the region's, e.g. a VPC endpoint. `https://` only, unless
    /// the operator runs with `--allow-http-account-endpoints` (test servers). STS is reached as
    /// for the operator's own calls. Changing it does not move existing queues
    /// (`AccountChanged`); deleting such a Queue looks for its queue through the endpoint named
    /// here now (its owner tag decides), never through one recorded in the Queue's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub endpoint_url: Option<String>,

    /// Other namespaces whose Queues may use this account (with `accountRef.namespace` set to
    /// this one). Empty: only Queues in this namespace. Their calls still carry this namespace's
    /// external id: the role trusts the AwsAccount's namespace, which decides who shares it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    pub allowed_namespaces: Vec<String>,
}

/// What skyport sends when it assumes the role, and whether the account is usable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsAccountStatus {
    /// The external id every AssumeRole for this account sends: `skyport:<cluster id>:<namespace>`.
    /// Put it in the role's trust policy as `"Condition": {"StringEquals": {"sts:ExternalId":
    /// "<this value>"}}`; only AwsAccounts of this namespace in this cluster can then use the role.
    /// Not a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    /// The STS session name (`skyport-<namespace>`): CloudTrail shows it for every call made with
    /// the role, and a trust policy may also require it (`sts:RoleSessionName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_session_name: Option<String>,
    /// Queues whose SQS calls spend this account and region's budget: those of every AwsAccount
    /// naming a role of the same AWS account in the same region. They pace the drift checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_queues: Option<u64>,
    /// How often each of those Queues is compared with SQS (one GetQueueAttributes) to find
    /// changes made outside skyport, e.g. `1m` or `6m 56s`: the operator's `--queue-resync`, or
    /// longer when that many checks would take more than half of the budget (`--sqs-rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_check_period: Option<String>,
    /// How often, at most, each of those Queues re-reads its tags (who owns the queue): the
    /// operator's `--queue-tag-resync`, or longer when that many reads would take more than half
    /// of the tagging budget (`--sqs-tag-rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_check_period: Option<String>,
    /// `Ready`: Queues can use it (the endpoint is allowed, it is not being deleted; `Deleting`
    /// while the finalizer `awsaccounts.skyport.dev/in-use` waits for the Queues using it to
    /// delete their SQS queues). Whether the role trusts skyport shows on the Queues
    /// (`AssumeRoleDenied`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The external id for AwsAccounts of `namespace` in the cluster `cluster`. AWS allows 2-1224
/// characters of `[\w+=,.@:/-]`: anything else in a configured cluster id becomes `-`.
pub fn external_id(cluster: &str, namespace: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_+=,.@:/-".contains(c);
    let cluster: String = cluster.chars().take(1100).map(|c| if allowed(c) { c } else { '-' }).collect();
    format!("skyport:{cluster}:{namespace}")
}

/// The STS session name for AwsAccounts of `namespace`: `skyport-<namespace>`, at most 64
/// characters (STS's limit); a longer namespace is cut and ends in a hash of the whole name so
/// two long namespaces never share one.
pub fn session_name(namespace: &str) -> String {
    let name = format!("skyport-{namespace}");
    if name.len() <= 64 {
        return name;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(namespace.as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}-{hash}", &name[..55])
}

/// The AWS account number in a role ARN (`arn:aws:iam::<account>:role/...`).
pub fn account_id(role_arn: &str) -> Option<&str> {
    role_arn.split(':').nth(4).filter(|a| a.len() == 12)
}

/// A Queue's reference to an [`AwsAccount`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct AccountRef {
    /// `metadata.name` of the AwsAccount.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its namespace, when not the Queue's own (that AwsAccount must list the Queue's namespace
    /// in `allowedNamespaces`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

impl AccountRef {
    /// The namespace and name it points at, from a Queue in `queue_ns`.
    pub fn target<'a>(&'a self, queue_ns: &'a str) -> (&'a str, &'a str) {
        (self.namespace.as_deref().unwrap_or(queue_ns), &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_account_comes_from_the_role_arn() {
        assert_eq!(account_id("arn:aws:iam::000000000002:role/team-b"), Some("000000000002"));
        assert_eq!(account_id("arn:aws:iam::2:role/x"), None);
        assert_eq!(account_id("nonsense"), None);
    }

    #[test]
    fn the_external_id_names_cluster_and_namespace_in_awss_alphabet() {
        let id = external_id("9f1c2d3e-aaaa-bbbb-cccc-0123456789ab", "team-b");
        assert_eq!(id, "skyport:9f1c2d3e-aaaa-bbbb-cccc-0123456789ab:team-b");
        assert_eq!(external_id("prod eu#1", "a"), "skyport:prod-eu-1:a");
        let long = external_id(&"c".repeat(5000), &"n".repeat(63));
        assert!(long.len() <= 1224, "{}", long.len());
        let valid = |c: char| c.is_ascii_alphanumeric() || "_+=,.@:/-".contains(c);
        assert!(long.chars().all(valid));
    }

    #[test]
    fn session_names_fit_sts_and_stay_distinct() {
        assert_eq!(session_name("team-b"), "skyport-team-b");
        let (a, b) = (format!("{}a", "n".repeat(62)), format!("{}b", "n".repeat(62)));
        let (sa, sb) = (session_name(&a), session_name(&b));
        assert!(sa.len() <= 64 && sb.len() <= 64, "{sa} {sb}");
        assert_ne!(sa, sb);
        assert!(sa.starts_with("skyport-nnn"));
    }
}

//! `AwsAccount`: the AWS identity and region a namespace's Queues use instead of the operator's
//! own (STS AssumeRole into another account, possibly another region).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An IAM role skyport assumes for the SQS calls of the Queues that name this account.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[kube(
    group = "skyport.dev",
    version = "v1alpha1",
    kind = "AwsAccount",
    namespaced,
    shortname = "awsacct",
    category = "skyport",
    doc = "An AWS identity and region for Queues: skyport assumes `roleArn` (STS AssumeRole, with `externalId` when set) for every SQS call of a Queue whose `spec.accountRef` names this object. Usable from its own namespace, and from `allowedNamespaces`.",
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.roleArn"}"#,
    printcolumn = r#"{"name":"Region","type":"string","jsonPath":".spec.region"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AwsAccountSpec {
    /// ARN of the IAM role to assume, e.g. `arn:aws:iam::123456789012:role/team-b-queues`. Its
    /// trust policy must allow the operator's own identity to call `sts:AssumeRole` (see
    /// deploy/README.md). Changing it does not move existing queues: Queues created under
    /// another role report `AccountChanged`.
    #[schemars(regex(pattern = r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$"))]
    pub role_arn: String,

    /// The external id the role's trust policy requires (`sts:ExternalId`), if any. It guards
    /// against the confused-deputy problem and is not a secret in AWS's sense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 1224), regex(pattern = r"^[A-Za-z0-9+=,.@:/_-]+$"))]
    pub external_id: Option<String>,

    /// Region of the SQS queues, e.g. `eu-west-1`.
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"))]
    pub region: String,

    /// SQS endpoint to use instead of the region's (a VPC endpoint, or a test server). STS is
    /// reached like the operator's own calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048), regex(pattern = r"^https?://[^\s]+$"))]
    pub endpoint_url: Option<String>,

    /// Other namespaces whose Queues may use this account (with `accountRef.namespace` set to
    /// this one). Empty: only Queues in this namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    pub allowed_namespaces: Vec<String>,
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_account_comes_from_the_role_arn() {
        assert_eq!(super::account_id("arn:aws:iam::000000000002:role/team-b"), Some("000000000002"));
        assert_eq!(super::account_id("arn:aws:iam::2:role/x"), None);
        assert_eq!(super::account_id("nonsense"), None);
    }
}

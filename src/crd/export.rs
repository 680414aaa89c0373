//! `spec.exports`: the queue's URL, ARN and name in a ConfigMap or Secret whose name and keys
//! the user chooses, so existing Deployments keep their variable names.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most exports one Queue may have: keeps the CEL uniqueness check cheap and a Queue's
/// writes per reconcile bounded.
pub const MAX_EXPORTS: usize = 8;

/// A Kubernetes object name (DNS subdomain), as ConfigMaps and Secrets require.
const OBJECT_NAME: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A ConfigMap or Secret data key; also a valid name for `envFrom`.
const DATA_KEY: &str = r"^[-._a-zA-Z0-9]+$";

/// One object to publish the queue's coordinates in, besides the ConfigMap `<name>-sqs`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Export {
    /// `ConfigMap` or `Secret`. Either is created and owned by the Queue (deleted with it); an
    /// existing object of that name that the Queue does not own is never written (Ready=False,
    /// reason ExportConflict).
    pub kind: ExportKind,
    /// Name of the ConfigMap or Secret, in the Queue's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME))]
    pub name: String,
    /// Which values to write, each under the key given (at least one).
    pub keys: ExportKeys,
}

/// The kinds of object an export can be.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum ExportKind {
    ConfigMap,
    Secret,
}

impl std::fmt::Display for ExportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExportKind::ConfigMap => "ConfigMap",
            ExportKind::Secret => "Secret",
        })
    }
}

/// Data keys for the queue's URL, ARN and name; an unset one is not exported.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.url) || has(self.arn) || has(self.name)").message("keys needs at least one of url, arn and name"),
    validation = Rule::new("!(has(self.url) && has(self.arn) && self.url == self.arn) && !(has(self.url) && has(self.name) && self.url == self.name) && !(has(self.arn) && has(self.name) && self.arn == self.name)").message("keys must be different from each other")
)]
pub struct ExportKeys {
    /// Key for the queue's URL, e.g. `QUEUE_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY))]
    pub url: Option<String>,
    /// Key for the queue's ARN, e.g. `QUEUE_ARN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY))]
    pub arn: Option<String>,
    /// Key for the SQS queue name, e.g. `QUEUE_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY))]
    pub name: Option<String>,
}

/// An object an export wrote, as recorded in status (so one dropped from the spec is deleted).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub struct ExportRef {
    /// `ConfigMap` or `Secret`.
    pub kind: ExportKind,
    /// The object's name in the Queue's namespace.
    pub name: String,
    /// The UID of the Secret this Queue created (Secrets only). skyport never reads Secrets:
    /// every later write replaces the whole object with this UID in it, which the API server
    /// refuses for any other object of the name, and a dropped export is deleted only with this
    /// UID as precondition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl ExportRef {
    /// Whether both name the same object (kind and name; the UID is what is known of it).
    pub fn names(&self, kind: ExportKind, name: &str) -> bool {
        self.kind == kind && self.name == name
    }
}

impl Export {
    pub fn target(&self) -> ExportRef {
        ExportRef { kind: self.kind, name: self.name.clone(), uid: None }
    }
}

/// CEL on `spec.exports`: each (kind, name) once.
pub const UNIQUE_RULE: &str = "self.all(e, self.exists_one(f, f.kind == e.kind && f.name == e.name))";
/// CEL on the whole Queue: an export cannot be the Queue's own ConfigMap `<name>-sqs`.
pub const NOT_DEFAULT_RULE: &str = "!has(self.spec.exports) || self.spec.exports.all(e, e.kind != 'ConfigMap' || e.name != self.metadata.name + '-sqs')";

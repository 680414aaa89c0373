//! Desired vs observed: what, if anything, must be done to SQS (pure, no IO).

use std::time::Duration;

use providers::sqs::{Attributes, Tags};
use serde_json::Value;

use super::desired::{Desired, TAG_ADOPTED, TAG_OWNER_UID};
use super::tenancy::{self, Holder};
use crate::config::NameGrant;
use crate::crd::queue::OwnershipProof;
use crate::reasons::Reason;

pub mod redrive;

/// What observation found under the queue's name.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    /// No queue of that name exists.
    Absent,
    Present(Existing),
}

/// A queue that exists in SQS.
#[derive(Debug, Clone, PartialEq)]
pub struct Existing {
    pub url: String,
    pub attributes: Attributes,
    /// `None` when tags were not read this time (ownership was proven earlier, see `verified`).
    pub tags: Option<Tags>,
    /// Its owner tag named this Queue when last read, for this very queue (same URL and
    /// `CreatedTimestamp`: not deleted and recreated under the same name since).
    pub verified: bool,
    /// For a queue whose owner tag names another Queue: whether that Queue still exists
    /// (`None`: not looked up, or the lookup failed).
    pub owner_live: Option<bool>,
}

impl Existing {
    /// Whether skyport's adoption marker is on the queue (read this pass).
    pub fn marked_adopted(&self) -> bool {
        self.tags.as_ref().is_some_and(|t| t.get(TAG_ADOPTED).is_some_and(|v| v == "true"))
    }
}

/// One write to SQS.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Create { name: String, attributes: Attributes, tags: Tags },
    SetAttributes(Attributes),
    Tag(Tags),
    Untag(Vec<String>),
}

/// A queue that exists and matches the spec.
#[derive(Debug, Clone)]
pub struct Ready {
    pub url: String,
    pub arn: String,
    pub name: String,
    /// The queue existed before and was taken over (`status.adopted`).
    pub adopted: bool,
    /// Its `CreatedTimestamp` when read in this pass (to notice a recreated queue later).
    pub created: Option<String>,
    /// Normal Events to publish: (reason, note).
    pub events: Vec<(Reason, String)>,
    /// The sealed ownership proof for status (only with an ownership key).
    pub proof: Option<Box<OwnershipProof>>,
}

/// Outcome of one converge pass, before status is written.
#[derive(Debug)]
pub enum Outcome {
    Ready(Ready),
    Wait {
        reason: Reason,
        message: String,
        retry: Option<Duration>,
    },
    /// A create was due, but the API server no longer has this Queue live (deleted, being
    /// deleted, or replaced by another of that name): the cache is behind, nothing was written.
    Behind,
}

/// What the Queue asks besides the desired SQS state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Intent<'a> {
    pub fifo: bool,
    pub uid: &'a str,
    /// The Queue's namespace and this cluster's id: whose queues it may take.
    pub namespace: &'a str,
    pub cluster: &'a str,
    /// `--queue-name-grant`: queue names made outside skyport that namespaces may adopt.
    pub grants: &'a [NameGrant],
    /// `spec.adopt`.
    pub adopt: bool,
    /// `status.adopted`: the queue existed before skyport took it over.
    pub adopted: bool,
    /// When to look again at a queue that is not ours (its owner may go away).
    pub recheck: Duration,
}

/// The decision for one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Run these steps in order (none: converged). `adopting` marks a first take-over.
    Apply { steps: Vec<Step>, adopting: bool },
    /// Writes are due but the owner tag was not read in this pass: read it, then plan again
    /// (ownership is checked against SQS before every write).
    NeedTags,
    /// Do nothing now; report `reason` and look again after `retry`.
    Wait { reason: Reason, message: String, retry: Option<Duration> },
}

/// Decides the steps that make `observed` match `desired`.
pub fn plan(desired: &Desired, intent: &Intent<'_>, observed: &Observed) -> Plan {
    let existing = match observed {
        Observed::Absent => {
            return Plan::Apply {
                steps: vec![Step::Create {
                    name: desired.name.clone(),
                    attributes: desired.create_attributes(intent.fifo),
                    tags: desired.tags.clone(),
                }],
                adopting: false,
            };
        }
        Observed::Present(existing) => existing,
    };

    let ours = match &existing.tags {
        Some(tags) => tags.get(TAG_OWNER_UID).is_some_and(|u| u == intent.uid),
        None if existing.verified => true,
        None => return Plan::NeedTags,
    };
    if !ours && let Some(refusal) = refuse(desired, intent, existing) {
        return refusal;
    }
    // An adopted queue keeps what the spec does not mention: unset documents are not cleared
    // and tags that are not in the spec stay. The marker on the queue says so even when the
    // status write after the adoption was lost.
    let adopting = !ours;
    let gentle = adopting || intent.adopted || existing.marked_adopted();
    let mut want_tags = desired.tags.clone();
    if gentle {
        want_tags.insert(TAG_ADOPTED.into(), "true".into());
    }

    let mut steps = Vec::new();
    let changed: Attributes = desired
        .attributes
        .iter()
        .filter(|(_, v)| !(gentle && v.is_empty()))
        .filter(|(k, v)| !attribute_matches(k, v, existing.attributes.get(k.as_str()).map(String::as_str)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !changed.is_empty() {
        steps.push(Step::SetAttributes(changed));
    }
    if let Some(observed_tags) = &existing.tags {
        let add: Tags = want_tags
            .iter()
            .filter(|(k, v)| observed_tags.get(k.as_str()) != Some(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let remove: Vec<String> = observed_tags
            .keys()
            .filter(|k| !want_tags.contains_key(k.as_str()) && (!gentle || k.starts_with("skyport.dev/")))
            .cloned()
            .collect();
        // Untag first: SQS allows 50 tags, and replacing many at once must not pass through
        // a state holding both sets.
        if !remove.is_empty() {
            steps.push(Step::Untag(remove));
        }
        if !add.is_empty() {
            // Taking a queue over claims it before anything else is written: the owner tag and
            // the adoption marker in one call, so no interruption leaves a changed queue
            // unclaimed or a claimed one unmarked.
            if adopting {
                steps.insert(0, Step::Tag(add));
            } else {
                steps.push(Step::Tag(add));
            }
        }
    }
    if !steps.is_empty() && existing.tags.is_none() {
        return Plan::NeedTags;
    }
    Plan::Apply { steps, adopting }
}

/// Why a queue that is not ours is left alone, if it is (see [`tenancy`]).
fn refuse(desired: &Desired, intent: &Intent<'_>, existing: &Existing) -> Option<Plan> {
    let retry = Some(intent.recheck);
    let name = &desired.name;
    let holder =
        existing.tags.as_ref().map_or(Holder::Untagged, |t| tenancy::holder(t, intent.namespace, intent.cluster));
    if !intent.adopt {
        let message = match &holder {
            Holder::Untagged => format!(
                "an SQS queue named {name:?} already exists and was not created by this Queue; set spec.adopt: true to manage it (the platform team must grant this namespace its name), or choose another spec.queueName"
            ),
            Holder::SameNamespace { name: owner, .. } => format!(
                "an SQS queue named {name:?} already exists and belongs to Queue {owner}; choose another spec.queueName"
            ),
            _ => format!(
                "an SQS queue named {name:?} already exists and belongs to another Queue; choose another spec.queueName"
            ),
        };
        return Some(Plan::Wait { reason: Reason::AlreadyExists, message, retry });
    }
    tenancy::adoption_refusal(&holder, intent.namespace, name, intent.grants, existing.owner_live)
        .map(|(reason, message)| Plan::Wait { reason, message, retry })
}

/// Compares one attribute by meaning: numbers as numbers, booleans case-insensitively, policy
/// documents as JSON values (IAM treats `"a"` and `["a"]` alike, and key order never matters).
/// An empty desired value means the attribute must be absent or empty.
pub fn attribute_matches(name: &str, desired: &str, observed: Option<&str>) -> bool {
    let observed = observed.unwrap_or("");
    match name {
        "Policy" | "RedrivePolicy" | "RedriveAllowPolicy" => {
            if desired.is_empty() || observed.is_empty() {
                return desired.is_empty() && observed.trim().is_empty();
            }
            match (serde_json::from_str::<Value>(desired), serde_json::from_str::<Value>(observed)) {
                (Ok(d), Ok(o)) => normalize(d) == normalize(o),
                _ => desired == observed,
            }
        }
        "ContentBasedDeduplication" | "SqsManagedSseEnabled" | "FifoQueue" => desired.eq_ignore_ascii_case(observed),
        "VisibilityTimeout"
        | "MessageRetentionPeriod"
        | "DelaySeconds"
        | "MaximumMessageSize"
        | "ReceiveMessageWaitTimeSeconds"
        | "KmsDataKeyReusePeriodSeconds" => match (desired.trim().parse::<i64>(), observed.trim().parse::<i64>()) {
            (Ok(d), Ok(o)) => d == o,
            _ => desired == observed,
        },
        _ => desired == observed,
    }
}

/// A canonical form for policy documents: one-element arrays become their element, arrays are
/// ordered, and numeric strings (SQS echoes `"maxReceiveCount":"3"`) become numbers.
fn normalize(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, normalize(v))).collect()),
        Value::Array(items) => {
            let mut items: Vec<Value> = items.into_iter().map(normalize).collect();
            if items.len() == 1 {
                return items.pop().expect("one element");
            }
            items.sort_by_key(|v| v.to_string());
            Value::Array(items)
        }
        Value::String(s) => match s.parse::<i64>() {
            Ok(n) => Value::from(n),
            Err(_) => Value::String(s),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests;

//! Desired vs observed: what, if anything, must be done to SQS (pure, no IO).

use std::time::Duration;

use providers::sqs::{Attributes, Tags};
use serde_json::Value;

use super::desired::{Desired, TAG_OWNER_UID};

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
    /// `None` when tags were not read this time (the queue's tags are known to be converged).
    pub tags: Option<Tags>,
    /// `status.queueUrl` of the Queue names this very queue: skyport created or adopted it.
    pub recorded: bool,
}

/// One write to SQS.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Create { name: String, attributes: Attributes, tags: Tags },
    SetAttributes(Attributes),
    Tag(Tags),
    Untag(Vec<String>),
}

/// The decision for one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Run these steps in order (none: converged). `adopting` marks a first take-over.
    Apply { steps: Vec<Step>, adopting: bool },
    /// Do nothing now; report `reason` and look again after `retry`.
    Wait { reason: &'static str, message: String, retry: Option<Duration> },
}

/// Decides the steps that make `observed` match `desired`.
pub fn plan(desired: &Desired, fifo: bool, uid: &str, adopt: bool, observed: &Observed) -> Plan {
    let existing = match observed {
        Observed::Absent => {
            return Plan::Apply {
                steps: vec![Step::Create {
                    name: desired.name.clone(),
                    attributes: desired.create_attributes(fifo),
                    tags: desired.tags.clone(),
                }],
                adopting: false,
            };
        }
        Observed::Present(existing) => existing,
    };

    let ours = existing.recorded || existing.tags.as_ref().and_then(|t| t.get(TAG_OWNER_UID)).is_some_and(|u| u == uid);
    if !ours && !adopt {
        return Plan::Wait {
            reason: "AlreadyExists",
            message: format!(
                "an SQS queue named {:?} already exists and was not created by this Queue; set spec.adopt: true to manage it, or choose another spec.queueName",
                desired.name
            ),
            retry: None,
        };
    }

    let mut steps = Vec::new();
    let changed: Attributes = desired
        .attributes
        .iter()
        .filter(|(k, v)| !attribute_matches(k, v, existing.attributes.get(k.as_str()).map(String::as_str)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !changed.is_empty() {
        steps.push(Step::SetAttributes(changed));
    }
    if let Some(observed_tags) = &existing.tags {
        let add: Tags = desired
            .tags
            .iter()
            .filter(|(k, v)| observed_tags.get(k.as_str()) != Some(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let remove: Vec<String> =
            observed_tags.keys().filter(|k| !desired.tags.contains_key(k.as_str())).cloned().collect();
        if !add.is_empty() {
            steps.push(Step::Tag(add));
        }
        if !remove.is_empty() {
            steps.push(Step::Untag(remove));
        }
    }
    Plan::Apply { steps, adopting: !ours }
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
mod tests {
    use super::*;
    use crate::controllers::queue::desired::{Owner, desired};
    use crate::crd::queue::QueueSpec;

    const UID: &str = "uid-1";

    fn want(spec: &QueueSpec) -> Desired {
        desired(spec, &Owner { namespace: "ns", name: "q", uid: UID }, None)
    }

    fn existing(attrs: &[(&str, &str)], tags: Option<&[(&str, &str)]>, recorded: bool) -> Observed {
        Observed::Present(Existing {
            url: "http://sqs/000000000000/ns-q".into(),
            attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            tags: tags.map(|t| t.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            recorded,
        })
    }

    fn converged_tags(d: &Desired) -> Vec<(&str, &str)> {
        d.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn absent_queue_is_created_with_attributes_and_tags() {
        let spec = QueueSpec { delay_seconds: Some(5), fifo: true, ..Default::default() };
        let d = want(&spec);
        let Plan::Apply { steps, .. } = plan(&d, true, UID, false, &Observed::Absent) else { panic!() };
        let [Step::Create { name, attributes, tags }] = steps.as_slice() else { panic!("{steps:?}") };
        assert_eq!(name, "ns-q.fifo");
        assert_eq!(attributes["DelaySeconds"], "5");
        assert_eq!(attributes["FifoQueue"], "true");
        assert_eq!(tags[TAG_OWNER_UID], UID);
    }

    #[test]
    fn converged_queue_needs_no_steps_even_with_server_spellings() {
        let spec = QueueSpec {
            visibility_timeout_seconds: Some(45),
            content_based_deduplication: Some(true),
            policy: Some(
                serde_json::json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["sqs:SendMessage"], "Principal": "*"}]}),
            ),
            ..Default::default()
        };
        let d = want(&spec);
        let tags = converged_tags(&d);
        let observed = existing(
            &[
                ("VisibilityTimeout", "45"),
                ("ContentBasedDeduplication", "TRUE"),
                (
                    "Policy",
                    r#"{"Statement":{"Principal":"*","Action":"sqs:SendMessage","Effect":"Allow"},"Version":"2012-10-17"}"#,
                ),
                ("DelaySeconds", "7"),
                ("QueueArn", "arn"),
            ],
            Some(&tags),
            true,
        );
        assert_eq!(plan(&d, false, UID, false, &observed), Plan::Apply { steps: vec![], adopting: false });
    }

    #[test]
    fn only_differing_attributes_are_written() {
        let spec = QueueSpec { visibility_timeout_seconds: Some(60), delay_seconds: Some(0), ..Default::default() };
        let d = want(&spec);
        let observed = existing(&[("VisibilityTimeout", "30"), ("DelaySeconds", "0")], None, true);
        let Plan::Apply { steps, .. } = plan(&d, false, UID, false, &observed) else { panic!() };
        assert_eq!(steps, vec![Step::SetAttributes([("VisibilityTimeout".to_string(), "60".to_string())].into())]);
    }

    #[test]
    fn removed_policy_is_cleared() {
        let d = want(&QueueSpec::default());
        let observed = existing(&[("Policy", r#"{"Version":"2012-10-17"}"#)], None, true);
        let Plan::Apply { steps, .. } = plan(&d, false, UID, false, &observed) else { panic!() };
        assert_eq!(steps, vec![Step::SetAttributes([("Policy".to_string(), String::new())].into())]);
    }

    #[test]
    fn redrive_policy_with_string_count_matches_numeric_count() {
        assert!(attribute_matches(
            "RedrivePolicy",
            r#"{"deadLetterTargetArn":"arn:x","maxReceiveCount":3}"#,
            Some(r#"{"maxReceiveCount":"3","deadLetterTargetArn":"arn:x"}"#)
        ));
        assert!(!attribute_matches(
            "RedrivePolicy",
            r#"{"deadLetterTargetArn":"arn:y","maxReceiveCount":3}"#,
            Some(r#"{"maxReceiveCount":"3","deadLetterTargetArn":"arn:x"}"#)
        ));
    }

    #[test]
    fn tag_drift_adds_changed_and_removes_unknown_tags() {
        let spec = QueueSpec { tags: [("team".to_string(), "b".to_string())].into(), ..Default::default() };
        let d = want(&spec);
        let mut tags = converged_tags(&d);
        tags.retain(|(k, _)| *k != "team");
        tags.push(("team", "a"));
        tags.push(("stale", "x"));
        let observed = existing(&[], Some(&tags), true);
        let Plan::Apply { steps, .. } = plan(&d, false, UID, false, &observed) else { panic!() };
        assert_eq!(
            steps,
            vec![Step::Tag([("team".to_string(), "b".to_string())].into()), Step::Untag(vec!["stale".to_string()])]
        );
    }

    #[test]
    fn foreign_queue_is_left_alone_without_adopt() {
        let d = want(&QueueSpec::default());
        let observed = existing(&[], Some(&[("owner", "someone-else")]), false);
        assert!(matches!(
            plan(&d, false, UID, false, &observed),
            Plan::Wait { reason: "AlreadyExists", retry: None, .. }
        ));
    }

    #[test]
    fn foreign_queue_is_taken_over_with_adopt() {
        let d = want(&QueueSpec::default());
        let observed = existing(&[], Some(&[("owner", "someone-else")]), false);
        let Plan::Apply { steps, adopting } = plan(&d, false, UID, true, &observed) else { panic!() };
        assert!(adopting);
        assert!(steps.iter().any(|s| matches!(s, Step::Tag(t) if t[TAG_OWNER_UID] == UID)));
        assert!(steps.contains(&Step::Untag(vec!["owner".into()])));
    }

    #[test]
    fn queue_tagged_with_our_uid_is_ours_even_without_a_recorded_url() {
        let d = want(&QueueSpec::default());
        let tags = converged_tags(&d);
        let observed = existing(&[], Some(&tags), false);
        assert_eq!(plan(&d, false, UID, false, &observed), Plan::Apply { steps: vec![], adopting: false });
    }
}

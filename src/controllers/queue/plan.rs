//! Desired vs observed: what, if anything, must be done to SQS (pure, no IO).

use std::time::Duration;

use providers::sqs::{Attributes, Tags};
use serde_json::Value;

use super::desired::{Desired, TAG_ADOPTED, TAG_OWNER_UID};
use super::tenancy::{self, Holder};
use crate::config::NameGrant;

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
    pub events: Vec<(&'static str, String)>,
}

/// Outcome of one converge pass, before status is written.
#[derive(Debug)]
pub enum Outcome {
    Ready(Ready),
    Wait { reason: &'static str, message: String, retry: Option<Duration> },
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
    Wait { reason: &'static str, message: String, retry: Option<Duration> },
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
        return Some(Plan::Wait { reason: "AlreadyExists", message, retry });
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
mod tests {
    use super::*;
    use crate::controllers::queue::desired::{Owner, TAG_CLUSTER, TAG_OWNER_NAME, TAG_OWNER_NAMESPACE, desired};
    use crate::crd::queue::QueueSpec;

    const UID: &str = "uid-1";

    fn want(spec: &QueueSpec) -> Desired {
        desired(spec, &Owner { namespace: "ns", name: "q", uid: UID, cluster: "c-1", recorded_name: None }, None)
    }

    const RECHECK: Duration = Duration::from_secs(60);

    /// The platform grants namespace `ns` every name made outside skyport.
    fn grant_all() -> &'static [NameGrant] {
        static GRANTS: std::sync::OnceLock<Vec<NameGrant>> = std::sync::OnceLock::new();
        GRANTS.get_or_init(|| vec![NameGrant { namespace: "ns".into(), pattern: "*".into() }])
    }

    fn intent(fifo: bool, adopt: bool) -> Intent<'static> {
        Intent {
            fifo,
            uid: UID,
            namespace: "ns",
            cluster: "c-1",
            grants: grant_all(),
            adopt,
            adopted: false,
            recheck: RECHECK,
        }
    }

    fn existing(attrs: &[(&str, &str)], tags: Option<&[(&str, &str)]>, verified: bool) -> Observed {
        Observed::Present(Existing {
            url: "http://sqs/000000000000/ns_q".into(),
            attributes: attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            tags: tags.map(|t| t.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            verified,
            owner_live: None,
        })
    }

    fn converged_tags(d: &Desired) -> Vec<(&str, &str)> {
        d.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn absent_queue_is_created_with_attributes_and_tags() {
        let spec = QueueSpec { delay_seconds: Some(5), fifo: true, ..Default::default() };
        let d = want(&spec);
        let Plan::Apply { steps, .. } = plan(&d, &intent(true, false), &Observed::Absent) else { panic!() };
        let [Step::Create { name, attributes, tags }] = steps.as_slice() else { panic!("{steps:?}") };
        assert_eq!(name, "ns_q.fifo");
        assert_eq!(attributes["DelaySeconds"], "5");
        assert_eq!(attributes["FifoQueue"], "true");
        assert_eq!(tags[TAG_OWNER_UID], UID);
    }

    #[test]
    fn converged_queue_needs_no_steps_even_with_server_spellings() {
        let spec = QueueSpec {
            visibility_timeout_seconds: Some(45),
            content_based_deduplication: Some(true),
            policy: Some(Box::new(
                serde_json::json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["sqs:SendMessage"], "Principal": "*"}]}),
            )),
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
        assert_eq!(plan(&d, &intent(false, false), &observed), Plan::Apply { steps: vec![], adopting: false });
    }

    #[test]
    fn only_differing_attributes_are_written() {
        let spec = QueueSpec { visibility_timeout_seconds: Some(60), delay_seconds: Some(0), ..Default::default() };
        let d = want(&spec);
        let tags = converged_tags(&d);
        let observed = existing(&[("VisibilityTimeout", "30"), ("DelaySeconds", "0")], Some(&tags), true);
        let Plan::Apply { steps, .. } = plan(&d, &intent(false, false), &observed) else { panic!() };
        assert_eq!(steps, vec![Step::SetAttributes([("VisibilityTimeout".to_string(), "60".to_string())].into())]);
    }

    #[test]
    fn removed_policy_is_cleared() {
        let d = want(&QueueSpec::default());
        let tags = converged_tags(&d);
        let observed = existing(&[("Policy", r#"{"Version":"2012-10-17"}"#)], Some(&tags), true);
        let Plan::Apply { steps, .. } = plan(&d, &intent(false, false), &observed) else { panic!() };
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
        let Plan::Apply { steps, .. } = plan(&d, &intent(false, false), &observed) else { panic!() };
        assert_eq!(
            steps,
            vec![Step::Untag(vec!["stale".to_string()]), Step::Tag([("team".to_string(), "b".to_string())].into())],
            "untag before tag: SQS counts both sets against its 50-tag limit otherwise"
        );
    }

    #[test]
    fn foreign_queue_is_left_alone_without_adopt() {
        let d = want(&QueueSpec::default());
        let observed = existing(&[], Some(&[("owner", "someone-else")]), false);
        assert!(matches!(
            plan(&d, &intent(false, false), &observed),
            Plan::Wait { reason: "AlreadyExists", retry: Some(RECHECK), .. }
        ));
    }

    #[test]
    fn foreign_queue_is_taken_over_with_adopt_writing_only_declared_fields() {
        let spec = QueueSpec { visibility_timeout_seconds: Some(50), ..Default::default() };
        let d = want(&spec);
        let observed = existing(
            &[("VisibilityTimeout", "11"), ("Policy", r#"{"Version":"2012-10-17"}"#), ("RedrivePolicy", "{}")],
            Some(&[("owner", "someone-else")]),
            false,
        );
        let Plan::Apply { steps, adopting } = plan(&d, &intent(false, true), &observed) else { panic!() };
        assert!(adopting);
        let Step::Tag(claim) = &steps[0] else { panic!("the claim comes before any other write: {steps:?}") };
        assert_eq!((claim[TAG_OWNER_UID].as_str(), claim[TAG_ADOPTED].as_str()), (UID, "true"));
        assert_eq!(steps[1], Step::SetAttributes([("VisibilityTimeout".to_string(), "50".to_string())].into()));
        assert!(!steps.iter().any(|s| matches!(s, Step::Untag(_))), "foreign tags stay: {steps:?}");
        // Later passes treat it the same way: the marker on the queue, or status.adopted.
        let mut tags = converged_tags(&d);
        tags.push(("owner", "someone-else"));
        tags.push((TAG_ADOPTED, "true"));
        let observed = existing(&[("VisibilityTimeout", "50"), ("Policy", "{}")], Some(&tags), true);
        assert_eq!(plan(&d, &intent(false, true), &observed), Plan::Apply { steps: vec![], adopting: false });
        let adopted = Intent { adopted: true, ..intent(false, true) };
        assert_eq!(plan(&d, &adopted, &observed), Plan::Apply { steps: vec![], adopting: false });
    }

    #[test]
    fn an_adoption_whose_status_write_was_lost_stays_gentle() {
        // TagQueue claimed the queue, then the status write never happened: status.adopted is
        // unset, but the marker on the queue keeps its policy, redrive settings and tags.
        let d = want(&QueueSpec { visibility_timeout_seconds: Some(50), ..Default::default() });
        let mut tags = converged_tags(&d);
        tags.push(("cost-center", "legacy"));
        tags.push((TAG_ADOPTED, "true"));
        let policy = r#"{"Version":"2012-10-17","Statement":[]}"#;
        let observed = existing(&[("VisibilityTimeout", "50"), ("Policy", policy)], Some(&tags), false);
        assert_eq!(plan(&d, &intent(false, true), &observed), Plan::Apply { steps: vec![], adopting: false });
        // Without the marker the same queue would be treated as one skyport made.
        tags.retain(|(k, _)| *k != TAG_ADOPTED);
        let observed = existing(&[("VisibilityTimeout", "50"), ("Policy", policy)], Some(&tags), false);
        let Plan::Apply { steps, .. } = plan(&d, &intent(false, true), &observed) else { panic!() };
        assert!(steps.contains(&Step::SetAttributes([("Policy".to_string(), String::new())].into())), "{steps:?}");
    }

    #[test]
    fn a_queue_adopted_before_the_marker_existed_gets_it() {
        let d = want(&QueueSpec::default());
        let observed = existing(&[], Some(&converged_tags(&d)), true);
        let adopted = Intent { adopted: true, ..intent(false, true) };
        let Plan::Apply { steps, .. } = plan(&d, &adopted, &observed) else { panic!() };
        assert_eq!(steps, vec![Step::Tag([(TAG_ADOPTED.to_string(), "true".to_string())].into())]);
    }

    #[test]
    fn a_queue_another_live_queue_of_this_namespace_owns_is_never_adopted() {
        let d = want(&QueueSpec::default());
        let theirs =
            [(TAG_OWNER_UID, "uid-2"), (TAG_OWNER_NAMESPACE, "ns"), (TAG_OWNER_NAME, "first"), (TAG_CLUSTER, "c-1")];
        let Observed::Present(mut e) = existing(&[], Some(&theirs), false) else { unreachable!() };
        for live in [Some(true), None] {
            e.owner_live = live;
            let p = plan(&d, &intent(false, true), &Observed::Present(e.clone()));
            let Plan::Wait { reason, message, retry } = p else { panic!("{p:?}") };
            assert_eq!((reason, retry), ("OwnedByAnotherQueue", Some(RECHECK)));
            assert!(message.contains("first"), "{message}");
        }
        e.owner_live = Some(false);
        let p = plan(&d, &intent(false, true), &Observed::Present(e.clone()));
        assert!(matches!(p, Plan::Apply { adopting: true, .. }), "its owner is gone: {p:?}");
        let p = plan(&d, &intent(false, false), &Observed::Present(e));
        assert!(matches!(p, Plan::Wait { reason: "AlreadyExists", .. }), "never without adopt: {p:?}");
    }

    #[test]
    fn another_namespaces_or_clusters_queue_is_never_adopted_nor_named() {
        let d = want(&QueueSpec::default());
        let cases = [
            ("theirs", "c-1", "OwnedByAnotherNamespace"),
            ("ns", "c-2", "OwnedByAnotherCluster"),
            ("theirs", "c-2", "OwnedByAnotherCluster"),
        ];
        for (ns, cluster, want_reason) in cases {
            let theirs = [
                (TAG_OWNER_UID, "uid-2"),
                (TAG_OWNER_NAMESPACE, ns),
                (TAG_OWNER_NAME, "secret-name"),
                (TAG_CLUSTER, cluster),
            ];
            let Observed::Present(mut e) = existing(&[], Some(&theirs), false) else { unreachable!() };
            e.owner_live = Some(false);
            let p = plan(&d, &intent(false, true), &Observed::Present(e.clone()));
            let Plan::Wait { reason, message, .. } = p else { panic!("{p:?}") };
            assert_eq!(reason, want_reason);
            assert!(!message.contains("secret-name") && !message.contains("theirs"), "{message}");
            let Plan::Wait { message, .. } = plan(&d, &intent(false, false), &Observed::Present(e)) else { panic!() };
            assert!(!message.contains("secret-name") && !message.contains("theirs"), "{message}");
        }
    }

    #[test]
    fn a_queue_made_outside_skyport_is_adopted_only_where_the_platform_granted_it() {
        let d = want(&QueueSpec::default());
        let observed = existing(&[], Some(&[("team", "legacy")]), false);
        let no_grant = Intent { grants: &[], ..intent(false, true) };
        let p = plan(&d, &no_grant, &observed);
        assert!(matches!(p, Plan::Wait { reason: "AdoptionNotAllowed", .. }), "{p:?}");
        assert!(matches!(plan(&d, &intent(false, true), &observed), Plan::Apply { adopting: true, .. }));
    }

    #[test]
    fn writes_wait_for_a_fresh_look_at_the_owner_tag() {
        let d = want(&QueueSpec { visibility_timeout_seconds: Some(50), ..Default::default() });
        let observed = existing(&[("VisibilityTimeout", "11")], None, true);
        assert_eq!(
            plan(&d, &intent(false, false), &observed),
            Plan::NeedTags,
            "verified earlier is not enough to write"
        );
        let observed = existing(&[("VisibilityTimeout", "50")], None, true);
        assert_eq!(plan(&d, &intent(false, false), &observed), Plan::Apply { steps: vec![], adopting: false });
        let observed = existing(&[("VisibilityTimeout", "50")], None, false);
        assert_eq!(plan(&d, &intent(false, false), &observed), Plan::NeedTags, "never proven: read the tags");
    }

    #[test]
    fn queue_tagged_with_our_uid_is_ours_even_without_a_recorded_url() {
        let d = want(&QueueSpec::default());
        let tags = converged_tags(&d);
        let observed = existing(&[], Some(&tags), false);
        assert_eq!(plan(&d, &intent(false, false), &observed), Plan::Apply { steps: vec![], adopting: false });
    }
}

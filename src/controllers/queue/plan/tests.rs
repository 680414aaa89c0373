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
        Plan::Wait { reason: crate::reasons::Reason::AlreadyExists, retry: Some(RECHECK), .. }
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
        assert_eq!((reason.as_str(), retry), ("OwnedByAnotherQueue", Some(RECHECK)));
        assert!(message.contains("first"), "{message}");
    }
    e.owner_live = Some(false);
    let p = plan(&d, &intent(false, true), &Observed::Present(e.clone()));
    assert!(matches!(p, Plan::Apply { adopting: true, .. }), "its owner is gone: {p:?}");
    let p = plan(&d, &intent(false, false), &Observed::Present(e));
    assert!(
        matches!(p, Plan::Wait { reason: crate::reasons::Reason::AlreadyExists, .. }),
        "never without adopt: {p:?}"
    );
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
    assert!(matches!(p, Plan::Wait { reason: crate::reasons::Reason::AdoptionNotAllowed, .. }), "{p:?}");
    assert!(matches!(plan(&d, &intent(false, true), &observed), Plan::Apply { adopting: true, .. }));
}

#[test]
fn writes_wait_for_a_fresh_look_at_the_owner_tag() {
    let d = want(&QueueSpec { visibility_timeout_seconds: Some(50), ..Default::default() });
    let observed = existing(&[("VisibilityTimeout", "11")], None, true);
    assert_eq!(plan(&d, &intent(false, false), &observed), Plan::NeedTags, "verified earlier is not enough to write");
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

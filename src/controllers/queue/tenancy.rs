//! The namespace is the tenant boundary (pure): which SQS queue names a namespace may use, which
//! existing queues it may adopt or send dead letters to. Messages never name another namespace's
//! objects: a tenant learns only that the queue is not theirs.

use providers::sqs::Tags;

use super::desired::{TAG_CLUSTER, TAG_OWNER_NAME, TAG_OWNER_NAMESPACE, TAG_OWNER_UID};
use crate::config::NameGrant;
use crate::reasons::Reason;

/// Why a Queue may not use a name or a queue: (reason, message).
pub type Refusal = (Reason, String);

/// Who an existing queue belongs to, as far as its skyport tags say, seen from one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// No skyport owner tag: made outside skyport.
    Untagged,
    /// A Queue of this namespace in this cluster: (its UID, its name).
    SameNamespace { uid: String, name: String },
    /// A Queue of another namespace (in this cluster or any other).
    OtherNamespace,
    /// A Queue of another cluster sharing the AWS account.
    OtherCluster,
    /// Owner-tagged without a cluster tag: no one can tell which cluster's Queue it was.
    UnknownCluster,
}

/// Reads the owner tags of an existing queue. `cluster` empty: this operator has no cluster id,
/// and only the namespace is compared.
pub fn holder(tags: &Tags, namespace: &str, cluster: &str) -> Holder {
    let Some(uid) = tags.get(TAG_OWNER_UID) else { return Holder::Untagged };
    if !cluster.is_empty() {
        match tags.get(TAG_CLUSTER) {
            None => return Holder::UnknownCluster,
            Some(c) if c != cluster => return Holder::OtherCluster,
            Some(_) => {}
        }
    }
    if tags.get(TAG_OWNER_NAMESPACE).map(String::as_str) != Some(namespace) {
        return Holder::OtherNamespace;
    }
    Holder::SameNamespace { uid: uid.clone(), name: tags.get(TAG_OWNER_NAME).cloned().unwrap_or_default() }
}

/// Whether the platform granted `namespace` queues named `name` (`--queue-name-grant`).
pub fn granted(namespace: &str, name: &str, grants: &[NameGrant]) -> bool {
    grants.iter().any(|g| g.namespace == namespace && g.matches(name))
}

/// Why `namespace` may not ask for the explicit SQS name `name`, if it may not. Names of the
/// form `<namespace>_…` are every namespace's default form and belong to that namespace; names
/// the platform granted to other namespaces (and not to this one) are theirs.
pub fn name_refusal(namespace: &str, name: &str, grants: &[NameGrant]) -> Option<Refusal> {
    if let Some((prefix, _)) = name.split_once('_')
        && is_namespace_name(prefix)
        && prefix != namespace
    {
        return Some((
            Reason::QueueNameReserved,
            format!(
                "spec.queueName {name:?} has the form <namespace>_<name> that skyport gives the Queues of namespace {prefix:?}; a Queue may use that form only for its own namespace: start the name with \"{namespace}_\" or leave '_' out of the part before it"
            ),
        ));
    }
    let elsewhere = grants.iter().any(|g| g.namespace != namespace && g.matches(name));
    (elsewhere && !granted(namespace, name, grants)).then(|| {
        (
            Reason::QueueNameReserved,
            format!(
                "spec.queueName {name:?} is reserved by the platform team for another namespace (--queue-name-grant); choose another name"
            ),
        )
    })
}

/// Why a Queue of `namespace` asking to adopt the existing queue `name` may not, if it may not.
/// `owner_live` matters only for a Queue of the same namespace.
pub fn adoption_refusal(
    holder: &Holder,
    namespace: &str,
    name: &str,
    grants: &[NameGrant],
    owner_live: Option<bool>,
) -> Option<Refusal> {
    match holder {
        Holder::Untagged if granted(namespace, name, grants) => None,
        Holder::Untagged => Some((
            Reason::AdoptionNotAllowed,
            format!(
                "the SQS queue {name:?} was not created by skyport, and the platform team has not granted namespace {namespace} queues of that name: adopting it needs --queue-name-grant {namespace}=<pattern> on the operator"
            ),
        )),
        Holder::SameNamespace { .. } if owner_live == Some(false) => None,
        Holder::SameNamespace { name: owner, .. } => Some((
            Reason::OwnedByAnotherQueue,
            match owner_live {
                Some(_) => format!(
                    "the SQS queue {name:?} belongs to Queue {owner}, which still exists; adopt only takes queues no live Queue owns. Delete that Queue (with deletionPolicy Retain to keep the queue) or choose another spec.queueName"
                ),
                None => format!(
                    "the SQS queue {name:?} is tagged as belonging to Queue {owner}, and skyport could not check whether that Queue still exists; retrying"
                ),
            },
        )),
        Holder::OtherNamespace => Some((
            Reason::OwnedByAnotherNamespace,
            format!(
                "the SQS queue {name:?} belongs to a Queue of another namespace; skyport never moves a queue between namespaces: choose another spec.queueName"
            ),
        )),
        Holder::OtherCluster => Some((
            Reason::OwnedByAnotherCluster,
            format!(
                "the SQS queue {name:?} belongs to a Queue of another cluster sharing this AWS account; choose another spec.queueName"
            ),
        )),
        Holder::UnknownCluster => Some((
            Reason::OwnedByAnotherCluster,
            format!(
                "the SQS queue {name:?} carries a skyport owner tag but no skyport.dev/cluster tag, so no cluster can prove it is its own; if it is this cluster's, tag it skyport.dev/cluster=<this cluster's id> in AWS, or choose another spec.queueName"
            ),
        )),
    }
}

/// Why a Queue of `namespace` may not send its dead letters to the existing queue `name` (its
/// `deadLetter` target, by ARN or through a Queue's status): SQS moves messages by the redrive
/// policy without asking the target queue's IAM policy, so a target of another tenant would
/// receive this tenant's messages. The message does not repeat the name: a default name carries
/// the other namespace's.
pub fn dead_letter_refusal(holder: &Holder, namespace: &str, name: &str, grants: &[NameGrant]) -> Option<Refusal> {
    let refusal = |why: &str| {
        Some((
            Reason::DeadLetterNotAllowed,
            format!(
                "the dead-letter target (spec.deadLetter) is an SQS queue which {why}; point it at a Queue of this namespace (deadLetter.queueRef)"
            ),
        ))
    };
    match holder {
        Holder::SameNamespace { .. } => None,
        Holder::Untagged if granted(namespace, name, grants) => None,
        Holder::Untagged => refusal(&format!(
            "skyport did not create and the platform team has not granted namespace {namespace} (--queue-name-grant)"
        )),
        Holder::OtherNamespace => refusal("belongs to a Queue of another namespace"),
        Holder::OtherCluster | Holder::UnknownCluster => refusal("does not belong to a Queue of this cluster"),
    }
}

/// A Kubernetes namespace name: a DNS label.
fn is_namespace_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(entries: &[(&str, &str)]) -> Tags {
        entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn grant(namespace: &str, pattern: &str) -> NameGrant {
        NameGrant { namespace: namespace.into(), pattern: pattern.into() }
    }

    fn owned(ns: &str, cluster: Option<&str>) -> Tags {
        let mut t = tags(&[(TAG_OWNER_UID, "u-2"), (TAG_OWNER_NAMESPACE, ns), (TAG_OWNER_NAME, "payments")]);
        if let Some(c) = cluster {
            t.insert(TAG_CLUSTER.into(), c.into());
        }
        t
    }

    #[test]
    fn the_owner_tags_say_whose_a_queue_is() {
        assert_eq!(holder(&tags(&[("team", "x")]), "a", "c1"), Holder::Untagged);
        assert_eq!(
            holder(&owned("a", Some("c1")), "a", "c1"),
            Holder::SameNamespace { uid: "u-2".into(), name: "payments".into() }
        );
        assert_eq!(holder(&owned("b", Some("c1")), "a", "c1"), Holder::OtherNamespace);
        assert_eq!(holder(&owned("a", Some("c2")), "a", "c1"), Holder::OtherCluster, "same namespace name elsewhere");
        assert_eq!(holder(&owned("a", None), "a", "c1"), Holder::UnknownCluster);
        assert!(matches!(holder(&owned("a", None), "a", ""), Holder::SameNamespace { .. }), "no cluster id here");
    }

    #[test]
    fn another_namespaces_queue_is_never_adopted_even_when_its_queue_is_gone() {
        for live in [Some(true), Some(false), None] {
            let (reason, message) = adoption_refusal(&Holder::OtherNamespace, "a", "shared", &[], live).unwrap();
            assert_eq!(reason, "OwnedByAnotherNamespace");
            assert!(!message.contains("payments"), "names nothing of theirs: {message}");
        }
        let other_cluster = adoption_refusal(&Holder::OtherCluster, "a", "q", &[grant("a", "*")], Some(false));
        assert_eq!(other_cluster.map(|r| r.0.as_str()), Some("OwnedByAnotherCluster"));
        assert!(adoption_refusal(&Holder::UnknownCluster, "a", "q", &[], Some(false)).is_some());
    }

    #[test]
    fn a_namespace_takes_back_its_own_retained_queue_once_its_queue_is_gone() {
        let mine = Holder::SameNamespace { uid: "u-2".into(), name: "payments".into() };
        assert_eq!(adoption_refusal(&mine, "a", "q", &[], Some(false)), None);
        let live = adoption_refusal(&mine, "a", "q", &[], Some(true)).unwrap();
        assert_eq!(live.0, "OwnedByAnotherQueue");
        assert!(live.1.contains("payments"), "the same namespace may see its own names: {}", live.1);
        assert_eq!(adoption_refusal(&mine, "a", "q", &[], None).map(|r| r.0.as_str()), Some("OwnedByAnotherQueue"));
    }

    #[test]
    fn queues_made_outside_skyport_are_adoptable_only_where_granted() {
        let refused = adoption_refusal(&Holder::Untagged, "a", "legacy-orders", &[], None).unwrap();
        assert_eq!(refused.0, "AdoptionNotAllowed");
        assert!(refused.1.contains("--queue-name-grant a="), "{}", refused.1);
        let grants = [grant("a", "legacy-*"), grant("b", "old-*")];
        assert_eq!(adoption_refusal(&Holder::Untagged, "a", "legacy-orders", &grants, None), None);
        assert!(adoption_refusal(&Holder::Untagged, "a", "old-orders", &grants, None).is_some());
    }

    #[test]
    fn the_default_name_form_of_another_namespace_is_refused() {
        assert_eq!(name_refusal("a", "b_payments", &[]).map(|r| r.0.as_str()), Some("QueueNameReserved"));
        assert_eq!(name_refusal("a", "a_payments", &[]), None);
        assert_eq!(name_refusal("a", "payments", &[]), None);
        assert_eq!(name_refusal("a", "Legacy_Orders", &[]), None, "not a namespace's form");
        assert_eq!(name_refusal("team-a", "team-b_x.fifo", &[]).map(|r| r.0.as_str()), Some("QueueNameReserved"));
    }

    #[test]
    fn names_granted_to_another_namespace_are_theirs() {
        let grants = [grant("b", "billing-*"), grant("a", "billing-shared")];
        let (reason, message) = name_refusal("a", "billing-invoices", &grants).unwrap();
        assert_eq!(reason, "QueueNameReserved");
        assert!(!message.contains("\"b\""), "does not name the other namespace: {message}");
        assert_eq!(name_refusal("b", "billing-invoices", &grants), None);
        assert_eq!(name_refusal("a", "billing-shared", &grants), None, "granted to both");
    }

    #[test]
    fn dead_letters_go_only_to_queues_of_this_namespace_or_granted_ones() {
        let mine = Holder::SameNamespace { uid: "u".into(), name: "dlq".into() };
        assert_eq!(dead_letter_refusal(&mine, "a", "a_dlq", &[]), None);
        assert_eq!(
            dead_letter_refusal(&Holder::OtherNamespace, "a", "b_dlq", &[]).map(|r| r.0.as_str()),
            Some("DeadLetterNotAllowed")
        );
        assert!(dead_letter_refusal(&Holder::OtherCluster, "a", "x", &[]).is_some());
        assert!(dead_letter_refusal(&Holder::Untagged, "a", "legacy-dlq", &[]).is_some());
        assert_eq!(dead_letter_refusal(&Holder::Untagged, "a", "legacy-dlq", &[grant("a", "legacy-*")]), None);
    }
}

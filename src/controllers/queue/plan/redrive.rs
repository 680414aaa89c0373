//! Which dead-letter target a pass must prove this namespace's (pure). SQS moves dead letters by
//! the source queue's redrive policy without asking the target, and a queue name is free again
//! once its queue is deleted: a redrive is only ever written to, and only ever left pointing at,
//! a queue whose owner tags say it is this namespace's (see [`super::tenancy`]).

use super::{Observed, Plan, Step};

/// The queue a RedrivePolicy document sends dead letters to.
pub fn target(policy: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_str(policy).ok()?;
    doc.get("deadLetterTargetArn")?.as_str().filter(|arn| !arn.is_empty()).map(String::from)
}

/// A dead-letter target to prove before the pass ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// The plan writes a redrive to it: nothing is written unless it is proven.
    Written(String),
    /// A redrive to it is on the queue and stays: taken off unless it is proven.
    InPlace(String),
}

impl Proof {
    pub fn arn(&self) -> &str {
        match self {
            Proof::Written(arn) | Proof::InPlace(arn) => arn,
        }
    }
}

/// What `steps` write to RedrivePolicy: `None` when they leave it alone (`Some("")` removes it).
fn written(steps: &[Step]) -> Option<&str> {
    steps.iter().rev().find_map(|s| match s {
        Step::Create { attributes, .. } | Step::SetAttributes(attributes) => {
            attributes.get("RedrivePolicy").map(String::as_str)
        }
        _ => None,
    })
}

/// The target `plan` and the queue's redrive leave to prove: the one the plan writes, always;
/// else the one in place when `due` (its last proof is older than the owner tags' re-read
/// cadence, or there is none for it). Nothing when the plan writes nothing to a queue that is
/// ours (a `Wait` or a tag read first), nor for the redrive of a queue being adopted, which is
/// not ours until the plan's first step claims it (the next pass looks at it).
pub fn to_prove(plan: &Plan, observed: &Observed, due: impl FnOnce(&str) -> bool) -> Option<Proof> {
    let Plan::Apply { steps, adopting } = plan else { return None };
    if let Some(doc) = written(steps) {
        return target(doc).map(Proof::Written);
    }
    in_place(observed).filter(|arn| !adopting && due(arn)).map(Proof::InPlace)
}

/// The target of the redrive on the observed queue, if it has one.
pub fn in_place(observed: &Observed) -> Option<String> {
    let Observed::Present(existing) = observed else { return None };
    target(existing.attributes.get("RedrivePolicy")?)
}

#[cfg(test)]
mod tests {
    use super::super::Existing;
    use super::*;

    const ARN: &str = "arn:aws:sqs:eu-west-1:000000000000:ns_dlq";

    fn doc(arn: &str) -> String {
        serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": "3"}).to_string()
    }

    fn queue_with(redrive: Option<&str>) -> Observed {
        let attributes = redrive.map(|r| ("RedrivePolicy".to_string(), r.to_string())).into_iter().collect();
        Observed::Present(Existing {
            url: "http://sqs/000000000000/ns_q".into(),
            attributes,
            tags: None,
            verified: true,
            owner_live: None,
        })
    }

    fn apply(steps: Vec<Step>) -> Plan {
        Plan::Apply { steps, adopting: false }
    }

    #[test]
    fn a_redrive_being_written_is_always_proven_first() {
        let set = Step::SetAttributes([("RedrivePolicy".to_string(), doc(ARN))].into());
        let proof = to_prove(&apply(vec![set]), &queue_with(None), |_| false);
        assert_eq!(proof, Some(Proof::Written(ARN.into())), "whatever the cadence says");
        let create = Step::Create {
            name: "ns_q".into(),
            attributes: [("RedrivePolicy".to_string(), doc(ARN))].into(),
            tags: Default::default(),
        };
        assert_eq!(to_prove(&apply(vec![create]), &Observed::Absent, |_| false), Some(Proof::Written(ARN.into())));
    }

    #[test]
    fn a_redrive_left_in_place_is_proven_again_at_the_tag_cadence() {
        let converged = apply(Vec::new());
        let observed = queue_with(Some(&doc(ARN)));
        assert_eq!(to_prove(&converged, &observed, |_| false), None, "proven recently");
        assert_eq!(to_prove(&converged, &observed, |arn| arn == ARN), Some(Proof::InPlace(ARN.into())));
        let other_write = apply(vec![Step::SetAttributes([("DelaySeconds".to_string(), "5".to_string())].into())]);
        assert_eq!(to_prove(&other_write, &observed, |_| true), Some(Proof::InPlace(ARN.into())));
    }

    #[test]
    fn removing_a_redrive_or_not_writing_needs_no_proof() {
        let observed = queue_with(Some(&doc(ARN)));
        let removal = Step::SetAttributes([("RedrivePolicy".to_string(), String::new())].into());
        assert_eq!(to_prove(&apply(vec![removal]), &observed, |_| true), None);
        let wait = Plan::Wait { reason: crate::reasons::Reason::AlreadyExists, message: String::new(), retry: None };
        assert_eq!(to_prove(&wait, &observed, |_| true), None, "not our queue: nothing of ours on it");
        assert_eq!(to_prove(&Plan::NeedTags, &observed, |_| true), None);
        let adopting = Plan::Apply { steps: Vec::new(), adopting: true };
        assert_eq!(to_prove(&adopting, &observed, |_| true), None, "not claimed yet: looked at next pass");
        assert_eq!(to_prove(&apply(Vec::new()), &queue_with(None), |_| true), None, "no redrive");
        assert_eq!(to_prove(&apply(Vec::new()), &queue_with(Some("{}")), |_| true), None, "an empty document");
    }
}

//! Status conditions in the shape Kubernetes tooling understands (`kubectl wait --for=condition`).

use compact_str::CompactString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a condition holds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

// Its strings are `CompactString`s: the same JSON and schema as `String`, but up to 24 bytes
// are kept inline. Type, reason and time always fit, so a cached object's conditions allocate
// only their messages (two conditions on every cached Queue, 56 bytes less each).
/// One observation of an aspect of the object's state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Kind of condition: `Ready` (the cloud resource exists and is usable) or `Synced` (the last
    /// reconcile applied the current spec without error).
    #[serde(rename = "type")]
    pub type_: CompactString,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Machine-readable reason in PascalCase, for example `Available` or `RecentlyDeleted`.
    pub reason: CompactString,
    /// Human-readable explanation, including what to do when something is wrong.
    #[serde(default)]
    pub message: CompactString,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: CompactString,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    pub fn new(type_: &str, status: ConditionStatus, reason: &str, message: impl Into<CompactString>) -> Self {
        Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: CompactString::default(),
            observed_generation: None,
        }
    }
}

/// Merges `next` into `previous`, keeping `lastTransitionTime` when the status did not change so
/// that an unchanged observation produces an identical status (and so no API write).
pub fn merge(previous: &[Condition], mut next: Vec<Condition>, now: &str) -> Vec<Condition> {
    for c in &mut next {
        c.last_transition_time = match previous.iter().find(|p| p.type_ == c.type_) {
            Some(p) if p.status == c.status && !p.last_transition_time.is_empty() => p.last_transition_time.clone(),
            _ => now.into(),
        };
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut old = Condition::new("Ready", ConditionStatus::True, "Available", "");
        old.last_transition_time = "2026-01-01T00:00:00Z".into();
        let same = merge(
            std::slice::from_ref(&old),
            vec![Condition::new("Ready", ConditionStatus::True, "Available", "x")],
            "2026-02-02T00:00:00Z",
        );
        assert_eq!(same[0].last_transition_time, "2026-01-01T00:00:00Z");
        let flipped = merge(
            &[old],
            vec![Condition::new("Ready", ConditionStatus::False, "Unavailable", "")],
            "2026-02-02T00:00:00Z",
        );
        assert_eq!(flipped[0].last_transition_time, "2026-02-02T00:00:00Z");
    }
}

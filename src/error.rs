//! The operator's one error type and its policy: which failures are permanent (wait for the user)
//! and which are transient (retry with backoff), and the PascalCase reason each one reports.

use providers::{ErrorClass, HostError, QueueError};

use crate::reasons::Reason;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Queue(#[from] QueueError),
    #[error("{0}")]
    Host(#[from] HostError),
    #[error("object has no {0}")]
    MissingObjectKey(&'static str),
    /// The user's input cannot be served as written (a spec, an annotation, an object in the
    /// way): reported as `InvalidSpec` and left until the user changes something.
    #[error("{0}")]
    InvalidSpec(String),
    /// skyport failed on its own side (a document it builds does not serialize or render, its
    /// own configuration is unusable, an object it made vanished mid-way): not the user's to fix,
    /// so never reported as a spec error, and retried with backoff.
    #[error("internal error: {0}")]
    Internal(String),
    #[error("{0}")]
    Artifact(#[from] crate::tunnel::verify::ArtifactProblem),
    /// A Tunnel slot created its day's exit servers (`--tunnel-max-hosts-per-day`): nothing is
    /// created until `retry_after` has passed.
    #[error("{message}")]
    HostBudget { message: String, retry_after: std::time::Duration },
    /// The reserved address a Service names (`skyport.dev/reserved-address`) cannot be handed
    /// to its Tunnel: not found, not retained here, or still held. Retried with backoff, since
    /// the Tunnel holding it may yet be deleted.
    #[error("{0}")]
    Handover(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Permanent errors are reported and then left until the object changes; retrying them
    /// would only repeat the same refusal.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Queue(e) => e.class() == ErrorClass::Permanent,
            Error::Host(e) => e.class() == ErrorClass::Permanent,
            Error::InvalidSpec(_) | Error::MissingObjectKey(_) => true,
            // A file published or a mirror fixed later heals it without touching the object.
            Error::Kube(_)
            | Error::Internal(_)
            | Error::Artifact(_)
            | Error::HostBudget { .. }
            | Error::Handover(_) => false,
        }
    }

    /// Stable reason for conditions, Events and metrics.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Kube(_) => Reason::KubernetesApiError,
            Error::MissingObjectKey(_) => Reason::InvalidObject,
            Error::InvalidSpec(_) => Reason::InvalidSpec,
            Error::Internal(_) => Reason::InternalError,
            Error::Artifact(p) => p.reason(),
            Error::HostBudget { .. } => Reason::HostBudgetSpent,
            Error::Handover(_) => Reason::AddressNotHandedOver,
            Error::Queue(e) => match e {
                QueueError::NotFound => Reason::NotFound,
                QueueError::DeletedRecently(_) => Reason::RecentlyDeleted,
                QueueError::AlreadyExists(_) => Reason::AlreadyExists,
                QueueError::Invalid { .. } => Reason::InvalidAttribute,
                QueueError::AccessDenied { .. } => Reason::AccessDenied,
                QueueError::CredentialsRejected { .. } => Reason::CredentialsRejected,
                QueueError::AssumeRoleRefused { .. } => Reason::AssumeRoleDenied,
                QueueError::Throttled { .. } => Reason::Throttled,
                QueueError::Unavailable(_) => Reason::SqsUnavailable,
                QueueError::Other { .. } => Reason::SqsError,
            },
            Error::Host(e) => match e {
                HostError::RateLimited { .. } => Reason::ProviderRateLimited,
                HostError::Unauthorized { .. } => Reason::ProviderUnauthorized,
                HostError::Invalid { .. } => Reason::ProviderRejected,
                HostError::NotFound { .. } => Reason::ProviderNotFound,
                HostError::AlreadyExists { .. } => Reason::ProviderConflict,
                HostError::Quota { .. } => Reason::ProviderQuotaExceeded,
                HostError::Unavailable { .. } => Reason::ProviderUnavailable,
                HostError::NoDefaultVpc { .. } => Reason::ProviderNoDefaultVpc,
            },
        }
    }

    /// Failures that heal on the scale of token refreshes and key rotations, not seconds (refused
    /// credentials): retried no faster than the controller's slow floor (one resync).
    pub fn heals_slowly(&self) -> bool {
        matches!(self, Error::Queue(QueueError::CredentialsRejected { .. } | QueueError::AssumeRoleRefused { .. }))
    }

    /// How long the cloud asked us to wait before the next call, when it said so.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Host(e) => e.retry_after(),
            Error::HostBudget { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_error_waits_for_the_user_an_internal_failure_is_retried() {
        let spec = Error::InvalidSpec("annotation skyport.dev/address: \"x\" is not one of Reserved, Ephemeral".into());
        assert!(spec.is_permanent());
        assert_eq!(spec.reason(), "InvalidSpec");
        let internal = Error::Internal("client Deployment: missing field `spec`".into());
        assert!(!internal.is_permanent(), "an internal failure is retried with backoff");
        assert_eq!(internal.reason(), "InternalError");
        assert_ne!(internal.reason(), spec.reason(), "users never see an internal failure as a spec error");
        assert!(internal.to_string().starts_with("internal error: "), "{internal}");
        assert!(internal.retry_after().is_none() && !internal.heals_slowly());
    }
}

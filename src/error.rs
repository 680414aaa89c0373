//! The operator's one error type and its policy: which failures are permanent (wait for the user)
//! and which are transient (retry with backoff), and the PascalCase reason each one reports.

use providers::{ErrorClass, QueueError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Queue(#[from] QueueError),
    #[error("object has no {0}")]
    MissingObjectKey(&'static str),
    #[error("{0}")]
    InvalidSpec(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Permanent errors are reported and then left until the object changes; retrying them
    /// would only repeat the same refusal.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Queue(e) => e.class() == ErrorClass::Permanent,
            Error::InvalidSpec(_) | Error::MissingObjectKey(_) => true,
            Error::Kube(_) => false,
        }
    }

    /// Stable reason for conditions, Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesApiError",
            Error::MissingObjectKey(_) => "InvalidObject",
            Error::InvalidSpec(_) => "InvalidSpec",
            Error::Queue(e) => match e {
                QueueError::NotFound => "NotFound",
                QueueError::DeletedRecently(_) => "RecentlyDeleted",
                QueueError::AlreadyExists(_) => "AlreadyExists",
                QueueError::Invalid { .. } => "InvalidAttribute",
                QueueError::AccessDenied { .. } => "AccessDenied",
                QueueError::Throttled { .. } => "Throttled",
                QueueError::Unavailable(_) => "SqsUnavailable",
                QueueError::Other { .. } => "SqsError",
            },
        }
    }
}

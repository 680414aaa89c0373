//! Provider errors, classified once so that every controller applies the same retry policy.

/// How the controller should react to a failed cloud call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retrying cannot help until the user changes something (spec, IAM policy).
    Permanent,
    /// The call may succeed later (throttling, network, 5xx).
    Transient,
}

/// A failed SQS call. Messages come from AWS and never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue does not exist")]
    NotFound,
    #[error("the queue name was deleted less than 60 seconds ago and cannot be reused yet: {0}")]
    DeletedRecently(String),
    #[error("a queue with this name already exists with different attributes: {0}")]
    AlreadyExists(String),
    #[error("SQS rejected the request ({code}): {message}")]
    Invalid { code: String, message: String },
    #[error("access denied by AWS ({code}): {message}")]
    AccessDenied { code: String, message: String },
    /// The credentials themselves were refused: expired, not (yet) known to AWS, or signed with a
    /// key being rotated. Unlike a missing permission this often heals by itself (a refreshed
    /// web-identity token, a rotated Secret reaching the pod), so it is retried, slowly.
    #[error("AWS refused the credentials ({code}): {message}")]
    CredentialsRejected { code: String, message: String },
    /// STS refused to let the operator assume an AwsAccount's role: its trust policy does not
    /// name the operator's identity, or requires another external id or session name. Fixed in
    /// IAM, outside the cluster, so it is retried, slowly.
    #[error(
        "STS refused AssumeRole ({code}): {message}; the role's trust policy must allow the operator's identity with the condition sts:ExternalId equal to the AwsAccount's status.externalId"
    )]
    AssumeRoleRefused { code: String, message: String },
    #[error("SQS throttled the request ({code}): {message}")]
    Throttled { code: String, message: String },
    #[error("SQS endpoint unreachable or failing: {0}")]
    Unavailable(String),
    #[error("SQS call failed ({code}): {message}")]
    Other { code: String, message: String },
}

impl QueueError {
    pub fn class(&self) -> ErrorClass {
        match self {
            QueueError::Invalid { .. } | QueueError::AccessDenied { .. } => ErrorClass::Permanent,
            QueueError::NotFound
            | QueueError::DeletedRecently(_)
            | QueueError::AlreadyExists(_)
            | QueueError::Throttled { .. }
            | QueueError::CredentialsRejected { .. }
            | QueueError::AssumeRoleRefused { .. }
            | QueueError::Unavailable(_)
            | QueueError::Other { .. } => ErrorClass::Transient,
        }
    }

    /// Stable snake_case label for metrics (the `outcome` of a failed cloud call).
    pub fn label(&self) -> &'static str {
        match self {
            QueueError::NotFound => "not_found",
            QueueError::DeletedRecently(_) => "deleted_recently",
            QueueError::AlreadyExists(_) => "already_exists",
            QueueError::Invalid { .. } => "invalid",
            QueueError::AccessDenied { .. } => "access_denied",
            QueueError::CredentialsRejected { .. } => "credentials_rejected",
            QueueError::AssumeRoleRefused { .. } => "assume_role_refused",
            QueueError::Throttled { .. } => "throttled",
            QueueError::Unavailable(_) => "unavailable",
            QueueError::Other { .. } => "other",
        }
    }

    /// Maps an AWS error code (query- or JSON-protocol spelling) and message to a variant.
    pub fn from_code(code: &str, message: String) -> Self {
        let short = code.rsplit(['.', '#']).next().unwrap_or(code);
        match short {
            "NonExistentQueue" | "QueueDoesNotExist" => QueueError::NotFound,
            "QueueDeletedRecently" => QueueError::DeletedRecently(message),
            "QueueAlreadyExists" | "QueueNameExists" => QueueError::AlreadyExists(message),
            "InvalidAttributeName"
            | "InvalidAttributeValue"
            | "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidAddress"
            | "UnsupportedOperation"
            | "ValidationError"
            | "TooManyEntriesInBatchRequest"
            | "KmsInvalidKeyUsage"
            | "KmsNotFound"
            | "KmsInvalidState" => QueueError::Invalid { code: code.to_string(), message },
            "AccessDenied" | "AccessDeniedException" | "InvalidSecurity" | "KmsAccessDenied" | "KmsDisabled" => {
                QueueError::AccessDenied { code: code.to_string(), message }
            }
            "ExpiredToken"
            | "ExpiredTokenException"
            | "RequestExpired"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "SignatureDoesNotMatch"
            | "MissingAuthenticationToken" => QueueError::CredentialsRejected { code: code.to_string(), message },
            "RequestThrottled" | "ThrottlingException" | "Throttling" | "OverLimit" | "KmsThrottled" => {
                QueueError::Throttled { code: code.to_string(), message }
            }
            "InternalError" | "InternalFailure" | "ServiceUnavailable" => {
                QueueError::Unavailable(format!("{code}: {message}"))
            }
            _ => QueueError::Other { code: code.to_string(), message },
        }
    }
}

/// A failed exit-server host call (DigitalOcean, Hetzner Cloud, ...). Messages come from the
/// provider's error body with the API token scrubbed out, so they are safe to log and to put in
/// status conditions and Events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The provider throttled us (HTTP 429) or our own view of its quota says to wait.
    /// `retry_after` is the provider's `Retry-After`, else the time until its rate-limit reset.
    #[error("{provider} rate limit reached{}", retry_hint(.retry_after))]
    RateLimited { provider: &'static str, retry_after: Option<std::time::Duration> },
    /// The token is missing, wrong, expired or lacks the scope (HTTP 401 / 403).
    #[error("{provider} rejected the credentials: {message}")]
    Unauthorized { provider: &'static str, message: String },
    /// The request itself is wrong (unknown region or size, bad user data; HTTP 400 / 422).
    #[error("{provider} rejected the request: {message}")]
    Invalid { provider: &'static str, message: String },
    /// The host (or another referenced object) does not exist (HTTP 404).
    #[error("{provider}: not found: {message}")]
    NotFound { provider: &'static str, message: String },
    /// An object with the same unique field (the server name) already exists (HTTP 409).
    #[error("{provider}: already exists: {message}")]
    AlreadyExists { provider: &'static str, message: String },
    /// An account limit was reached (number of servers, cores, IPs).
    #[error("{provider} quota exceeded: {message}")]
    Quota { provider: &'static str, message: String },
    /// Network failure, timeout, 5xx, maintenance, a locked resource or a malformed response.
    #[error("{provider} unavailable: {message}")]
    Unavailable { provider: &'static str, message: String },
    /// The account has no default network where the host would go (EC2: no default VPC in the
    /// region) and the operator names none (`--ec2-subnet-ids`). Fixed in the operator's settings.
    #[error("{provider}: {message}")]
    NoDefaultVpc { provider: &'static str, message: String },
}

fn retry_hint(retry_after: &Option<std::time::Duration>) -> String {
    match retry_after {
        Some(d) => format!(", retry after {:.1}s", d.as_secs_f64()),
        None => String::new(),
    }
}

impl HostError {
    /// Invalid input and bad credentials need a user to act; everything else may pass with time.
    /// A quota counts as transient: it frees up when hosts are deleted, including by the
    /// operator's own orphan sweep, and the controller's backoff keeps retries cheap.
    pub fn class(&self) -> ErrorClass {
        match self {
            HostError::Unauthorized { .. } | HostError::Invalid { .. } | HostError::NoDefaultVpc { .. } => {
                ErrorClass::Permanent
            }
            HostError::RateLimited { .. }
            | HostError::NotFound { .. }
            | HostError::AlreadyExists { .. }
            | HostError::Quota { .. }
            | HostError::Unavailable { .. } => ErrorClass::Transient,
        }
    }

    /// How long the provider asked us to wait, when it said so.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            HostError::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Stable snake_case label for metrics (the `outcome` of a failed cloud call) and logs.
    pub fn label(&self) -> &'static str {
        match self {
            HostError::RateLimited { .. } => "rate_limited",
            HostError::Unauthorized { .. } => "unauthorized",
            HostError::Invalid { .. } => "invalid",
            HostError::NotFound { .. } => "not_found",
            HostError::AlreadyExists { .. } => "already_exists",
            HostError::Quota { .. } => "quota",
            HostError::Unavailable { .. } => "unavailable",
            HostError::NoDefaultVpc { .. } => "no_default_vpc",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_errors_needing_a_user_are_permanent_the_rest_transient() {
        let p = "test";
        let m = String::new;
        for e in [
            HostError::Unauthorized { provider: p, message: m() },
            HostError::Invalid { provider: p, message: m() },
            HostError::NoDefaultVpc { provider: p, message: m() },
        ] {
            assert_eq!(e.class(), ErrorClass::Permanent, "{e}");
        }
        for e in [
            HostError::RateLimited { provider: p, retry_after: None },
            HostError::NotFound { provider: p, message: m() },
            HostError::AlreadyExists { provider: p, message: m() },
            HostError::Quota { provider: p, message: m() },
            HostError::Unavailable { provider: p, message: m() },
        ] {
            assert_eq!(e.class(), ErrorClass::Transient, "{e}");
        }
        let e = HostError::RateLimited { provider: p, retry_after: Some(std::time::Duration::from_millis(2500)) };
        assert_eq!(e.to_string(), "test rate limit reached, retry after 2.5s");
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_millis(2500)));
    }

    #[test]
    fn query_and_json_protocol_codes_map_to_the_same_variant() {
        assert!(matches!(
            QueueError::from_code("AWS.SimpleQueueService.NonExistentQueue", String::new()),
            QueueError::NotFound
        ));
        assert!(matches!(QueueError::from_code("QueueDoesNotExist", String::new()), QueueError::NotFound));
        assert!(matches!(
            QueueError::from_code("AWS.SimpleQueueService.QueueDeletedRecently", "wait".into()),
            QueueError::DeletedRecently(m) if m == "wait"
        ));
    }

    #[test]
    fn credentials_that_may_heal_are_retried_not_parked() {
        // A web-identity token refreshed late or a key being rotated: AWS answers with these
        // codes for a while, then the same request succeeds.
        for code in ["ExpiredToken", "InvalidClientTokenId", "com.amazon.coral.service#UnrecognizedClientException"] {
            let e = QueueError::from_code(code, "m".into());
            assert!(matches!(e, QueueError::CredentialsRejected { .. }), "{code}: {e:?}");
            assert_eq!(e.class(), ErrorClass::Transient, "{code}");
        }
    }

    #[test]
    fn invalid_input_and_access_problems_are_permanent_the_rest_transient() {
        let permanent = ["InvalidAttributeValue", "AccessDenied", "AccessDeniedException"];
        for code in permanent {
            assert_eq!(QueueError::from_code(code, String::new()).class(), ErrorClass::Permanent, "{code}");
        }
        let transient = [
            "RequestThrottled",
            "InternalError",
            "SomethingNew",
            "QueueDeletedRecently",
            "ExpiredToken",
            "InvalidClientTokenId",
            "UnrecognizedClientException",
            "SignatureDoesNotMatch",
        ];
        for code in transient {
            assert_eq!(QueueError::from_code(code, String::new()).class(), ErrorClass::Transient, "{code}");
        }
    }
}

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
            | QueueError::Unavailable(_)
            | QueueError::Other { .. } => ErrorClass::Transient,
        }
    }

    /// Maps an AWS error code (query- or JSON-protocol spelling) and message to a variant.
    pub fn from_code(code: &str, message: String) -> Self {
        let short = code.rsplit('.').next().unwrap_or(code);
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
            "AccessDenied"
            | "AccessDeniedException"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "InvalidSecurity"
            | "SignatureDoesNotMatch"
            | "MissingAuthenticationToken"
            | "ExpiredToken"
            | "KmsAccessDenied"
            | "KmsDisabled" => QueueError::AccessDenied { code: code.to_string(), message },
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn invalid_input_and_access_problems_are_permanent_the_rest_transient() {
        let permanent = ["InvalidAttributeValue", "AccessDenied", "InvalidClientTokenId"];
        for code in permanent {
            assert_eq!(QueueError::from_code(code, String::new()).class(), ErrorClass::Permanent, "{code}");
        }
        let transient = ["RequestThrottled", "InternalError", "SomethingNew", "QueueDeletedRecently"];
        for code in transient {
            assert_eq!(QueueError::from_code(code, String::new()).class(), ErrorClass::Transient, "{code}");
        }
    }
}

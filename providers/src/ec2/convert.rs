//! EC2's answers in the shared vocabulary: instances as hosts, error codes as [`HostError`]s.

use std::collections::BTreeMap;

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{Instance, InstanceStateName};

use super::{PROVIDER, Regional};
use crate::error::HostError;
use crate::hosts::{Host, HostState};

pub(super) fn host(instance: &Instance) -> Option<Host> {
    let state = match instance.state().and_then(|s| s.name()) {
        Some(InstanceStateName::Pending) => HostState::Provisioning,
        Some(InstanceStateName::Running) => HostState::Running,
        Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => HostState::Stopped,
        Some(InstanceStateName::ShuttingDown) => HostState::Deleting,
        Some(InstanceStateName::Terminated) => return None,
        _ => HostState::Provisioning,
    };
    let tags: BTreeMap<String, String> = instance
        .tags()
        .iter()
        .filter(|t| t.key() != Some("Name"))
        .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
        .collect();
    let name = instance.tags().iter().find(|t| t.key() == Some("Name")).and_then(|t| t.value()).unwrap_or_default();
    Some(Host {
        id: instance.instance_id()?.to_string(),
        name: name.to_string(),
        public_ipv4: instance.public_ip_address().map(str::to_string),
        state,
        tags,
        placement: instance.placement().and_then(|p| p.availability_zone()).map(str::to_string),
    })
}

/// [`host`] with the id qualified by region.
pub(super) fn host_in(r: &Regional, instance: &Instance) -> Option<Host> {
    host(instance).map(|h| Host { id: r.qualify(&h.id), ..h })
}

/// Maps an EC2 error code (and message) to a [`HostError`]; messages come from AWS and hold no
/// credentials.
pub fn error_from_code(code: &str, message: String) -> HostError {
    let p = PROVIDER;
    let message = if message.is_empty() { code.to_string() } else { format!("{code}: {message}") };
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => {
            HostError::RateLimited { provider: p, retry_after: None }
        }
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "Blocked"
        | "PendingVerification" => HostError::Unauthorized { provider: p, message },
        "InvalidInstanceID.NotFound"
        | "InvalidGroup.NotFound"
        | "InvalidGroupId.NotFound"
        | "InvalidAllocationID.NotFound"
        | "InvalidAssociationID.NotFound"
        | "InvalidAddress.NotFound" => HostError::NotFound { provider: p, message },
        "InvalidGroup.Duplicate" => HostError::AlreadyExists { provider: p, message },
        // CreateSecurityGroup or RunInstances without a VPC or subnet where the region has no
        // default VPC.
        "VPCIdNotSpecified" => HostError::NoDefaultVpc {
            provider: p,
            message: format!("{message}; {}", super::network::NO_DEFAULT_VPC_FIX),
        },
        "InsufficientInstanceCapacity"
        | "DependencyViolation"
        | "InternalError"
        | "Unavailable"
        | "ServiceUnavailable" => HostError::Unavailable { provider: p, message },
        c if c.ends_with("LimitExceeded") || c == "MaxSpotInstanceCountExceeded" => {
            HostError::Quota { provider: p, message }
        }
        c if c.starts_with("Invalid") || c.starts_with("Missing") || c.starts_with("Unsupported") => {
            HostError::Invalid { provider: p, message }
        }
        _ => HostError::Unavailable { provider: p, message },
    }
}

pub(super) fn map_err<E, R>(err: SdkError<E, R>) -> HostError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match crate::aws::failure(err) {
        crate::aws::Failure::Service { code, message } => error_from_code(&code, message),
        crate::aws::Failure::Transport(message) => HostError::Unavailable { provider: PROVIDER, message },
    }
}

//! What a Tunnel reports: its phase, host, ports and `Ready` condition, and Warning Events
//! (on the Service too for provider failures and a refused size or region) when a new problem
//! appears. The status itself is written by the spine ([`super::phases::Pass::record`]).

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::api::Api;
use tracing::warn;

use super::Context;
use crate::controllers::status::StatusWriter;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{Tunnel, TunnelPort};
use crate::reasons::Reason;

/// The Tunnel's status writer: starts from the status this controller last wrote, which the
/// cache can lag (a reconcile woken by the client Deployment we just made must not see a
/// Tunnel without the host it recorded). Only skyport writes a Tunnel's status.
pub type Writer<'a> = StatusWriter<'a, Tunnel>;

pub fn writer<'a>(tunnel: &Tunnel, api: &'a Api<Tunnel>, ctx: &'a Context) -> Writer<'a> {
    StatusWriter::new(tunnel, api, &ctx.api_writes, Some(&ctx.written))
}

pub fn describe(ports: &[TunnelPort]) -> String {
    ports.iter().map(|p| format!("{}/{}", p.port, p.protocol)).collect::<Vec<_>>().join(", ")
}

pub fn not_ready(reason: Reason, message: &str) -> Vec<Condition> {
    vec![Condition::new("Ready", ConditionStatus::False, reason.as_str(), message)]
}

/// Warning Events for a Ready=False with `reason`, when it is new (`current` is the reason
/// reported now): on the Tunnel, and on its Service for provider failures, a refused size or
/// region, unusable Service ports and a tunnel that does not come up.
pub async fn warn_if_new(
    tunnel: &Tunnel,
    service: Option<&Service>,
    ctx: &Context,
    current: Option<&str>,
    reason: Reason,
    message: &str,
) {
    if current == Some(reason.as_str()) {
        return;
    }
    warn!(%reason, message, "tunnel not ready");
    ctx.publish(tunnel, reason, message.to_string()).await;
    if let (Some(service), true) = (service, for_service(reason)) {
        ctx.publish_on(&service.object_ref(&()), reason, message.to_string()).await;
    }
}

/// Whether the Service's owner, who may not see Tunnels, must learn of a Tunnel's `reason` on the
/// Service too: why nothing happens.
pub fn for_service(reason: Reason) -> bool {
    use Reason::*;
    matches!(
        reason,
        ProviderRateLimited
            | ProviderUnauthorized
            | ProviderRejected
            | ProviderNotFound
            | ProviderConflict
            | ProviderQuotaExceeded
            | ProviderUnavailable
            | ProviderNoDefaultVpc
            | ProviderNotConfigured
            | ArtifactUnavailable
            | ArtifactDigestMismatch
            | NotAllowed
            | TunnelNotEstablished
            | ExitServerUnreachable
            | ExitServerArtifactRefused
            | ExitServerNotStarted
            | ClientNotAvailable
            | InvalidService
    )
}

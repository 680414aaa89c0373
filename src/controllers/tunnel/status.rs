//! What a Tunnel reports: its phase, host, ports and `Ready` condition, and Warning Events
//! (on the Service too for provider failures and a refused size or region) when a new problem appears.

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::warn;

use super::Context;
use crate::controllers::status::{ObjectStatus, StatusWriter};
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelPort};
use crate::error::Result;

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

pub fn not_ready(reason: &str, message: &str) -> Vec<Condition> {
    vec![Condition::new("Ready", ConditionStatus::False, reason, message)]
}

/// Ready=False with `reason`; a Warning Event on the Tunnel (and on its Service for provider
/// failures, a refused size or region, unusable Service ports and a tunnel that does not come
/// up) when the reason is new.
pub async fn report(
    tunnel: &Tunnel,
    service: Option<&Service>,
    ctx: &Context,
    status: &mut Writer<'_>,
    phase: TunnelPhase,
    reason: &str,
    message: &str,
) -> Result<()> {
    if status.current().not_ready_reason() != Some(reason) {
        warn!(reason, message, "tunnel not ready");
        ctx.publish(tunnel, EventType::Warning, reason, message.to_string()).await;
        // The Service's owner, who may not see Tunnels, must learn why nothing happens.
        let for_service = reason.starts_with("Provider")
            || reason.starts_with("Artifact")
            || [super::plan::NOT_ALLOWED, "TunnelNotEstablished", "InvalidService"].contains(&reason);
        if let (Some(service), true) = (service, for_service) {
            ctx.publish_on(&service.object_ref(&()), EventType::Warning, reason, message.to_string()).await;
        }
    }
    status
        .write(|s| {
            s.phase = Some(phase);
            s.conditions = not_ready(reason, message);
        })
        .await
}

//! What to do about a Service's Tunnel: pure, from the Service and the Tunnel in the cache.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::{Resource, ResourceExt};

use super::desired::{owned_by, proxy_protocol, served, source_ranges};
use crate::config::TunnelArgs;
use crate::crd::tunnel::{ProxyProtocol, Tunnel};

/// The one step for this reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Served and without a Tunnel: create it.
    Create,
    /// Served, and its Tunnel's `spec.sourceRanges` differ from the Service's: set them.
    SetSourceRanges(Vec<String>),
    /// Served, and its Tunnel's `spec.proxyProtocol` differs from the annotation's: set it.
    SetProxyProtocol(Option<ProxyProtocol>),
    /// Served, with a Tunnel, and an annotation that cannot be read: say so, change nothing.
    InvalidAnnotation(String),
    /// No longer served (or being deleted) and it owns its Tunnel: delete it, saying `why`.
    Delete { why: &'static str },
    /// Look again after this long: a same-named Tunnel of another Service may be going away.
    Retry(Duration),
    /// Nothing to do; `why` is for the debug log.
    Leave { why: &'static str },
}

/// Decides the step for `service`, given the Tunnel of its Tunnel's name, if any.
pub fn step(service: &Service, existing: Option<&Tunnel>, settings: &TunnelArgs) -> Step {
    let serve = service.meta().deletion_timestamp.is_none() && served(service, settings).is_ok();
    let proxy = proxy_protocol(service).map_err(|e| e.to_string());
    match (serve, existing) {
        (true, None) => Step::Create,
        (true, Some(tunnel)) if !owned_by(tunnel, service) => {
            // A Tunnel of that name that this Service does not own: made by hand, or left by an
            // earlier Service of the same name whose garbage collection is still pending.
            if tunnel.meta().deletion_timestamp.is_none()
                && !tunnel.owner_references().iter().any(|r| r.kind == "Service")
            {
                return Step::Leave { why: "Tunnel exists and is not owned by this Service; leaving it" };
            }
            Step::Retry(Duration::from_secs(2))
        }
        // Being deleted (kubectl delete tunnel): a fresh one follows once it is gone. Looked at
        // again rather than left to the owned-object watch: that watch's delete event can arrive
        // before the Tunnel controller's cache, read here, drops the Tunnel, and nothing would
        // wake this Service after that.
        (true, Some(tunnel)) if tunnel.meta().deletion_timestamp.is_some() => Step::Retry(Duration::from_secs(1)),
        (true, Some(tunnel)) if tunnel.spec.source_ranges != source_ranges(service) => {
            Step::SetSourceRanges(source_ranges(service))
        }
        (true, Some(_)) if let Err(why) = proxy => Step::InvalidAnnotation(why),
        (true, Some(tunnel)) if proxy.as_ref().is_ok_and(|p| *p != tunnel.spec.proxy_protocol) => {
            Step::SetProxyProtocol(proxy.unwrap_or_default())
        }
        (true, Some(_)) => Step::Leave { why: "Tunnel exists" },
        (false, Some(tunnel)) if owned_by(tunnel, service) && tunnel.meta().deletion_timestamp.is_none() => {
            Step::Delete { why: served(service, settings).err().unwrap_or("being deleted") }
        }
        (false, _) => Step::Leave { why: "not served" },
    }
}

//! The HTTP endpoints for kubelet probes and Prometheus.
//!
//! | path | answer |
//! |---|---|
//! | `/healthz`, `/livez` | `200 ok` while the process serves requests (liveness) |
//! | `/readyz` | `200` when running with synced caches, or waiting as a leader-election standby; `503` while starting, syncing or shutting down (readiness) |
//! | `/metrics` | OpenMetrics text, see [`crate::metrics`] |
//!
//! A standby counts as ready (whether its warm caches synced or not: `skyport_caches_synced` says
//! that): otherwise a rolling update of a Deployment with several replicas could never finish, as
//! the new Pods wait for the old leader's Lease.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::debug;

use crate::metrics::{self, Metrics};

/// Where the operator is in its life, as `/readyz` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Starting = 0,
    /// Waiting for the leader Lease, its caches filling or kept (a warm standby).
    Standby = 1,
    /// Leader (or no election); the controllers' caches are filling.
    Syncing = 2,
    /// Caches synced, reconciling.
    Running = 3,
    ShuttingDown = 4,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Standby => "standby",
            Phase::Syncing => "syncing",
            Phase::Running => "running",
            Phase::ShuttingDown => "shutting down",
        }
    }

    pub fn is_ready(self) -> bool {
        matches!(self, Phase::Standby | Phase::Running)
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Standby,
            2 => Phase::Syncing,
            3 => Phase::Running,
            4 => Phase::ShuttingDown,
            _ => Phase::Starting,
        }
    }
}

/// What the endpoints read: the phase and the metrics.
pub struct State {
    phase: AtomicU8,
    pub metrics: Metrics,
}

impl State {
    pub fn new(metrics: Metrics) -> Arc<Self> {
        Arc::new(State { phase: AtomicU8::new(Phase::Starting as u8), metrics })
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::SeqCst))
    }

    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::SeqCst);
    }
}

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

/// Answers one request.
pub fn handle(state: &State, method: &Method, path: &str) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n");
    }
    match path {
        "/healthz" | "/livez" => respond(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" => {
            let phase = state.phase();
            let status = if phase.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            respond(status, TEXT, format!("{}\n", phase.name()))
        }
        "/metrics" => respond(StatusCode::OK, metrics::CONTENT_TYPE, state.metrics.encode()),
        _ => respond(StatusCode::NOT_FOUND, TEXT, "not found; try /healthz, /readyz or /metrics\n"),
    }
}

/// Binds `addr` (port 0 picks a free one) and returns the bound address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves HTTP/1 on `listener` until the process ends.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                debug!(error = %e, "accept failed");
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let response = handle(&state, req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await
            {
                debug!(%peer, error = %e, "HTTP connection failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_phase_and_health_is_always_ok() {
        let state = State::new(Metrics::default());
        let get = |path| handle(&state, &Method::GET, path).status();
        assert_eq!(get("/healthz"), StatusCode::OK);
        assert_eq!(get("/readyz"), StatusCode::SERVICE_UNAVAILABLE);
        for (phase, ready) in
            [(Phase::Standby, true), (Phase::Syncing, false), (Phase::Running, true), (Phase::ShuttingDown, false)]
        {
            state.set_phase(phase);
            assert_eq!(get("/readyz") == StatusCode::OK, ready, "{phase:?}");
            assert_eq!(get("/healthz"), StatusCode::OK);
        }
        assert_eq!(get("/metrics"), StatusCode::OK);
        assert_eq!(get("/nope"), StatusCode::NOT_FOUND);
        assert_eq!(handle(&state, &Method::POST, "/metrics").status(), StatusCode::METHOD_NOT_ALLOWED);
    }
}

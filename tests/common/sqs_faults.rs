//! A fault-injecting HTTP proxy in front of LocalStack's SQS endpoint (AWS JSON 1.0 protocol, as
//! aws-sdk-sqs speaks it). While faults are on, half the requests get one of: SQS's throttling
//! error (HTTP 400, `RequestThrottled`), an HTTP 500 `InternalError`, the connection closed
//! without an answer, or a 2 s delay before being forwarded. Every request is recorded with its
//! time, operation and queue, so a test can check the call rate and per-queue retry spacing.
//!
//! It can also stall every request (held, then forwarded), as an unreachable or overloaded
//! endpoint would, and enforce SQS's published tagging quota as AWS does, which LocalStack does not:
//! tagging actions over the rate are answered `RequestThrottled` (benches/ack.rs `--sqs-quota`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rand::Rng;
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Throttled,
    ServerError,
    Reset,
    Slow,
}

impl Fault {
    /// The request failed (a slow answer still succeeds).
    pub fn failed(self) -> bool {
        self != Fault::Slow
    }
}

#[derive(Debug, Clone)]
pub struct Call {
    pub at: Instant,
    pub operation: String,
    /// Queue name (`QueueName`, or the last segment of `QueueUrl`).
    pub queue: String,
    pub fault: Option<Fault>,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    pub calls: Arc<Mutex<Vec<Call>>>,
    pub faulty: Arc<AtomicBool>,
    quota: Arc<Mutex<Option<Bucket>>>,
    stall: Arc<Mutex<Option<Duration>>>,
}

#[derive(Clone)]
struct Shared {
    upstream: String,
    calls: Arc<Mutex<Vec<Call>>>,
    faulty: Arc<AtomicBool>,
    quota: Arc<Mutex<Option<Bucket>>>,
    stall: Arc<Mutex<Option<Duration>>>,
}

/// The tagging quota: `governor`'s bucket of one second, checked without waiting (SQS refuses,
/// it does not queue).
type Bucket = governor::DefaultDirectRateLimiter;

impl FaultProxy {
    /// Proxies a free loopback port to `upstream` (host:port), faults off.
    pub async fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let shared = Shared {
            upstream: upstream.to_string(),
            calls: Arc::default(),
            faulty: Arc::default(),
            quota: Arc::default(),
            stall: Arc::default(),
        };
        let proxy = FaultProxy {
            addr,
            calls: shared.calls.clone(),
            faulty: shared.faulty.clone(),
            quota: shared.quota.clone(),
            stall: shared.stall.clone(),
        };
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, shared.clone()));
                    // A reset ends the connection with an error: nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        proxy
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_faulty(&self, on: bool) {
        self.faulty.store(on, Ordering::SeqCst);
    }

    /// Tagging actions beyond `per_second` (a bucket of one second) are throttled, as SQS does
    /// per account; `None` lifts the quota.
    pub fn set_tagging_quota(&self, per_second: Option<u32>) {
        let bucket =
            per_second.and_then(std::num::NonZeroU32::new).map(|r| Bucket::direct(governor::Quota::per_second(r)));
        *self.quota.lock().unwrap() = bucket;
    }

    /// Every request is held for `hold` before it is forwarded; `None` forwards at once.
    pub fn set_stall(&self, hold: Option<Duration>) {
        *self.stall.lock().unwrap() = hold;
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

pub type Reply = Result<Response<Full<Bytes>>, std::io::Error>;

async fn handle(req: Request<Incoming>, shared: Shared) -> Reply {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let target = parts.headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let operation = target.rsplit('.').next().unwrap_or_default().to_string();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let queue = json["QueueName"]
        .as_str()
        .or_else(|| json["QueueUrl"].as_str().and_then(|u| u.rsplit('/').next()))
        .unwrap_or_default()
        .to_string();
    let over_quota = providers::sqs::TAGGING.contains(&operation.as_str())
        && shared.quota.lock().unwrap().as_ref().is_some_and(|bucket| bucket.check().is_err());
    let fault = if over_quota {
        Some(Fault::Throttled)
    } else {
        (shared.faulty.load(Ordering::SeqCst) && rand::rng().random_bool(0.5))
            .then(|| [Fault::Throttled, Fault::ServerError, Fault::Reset, Fault::Slow][rand::rng().random_range(0..4)])
    };
    shared.calls.lock().unwrap().push(Call { at: Instant::now(), operation, queue, fault });
    let stall = *shared.stall.lock().unwrap();
    if let Some(hold) = stall {
        tokio::time::sleep(hold).await;
    }
    match fault {
        Some(Fault::Throttled) => Ok(error(400, "RequestThrottled", "Sender", "Request is throttled.")),
        Some(Fault::ServerError) => Ok(error(500, "InternalError", "Receiver", "We encountered an internal error.")),
        Some(Fault::Reset) => Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected reset")),
        Some(Fault::Slow) => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            forward(&shared.upstream, parts, body).await
        }
        None => forward(&shared.upstream, parts, body).await,
    }
}

/// An error as SQS's JSON protocol sends it: `__type` in the body, and the query-compatible code
/// in `x-amzn-query-error`, which the SDK reports as the error code.
fn error(status: u16, code: &str, fault: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"__type": format!("com.amazonaws.sqs#{code}"), "message": message});
    Response::builder()
        .status(status)
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amzn-query-error", format!("{code};{fault}"))
        .header("x-amzn-requestid", "00000000-0000-0000-0000-000000000000")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Sends the request on to `upstream` and returns its answer (also the STS stand-in's way to
/// LocalStack).
pub async fn forward(upstream: &str, parts: hyper::http::request::Parts, body: Bytes) -> Reply {
    let stream = TcpStream::connect(upstream).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let response =
        sender.send_request(Request::from_parts(parts, Full::new(body))).await.map_err(std::io::Error::other)?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

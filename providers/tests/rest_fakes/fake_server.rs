//! The fake API server both clouds' fakes run on: it checks the bearer token (echoing a wrong
//! one, as a careless API might), serves scripted responses first, records every request and
//! sends rate-limit headers in each provider's spelling. The routes are in `fake_digitalocean.rs`
//! and `fake_hetzner.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::{POLLS_UNTIL_RUNNING, TOKEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    DigitalOcean,
    Hetzner,
}

#[derive(Debug)]
pub struct FakeHost {
    pub name: String,
    pub reads: u32,
    /// DigitalOcean tags, or Hetzner labels as `key=value` pairs.
    pub tags: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Hetzner: the primary IP (id, address) the server was created with, if it was given one.
    pub primary_ip: Option<(u64, String)>,
    /// Hetzner: the server's location.
    pub location: String,
    /// Hetzner: the spread placement group it was created in.
    pub placement_group: Option<u64>,
}

/// A Hetzner placement group.
#[derive(Debug)]
pub struct FakeGroup {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// A DigitalOcean reserved IP or a Hetzner primary IP.
#[derive(Debug)]
pub struct FakeAddress {
    pub id: u64,
    /// Hetzner's primary IP name, unique per project; DigitalOcean's reserved IPs have none.
    pub name: String,
    pub ip: String,
    pub host: Option<u64>,
    pub labels: BTreeMap<String, String>,
    pub location: String,
    pub auto_delete: bool,
}

/// A Hetzner floating IP.
#[derive(Debug)]
pub struct FakeFloating {
    pub ip: String,
    pub name: String,
    pub server: Option<u64>,
    pub labels: BTreeMap<String, String>,
    pub home_location: String,
}

/// A Hetzner action on a floating IP: it runs until `done_at`, and only then takes effect.
#[derive(Debug)]
pub struct FakeAction {
    pub command: String,
    pub floating_ip: u64,
    /// Where an assign (`Some`) or unassign (`None`) puts the floating IP.
    pub server: Option<u64>,
    pub done_at: std::time::Instant,
    /// `Some(error)` once it failed; it then changes nothing.
    pub error: Option<String>,
    pub finished: bool,
}

/// A scripted response, served instead of the normal one.
struct Scripted {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Value,
}

#[derive(Default)]
pub struct State {
    pub next_id: u64,
    pub hosts: BTreeMap<u64, FakeHost>,
    pub addresses: BTreeMap<u64, FakeAddress>,
    /// `(method, path, query)` of every request.
    pub requests: Vec<(String, String, String)>,
    pub create_bodies: Vec<Value>,
    /// Hetzner floating IPs and the actions on them.
    pub floating: BTreeMap<u64, FakeFloating>,
    /// Hetzner placement groups (their servers are the hosts naming them).
    pub groups: BTreeMap<u64, FakeGroup>,
    pub actions: BTreeMap<u64, FakeAction>,
    /// How long a Hetzner action runs.
    pub action_time: std::time::Duration,
    /// The next Hetzner action ends in `error`.
    pub fail_next_action: bool,
    scripted: VecDeque<Scripted>,
    /// `(limit, remaining, reset)` sent on every normal response.
    pub rate: Option<(u64, u64, u64)>,
    /// The public IPv4 every running host reports, instead of a documentation address: where a
    /// test runs a real exit server.
    pub public_ip: Option<String>,
}

pub struct Fake {
    kind: Kind,
    state: Mutex<State>,
}

impl Fake {
    pub async fn start(kind: Kind) -> (Arc<Fake>, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let fake = Arc::new(Fake {
            kind,
            state: Mutex::new(State {
                next_id: 1000,
                action_time: std::time::Duration::from_millis(300),
                ..State::default()
            }),
        });
        let server = fake.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let fake = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let fake = fake.clone();
                        async move { Ok::<_, Infallible>(fake.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let base = match kind {
            Kind::DigitalOcean => format!("http://{addr}"),
            Kind::Hetzner => format!("http://{addr}/v1"),
        };
        (fake, base)
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub fn script(&self, status: u16, headers: &[(&'static str, String)], body: Value) {
        self.state().scripted.push_back(Scripted { status, headers: headers.to_vec(), body });
    }

    pub fn request_count(&self) -> usize {
        self.state().requests.len()
    }

    /// This provider's error body.
    pub fn error(&self, status: u16, code: &str, message: &str) -> (u16, Value) {
        match self.kind {
            Kind::DigitalOcean => (status, json!({"id": code, "message": message, "request_id": "fake-req-1"})),
            Kind::Hetzner => (status, json!({"error": {"code": code, "message": message, "details": {}}})),
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = parse_query(req.uri().query().unwrap_or_default());
        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);

        let mut state = self.state();
        state.requests.push((method.to_string(), path.clone(), format!("{query:?}")));
        let rate = state.rate;
        let (status, extra, payload) = if let Some(s) = state.scripted.pop_front() {
            (s.status, s.headers, s.body)
        } else if auth != format!("Bearer {TOKEN}") {
            // Echo what was sent, as a careless API might: the adapter must scrub it.
            let (status, body) = self.error(401, "unauthorized", &format!("Unable to authenticate you ({auth})"));
            (status, vec![], body)
        } else {
            let (status, body) = match self.kind {
                Kind::DigitalOcean => self.digitalocean(&mut state, &method, &path, &query, body),
                Kind::Hetzner => self.hetzner(&mut state, &method, &path, &query, body),
            };
            (status, vec![], body)
        };
        drop(state);

        let mut response = Response::builder().status(status).header("content-type", "application/json");
        if let Some((limit, remaining, reset)) = rate {
            // DigitalOcean documents the names in lower case, Hetzner capitalised.
            let names = match self.kind {
                Kind::DigitalOcean => ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
                Kind::Hetzner => ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
            };
            if !extra.iter().any(|(k, _)| k.eq_ignore_ascii_case(names[1])) {
                response = response
                    .header(names[0], limit.to_string())
                    .header(names[1], remaining.to_string())
                    .header(names[2], reset.to_string());
            }
        }
        for (k, v) in extra {
            response = response.header(k, v);
        }
        let bytes = if status == 204 { Bytes::new() } else { Bytes::from(payload.to_string()) };
        response.body(Full::new(bytes)).unwrap()
    }

    /// Reads a host, advancing its boot.
    pub fn read(host: &mut FakeHost) -> bool {
        host.reads += 1;
        host.reads > POLLS_UNTIL_RUNNING
    }
}

/// `application/x-www-form-urlencoded` query → map (last value wins).
fn parse_query(query: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(query.as_bytes()).into_owned().collect()
}

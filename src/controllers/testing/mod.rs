//! In-process fakes for reconcile tests that need no servers: the Kubernetes API ([`FakeApi`],
//! behind a `tower-test` mock service, the way kube-rs tests its own controllers), SQS
//! ([`sqs::FakeSqs`]), a host provider ([`provider::FakeProvider`]) and the tunnel health check
//! ([`probe::FakeProbe`]).
//!
//! The fake API keeps objects by path and understands what skyport sends: GET, POST (create),
//! merge patches (conditional on `metadata.resourceVersion` when one is given), JSON patches
//! of `test` operations, server-side apply, status patches, DELETE and Events. Failures are injected per method and path.

mod hosts;
pub mod probe;
pub mod provider;
pub mod sqs;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hyper::{Method, Request, Response, StatusCode};
use kube::client::Body;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};

/// A reflector cache that has finished its first list (so `store_synced` returns at once), and
/// the writer that feeds it.
pub fn ready_store<K>() -> (Store<K>, Writer<K>)
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (reader, writer)
}

/// One request the fake API answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    /// Path without the query.
    pub path: String,
    pub body: Value,
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<String, Value>,
    calls: Vec<Call>,
    /// (method, path suffix, status, times left).
    failures: Vec<(Method, String, u16, usize)>,
    version: u64,
}

/// The fake API server; clones share it.
#[derive(Clone, Default)]
pub struct FakeApi(Arc<Mutex<Inner>>);

impl FakeApi {
    /// A client talking to a new fake API (the answering task runs on the test's runtime).
    pub fn start() -> (kube::Client, FakeApi) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        handle.allow(u64::MAX);
        let api = FakeApi::default();
        let server = api.clone();
        tokio::spawn(async move {
            while let Some((request, reply)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (status, answer) = server.answer(&parts.method, parts.uri.path(), body);
                let response = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).expect("JSON")))
                    .expect("response");
                reply.send_response(response);
            }
        });
        (kube::Client::new(service, "default"), api)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `obj` at `path` (the object's own URL path) as if it had been created.
    pub fn put(&self, path: &str, mut obj: Value) -> Value {
        let mut inner = self.lock();
        inner.version += 1;
        obj["metadata"]["resourceVersion"] = json!(inner.version.to_string());
        inner.objects.insert(path.to_string(), obj.clone());
        obj
    }

    /// Removes the object at `path`, as a delete by someone else would.
    pub fn remove(&self, path: &str) -> Option<Value> {
        self.lock().objects.remove(path)
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(path).cloned()
    }

    /// Fails the next `times` requests of `method` whose path ends with `suffix` with `status`.
    pub fn fail(&self, method: Method, suffix: &str, status: u16, times: usize) {
        self.lock().failures.push((method, suffix.to_string(), status, times));
    }

    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The requests that changed something: all but GET, and but JSON patches made only of
    /// `test` operations (reads that need no `get`, see `controllers::owned`).
    pub fn writes(&self) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.method != Method::GET && !only_tests(&c.body)).collect()
    }

    /// Reasons of the Events published, in order (a repeat is a patch of the first's series,
    /// and named by the first's reason).
    pub fn event_reasons(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.path.contains("/events") && c.method != Method::GET)
            .map(|c| {
                let event = if c.method == Method::PATCH { self.get(&c.path).unwrap_or_default() } else { c.body };
                event["reason"].as_str().unwrap_or_default().to_string()
            })
            .collect()
    }

    fn answer(&self, method: &Method, path: &str, body: Value) -> (StatusCode, Value) {
        let mut inner = self.lock();
        let injected =
            inner.failures.iter_mut().find(|(m, s, _, n)| m == method && path.ends_with(s.as_str()) && *n > 0);
        let (status, answer) = match injected {
            Some((_, _, code, n)) => {
                *n -= 1;
                let code = StatusCode::from_u16(*code).expect("status code");
                (code, status_body(code, "injected failure"))
            }
            None => inner.handle(method, path, &body),
        };
        inner.calls.push(Call { method: method.clone(), path: path.to_string(), body, status: status.as_u16() });
        (status, answer)
    }
}

impl Inner {
    fn handle(&mut self, method: &Method, path: &str, body: &Value) -> (StatusCode, Value) {
        let (key, subresource) = match path.strip_suffix("/status") {
            Some(key) => (key.to_string(), true),
            None => (path.to_string(), false),
        };
        match *method {
            Method::GET => match self.objects.get(&key) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => not_found(),
            },
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or("generated").to_string();
                let key = format!("{key}/{name}");
                if self.objects.contains_key(&key) && !key.contains("/events/") {
                    return (StatusCode::CONFLICT, status_body(StatusCode::CONFLICT, "already exists"));
                }
                let mut obj = body.clone();
                obj["metadata"]["uid"] = json!(format!("uid-{name}"));
                (StatusCode::CREATED, self.store(key, obj))
            }
            Method::PATCH if body.is_array() => match self.objects.get(&key) {
                None => not_found(),
                Some(_) if !only_tests(body) => {
                    (StatusCode::BAD_REQUEST, status_body(StatusCode::BAD_REQUEST, "only test operations are faked"))
                }
                Some(obj) => {
                    let failed = body
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|op| obj.pointer(op["path"].as_str().unwrap_or_default()) != Some(&op["value"]));
                    match failed {
                        true => (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            status_body(StatusCode::UNPROCESSABLE_ENTITY, "test failed"),
                        ),
                        false => (StatusCode::OK, obj.clone()),
                    }
                }
            },
            Method::PATCH => {
                let existing = self.objects.get(&key).cloned();
                let is_apply = body.get("apiVersion").is_some() && body.get("kind").is_some();
                let Some(mut obj) = existing.or_else(|| is_apply.then(|| json!({}))) else { return not_found() };
                let wanted = body["metadata"]["resourceVersion"].as_str();
                if let Some(wanted) = wanted
                    && obj["metadata"]["resourceVersion"].as_str() != Some(wanted)
                {
                    return (StatusCode::CONFLICT, status_body(StatusCode::CONFLICT, "the object has been modified"));
                }
                let mut patch = body.clone();
                if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                if subresource {
                    patch = json!({"status": patch.get("status").cloned().unwrap_or(Value::Null)});
                }
                merge(&mut obj, &patch);
                (StatusCode::OK, self.store(key, obj))
            }
            Method::DELETE => match self.objects.remove(&key) {
                Some(obj) => (StatusCode::OK, obj),
                None => not_found(),
            },
            _ => (StatusCode::METHOD_NOT_ALLOWED, status_body(StatusCode::METHOD_NOT_ALLOWED, "unsupported")),
        }
    }

    fn store(&mut self, key: String, mut obj: Value) -> Value {
        self.version += 1;
        obj["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.objects.insert(key, obj.clone());
        obj
    }
}

/// A JSON patch whose operations are all `test`s.
fn only_tests(body: &Value) -> bool {
    body.as_array().is_some_and(|ops| ops.iter().all(|op| op["op"] == "test"))
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("object");
    for (k, v) in fields {
        if v.is_null() {
            map.remove(k);
        } else {
            merge(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn not_found() -> (StatusCode, Value) {
    (StatusCode::NOT_FOUND, status_body(StatusCode::NOT_FOUND, "not found"))
}

fn status_body(code: StatusCode, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": code.canonical_reason().unwrap_or("Failure").replace(' ', ""),
        "code": code.as_u16(),
    })
}

/// Seconds of a requeue (kube's `Action` has no getter; its Debug shows the duration).
pub fn requeue_secs(action: &kube::runtime::controller::Action) -> f64 {
    let shown = format!("{action:?}");
    let inner = shown.split("Some(").nth(1).unwrap_or_else(|| panic!("not a requeue: {shown}"));
    let duration = inner.trim_end_matches([')', ' ', '}']);
    let (number, scale) = match duration.strip_suffix("ms") {
        Some(ms) => (ms, 0.001),
        None => (duration.strip_suffix('s').unwrap_or_else(|| panic!("{shown}")), 1.0),
    };
    number.parse::<f64>().unwrap_or_else(|_| panic!("{shown}")) * scale
}
